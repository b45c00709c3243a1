package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
)

// assertUpstreamAuthRefusal checks keybrake's answer to Stripe refusing its
// secret: a 502 api_error with code, never a 401, that no SDK retries and that
// carries nothing of Stripe's body (stripe-mock and the fake echo the key).
func assertUpstreamAuthRefusal(t *testing.T, r reply, code string) {
	t.Helper()
	AssertRefusal(t, r, http.StatusBadGateway, code)
	assert.Equal(t, "api_error", r.ErrType())
	assert.Equal(t, "false", r.Header.Get("Stripe-Should-Retry"))
	assert.NotContains(t, string(r.Raw), upstreamSecret)
	assert.NotContains(t, string(r.Raw), "Invalid API Key", "Stripe's message is not passed on")
	assert.NotContains(t, string(r.Raw), "permissions", "Stripe's message is not passed on")
}

// assertNothingHeld checks that the key has nothing committed or held today and
// that no hold or record is left: the attempts were undone.
func assertNothingHeld(t *testing.T, e *env, keyID string) {
	t.Helper()
	c, h := usage(t, e, keyID)
	assert.Zero(t, c, "committed")
	assert.Zero(t, h, "held")
	holds, _, err := e.Store.ListHolds(context.Background(), "", 10, "")
	require.NoError(t, err)
	assert.Empty(t, holds, "the claims are forgotten: a retry starts afresh")
}

// unknownHolds lists the holds whose outcome is unknown.
func unknownHolds(t *testing.T, e *env) []vault.Hold {
	t.Helper()
	holds, _, err := e.Store.ListHolds(context.Background(), vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	return holds
}

// Stripe answers 401 to keybrake's secret (the operator rolled it at Stripe):
// nothing executed, so nothing is held, stored or replayed, the caller learns
// that keybrake's secret is at fault without seeing Stripe's message, and a
// retry with the same idempotency key after the operator registers the new
// secret charges exactly once.
func TestRolledUpstreamSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	sc := e.Client(tok, 2) // the SDK's default retries: it must not retry this
	const rolled = "sk_test_rolledsecret"
	e.Fake.SetSecret(rolled)

	_, err := sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "order-1"))
	se := StripeErr(t, err)
	assert.Equal(t, http.StatusBadGateway, se.HTTPStatusCode)
	assert.Equal(t, stripe.ErrorTypeAPI, se.Type, "not an authentication error of the caller's key")
	assert.Equal(t, stripe.ErrorCode("upstream_authentication_failed"), se.Code)
	assert.NotContains(t, se.Msg, upstreamSecret)
	assert.Equal(t, 1, e.Fake.Count(), "the SDK did not retry")
	assert.Empty(t, e.Fake.Charges())
	assertNothingHeld(t, e, key.ID)
	assert.Equal(t, 1.0, MetricValue(t, e.Metrics, "keybrake_upstream_auth_failures_total"))
	assert.Contains(t, e.Logs.String(), `"level":"ERROR","msg":"Stripe rejected keybrake's upstream secret`)

	// Retried before the fix: forwarded again (nothing was stored), refused again.
	r := e.Post(t, "/v1/charges", tok, "order-1", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	assertUpstreamAuthRefusal(t, r, "upstream_authentication_failed")
	assert.Empty(t, r.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, 2, e.Fake.Count())

	// A read is refused the same way: Stripe's body never reaches the caller.
	r = e.MustSend(t, http.MethodGet, "/v1/charges", tok, nil, "")
	assertUpstreamAuthRefusal(t, r, "upstream_authentication_failed")
	assert.Equal(t, 3.0, MetricValue(t, e.Metrics, "keybrake_upstream_auth_failures_total"))

	_, _, err = e.Store.PutUpstream(ctx, "operator", "default", "stripe", rolled)
	require.NoError(t, err)
	ch, err := sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "order-1"))
	require.NoError(t, err)
	again, err := sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "order-1"))
	require.NoError(t, err)
	assert.Equal(t, ch.ID, again.ID)
	assert.Equal(t, "true", again.LastResponse.Header.Get("Idempotent-Replayed"))
	require.Len(t, e.Fake.Charges(), 1, "charged exactly once")
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 6000, c)
	assert.Zero(t, h)
}

