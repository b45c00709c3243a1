package vault

import (
	"context"
	"time"
)

// Renewals: the money Stripe moves on its own schedule for objects a key's
// request started (a subscription, its invoices), metered from Stripe's
// events (docs/renewals.md).

// ObjectLink says that a Stripe object belongs to a vault key although no
// request of the key named it: a subscription a Checkout Session or Payment
// Link the key created started, a subscription the key created, an invoice
// such a subscription issued. Money the object moves later is the key's.
type ObjectLink struct {
	// Upstream and ObjectID name the object: Stripe's ids are the upstream
	// account's.
	Upstream string `json:"upstream"`
	ObjectID string `json:"object_id"`
	KeyID    string `json:"key_id"`
	// StripeAccount is the connected account the object lives under ("" for
	// the platform).
	StripeAccount string `json:"stripe_account,omitempty"`
	// Via is the object that started it (cs_…, plink_…, the subscription of
	// an invoice), "" when the key's request created it.
	Via string `json:"via,omitempty"`
	// Renewal is what a renewal invoice's link decided (RenewalHeld, …); ""
	// for any other object.
	Renewal RenewalOutcome `json:"renewal,omitempty"`
	// Amount is a renewal's amount_due, in minor units of Currency.
	Amount   int64  `json:"amount,omitempty"`
	Currency string `json:"currency,omitempty"`
	// EventID is the Stripe event that made the link, when one did.
	EventID   string    `json:"event_id,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// EndedAt is when Stripe said the object ended (a subscription
	// canceled): the link is removed ObjectRetention after it.
	EndedAt time.Time `json:"ended_at,omitzero"`
}

// RenewalOutcome is what keybrake did about a renewal invoice.
type RenewalOutcome string

// Renewal outcomes.
const (
	// RenewalHeld: its amount_due is held as the invoice's exposure.
	RenewalHeld RenewalOutcome = "held"
	// RenewalCounted: held although it is over a cap, under policy
	// renewals "count" (or once Stripe had already finalised it); the
	// excess is booked as an allowance, as report mode's.
	RenewalCounted RenewalOutcome = "counted_over_cap"
	// RenewalPaused: over a cap, nothing held; keybrake sets
	// auto_advance=false on the draft at Stripe.
	RenewalPaused RenewalOutcome = "paused"
)

// Renewal is a renewal invoice Stripe told keybrake about, to be metered
// against the key its subscription is linked to (ApplyRenewal).
type Renewal struct {
	Upstream       string
	InvoiceID      string
	SubscriptionID string
	Customer       string
	StripeAccount  string
	// AmountDue is the invoice's amount_due in minor units of Currency.
	AmountDue int64
	Currency  string
	// Draft says the invoice is still a draft, which keybrake can pause;
	// a renewal first seen finalised (its events out of order) is counted.
	Draft bool
	// EventID is the Stripe event that reported it.
	EventID string
}

// RenewalResult is what ApplyRenewal did.
type RenewalResult struct {
	// Link is the invoice's link as it now is (Renewal says what was
	// decided, the first time or earlier).
	Link ObjectLink
	// Applied is false when the invoice had been decided before (a
	// duplicate or late event): nothing changed.
	Applied bool
	// Message says why a renewal was paused or counted over a cap.
	Message string
}

// IndirectEvent is what one of Stripe's events says about objects keys
// created indirectly; ApplyStripeEvent applies it in the transaction that
// records the event's id. Each part applies only to objects linked to a key.
type IndirectEvent struct {
	// Account is the event's connected account ("" for the platform).
	Account string
	// Renewal is a renewal invoice, metered as ApplyRenewal does when its
	// subscription is linked.
	Renewal *Renewal
	// InvoiceID, of SubscriptionID, is an invoice of a subscription that is
	// no renewal (its first): linked, never counted again.
	InvoiceID, SubscriptionID string
	// SessionID (from PaymentLinkID, "" for none) started the subscription
	// Started: linked to the key of the session or the link.
	SessionID, PaymentLinkID, Started string
	// Ended is a subscription Stripe ended: its link goes with retention.
	Ended string
}

// RenewalPause is a pending call to Stripe: auto_advance=false on a renewal
// invoice over a cap. It is written in the transaction that decided the
// pause and removed once Stripe accepted the call.
type RenewalPause struct {
	Upstream      string    `json:"upstream"`
	InvoiceID     string    `json:"invoice_id"`
	KeyID         string    `json:"key_id"`
	StripeAccount string    `json:"stripe_account,omitempty"`
	Attempts      int       `json:"attempts"`
	NextAt        time.Time `json:"next_at"`
	LastError     string    `json:"last_error,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
}

// RenewalStore keeps the links of objects keys created indirectly, meters
// their renewals and queues the pauses keybrake owes Stripe.
type RenewalStore interface {
	// LinkObject links l.ObjectID (of l.Upstream) to l.KeyID. The first link
	// of an object stands: linking it again, to any key, changes nothing and
	// returns the link that stands (created false). Errors: ErrInvalid (an
	// empty upstream, object or key id, a key of another upstream),
	// ErrNotFound (no such key).
	LinkObject(ctx context.Context, l ObjectLink) (link ObjectLink, created bool, err error)
	// GetLink returns the link of objectID of upstream. Errors: ErrNotFound.
	GetLink(ctx context.Context, upstream, objectID string) (ObjectLink, error)
	// EndLink notes that Stripe ended the linked object (a subscription
	// canceled): the link is removed by retention ObjectRetention later.
	// Errors: ErrNotFound.
	EndLink(ctx context.Context, upstream, objectID string) error
	// ApplyRenewal meters a renewal invoice of a subscription linked to a
	// key, once per invoice, in one write transaction: under the key's caps
	// (and its budgets', checked as a Reserve checks them) its amount_due is
	// held as the invoice's exposure; over a cap, policy renewals
	// "pause_over_cap" holds nothing, queues a RenewalPause and emits
	// renewal.paused, and "count" holds it anyway with the excess as an
	// allowance. The invoice is linked to the key with what was decided.
	// Errors: ErrInvalid (missing ids, a negative amount), ErrNotFound (the
	// subscription is linked to no key).
	ApplyRenewal(ctx context.Context, r Renewal) (RenewalResult, error)
	// DuePauses returns up to limit pending pauses whose NextAt has come,
	// oldest first.
	DuePauses(ctx context.Context, limit int) ([]RenewalPause, error)
	// PauseSent removes a pending pause once Stripe accepted it; with
	// lastError (Stripe will not pause the invoice: it was finalised), the
	// renewal is counted instead, over the cap, as RenewalCounted.
	PauseSent(ctx context.Context, upstream, invoiceID, lastError string) error
	// PauseFailed records a failed attempt and when to try again.
	PauseFailed(ctx context.Context, upstream, invoiceID string, retryAt time.Time, lastError string) error
}
