package proxy_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

// TestScrubSecrets: what looks like a Stripe secret is replaced by its
// prefix; a masked key, a publishable key and other text are left alone.
func TestScrubSecrets(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"error":{"message":"Invalid key sk_live_51AbCdEf0123456789 sent"}}`: `{"error":{"message":"Invalid key sk_live_[redacted] sent"}}`,
		`rk_test_abcdefgh12 and whsec_Zx81Kq0abcdEF`:                          `rk_test_[redacted] and whsec_[redacted]`,
		`Invalid API Key provided: sk_test_********1234`:                      `Invalid API Key provided: sk_test_********1234`,
		`pk_live_51AbCdEf0123456789 is publishable`:                           `pk_live_51AbCdEf0123456789 is publishable`,
		`no secret here`: `no secret here`,
	} {
		assert.Equal(t, want, string(proxy.ScrubSecrets([]byte(in))), in)
	}
}

// TestUpstreamErrorBodiesAreScrubbed: a Stripe error that quotes a secret —
// the upstream key itself, another key, a webhook secret — reaches the caller
// without it, on a recorded request (and its replay) and on a read.
func TestUpstreamErrorBodiesAreScrubbed(t *testing.T) {
	t.Parallel()
	const upstreamSecret = "sk_test_51UpstreamSecretDoNotLeakXyz"
	quoting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"type":"invalid_request_error","message":"You sent %s, rk_live_abcdefgh1234 and whsec_abcdefgh1234"}}`,
			r.Header.Get("Authorization"))
	}))
	t.Cleanup(quoting.Close)
	e := MustEnv(t, withUpstreamURL(quoting.URL, upstreamSecret))
	tok, _ := e.MustKey(t, Policy("99.00"))
	charge := form("amount", "100", "currency", "usd", "source", "tok_visa")
	for _, r := range []reply{
		e.Post(t, "/v1/charges", tok, "quoted", charge),
		e.Post(t, "/v1/charges", tok, "quoted", charge), // the replay
		e.MustSend(t, http.MethodGet, "/v1/charges", tok, nil, ""),
	} {
		require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Raw)
		for _, secret := range []string{upstreamSecret, "rk_live_abcdefgh1234", "whsec_abcdefgh1234"} {
			assert.NotContains(t, string(r.Raw), secret)
		}
		assert.Contains(t, string(r.Raw), "sk_test_[redacted]")
	}
}
