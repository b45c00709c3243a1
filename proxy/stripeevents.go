package proxy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// Stripe's events: the endpoint an operator registers at Stripe for an
// upstream. A delivery is verified as Stripe documents its signatures, then
// its object is applied to the keys that count it exactly as an answer read
// through the proxy would be (stripeapi.ReadMoneyObject, the store's observe),
// in the one transaction that also records the event's id. See
// docs/stripe-events.md.

// MaxStripeEventBytes bounds the body of a delivery. Stripe's events are a few
// kilobytes; an invoice with many lines a few hundred.
const MaxStripeEventBytes = 1 << 20

// StripeEventRejection says why a delivery was turned down. Each is also the
// reason label of keybrake_stripe_events_rejected_total.
type StripeEventRejection string

// Why a delivery is turned down; nothing changes for any of them.
const (
	EventUnknownUpstream  StripeEventRejection = "unknown_upstream"
	EventNoSecret         StripeEventRejection = "no_webhook_secret"
	EventSignatureMissing StripeEventRejection = "signature_missing"
	EventSignatureInvalid StripeEventRejection = "signature_invalid"
	EventTooOld           StripeEventRejection = "timestamp_outside_tolerance"
	EventMalformed        StripeEventRejection = "event_malformed"
	EventTooLarge         StripeEventRejection = "event_too_large"
)

// stripeEventRejections lists every rejection (the metric's label values).
var stripeEventRejections = [...]StripeEventRejection{
	EventUnknownUpstream, EventNoSecret, EventSignatureMissing, EventSignatureInvalid, EventTooOld, EventMalformed, EventTooLarge,
}

// stripeEventOutcomes lists the outcomes of an accepted delivery (the label
// values of keybrake_stripe_events_total).
var stripeEventOutcomes = [...]vault.StripeEventOutcome{
	vault.StripeEventApplied, vault.StripeEventUnchanged, vault.StripeEventDropped, vault.StripeEventDuplicate,
}

// StripeEventError is a delivery turned down: nothing changed. Message is for
// the sender (it never echoes a secret).
type StripeEventError struct {
	Reason  StripeEventRejection
	Message string
}

// Error implements error.
func (e *StripeEventError) Error() string { return string(e.Reason) + ": " + e.Message }

// RejectStripeEvent counts a delivery turned down before ReceiveStripeEvent
// could read it (a body over MaxStripeEventBytes) and returns its error.
func (p *Proxy) RejectStripeEvent(reason StripeEventRejection, message string) error {
	p.metrics.stripeEventRejected(reason)
	return &StripeEventError{Reason: reason, Message: message}
}

// ReceiveStripeEvent verifies one delivery of a Stripe event to upstream's
// endpoint — signature the Stripe-Signature header, payload the raw body — and
// applies it (vault.Store.ApplyStripeEvent). Errors: *StripeEventError (the
// delivery is turned down, nothing changed), and the store's.
func (p *Proxy) ReceiveStripeEvent(ctx context.Context, upstream, signature string, payload []byte) (vault.StripeEventResult, error) {
	res, err := p.receiveStripeEvent(ctx, upstream, signature, payload)
	var se *StripeEventError
	switch {
	case errors.As(err, &se):
		p.metrics.stripeEventRejected(se.Reason)
		p.log.LogAttrs(ctx, slog.LevelWarn, "stripe event turned down", slog.String(logfield.Upstream, upstream),
			slog.String(logfield.Reason, string(se.Reason)))
	case err != nil:
		p.log.LogAttrs(ctx, slog.LevelError, "applying a stripe event failed", slog.String(logfield.Upstream, upstream),
			slog.Any(logfield.Error, err))
	default:
		p.metrics.stripeEventAccepted(res.Outcome)
	}
	return res, err
}

func (p *Proxy) receiveStripeEvent(ctx context.Context, upstream, signature string, payload []byte) (vault.StripeEventResult, error) {
	if len(payload) > MaxStripeEventBytes {
		return vault.StripeEventResult{}, &StripeEventError{Reason: EventTooLarge, Message: fmt.Sprintf("the event is over %d bytes", MaxStripeEventBytes)}
	}
	secrets, err := p.store.UpstreamWebhookSecrets(ctx, upstream)
	if errors.Is(err, vault.ErrNotFound) {
		return vault.StripeEventResult{}, &StripeEventError{Reason: EventUnknownUpstream,
			Message: fmt.Sprintf("no upstream %q is registered", upstream)}
	}
	if err != nil {
		return vault.StripeEventResult{}, fmt.Errorf("stripe event: %w", err)
	}
	if len(secrets) == 0 {
		return vault.StripeEventResult{}, &StripeEventError{Reason: EventNoSecret,
			Message: fmt.Sprintf("upstream %q has no webhook secret: set webhook_secrets (PATCH /api/v1/upstreams/%s)", upstream, upstream)}
	}
	signedAt, err := VerifyStripeSignature(payload, signature, secrets)
	if err != nil {
		return vault.StripeEventResult{}, err
	}
	ev, err := readStripeEvent(payload)
	if err != nil {
		return vault.StripeEventResult{}, err
	}
	ev.Upstream, ev.SignedAt = upstream, signedAt
	res, err := p.store.ApplyStripeEvent(ctx, ev)
	if err != nil {
		return vault.StripeEventResult{}, fmt.Errorf("stripe event: %w", err)
	}
	if res.Outcome == vault.StripeEventTooOld {
		return res, &StripeEventError{Reason: EventTooOld,
			Message: fmt.Sprintf("the signature's timestamp is more than %s from keybrake's clock (a replayed delivery?)", vault.StripeEventTolerance)}
	}
	p.log.LogAttrs(ctx, slog.LevelInfo, "stripe event", slog.String(logfield.Upstream, upstream),
		slog.String(logfield.ObjectID, ev.ObjectID), slog.String(logfield.EventID, ev.ID), slog.String(logfield.EventType, ev.Type),
		slog.String(logfield.Outcome, string(res.Outcome)))
	return res, nil
}

