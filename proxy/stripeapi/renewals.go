package stripeapi

// What Stripe's objects show about the money a key's request started
// indirectly: the invoices a subscription issues, the subscription a Checkout
// Session started (see docs/renewals.md).

// SubscriptionInvoice is what an invoice says about the subscription that
// issued it.
type SubscriptionInvoice struct {
	ID           string
	Subscription string
	// BillingReason is why Stripe made it: subscription_create (the first
	// period), subscription_cycle (a renewal), subscription_update, …
	BillingReason string
	Customer      string
	Currency      string
	AmountDue     int64
	// Status is draft, open, paid, uncollectible or void.
	Status string
}

// Renews reports whether the invoice is a renewal keybrake meters: a new
// period (subscription_cycle) or a change that invoices (subscription_update).
func (si SubscriptionInvoice) Renews() bool {
	return si.BillingReason == "subscription_cycle" || si.BillingReason == "subscription_update"
}

// ReadSubscriptionInvoice reads an invoice issued by a subscription: ok false
// for anything else, or an invoice without a readable amount_due. The
// subscription is under parent.subscription_details (API 2025-03-31.basil
// and later) or, in older versions, the top-level subscription.
func ReadSubscriptionInvoice(o Object) (SubscriptionInvoice, bool) {
	if o.Get("object") != "invoice" || !IsID(o.Get("id")) {
		return SubscriptionInvoice{}, false
	}
	sub := o.Object("parent").Object("subscription_details").Get("subscription")
	if sub == "" {
		sub = o.Get("subscription")
	}
	due, ok := o.int("amount_due")
	if !IsID(sub) || !ok || o.Get("currency") == "" {
		return SubscriptionInvoice{}, false
	}
	return SubscriptionInvoice{ID: o.Get("id"), Subscription: sub, BillingReason: o.Get("billing_reason"),
		Customer: o.Get("customer"), Currency: o.Get("currency"), AmountDue: due, Status: o.Get("status")}, true
}

// StartedSubscription is the subscription a Checkout Session started, and
// the Payment Link the session came from ("" for none): ok false when the
// object is no session or started none.
func StartedSubscription(o Object) (session, subscription, paymentLink string, ok bool) {
	if o.Get("object") != "checkout.session" {
		return "", "", "", false
	}
	sub := o.Get("subscription")
	if sub == "" {
		sub = o.Object("subscription").Get("id") // expanded
	}
	if !IsID(o.Get("id")) || !IsID(sub) {
		return "", "", "", false
	}
	link := o.Get("payment_link")
	if !IsID(link) {
		link = ""
	}
	return o.Get("id"), sub, link, true
}