// A 403 is Stripe refusing keybrake's secret a permission (a restricted key
// without it, or no access to the connected account): nothing executed either.
// It is answered like a 401, with its own code.
func TestRestrictedUpstreamSecretLacksPermission(t *testing.T) {
	t.Parallel()
	const restricted = "rk_test_readonly7319"
	e := MustEnv(t, withUpstreamURL("", restricted))
	e.Fake.AddRestrictedKey(restricted, func(r proxytest.Request) bool {
		return r.Method == http.MethodGet && !strings.HasPrefix(r.Path, "/v1/payment_intents/")
	})
	tok, key := e.MustKey(t, Policy("99.00"))

	r := e.Post(t, "/v1/charges", tok, "c1", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	assertUpstreamAuthRefusal(t, r, "upstream_permission_denied")
	assert.NotContains(t, string(r.Raw), restricted[len(restricted)-4:], "not even the key's last characters")
	assert.Empty(t, e.Fake.Charges())

	// A lookup refused for permission says so, instead of amount_unknown.
	pi := e.Fake.AddPaymentIntent(7000, "usd", "")
	r = e.Post(t, "/v1/payment_intents/"+pi+"/confirm", tok, "c2", form("payment_method", "pm_card_visa"))
	assertUpstreamAuthRefusal(t, r, "upstream_permission_denied")
	assert.Zero(t, e.Fake.CountWhere(func(r proxytest.Request) bool { return r.Method == http.MethodPost && r.Path != "/v1/charges" }),
		"the confirm was not forwarded")

	r = e.MustSend(t, http.MethodGet, "/v1/charges", tok, nil, "")
	assert.Equal(t, http.StatusOK, r.Status, "what the key may do passes: %s", r.Raw)
	assert.Equal(t, 2.0, MetricValue(t, e.Metrics, "keybrake_upstream_auth_failures_total"))
	assertNothingHeld(t, e, key.ID)
}

// A lookup answered 401 says that keybrake's secret is wrong, not amount_unknown.
func TestLookupWithRolledSecret(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	pi := e.Fake.AddPaymentIntent(7000, "usd", "")
	e.Fake.SetSecret("sk_test_rolledsecret")
	r := e.Post(t, "/v1/payment_intents/"+pi+"/confirm", tok, "c1", form("payment_method", "pm_card_visa"))
	assertUpstreamAuthRefusal(t, r, "upstream_authentication_failed")
	assert.Equal(t, 1, e.Fake.Count(), "only the lookup reached Stripe")
	assert.Equal(t, 1.0, MetricValue(t, e.Metrics, "keybrake_upstream_auth_failures_total"))
}

// An attempt that resumes an unknown outcome and is refused for keybrake's
// secret settles nothing: the earlier attempt may have moved the money, so its
// hold stays unknown, and the caller is told to retry with the same key.
func TestRolledSecretOnAResumedRequestKeepsTheHold(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	charge := form("amount", "6000", "currency", "usd", "source", "tok_visa")
	e.Fake.FailNext(proxytest.FailAfterCreate500, 1)
	r := e.Post(t, "/v1/charges", tok, "k1", charge)
	require.Equal(t, http.StatusInternalServerError, r.Status)

	e.Fake.SetSecret("sk_test_rolledsecret")
	r = e.Post(t, "/v1/charges", tok, "k1", charge)
	assertUpstreamAuthRefusal(t, r, "upstream_authentication_failed")
	assert.Contains(t, r.ErrMessage(), "still unknown")
	holds := unknownHolds(t, e)
	require.Len(t, holds, 1, "the first attempt's outcome is still unknown")
	assert.Equal(t, key.ID, holds[0].KeyID)
	assert.EqualValues(t, 6000, holds[0].Amount)
	assert.Len(t, e.Fake.Charges(), 1)
}

// stripe-mock answers a key it does not accept with a 401 whose message repeats
// the key in full: behind keybrake, the vault-key holder never sees it.
func TestStripeMockRejectedSecretNeverReachesTheCaller(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stripe-mock: skipped with -short")
	}
	const wrong = "sk_test_not_accepted" // stripe-mock accepts only keys of three parts
	mock := proxytest.StripeMock(t)
	direct, err := http.NewRequest(http.MethodGet, mock.String()+"/v1/charges", nil)
	require.NoError(t, err)
	direct.Header.Set("Authorization", "Bearer "+wrong)
	d := MustDo(t, http.DefaultClient, direct)
	require.Equal(t, http.StatusUnauthorized, d.Status)
	require.Contains(t, string(d.Raw), wrong, "stripe-mock echoes the key it rejects")

	e := MustEnv(t, withUpstreamURL(mock.String(), wrong))
	tok, key := e.MustKey(t, Policy("99.00"))
	_, err = e.Client(tok, 0).V1Charges.Create(context.Background(), chargeParams(6000, "usd", "m1"))
	se := StripeErr(t, err)
	assert.Equal(t, http.StatusBadGateway, se.HTTPStatusCode)
	assert.Equal(t, stripe.ErrorCode("upstream_authentication_failed"), se.Code)
	assert.NotContains(t, string(se.LastResponse.RawJSON), wrong)
	r := e.MustSend(t, http.MethodGet, "/v1/charges", tok, nil, "")
	assertUpstreamAuthRefusal(t, r, "upstream_authentication_failed")
	assert.NotContains(t, string(r.Raw), wrong)
	assert.NotContains(t, e.Logs.String(), wrong, "nor do the logs")
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c+h)
}
