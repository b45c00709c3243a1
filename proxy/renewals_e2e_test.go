package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
)

// renewalEnv is a key allowed everything with a daily cap, a customer, and a
// monthly price of 30.00.
type renewalEnv struct {
	e       *env
	key     vault.Key
	sc      *stripe.Client
	monthly string
	cus     string
	url     string // the events endpoint
}

func newRenewalEnv(t *testing.T, daily string, mods ...func(*policy.Policy)) *renewalEnv {
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy(daily, append([]func(*policy.Policy){everything}, mods...)...))
	return &renewalEnv{e: e, key: key, sc: e.Client(tok, 0), monthly: e.Fake.AddRecurringPrice(3000, "usd"), cus: e.Fake.AddCustomer("usd"),
		url: e.MustEventsURL(t)}
}

// subscribe creates, through keybrake with stripe-go, a subscription of one
// monthly price.
func (r *renewalEnv) subscribe(t *testing.T) string {
	t.Helper()
	sub, err := r.sc.V1Subscriptions.Create(context.Background(), &stripe.SubscriptionCreateParams{Customer: stripe.String(r.cus),
		Items: []*stripe.SubscriptionCreateItemParams{{Price: stripe.String(r.monthly), Quantity: stripe.Int64(1)}}})
	require.NoError(t, err)
	return sub.ID
}

// send delivers ev, signed as Stripe signs it, to the events endpoint.
func (r *renewalEnv) send(t *testing.T, ev proxytest.Event) {
	t.Helper()
	status, body := deliver(t, r.e, r.url, ev)
	require.Equal(t, http.StatusOK, status, body)
}

func (r *renewalEnv) invoice(t *testing.T, id string) proxytest.Invoice {
	t.Helper()
	for _, inv := range r.e.Fake.Invoices() {
		if inv.ID == id {
			return inv
		}
	}
	t.Fatalf("no invoice %s", id)
	return proxytest.Invoice{}
}

// A subscription created through a key renews under the cap: its invoice's
// amount_due is held from invoice.created, committed on invoice.paid, once
// however often and in whatever order the events come.
func TestRenewalUnderTheCapIsHeldThenCommitted(t *testing.T) {
	t.Parallel()
	r := newRenewalEnv(t, "100.00")
	sub := r.subscribe(t)
	c, h := usage(t, r.e, r.key.ID)
	require.EqualValues(t, 3000, c, "the first period, at creation")
	require.Zero(t, h)

	inv := r.e.Fake.RenewSubscription(sub)
	created := r.e.Fake.Event("invoice.created", inv)
	r.send(t, created)
	r.send(t, created)
	c, h = usage(t, r.e, r.key.ID)
	assert.EqualValues(t, 3000, c)
	assert.EqualValues(t, 3000, h, "the renewal held once")

	require.Equal(t, []string{inv}, r.e.Fake.AdvanceInvoices(), "Stripe collects it an hour later")
	r.send(t, r.e.Fake.Event("invoice.paid", inv))
	r.send(t, created) // late and again
	c, h = usage(t, r.e, r.key.ID)
	assert.EqualValues(t, 6000, c, "invoice.paid commits it")
	assert.Zero(t, h)
	n, err := r.e.Proxy.SendPauses(context.Background())
	require.NoError(t, err)
	assert.Zero(t, n)
}

