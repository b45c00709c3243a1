package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// The secret is rolled at Stripe while keybrake serves: callers get a keybrake
// error that is not Stripe's and not a wrong-key 401, the operator sees it in
// the log and on /metrics, registers the new secret through the admin API, and
// the caller's retry with the same idempotency key charges once.
func TestEndToEndRolledUpstreamSecret(t *testing.T) {
	t.Parallel()
	const oldSecret, newSecret = "sk_test_e2eoriginal", "sk_test_e2erolled"
	fake := proxytest.NewFakeStripe(t, oldSecret)
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: oldSecret})
	ctx := context.Background()
	adminToken := strings.TrimSpace(MustRunCommand(t, env{}, "token", "--data-dir", dataDir))
	var minted struct {
		Token   string `json:"token"`
		BaseURL string `json:"base_url"`
	}
	require.Equal(t, http.StatusCreated, adminDo(t, http.MethodPost, m.AdminURL()+"/api/v1/keys", adminToken, map[string]any{
		"name": "rolled", "policy": map[string]any{"vendor": "stripe", "currency": "usd", "daily_cap": "50.00",
			"expires_at": time.Now().Add(72 * time.Hour).UTC().Format(time.RFC3339)},
	}, &minted))
	sc := MustStripeClient(t, minted.BaseURL, minted.Token)
	params := func() *stripe.ChargeCreateParams {
		p := &stripe.ChargeCreateParams{Amount: stripe.Int64(2500), Currency: stripe.String("usd"),
			Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")}}
		p.SetIdempotencyKey("order-7")
		return p
	}

	fake.SetSecret(newSecret)
	_, err := sc.V1Charges.Create(ctx, params())
	var se *stripe.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, http.StatusBadGateway, se.HTTPStatusCode)
	assert.Equal(t, stripe.ErrorCode("upstream_authentication_failed"), se.Code)
	assert.NotContains(t, string(se.LastResponse.RawJSON), oldSecret)
	assert.Contains(t, m.stderr.String(), "Stripe rejected keybrake's upstream secret")
	assert.NotContains(t, m.stderr.String(), oldSecret)
	status, body := MustGet(t, m.AdminURL()+"/metrics", "")
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, strings.Split(string(body), "\n"), "keybrake_upstream_auth_failures_total 1")

	require.Equal(t, http.StatusOK, adminDo(t, http.MethodPost, m.AdminURL()+"/api/v1/upstreams", adminToken,
		map[string]string{"name": "default", "vendor": "stripe", "secret": newSecret}, nil))
	ch, err := sc.V1Charges.Create(ctx, params())
	require.NoError(t, err)
	again, err := sc.V1Charges.Create(ctx, params())
	require.NoError(t, err)
	assert.Equal(t, ch.ID, again.ID)
	assert.Len(t, fake.Charges(), 1, "charged once")
}
