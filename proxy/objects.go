package proxy

import (
	"context"
	"log/slog"
	"strings"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// Money objects: how Stripe's answers about the objects that outlive a request
// settle the request's hold and the key's exposure on them (see "The metering
// model" in docs/ARCHITECTURE.md; stripeapi reads the answers).

// countedID is the object a metered request's money is counted on: the target, or
// the object the answer o shows the request created; "" when the money moved at
// once.
func (c *call) countedID(o stripeapi.Object) string {
	switch {
	case c.cls.Target != "":
		return c.cls.Target
	case c.cls.Creates && stripeapi.IsID(o.Get("id")):
		return o.Get("id")
	}
	return ""
}

// settleAnswer fills the commit of a metered request from Stripe's answer o (a 2xx
// body, or the object a 4xx body shows was created). A request whose money moves
// at once commits its hold. On a money object it commits what the object moved
// since the key last saw it (at least 0), keeps the rest of the hold as the
// object's exposure, and releases everything when the answer shows the object can
// move no more money. An answer about something else (a new invoice line) moved
// nothing yet; an answer keybrake cannot read at all commits the hold and keeps
// the object's exposure as it was. It returns the overrun: what Stripe reported
// moved beyond the hold and the object's exposure.
func (c *call) settleAnswer(sr *vault.SettleRequest, o stripeapi.Object) (overrun int64) {
	sr.Amount = c.amount
	if id := o.Get("id"); stripeapi.IsID(id) {
		sr.ObjectID = id
	}
	id := c.countedID(o)
	if id == "" {
		return 0
	}
	sr.ObjectID = id
	sr.Object = vault.ObjectSettle{Created: c.cls.Creates && c.cls.Target == "", Expose: true,
		StripeAccount: c.account, StripeContext: c.stripeContext}
	if o.Get("object") == "" {
		return 0
	}
	sr.Amount = 0
	m, read := stripeapi.ReadMoneyObject(o, c.currency)
	if !read || m.ID != id {
		return 0
	}
	sr.Object.Terminal = m.Terminal
	if !m.MovedKnown {
		return 0 // it moves no money by itself (an invoice item)
	}
	sr.Object.Moved, sr.Object.MovedKnown = m.Moved, true
	sr.Amount = max(0, m.Moved-c.movedBefore())
	// What the answer says moved is the truth: if it is more than was held (the
	// object changed at Stripe between keybrake's lookup and this request), it is
	// booked as an overrun.
	sr.AllowOverrun = true
	return max(0, sr.Amount-c.amount-c.exposure.Held)
}

// movedBefore is what the counted object had moved before this request: nothing
// for an object it creates; for one the key created, what the key last saw (money
// moved on it outside the key is still the key's to count); for another, what
// the lookup just before the request saw.
func (c *call) movedBefore() int64 {
	switch {
	case c.cls.Creates && c.cls.Target == "":
		return 0
	case c.exposure.Own && c.exposure.MovedSeen:
		return c.exposure.Moved
	case c.looked != nil && c.looked.MovedKnown:
		return c.looked.Moved
	}
	return c.exposure.Moved
}

// bodyShapeOf reads what a 4xx's body shows for the settle decision (any other
// answer's body shows nothing to it): an idempotency_error, and a money object
// the request created anyway, which it also returns (a PaymentIntent created
// with confirm=true whose payment was declined: error.payment_intent, status
// requires_payment_method, still confirmable with its client_secret). That
// object's money stays counted as its exposure until Stripe shows it moved or
// cannot.
func (c *call) bodyShapeOf(status int, body []byte) (bodyShape, stripeapi.Object) {
	if status < 400 || status >= 500 {
		return 0, nil
	}
	var shape bodyShape
	if stripeapi.ErrorType(body) == TypeIdempotency {
		shape |= bodyIdempotencyError
	}
	if !c.metered() || !c.cls.Creates || c.cls.Target != "" {
		return shape, nil
	}
	o, ok := stripeapi.MoneyObjectInError(body, c.currency)
	if !ok {
		return shape, nil
	}
	return shape | bodyCreatedObject, o
}

// observe applies an answer that settled no money object of its own — a read, a
// cancel, an expiry, a deletion, an unmetered update — to the key's exposure on
// the object it shows: money it moved is committed, a terminal state releases the
// rest. A failure is logged: the exposure then simply stays counted.
func (p *Proxy) observe(ctx context.Context, c *call, body []byte) {
	o := stripeapi.DecodeObject(body)
	p.linkSeen(ctx, c.key.Upstream, c.account, "", o)
	m, ok := stripeapi.ReadMoneyObject(o, c.key.Policy.EffectiveCurrency())
	if !ok {
		return
	}
	_, err := p.store.ObserveObject(ctx, c.key.ID, m.ID, vault.Observation{
		Operation: c.cls.Operation, Moved: m.Moved, MovedKnown: m.MovedKnown, Terminal: m.Terminal,
	})
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelError, "observing a money object failed; its exposure stays counted",
			slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.Any(logfield.Error, err))
	}
}

// observable reports whether an answer to c may show a money object worth
// reading: a single object of a money resource, not a list.
func observable(c *call) bool {
	if c.cls.ObjectID == "" {
		return false
	}
	op := c.cls.Operation
	switch op[:max(0, strings.LastIndexByte(op, '.'))] {
	case "payment_intents", "charges", "invoices", "invoiceitems", "checkout.sessions":
		return true
	}
	return false
}
