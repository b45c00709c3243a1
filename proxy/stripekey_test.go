package proxy_test

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/keybrake/keybrake/proxy"
)

func TestStripeSecretKeySentAsVaultKey(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	for name, tc := range map[string]struct {
		header, kind string
	}{
		"live secret, bearer":     {"Bearer sk_live_51Habcdefghijklmnop", "sk_live"},
		"test secret, basic":      {"Basic " + base64.StdEncoding.EncodeToString([]byte("sk_test_51Hqrstuvwxyz:")), "sk_test"},
		"restricted key, bearer":  {"Bearer rk_live_51Hzyxwvutsrqpon", "rk_live"},
		"odd secret-looking text": {"Bearer sk_oddity", "sk"},
	} {
		t.Run(name, func(t *testing.T) {
			before := e.Logs.String()
			r := e.MustSend(t, http.MethodPost, "/v1/charges", "", http.Header{"Authorization": {tc.header}, "Idempotency-Key": {"k"}},
				form("amount", "100", "currency", "usd").Encode())
			AssertRefusal(t, r, http.StatusUnauthorized, "vault_key_invalid")
			errBody, _ := r.Body["error"].(map[string]any)
			assert.Contains(t, errBody["message"], "This is a Stripe secret key, not a vault key")
			logs := strings.TrimPrefix(e.Logs.String(), before)
			assert.Contains(t, logs, `"level":"WARN","msg":"a Stripe secret key was sent to the proxy instead of a vault key"`)
			assert.Contains(t, logs, `"stripe_key_kind":"`+tc.kind+`"`)
			assert.NotContains(t, logs, "51H", "never the key itself")
		})
	}
	assert.Zero(t, e.Fake.Count(), "nothing reached Stripe")

	// A vault key that is merely unknown is not an incident.
	before := e.Logs.String()
	r := e.MustSend(t, http.MethodGet, "/v1/charges", "vk_unknown", nil, "")
	AssertRefusal(t, r, http.StatusUnauthorized, "vault_key_invalid")
	assert.NotContains(t, strings.TrimPrefix(e.Logs.String(), before), "Stripe secret key")
}

func TestStripeKeyKind(t *testing.T) {
	t.Parallel()
	for header, want := range map[string]string{
		"Bearer sk_test_abc":   "sk_test",
		"Bearer rk_test_abc":   "rk_test",
		"Bearer sk_abc":        "sk",
		"Bearer pk_live_abc":   "", // a publishable key is not a secret
		"Bearer vk_abc":        "",
		"":                     "",
		"Bearer sk_live_a_b_c": "sk_live",
	} {
		h := http.Header{}
		if header != "" {
			h.Set("Authorization", header)
		}
		assert.Equal(t, want, proxy.StripeKeyKind(h), header)
	}
}
