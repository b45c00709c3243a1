package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// Money that recurs, through the real program: a subscription's trial end moved
// ahead, invoice items added to a subscription that pays a connected account
// (stripe-go, as a caller would send them), and a Payment Link with an inline
// recurring price through the MCP endpoint's stripe_request, which runs the
// same pipeline in-process. Each was forwarded before; none reaches Stripe now.
func TestMoneyThatRecursThroughServe(t *testing.T) {
	t.Parallel()
	s := MustMCPServer(t)
	id, token := s.MustMint(t, "recurring", map[string]any{"period_cap": "100.00", "operations": []string{"*"}})
	ctx := context.Background()
	monthly := s.fake.AddRecurringPrice(1000, "usd")
	once := s.fake.AddPrice(1000, "usd")
	sub, item := s.fake.AddSubscription(s.fake.AddCustomer("usd"), monthly, 1, "active")
	paying, _ := s.fake.AddSubscription(s.fake.AddCustomer("usd"), monthly, 1, "active")
	s.fake.SetSubscriptionDestination(paying, "acct_other")
	sc := MustStripeClient(t, s.PublicURL(), token)

	refused := func(err error, code string) {
		t.Helper()
		var serr *stripe.Error
		require.ErrorAs(t, err, &serr)
		assert.Equal(t, code, string(serr.Code), serr.Msg)
	}
	_, err := sc.V1Subscriptions.Update(ctx, sub, &stripe.SubscriptionUpdateParams{
		TrialEnd: stripe.Int64(time.Now().Add(time.Minute).Unix()),
		Items:    []*stripe.SubscriptionUpdateItemParams{{ID: stripe.String(item), Quantity: stripe.Int64(1000)}},
	})
	refused(err, "amount_unknown")
	_, err = sc.V1Subscriptions.Update(ctx, paying, &stripe.SubscriptionUpdateParams{
		AddInvoiceItems: []*stripe.SubscriptionUpdateAddInvoiceItemParams{{Price: stripe.String(once), Quantity: stripe.Int64(1)}},
	})
	refused(err, "account_not_allowed")

	c := MustMCP(t, s.ProxyURL(), token)
	res := MustCall(t, c, "stripe_request", map[string]any{"method": "POST", "path": "/v1/payment_links",
		"idempotency_key": "link-daily", "params": map[string]any{
			"line_items": []any{map[string]any{"quantity": 1, "price_data": map[string]any{"currency": "usd", "product": "prod_1",
				"unit_amount": 1000, "recurring": map[string]any{"interval": "day"}}}},
			"restrictions": map[string]any{"completed_sessions": map[string]any{"limit": 5}}}})
	require.True(t, res.IsError, text(res))
	assert.Equal(t, "amount_unknown", structured(t, res)["code"], text(res))

	assert.Zero(t, s.fake.CountWhere(func(r proxytest.Request) bool { return r.Method == http.MethodPost }), "no write reached Stripe")
	assert.Zero(t, s.fake.TotalMoved("usd"))
	var usage usageAnswer
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, s.AdminURL()+"/api/v1/keys/"+id+"/usage", s.admin, nil, &usage))
	require.NotNil(t, usage.Period)
	assertMoney(t, "0", usage.Period.Committed)
	assertMoney(t, "0", usage.Period.Held)
}
