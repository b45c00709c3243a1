package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// Money objects: how Stripe's answers about the objects that outlive a request
// (see "Money objects" in the package documentation) are read.

// jsonObject is a Stripe object decoded one level deep.
type jsonObject map[string]json.RawMessage

// decodeObject decodes a JSON object, nil when body is not one.
func decodeObject(body []byte) jsonObject {
	var o jsonObject
	if json.Unmarshal(body, &o) != nil {
		return nil
	}
	return o
}

func (o jsonObject) str(field string) string {
	var s string
	if raw, ok := o[field]; ok {
		_ = json.Unmarshal(raw, &s)
	}
	return s
}

// int reads a non-negative integer field.
func (o jsonObject) int(field string) (int64, bool) {
	raw, ok := o[field]
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

func (o jsonObject) isTrue(field string) bool { return string(o[field]) == "true" }

// path is the raw value at a dotted path ("pricing.unit_amount_decimal"); a
// missing or null value gives ok false.
func (o jsonObject) path(dotted string) (json.RawMessage, bool) {
	cur := o
	for {
		name, rest, nested := strings.Cut(dotted, ".")
		raw, ok := cur[name]
		if !ok || string(raw) == "null" {
			return nil, false
		}
		if !nested {
			return raw, true
		}
		if cur = decodeObject(raw); cur == nil {
			return nil, false
		}
		dotted = rest
	}
}

// factor reads the first of fields that is present: an integer, or a decimal
// string without fractional minor units ("1500", "1500.000").
func (o jsonObject) factor(fields []string) (int64, error) {
	for _, f := range fields {
		raw, ok := o.path(f)
		if !ok {
			continue
		}
		s := string(raw)
		if strings.HasPrefix(s, `"`) {
			if err := json.Unmarshal(raw, &s); err != nil {
				return 0, fmt.Errorf("lookup field %q: %w", f, err)
			}
		}
		ip, fp, _ := strings.Cut(s, ".")
		if !isDigits(ip) || (fp != "" && !isDigits(fp)) || strings.Trim(fp, "0") != "" || len(ip) > maxMoneyDigits {
			return 0, fmt.Errorf("lookup field %q: %q is not a whole number of minor units", f, clip(s))
		}
		n, err := strconv.ParseInt(ip, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("lookup field %q: %w", f, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("lookup: none of %v present", fields)
}

func (o jsonObject) object(field string) jsonObject {
	raw, ok := o[field]
	if !ok {
		return nil
	}
	return decodeObject(raw)
}

// moneyKind says how to read one kind of Stripe money object (its "object" value).
type moneyKind struct {
	// moved is the object's cumulative money moved; ok is false when the kind
	// moves no money by itself (an invoice item is collected by its invoice).
	moved func(o jsonObject) (n int64, ok bool)
	// terminal reports that the object can move no more money.
	terminal func(o jsonObject) bool
}

func statusIn(statuses ...string) func(jsonObject) bool {
	return func(o jsonObject) bool {
		if o.isTrue("deleted") {
			return true
		}
		st := o.str("status")
		for _, s := range statuses {
			if st == s {
				return true
			}
		}
		return false
	}
}

func intField(field string) func(jsonObject) (int64, bool) {
	return func(o jsonObject) (int64, bool) { return o.int(field) }
}

// moneyKinds are the objects whose answers keybrake reads. A PaymentIntent moves
// amount_received and is done once succeeded or cancelled (a final capture leaves it
// succeeded, releasing what was not captured); a Charge moves amount_captured and
// is done once captured, failed, or refunded uncaptured (an expired authorisation);
// an invoice moves amount_paid and is done once paid, void or deleted; a Checkout
// Session moves amount_total once paid and is done once expired or complete and
// paid; an invoice item moves nothing by itself and is done once deleted.
var moneyKinds = map[string]moneyKind{
	"payment_intent": {moved: intField("amount_received"), terminal: statusIn("succeeded", "canceled")},
	"charge": {moved: intField("amount_captured"), terminal: func(o jsonObject) bool {
		return o.isTrue("captured") || o.str("status") == "failed" || o.isTrue("refunded")
	}},
	"invoice": {moved: intField("amount_paid"), terminal: statusIn("paid", "void")},
	"checkout.session": {
		moved: func(o jsonObject) (int64, bool) {
			if o.str("payment_status") != "paid" {
				return 0, true
			}
			return o.int("amount_total")
		},
		terminal: func(o jsonObject) bool {
			st, ps := o.str("status"), o.str("payment_status")
			return st == "expired" || (st == "complete" && ps != "unpaid")
		},
	},
	"invoiceitem": {moved: func(jsonObject) (int64, bool) { return 0, false }, terminal: statusIn()},
}

// moneyObject is what one answer says about a money object.
type moneyObject struct {
	id         string
	moved      int64
	movedKnown bool
	terminal   bool
}

// readMoneyObject reads o as a money object in currency (an object in another
// currency, or of a kind keybrake does not read, gives ok false; a deleted object
// carries no currency).
func readMoneyObject(o jsonObject, currency string) (moneyObject, bool) {
	kind, ok := moneyKinds[o.str("object")]
	id := o.str("id")
	if !ok || !isID(id) {
		return moneyObject{}, false
	}
	if cur := o.str("currency"); cur != currency && !(cur == "" && o.isTrue("deleted")) {
		return moneyObject{}, false
	}
	m := moneyObject{id: id, terminal: kind.terminal(o)}
	m.moved, m.movedKnown = kind.moved(o)
	return m, true
}

// countedID is the object a metered request's money is counted on: the target, or
// the object the answer o shows the request created; "" when the money moved at
// once.
func (c *call) countedID(o jsonObject) string {
	switch {
	case c.cls.Target != "":
		return c.cls.Target
	case c.cls.Creates && isID(o.str("id")):
		return o.str("id")
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
// the object's exposure as it was.
func (c *call) settleAnswer(sr *vault.SettleRequest, o jsonObject) {
	sr.Amount = c.amount
	if id := o.str("id"); isID(id) {
		sr.ObjectID = id
	}
	id := c.countedID(o)
	if id == "" {
		return
	}
	sr.ObjectID = id
	sr.Object = vault.ObjectSettle{Created: c.cls.Creates && c.cls.Target == "", Expose: true}
	if o.str("object") == "" {
		return
	}
	sr.Amount = 0
	m, read := readMoneyObject(o, c.currency)
	if !read || m.id != id {
		return
	}
	sr.Object.Terminal = m.terminal
	if !m.movedKnown {
		return // it moves no money by itself (an invoice item)
	}
	sr.Object.Moved, sr.Object.MovedKnown = m.moved, true
	sr.Amount = max(0, m.moved-c.movedBefore())
	// What the answer says moved is the truth: if it is more than was held (the
	// object changed at Stripe between keybrake's lookup and this request), it is
	// booked as an overrun.
	sr.AllowOverrun = true
	c.overrun = max(0, sr.Amount-c.amount-c.exposure.Held)
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
	case c.looked != nil && c.looked.movedKnown:
		return c.looked.moved
	}
	return c.exposure.Moved
}

// keepCreatedObject turns the settle of a 4xx into a commit when the error body
// shows that the request created a money object anyway (a PaymentIntent created
// with confirm=true whose payment was declined: error.payment_intent, status
// requires_payment_method, still confirmable with its client_secret). Its money
// stays counted as the object's exposure until Stripe shows it moved or cannot.
func (c *call) keepCreatedObject(sr *vault.SettleRequest, body []byte) {
	if !c.metered || !c.cls.Creates || c.cls.Target != "" {
		return
	}
	e := decodeObject(body).object("error")
	for field := range e {
		o := e.object(field)
		if _, ok := readMoneyObject(o, c.currency); ok {
			sr.Outcome = vault.SettleCommit
			c.settleAnswer(sr, o)
			return
		}
	}
}

// observe applies an answer that settled no money object of its own — a read, a
// cancel, an expiry, a deletion, an unmetered update — to the key's exposure on
// the object it shows: money it moved is committed, a terminal state releases the
// rest. A failure is logged: the exposure then simply stays counted.
func (p *Proxy) observe(ctx context.Context, c *call, body []byte) {
	m, ok := readMoneyObject(decodeObject(body), c.key.Policy.EffectiveCurrency())
	if !ok {
		return
	}
	_, err := p.store.ObserveObject(ctx, c.key.ID, m.id, vault.Observation{
		Operation: c.cls.Operation, Moved: m.moved, MovedKnown: m.movedKnown, Terminal: m.terminal,
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
