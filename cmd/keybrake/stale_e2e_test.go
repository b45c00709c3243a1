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

// TestServeRefreshesStaleExposure: serve runs the stale-exposure refresher. A
// Checkout Session created through keybrake expires at Stripe with no request
// through keybrake; once its exposure is older than --exposure-refresh-after,
// the refresher looks it up and frees the budget, with no operator.
func TestServeRefreshesStaleExposure(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_stale")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret}, "--exposure-refresh-after", "1s")
	token := strings.TrimSpace(MustRunCommand(t, env{}, "token", "--data-dir", dataDir))
	admin := m.AdminURL() + "/api/v1"
	var key struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	require.Equal(t, http.StatusCreated, adminDo(t, http.MethodPost, admin+"/keys", token, map[string]any{
		"name": "checkout-agent", "policy": map[string]any{"vendor": "stripe", "currency": "usd", "daily_cap": "80.00",
			"expires_at": time.Now().Add(72 * time.Hour).UTC().Format(time.RFC3339)},
	}, &key))
	cs, err := MustStripeClient(t, m.PublicURL(), key.Token).V1CheckoutSessions.Create(context.Background(), &stripe.CheckoutSessionCreateParams{
		Mode: stripe.String("payment"), SuccessURL: stripe.String("https://example.test/ok"),
		LineItems: []*stripe.CheckoutSessionCreateLineItemParams{{Quantity: stripe.Int64(1),
			PriceData: &stripe.CheckoutSessionCreateLineItemPriceDataParams{Currency: stripe.String("usd"), UnitAmount: stripe.Int64(4000),
				ProductData: &stripe.CheckoutSessionCreateLineItemPriceDataProductDataParams{Name: stripe.String("Order 42")}}}},
	})
	require.NoError(t, err)
	require.True(t, fake.ExpireSession(cs.ID), "Stripe expires it by itself")

	var list struct {
		Exposures []struct {
			ObjectID string `json:"object_id"`
		} `json:"exposures"`
	}
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, admin+"/keys/"+key.ID+"/exposures", token, nil, &list))
	lookedUp := func() bool {
		return fake.CountWhere(func(r proxytest.Request) bool {
			return r.Method == http.MethodGet && r.Path == "/v1/checkout/sessions/"+cs.ID
		}) > 0
	}
	if !lookedUp() {
		require.Len(t, list.Exposures, 1, "held until Stripe's word arrives")
	}
	require.Eventually(t, func() bool {
		require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, admin+"/keys/"+key.ID+"/exposures", token, nil, &list))
		return len(list.Exposures) == 0
	}, 20*time.Second, 50*time.Millisecond, "the refresher frees the expired session's exposure")
	assert.True(t, lookedUp(), "by looking it up at Stripe")
}
