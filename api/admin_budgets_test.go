package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
)

// TestAdminBudgetsLifecycle: a budget created, a key minted under it, its
// usage moving with the key's holds, a merge patch, the tree's refusals, and
// delete refused while a key names it.
func TestAdminBudgetsLifecycle(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")

	r := env.Do(http.MethodPost, "/api/v1/budgets", env.adminToken, map[string]any{
		"name": "org", "currency": "usd", "period_cap": "15.00", "labels": map[string]string{"team": "ops"},
	})
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	org := r.JSON(t)
	orgID := org["id"].(string)
	assert.Equal(t, "/api/v1/budgets/"+orgID, r.Header.Get("Location"))
	assert.Equal(t, "15.00", org["period_cap"])
	assert.Nil(t, org["parent"])

	r = env.Do(http.MethodPost, "/api/v1/budgets", env.adminToken, map[string]any{
		"name": "team", "parent": orgID, "currency": "usd", "daily_cap": 10, "velocity": []map[string]any{{"count": 20, "per": "1m"}},
	})
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	teamID := r.JSON(t)["id"].(string)

	// A name is unique among siblings: 409.
	r = env.Do(http.MethodPost, "/api/v1/budgets", env.adminToken, map[string]any{"name": "team", "parent": orgID, "currency": "usd", "daily_cap": "1.00"})
	assert.Equal(t, http.StatusConflict, r.Status, "body: %s", r.Body)
	assert.Contains(t, string(r.Body), `budget name \"team\" is taken under budget `+orgID)

	// Currency must match the parent's; unknown fields and bad limits are 422.
	r = env.Do(http.MethodPost, "/api/v1/budgets", env.adminToken, map[string]any{"name": "eur", "parent": orgID, "currency": "eur", "daily_cap": "1.00"})
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status)
	assert.Equal(t, []string{"parent"}, r.ErrorFields(t))
	r = env.Do(http.MethodPost, "/api/v1/budgets", env.adminToken, map[string]any{"name": "x", "currency": "usd", "daily_cap": "1.00", "velocity": []map[string]any{{"count": 0, "per": "1y"}}, "colour": "red"})
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status)
	assert.ElementsMatch(t, []string{"colour", "velocity[0].count", "velocity[0].per"}, r.ErrorFields(t))
	// A velocity glob that matches no operation would count nothing: refused,
	// with the closest name; on a key's policy too, and on a patch.
	r = env.Do(http.MethodPost, "/api/v1/budgets", env.adminToken, map[string]any{"name": "x", "currency": "usd", "daily_cap": "1.00",
		"velocity": []map[string]any{{"count": 3, "per": "1m", "operations": []string{"refunds.create", "refunds.creat"}}}})
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status)
	assert.Equal(t, []string{"velocity[0].operations[1]"}, r.ErrorFields(t))
	assert.Contains(t, string(r.Body), `did you mean \"refunds.create\"`)
	r = env.Do(http.MethodPost, "/api/v1/keys", env.adminToken, map[string]any{"name": "typo", "policy": map[string]any{
		"vendor": "stripe", "per_request_cap": "5.00", "expires_at": "2026-10-01T00:00:00Z",
		"velocity": []map[string]any{{"count": 3, "per": "1m", "operations": []string{"chargez.*"}}}}})
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status)
	assert.Equal(t, []string{"policy.velocity[0].operations[0]"}, r.ErrorFields(t))
	r = env.Do(http.MethodPatch, "/api/v1/budgets/"+teamID, env.adminToken, `{"velocity":[{"count":3,"per":"1m","operations":["payouts.nope"]}]}`,
		"Content-Type", "application/merge-patch+json")
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status, "body: %s", r.Body)
	r = env.Do(http.MethodPost, "/api/v1/budgets", env.adminToken, map[string]any{"name": "x", "currency": "usd", "daily_cap": "1.00", "parent": "bud_nope"})
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status)

	// A key under the team; a key under a missing budget is refused.
	k := env.MustMint("agent", "", nil, `{"vendor":"stripe","per_request_cap":"5.00","expires_at":"2026-10-01T00:00:00Z","budget":"`+teamID+`"}`)
	r = env.Do(http.MethodPost, "/api/v1/keys", env.adminToken, map[string]any{"name": "lost", "policy": map[string]any{
		"vendor": "stripe", "per_request_cap": "5.00", "expires_at": "2026-10-01T00:00:00Z", "budget": "bud_nope"}})
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status)
	assert.Equal(t, []string{"policy.budget"}, r.ErrorFields(t))

	env.MustHold(k.ID, "a", 300, vault.SettleCommit)
	r = env.Do(http.MethodGet, "/api/v1/budgets/"+orgID, env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	got := r.JSON(t)
	assert.EqualValues(t, 1, got["children"])
	assert.EqualValues(t, 0, got["keys"])
	period := got["usage"].(map[string]any)["period"].(map[string]any)
	assert.Equal(t, "3.00", period["committed"])
	assert.Equal(t, "12.00", period["remaining"])
	assert.Contains(t, period, "reset_at")
	assert.Nil(t, period["reset_at"], "a budget without expires_at: its period never resets")
	assert.Nil(t, period["end"])
	assert.NotNil(t, got["usage"].(map[string]any)["daily"].(map[string]any)["reset_at"], "its day does")

	r = env.Do(http.MethodGet, "/api/v1/budgets/"+teamID+"/usage", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	assert.Equal(t, "7.00", r.JSON(t)["daily"].(map[string]any)["remaining"])

	// Merge patch: lower the cap, drop the velocity; If-Match at a stale version fails.
	etag := env.Do(http.MethodGet, "/api/v1/budgets/"+teamID, env.adminToken, nil).Header.Get("ETag")
	r = env.Do(http.MethodPatch, "/api/v1/budgets/"+teamID, env.adminToken, `{"daily_cap":"4.00","velocity":null}`,
		"Content-Type", "application/merge-patch+json", "If-Match", etag)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	team := r.JSON(t)
	assert.Equal(t, "4.00", team["daily_cap"])
	assert.Empty(t, team["velocity"])
	assert.Equal(t, "1.00", team["usage"].(map[string]any)["daily"].(map[string]any)["remaining"])
	r = env.Do(http.MethodPatch, "/api/v1/budgets/"+teamID, env.adminToken, `{"daily_cap":"5.00"}`, "If-Match", etag)
	assert.Equal(t, http.StatusPreconditionFailed, r.Status)
	r = env.Do(http.MethodPatch, "/api/v1/budgets/"+teamID, env.adminToken, `{"currency":"eur"}`)
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status)

	// Listing: the roots, the children of org.
	r = env.Do(http.MethodGet, "/api/v1/budgets?parent=null", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	assert.Len(t, r.JSON(t)["budgets"], 1)
	r = env.Do(http.MethodGet, "/api/v1/budgets?parent="+orgID, env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	assert.Len(t, r.JSON(t)["budgets"], 1)

	// Delete: 409 while named, 204 once the key is revoked and the child gone.
	assert.Equal(t, http.StatusConflict, env.Do(http.MethodDelete, "/api/v1/budgets/"+teamID, env.adminToken, nil).Status)
	assert.Equal(t, http.StatusConflict, env.Do(http.MethodDelete, "/api/v1/budgets/"+orgID, env.adminToken, nil).Status)
	require.Equal(t, http.StatusOK, env.Do(http.MethodPost, "/api/v1/keys/"+k.ID+"/revoke", env.adminToken, nil).Status)
	assert.Equal(t, http.StatusNoContent, env.Do(http.MethodDelete, "/api/v1/budgets/"+teamID, env.adminToken, nil).Status)
	assert.Equal(t, http.StatusNoContent, env.Do(http.MethodDelete, "/api/v1/budgets/"+orgID, env.adminToken, nil).Status)
	assert.Equal(t, http.StatusNotFound, env.Do(http.MethodGet, "/api/v1/budgets/"+orgID, env.adminToken, nil).Status)
}
