package proxytest

import (
	"testing"

	"github.com/keybrake/keybrake/proxy/fakestripe"
)

// The fake Stripe lives in proxy/fakestripe, where `keybrake serve --demo` can
// use it too; tests reach it through these names.
type (
	FakeStripe       = fakestripe.FakeStripe
	FailMode         = fakestripe.FailMode
	Request          = fakestripe.Request
	Charge           = fakestripe.Charge
	Transfer         = fakestripe.Transfer
	Account          = fakestripe.Account
	PaymentIntent    = fakestripe.PaymentIntent
	PaymentLink      = fakestripe.PaymentLink
	Refund           = fakestripe.Refund
	Subscription     = fakestripe.Subscription
	SubscriptionItem = fakestripe.SubscriptionItem
	CheckoutSession  = fakestripe.CheckoutSession
	Invoice          = fakestripe.Invoice
	InvoiceItem      = fakestripe.InvoiceItem
	Event            = fakestripe.Event
)

// The fake's failure modes (see fakestripe.FailMode).
const (
	FailAfterCreate500           = fakestripe.FailAfterCreate500
	FailAfterCreateReset         = fakestripe.FailAfterCreateReset
	FailAfterCreateDelay         = fakestripe.FailAfterCreateDelay
	FailBefore429                = fakestripe.FailBefore429
	FailBefore500                = fakestripe.FailBefore500
	FailAfterCreateResetInFlight = fakestripe.FailAfterCreateResetInFlight
	FailIdempotencyMismatch      = fakestripe.FailIdempotencyMismatch
)

// IssuingCardNumber is the fake's Issuing card number.
const IssuingCardNumber = fakestripe.IssuingCardNumber

// BasicAuth is the Authorization header of HTTP Basic with token as the user name.
func BasicAuth(token string) string { return fakestripe.BasicAuth(token) }

// NewFakeStripe starts a fake Stripe that accepts secret and stops it in tb.Cleanup.
func NewFakeStripe(tb testing.TB, secret string) *FakeStripe {
	tb.Helper()
	f, err := fakestripe.Start(secret)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(f.Close)
	return f
}
