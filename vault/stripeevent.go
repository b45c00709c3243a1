package vault

import "time"

// Stripe's webhook events, as the store applies them: each event id once per
// upstream, recorded in the transaction that applies it (see
// docs/stripe-events.md).

// StripeEventTolerance is how far a Stripe-Signature's timestamp may be from
// the store's clock, either way (Stripe's own libraries use 300 s).
const StripeEventTolerance = 300 * time.Second

// StripeEventRetention is how long the id of an applied event is kept to
// recognise a duplicate: Stripe retries an event for up to three days.
const StripeEventRetention = 7 * 24 * time.Hour

// OperationStripeEvent is the operation of the ledger events a Stripe event
// writes; their StripeRequestID is the event's id (evt_…).
const OperationStripeEvent = "stripe_event"

// StripeEvent is one of Stripe's events, its signature verified.
type StripeEvent struct {
	// ID is Stripe's event id (evt_…); Type its type (payment_intent.succeeded).
	ID, Type string
	// Upstream is the upstream whose endpoint received it.
	Upstream string
	// SignedAt is the timestamp of its Stripe-Signature (t=…), checked against
	// the store's clock within StripeEventTolerance.
	SignedAt time.Time
	// ObjectID is the id of data.object ("" when it has none).
	ObjectID string
	// IdempotencyKey is request.idempotency_key: the Idempotency-Key of the API
	// request that caused the event ("" when none did).
	IdempotencyKey string
	// Read reads data.object as a money object in a key's currency: ok false
	// when it is none keybrake reads in that currency. It runs inside the
	// store's transaction and may run more than once: a pure function.
	Read func(currency string) (ob Observation, ok bool)
}

// StripeEventOutcome is what the store did with a Stripe event.
type StripeEventOutcome string

// Stripe event outcomes.
const (
	// StripeEventApplied: the event changed what a key counts (an exposure
	// committed or released, an unknown hold settled).
	StripeEventApplied StripeEventOutcome = "applied"
	// StripeEventUnchanged: a key knows the object, but the event shows
	// nothing it has not counted already (an older event, a live object).
	StripeEventUnchanged StripeEventOutcome = "unchanged"
	// StripeEventDropped: no key of the upstream knows the object.
	StripeEventDropped StripeEventOutcome = "dropped"
	// StripeEventDuplicate: the event id was applied before; nothing changed.
	StripeEventDuplicate StripeEventOutcome = "duplicate"
	// StripeEventTooOld: the signature's timestamp is outside the tolerance
	// of the store's clock (a replay); nothing changed, nothing recorded.
	StripeEventTooOld StripeEventOutcome = "too_old"
)

// StripeEventResult is what ApplyStripeEvent did.
type StripeEventResult struct {
	Outcome StripeEventOutcome
	// Keys are the keys whose exposure the event changed.
	Keys []string
	// Resolved are the unknown holds the event settled.
	Resolved []string
}
