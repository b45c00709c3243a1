package proxy_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Holes found by the second adversarial review: requests that make Stripe
// charge at once, or later without another request, an amount keybrake never
// metered. The fake Stripe behaves as Stripe documents each case; the harness's
// cleanup checks that it never moved more than the caps allow.

// refusedUnknown asserts an amount_unknown refusal whose message says why.
func refusedUnknown(t *testing.T, r reply, words string) {
	t.Helper()
	AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
	assert.Contains(t, r.ErrMessage(), words)
}

// Hole: POST /v1/subscriptions/{id}/resume defaults to billing_cycle_anchor=now
// (Stripe's API reference), which starts a new billing period at once and
// charges it. Only an explicit billing_cycle_anchor=now was refused, so a plain
// resume of a paused 400.00 subscription was forwarded unmetered past a 50.00
// cap.
func TestSubscriptionResumeChargesAPeriodAtOnce(t *testing.T) {
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("50.00", everything))
	monthly := e.Fake.AddRecurringPrice(40000, "usd")
	sub, _ := e.Fake.AddSubscription(e.Fake.AddCustomer("usd"), monthly, 1, "paused")

	refusedUnknown(t, e.Post(t, "/v1/subscriptions/"+sub+"/resume", tok, "resume", nil), "billing_cycle_anchor=unchanged")
	assert.Zero(t, postsTo(e, "/v1/subscriptions/"+sub+"/resume"), "the resume never reached Stripe")

	// Resuming on the old cycle bills the rest of the period at the next renewal,
	// which keybrake never sees (a documented limit), and charges nothing now.
	r := e.Post(t, "/v1/subscriptions/"+sub+"/resume", tok, "resume-unchanged", form("billing_cycle_anchor", "unchanged"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c+h)
	assert.Zero(t, e.Fake.TotalMoved("usd"))
}

// Hole: changing a subscription item to a price with another billing interval
// (monthly to yearly), or away from a free price, starts the new billing period
// at once and charges it in full (Stripe's "How does Stripe handle subscription
// plan changes"), whatever proration_behavior says. The update was classified as
// moving no money.
func TestSubscriptionPriceChangeChargesAtOnce(t *testing.T) {
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("50.00", everything))
	monthly := e.Fake.AddRecurringPrice(1000, "usd")
	yearly := e.Fake.AddRecurringPriceEvery(120000, "usd", "year")
	sub, item := e.Fake.AddSubscription(e.Fake.AddCustomer("usd"), monthly, 1, "active")

	for name, f := range map[string]map[string]string{
		"subscription": {"items[0][id]": item, "items[0][price]": yearly, "proration_behavior": "none"},
		"price_data": {"items[0][id]": item, "items[0][price_data][currency]": "usd", "items[0][price_data][product]": "prod_1",
			"items[0][price_data][recurring][interval]": "year", "items[0][price_data][unit_amount]": "120000"},
	} {
		body := form()
		for k, v := range f {
			body.Set(k, v)
		}
		refusedUnknown(t, e.Post(t, "/v1/subscriptions/"+sub, tok, "upd-"+name, body), "new price")
	}
	refusedUnknown(t, e.Post(t, "/v1/subscription_items/"+item, tok, "item", form("price", yearly)), "new price")
	assert.Zero(t, e.Fake.TotalMoved("usd"), "no new period was charged")

	// A quantity change waits for the next renewal (prorations), as before.
	r := e.Post(t, "/v1/subscriptions/"+sub, tok, "qty", form("items[0][id]", item, "items[0][quantity]", "2"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
}
