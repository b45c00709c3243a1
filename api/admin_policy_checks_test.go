package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

func TestMintRefusesUnknownOperationsWithSuggestions(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	r := env.Do(http.MethodPost, "/api/v1/keys", env.adminToken, `{"name": "typo", "policy": {
		"vendor": "stripe", "daily_cap": "10.00", "expires_at": "2026-10-01T00:00:00Z",
		"operations": ["charges.creat", "*.read", "payment_intent.*", "Charges.create", "zzzz.qqqqqqqq"]}}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.Status, "body: %s", r.Body)
	p := r.Problem(t)
	assert.Equal(t, api.ProblemValidation, p.Type)
	byField := map[string]string{}
	for _, e := range p.Errors {
		byField[e.Field] = e.Message
	}
	assert.Equal(t, `"charges.creat" is not an operation keybrake knows; did you mean "charges.create"?`, byField["policy.operations[0]"])
	assert.NotContains(t, byField, "policy.operations[1]", "*.read is fine")
	assert.Contains(t, byField["policy.operations[2]"], `did you mean "payment_intents.*"`)
	assert.NotContains(t, byField["policy.operations[3]"], "keybrake knows", "a malformed glob gets its own error only")
	assert.NotEmpty(t, byField["policy.operations[3]"])
	assert.Equal(t, `"zzzz.qqqqqqqq" is not an operation keybrake knows`, byField["policy.operations[4]"])
	keys, _, err := env.store.ListKeys(t.Context(), vault.KeyFilter{})
	require.NoError(t, err)
	assert.Empty(t, keys, "nothing minted")

	// The same check applies to a change.
	k := env.MustMint("ok", "", nil, seedLegacyPolicy)
	r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, `{"policy": {"operations": ["refund.create"]}}`,
		"Content-Type", "application/merge-patch+json")
	require.Equal(t, http.StatusUnprocessableEntity, r.Status, "body: %s", r.Body)
	assert.Equal(t, []policy.FieldError{{Field: "policy.operations[0]",
		Message: `"refund.create" is not an operation keybrake knows; did you mean "refunds.create"?`}}, r.Problem(t).Errors)
}

func TestMintAndPatchWarnWhenACapCanNeverBind(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	r := env.Do(http.MethodPost, "/api/v1/keys", env.adminToken, `{"name": "odd", "policy": {
		"vendor": "stripe", "daily_cap": "150.00", "period_cap": "110.00", "expires_at": "2026-10-01T00:00:00Z"}}`)
	require.Equal(t, http.StatusCreated, r.Status, "minted as asked; body: %s", r.Body)
	var minted struct {
		ID       string   `json:"id"`
		Warnings []string `json:"warnings"`
	}
	r.Decode(t, &minted)
	assert.Equal(t, []string{"daily_cap (150.00) is above period_cap (110.00): every day lies in the period, so daily_cap can never be reached"},
		minted.Warnings)

	r = env.Do(http.MethodPatch, "/api/v1/keys/"+minted.ID, env.adminToken, `{"policy": {"daily_cap": "100.00", "per_request_cap": "120.00"}}`,
		"Content-Type", "application/merge-patch+json")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var patched struct {
		Warnings []string `json:"warnings"`
	}
	r.Decode(t, &patched)
	assert.Equal(t, []string{"per_request_cap (120.00) is above daily_cap (100.00): a larger request is refused by daily_cap, so per_request_cap can never be reached"},
		patched.Warnings)

	// Readings of the key carry no warnings; a sensible policy gets none.
	g := env.Do(http.MethodGet, "/api/v1/keys/"+minted.ID, env.adminToken, nil)
	assert.NotContains(t, g.JSON(t), "warnings")
	k := env.Do(http.MethodPost, "/api/v1/keys", env.adminToken, `{"name": "fine", "policy": `+seedLegacyPolicy+`}`)
	require.Equal(t, http.StatusCreated, k.Status)
	assert.NotContains(t, k.JSON(t), "warnings")
}