// VerifyStripeSignature checks a Stripe-Signature header ("t=…,v1=…", with
// several v1 entries during a rotation) against payload as Stripe documents:
// one v1 must be the hex HMAC-SHA256 of "{t}.{payload}" under one of secrets,
// compared in constant time. It returns the signature's timestamp, which the
// caller checks against its clock. Errors: *StripeEventError.
func VerifyStripeSignature(payload []byte, header string, secrets []string) (time.Time, error) {
	if strings.TrimSpace(header) == "" {
		return time.Time{}, &StripeEventError{Reason: EventSignatureMissing, Message: "no Stripe-Signature header"}
	}
	var (
		t      int64
		haveT  bool
		sigs   [][]byte
		badSig = &StripeEventError{Reason: EventSignatureInvalid, Message: "the Stripe-Signature header matches none of the upstream's webhook secrets"}
	)
	for item := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || haveT {
				return time.Time{}, &StripeEventError{Reason: EventSignatureInvalid, Message: "the Stripe-Signature header has no single valid timestamp"}
			}
			t, haveT = n, true
		case "v1":
			if b, err := hex.DecodeString(v); err == nil && len(b) == sha256.Size {
				sigs = append(sigs, b)
			}
		}
	}
	if !haveT {
		return time.Time{}, &StripeEventError{Reason: EventSignatureInvalid, Message: "the Stripe-Signature header has no timestamp"}
	}
	if len(sigs) == 0 {
		return time.Time{}, &StripeEventError{Reason: EventSignatureInvalid, Message: "the Stripe-Signature header has no v1 signature"}
	}
	ts := strconv.FormatInt(t, 10)
	match := false
	for _, secret := range secrets {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(ts))
		mac.Write([]byte{'.'})
		mac.Write(payload)
		want := mac.Sum(nil)
		for _, sig := range sigs {
			// Every comparison runs, so the time taken says nothing of which matched.
			if hmac.Equal(want, sig) {
				match = true
			}
		}
	}
	if !match {
		return time.Time{}, badSig
	}
	return time.Unix(t, 0), nil
}

// stripeEventWire is the part of an event keybrake reads.
type stripeEventWire struct {
	ID     string          `json:"id"`
	Object string          `json:"object"`
	Type   string          `json:"type"`
	Data   json.RawMessage `json:"data"`
	// Request is {id, idempotency_key} (API versions since 2017-05-25), a
	// string id before, or null.
	Request json.RawMessage `json:"request"`
}

// readStripeEvent reads a verified payload as an event. Errors:
// *StripeEventError (EventMalformed).
func readStripeEvent(payload []byte) (vault.StripeEvent, error) {
	var w stripeEventWire
	malformed := func(msg string) (vault.StripeEvent, error) {
		return vault.StripeEvent{}, &StripeEventError{Reason: EventMalformed, Message: msg}
	}
	if err := json.Unmarshal(payload, &w); err != nil {
		return malformed("the body is not a Stripe event (JSON object)")
	}
	if w.Object != "event" || !stripeapi.IsID(w.ID) || w.Type == "" || len(w.Type) > 100 {
		return malformed(`the body is not a Stripe event: it needs "object": "event", an id and a type`)
	}
	data := stripeapi.DecodeObject(w.Data)
	obj := data.Object("object")
	if obj == nil {
		return malformed("the event has no data.object")
	}
	ev := vault.StripeEvent{ID: w.ID, Type: w.Type}
	if id := obj.Get("id"); stripeapi.IsID(id) {
		ev.ObjectID = id
	}
	if req := stripeapi.DecodeObject(w.Request); req != nil {
		ev.IdempotencyKey = req.Get("idempotency_key")
	}
	ev.Read = func(currency string) (vault.Observation, bool) { return readEventObject(obj, currency) }
	return ev, nil
}

// readEventObject reads an event's object as a read through the proxy reads an
// answer (stripeapi.ReadMoneyObject). A refund is read too, for the unknown
// hold of the request that created it: it moved its amount unless it failed
// or was cancelled, and it is final either way.
func readEventObject(o stripeapi.Object, currency string) (vault.Observation, bool) {
	if o.Get("object") == "refund" {
		return readRefund(o, currency)
	}
	m, ok := stripeapi.ReadMoneyObject(o, currency)
	if !ok {
		return vault.Observation{}, false
	}
	return vault.Observation{Moved: m.Moved, MovedKnown: m.MovedKnown, Terminal: m.Terminal}, true
}

// readRefund reads a refund in currency (see readEventObject).
func readRefund(o stripeapi.Object, currency string) (vault.Observation, bool) {
	amount, err := strconv.ParseInt(string(o["amount"]), 10, 64)
	if err != nil || amount < 0 || o.Get("currency") != currency || !stripeapi.IsID(o.Get("id")) {
		return vault.Observation{}, false
	}
	switch o.Get("status") {
	case "failed", "canceled":
		return vault.Observation{MovedKnown: true, Terminal: true}, true
	}
	return vault.Observation{Moved: amount, MovedKnown: true, Terminal: true}, true
}