// A renewal over the cap is paused at Stripe (auto_advance=false) and never
// collected; nothing is held; renewal.paused is emitted.
func TestRenewalOverTheCapIsPausedAndNeverCollected(t *testing.T) {
	t.Parallel()
	r := newRenewalEnv(t, "50.00")
	_, _, err := r.e.Store.CreateWebhook(context.Background(), "tester", vault.WebhookInput{URL: "https://hooks.example.com/k",
		Events: []string{vault.EventRenewalPaused}})
	require.NoError(t, err)
	sub := r.subscribe(t)
	inv := r.e.Fake.RenewSubscription(sub)
	r.send(t, r.e.Fake.Event("invoice.created", inv))
	c, h := usage(t, r.e, r.key.ID)
	assert.EqualValues(t, 3000, c)
	assert.Zero(t, h, "nothing held")
	jobs, err := r.e.Store.ClaimDeliveries(context.Background(), 10, 0)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	assert.Equal(t, vault.EventRenewalPaused, jobs[0].EventType)

	pauses := func() int {
		return r.e.Fake.CountWhere(func(q proxytest.Request) bool {
			return q.Method == http.MethodPost && q.Path == "/v1/invoices/"+inv
		})
	}
	r.e.Fake.FailNext(proxytest.FailBefore500, 1)
	n, err := r.e.Proxy.SendPauses(context.Background())
	require.NoError(t, err)
	assert.Zero(t, n, "Stripe failed: kept for a retry")
	assert.True(t, r.invoice(t, inv).AutoAdvance)
	due, err := r.e.Store.DuePauses(context.Background(), 10)
	require.NoError(t, err)
	assert.Empty(t, due, "not before its retry time")

	// The retry, as the worker makes it once the time comes.
	require.NoError(t, r.e.Store.PauseFailed(context.Background(), r.key.Upstream, inv, time.Time{}, "test: due now"))
	n, err = r.e.Proxy.SendPauses(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.False(t, r.invoice(t, inv).AutoAdvance, "auto_advance=false reached Stripe")
	assert.Empty(t, r.e.Fake.AdvanceInvoices(), "a paused draft is never collected")
	assert.Equal(t, "draft", r.invoice(t, inv).Status)
	sent := pauses()
	n, err = r.e.Proxy.SendPauses(context.Background())
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Equal(t, sent, pauses(), "sent once it was accepted")
}

// Under renewals "count" keybrake meters a renewal over the cap and never
// touches the invoice; voided, it is released.
func TestCountedRenewalNeverTouchesTheInvoiceAndVoidReleases(t *testing.T) {
	t.Parallel()
	r := newRenewalEnv(t, "50.00", func(p *policy.Policy) { p.Renewals = policy.RenewalsCount })
	sub := r.subscribe(t)
	inv := r.e.Fake.RenewSubscription(sub)
	r.send(t, r.e.Fake.Event("invoice.created", inv))
	c, h := usage(t, r.e, r.key.ID)
	assert.EqualValues(t, 3000, c)
	assert.EqualValues(t, 3000, h, "held over the cap")
	n, err := r.e.Proxy.SendPauses(context.Background())
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Zero(t, r.e.Fake.CountWhere(func(q proxytest.Request) bool { return q.Path == "/v1/invoices/"+inv }),
		"count never touches the invoice")

	_, err = r.sc.V1Invoices.FinalizeInvoice(context.Background(), inv, nil)
	require.NoError(t, err)
	_, err = r.sc.V1Invoices.VoidInvoice(context.Background(), inv, nil)
	require.NoError(t, err)
	r.send(t, r.e.Fake.Event("invoice.voided", inv))
	c, h = usage(t, r.e, r.key.ID)
	assert.EqualValues(t, 3000, c)
	assert.Zero(t, h, "invoice.voided releases it")
}

// Out of order: invoice.paid before its invoice.created decides the renewal
// and commits it at once; the late invoice.created changes nothing.
func TestRenewalPaidBeforeCreatedAppliesOnce(t *testing.T) {
	t.Parallel()
	r := newRenewalEnv(t, "100.00")
	sub := r.subscribe(t)
	inv := r.e.Fake.RenewSubscription(sub)
	created := r.e.Fake.Event("invoice.created", inv)
	r.e.Fake.AdvanceInvoices()
	paid := r.e.Fake.Event("invoice.paid", inv)
	r.send(t, paid)
	r.send(t, created)
	r.send(t, paid)
	c, h := usage(t, r.e, r.key.ID)
	assert.EqualValues(t, 6000, c, "the first period and the renewal, once")
	assert.Zero(t, h)
}

// A subscription that a Checkout Session created through the key started is
// linked from checkout.session.completed, and its renewal counted.
func TestSubscriptionStartedByTheKeysSessionIsLinked(t *testing.T) {
	t.Parallel()
	r := newRenewalEnv(t, "100.00")
	cs, err := r.sc.V1CheckoutSessions.Create(context.Background(), &stripe.CheckoutSessionCreateParams{
		Mode: stripe.String("payment"), SuccessURL: stripe.String("https://example.com/ok"),
		LineItems: []*stripe.CheckoutSessionCreateLineItemParams{{Quantity: stripe.Int64(1),
			PriceData: &stripe.CheckoutSessionCreateLineItemPriceDataParams{Currency: stripe.String("usd"),
				Product: stripe.String("prod_1"), UnitAmount: stripe.Int64(1000)}}}})
	require.NoError(t, err)
	// The customer completes it in a browser; Stripe starts the subscription
	// and says so in the session's event.
	sub, _ := r.e.Fake.AddSubscription(r.cus, r.monthly, 1, "active")
	r.send(t, r.e.Fake.EventOf("checkout.session.completed", map[string]any{
		"id": cs.ID, "object": "checkout.session", "mode": "subscription", "status": "complete",
		"payment_status": "paid", "currency": "usd", "amount_total": 1000, "subscription": sub}))
	link, err := r.e.Store.GetLink(context.Background(), r.key.Upstream, sub)
	require.NoError(t, err)
	assert.Equal(t, r.key.ID, link.KeyID)
	assert.Equal(t, cs.ID, link.Via)

	_, before := usage(t, r.e, r.key.ID)
	inv := r.e.Fake.RenewSubscription(sub)
	r.send(t, r.e.Fake.Event("invoice.created", inv))
	_, h := usage(t, r.e, r.key.ID)
	assert.EqualValues(t, before+3000, h, "its renewal is the key's")

	other, _ := r.e.Fake.AddSubscription(r.cus, r.monthly, 1, "active")
	r.send(t, r.e.Fake.Event("invoice.created", r.e.Fake.RenewSubscription(other)))
	_, h2 := usage(t, r.e, r.key.ID)
	assert.Equal(t, h, h2, "a subscription started outside keybrake is nobody's")
}
