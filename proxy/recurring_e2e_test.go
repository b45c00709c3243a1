package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// Hole: subscriptions.create, subscriptions.update with immediate invoicing,
// customer balances and Payment Links move money at once or later when a policy
// names them, and were forwarded unmetered. Each is metered for what bounds it,
// or refused with a message that says why.
func TestMoneyThatMovesLaterIsMeteredOrRefused(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("150.00", everything))
	monthly := e.Fake.AddRecurringPrice(3000, "usd")
	cus := e.Fake.AddCustomer("usd")
	committed := func() int64 {
		c, h := usage(t, e, key.ID)
		assert.Zero(t, h, "these move their money at once or are counted in full")
		return c
	}
	refused := func(r reply, words string) {
		t.Helper()
		AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
		msg, _ := r.Body["error"].(map[string]any)["message"].(string)
		assert.Contains(t, msg, words)
	}

	r := e.Post(t, "/v1/subscriptions", tok, "sub", form("customer", cus, "items[0][price]", monthly, "items[0][quantity]", "2"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.EqualValues(t, 6000, committed(), "the first period: 2 × 30.00, looked up at Stripe")
	r = e.Post(t, "/v1/subscriptions", tok, "sub-big", form("customer", cus, "items[0][price]", monthly, "items[0][quantity]", "4"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")

	refused(e.Post(t, "/v1/subscriptions/sub_1", tok, "upd", form("items[0][id]", "si_1", "items[0][quantity]", "9",
		"proration_behavior", "always_invoice")), "prorations")
	refused(e.Post(t, "/v1/subscription_schedules", tok, "sched", form("customer", cus, "phases[0][items][0][price]", monthly)),
		"schedule")

	r = e.Post(t, "/v1/customers/"+cus, tok, "bal-1", form("balance", "2000"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.EqualValues(t, 8000, committed(), "a balance is added to the next invoice")
	r = e.Post(t, "/v1/customers/"+cus, tok, "bal-2", form("balance", "2500"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.EqualValues(t, 8500, committed(), "only the rise over the current balance")
	r = e.Post(t, "/v1/customers/"+cus, tok, "bal-3", form("balance", "-100"))
	require.Equal(t, http.StatusOK, r.Status, "a credit moves no money: %s", r.Raw)
	assert.EqualValues(t, 8500, committed())
	refused(e.Post(t, "/v1/customers", tok, "cus-new", form("balance", "5000")), "currency")
	r = e.Post(t, "/v1/customers/"+cus+"/balance_transactions", tok, "txn", form("amount", "700", "currency", "usd"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.EqualValues(t, 9200, committed())

	link := form("line_items[0][price_data][currency]", "usd", "line_items[0][price_data][product]", "prod_1",
		"line_items[0][price_data][unit_amount]", "1000", "line_items[0][quantity]", "1")
	refused(e.Post(t, "/v1/payment_links", tok, "link-open", link), "restrictions[completed_sessions][limit]")
	link.Set("restrictions[completed_sessions][limit]", "3")
	r = e.Post(t, "/v1/payment_links", tok, "link", link)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.EqualValues(t, 12200, committed(), "paid at most 3 times: 3 × 10.00")
}

// Stripe draws a customer's pending invoice items into a new subscription's
// first invoice, under every API version. Items made outside keybrake were
// never metered: subscriptions.create is refused while the customer has any,
// and goes through (metered for its own items) once they are gone.
func TestSubscriptionCreateIsRefusedWhileTheCustomerHasPendingItems(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	ctx := context.Background()
	tok, key := e.MustKey(t, Policy("150.00", everything))
	monthly := e.Fake.AddRecurringPrice(3000, "usd")
	cus := e.Fake.AddCustomer("usd")
	item := e.Fake.AddPendingItem("usd", cus, 90000)
	sc := e.Client(tok, 0)
	params := func() *stripe.SubscriptionCreateParams {
		return &stripe.SubscriptionCreateParams{Customer: stripe.String(cus),
			Items: []*stripe.SubscriptionCreateItemParams{{Price: stripe.String(monthly), Quantity: stripe.Int64(1)}}}
	}
	created := func() int {
		return e.Fake.CountWhere(func(r proxytest.Request) bool {
			return r.Method == http.MethodPost && r.Path == "/v1/subscriptions"
		})
	}

	_, err := sc.V1Subscriptions.Create(ctx, params())
	var serr *stripe.Error
	require.ErrorAs(t, err, &serr)
	assert.Equal(t, http.StatusForbidden, serr.HTTPStatusCode)
	assert.Equal(t, "amount_unknown", string(serr.Code))
	assert.Contains(t, serr.Msg, "pending invoice items")
	assert.Zero(t, created(), "nothing reached Stripe")
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c+h)

	_, err = sc.V1InvoiceItems.Delete(ctx, item, nil)
	require.NoError(t, err)
	sub, err := sc.V1Subscriptions.Create(ctx, params())
	require.NoError(t, err)
	assert.NotEmpty(t, sub.ID)
	assert.Equal(t, 1, created())
	c, _ = usage(t, e, key.ID)
	assert.EqualValues(t, 3000, c, "one period of its own item")
}
