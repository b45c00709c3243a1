package engine

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// Stripe's events. Each event id is recorded in the transaction that applies
// it, so an event is applied once whatever Stripe re-delivers and whenever the
// process dies: the record and its effect commit together or not at all. An
// event settles the unknown hold whose upstream idempotency key it names, and
// then is applied to every key that counts its object exactly as an answer
// read through the proxy would be (objectRec.observe). See
// docs/stripe-events.md.

// stripeEventRec is what is kept of an applied event: nothing of its object.
type stripeEventRec struct {
	Type       string                   `json:"type"`
	ReceivedAt time.Time                `json:"received_at"`
	Outcome    vault.StripeEventOutcome `json:"outcome"`
}

// maxStripeEventID bounds an event id (Stripe's are about 30 characters).
const maxStripeEventID = 255

// ApplyStripeEvent applies one of Stripe's events (vault.Store).
func (s *Engine) ApplyStripeEvent(ctx context.Context, ev vault.StripeEvent) (vault.StripeEventResult, error) {
	if ev.ID == "" || len(ev.ID) > maxStripeEventID || ev.Upstream == "" || ev.Read == nil || len(ev.ObjectID) > maxStripeEventID {
		return vault.StripeEventResult{}, fmt.Errorf("apply stripe event: %w", vault.ErrInvalid)
	}
	var res vault.StripeEventResult
	err := s.submit(ctx, func(tx Tx, now time.Time) error {
		var err error
		res, err = applyStripeEventTx(tx, now, ev) // a re-run starts over
		return err
	})
	if err != nil {
		return vault.StripeEventResult{}, fmt.Errorf("apply stripe event %s: %w", ev.ID, err)
	}
	return res, nil
}

func applyStripeEventTx(tx Tx, now time.Time, ev vault.StripeEvent) (vault.StripeEventResult, error) {
	res := vault.StripeEventResult{}
	if d := now.Sub(ev.SignedAt); d > vault.StripeEventTolerance || d < -vault.StripeEventTolerance {
		res.Outcome = vault.StripeEventTooOld
		return res, nil
	}
	k := idemKey(ev.Upstream, ev.ID)
	if v, err := tx.Get(BucketStripeEvents, k); err != nil || v != nil {
		res.Outcome = vault.StripeEventDuplicate
		return res, err
	}
	if ev.IdempotencyKey != "" && ev.ObjectID != "" {
		holdID, err := resolveByEventTx(tx, now, ev)
		if err != nil {
			return res, err
		}
		if holdID != "" {
			res.Resolved = append(res.Resolved, holdID)
		}
	}
	known := false
	if ev.ObjectID != "" {
		keys, err := objectKeysTx(tx, ev.ObjectID)
		if err != nil {
			return res, err
		}
		for _, keyID := range keys {
			counts, changed, err := observeByEventTx(tx, now, keyID, ev)
			if err != nil {
				return res, err
			}
			known = known || counts
			if changed {
				res.Keys = append(res.Keys, keyID)
			}
		}
	}
	switch {
	case len(res.Keys) > 0 || len(res.Resolved) > 0:
		res.Outcome = vault.StripeEventApplied
	case known:
		res.Outcome = vault.StripeEventUnchanged
	default:
		res.Outcome = vault.StripeEventDropped
	}
	rec := stripeEventRec{Type: ev.Type, ReceivedAt: now, Outcome: res.Outcome}
	return res, insertJSON(tx, BucketStripeEvents, k, &rec)
}

// observeByEventTx applies the event's object to keyID's exposure on it, when
// the key is of the event's upstream and counts the object: counts says it
// does, changed that the exposure changed.
func observeByEventTx(tx Tx, now time.Time, keyID string, ev vault.StripeEvent) (counts, changed bool, err error) {
	if err := tx.LockKey(keyID); err != nil {
		return false, false, err
	}
	key, err := getKey(tx, keyID)
	if isNotFound(err) {
		return false, false, nil
	}
	if err != nil || key.Upstream != ev.Upstream {
		return false, false, err
	}
	o, ok, err := getObject(tx, keyID, ev.ObjectID)
	if err != nil || !ok {
		return false, false, err
	}
	ob, read := ev.Read(key.Policy.EffectiveCurrency())
	if !read {
		return true, false, nil
	}
	ob.Operation = vault.OperationStripeEvent
	changes := o.observe(ob)
	if len(changes) == 0 {
		return true, false, nil
	}
	o.UpdatedAt = now
	if err := putObject(tx, keyID, ev.ObjectID, o); err != nil {
		return true, false, err
	}
	return true, true, applyPartChangesBy(tx, now, keyID, ev.ObjectID, ob.Operation, ev.ID, o.Currency, changes)
}

// resolveByEventTx settles the unknown hold whose upstream idempotency key the
// event names, from the event's object: the request executed, so what the
// object moved is committed (from the hold, then beyond it) and the rest of
// the hold stays as the object's exposure, or is released when the object can
// move no more money. It returns the hold's id, "" when the event names no
// unknown hold of its upstream or its object cannot be read.
func resolveByEventTx(tx Tx, now time.Time, ev vault.StripeEvent) (string, error) {
	uk := []byte(ev.IdempotencyKey)
	v, err := tx.Get(BucketUnknownKeys, uk)
	if err != nil || v == nil {
		return "", err
	}
	holdID := string(v)
	rec, err := getRecordByHold(tx, holdID)
	if isNotFound(err) {
		return "", tx.Delete(BucketUnknownKeys, uk)
	}
	if err != nil {
		return "", err
	}
	// Lock the hold's key, then read the record again: the first read may
	// predate a change made under that lock.
	if err := tx.LockKey(rec.KeyID); err != nil {
		return "", err
	}
	if rec, err = getRecordByHold(tx, holdID); err != nil {
		return "", err
	}
	hold := rec.Hold
	if hold.State != vault.HoldUnknown || rec.UpstreamKey != ev.IdempotencyKey {
		return "", tx.Delete(BucketUnknownKeys, uk) // settled since
	}
	key, err := getKey(tx, rec.KeyID)
	if err != nil && !isNotFound(err) {
		return "", err
	}
	if err != nil || key.Upstream != ev.Upstream {
		return "", nil
	}
	ob, read := ev.Read(key.Policy.EffectiveCurrency())
	if !read {
		return "", nil
	}
	obj, found, err := getObject(tx, rec.KeyID, ev.ObjectID)
	if err != nil {
		return "", err
	}
	var amount int64
	if ob.MovedKnown {
		amount = max(0, ob.Moved-obj.Moved) // obj.Moved is 0 for an object the key never saw
	}
	req := &vault.SettleRequest{
		KeyID: rec.KeyID, IdempotencyKey: rec.Idem, Outcome: vault.SettleCommit, ObjectID: ev.ObjectID,
		Amount: amount, AllowOverrun: true,
		Object: vault.ObjectSettle{
			Created: !found && strings.HasSuffix(hold.Operation, ".create"), Expose: true, Terminal: ob.Terminal,
			Moved: ob.Moved, MovedKnown: ob.MovedKnown, StripeAccount: obj.StripeAccount, StripeContext: obj.StripeContext,
		},
	}
	le := &vault.Event{
		Time: now, KeyID: rec.KeyID, Decision: vault.DecisionResolved, Reason: vault.OperationStripeEvent + ":" + ev.ID,
		StripeRequestID: ev.ID, ObjectID: ev.ObjectID, IdempotencyKey: rec.Idem,
	}
	// No answer is stored: keybrake never saw Stripe's. A retry is told the
	// hold was resolved, as after an operator's resolve.
	rec.Resolved = true
	if err := settleWritesAs(tx, now, req, rec, obj, nil, le); err != nil {
		return "", err
	}
	if err := tx.Delete(BucketUnknownKeys, uk); err != nil {
		return "", err
	}
	return holdID, nil
}

// objectKeysTx lists the keys that count the object, from the index.
func objectKeysTx(tx Tx, objectID string) ([]string, error) {
	prefix := idemKey(objectID, "")
	var out []string
	c := tx.Cursor(BucketObjectKeys)
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		out = append(out, string(k[len(prefix):]))
	}
	slices.Sort(out) // the order keys are locked in
	return out, nil
}

// indexObject notes that keyID counts objectID.
func indexObject(tx Tx, keyID, objectID string) error {
	if err := tx.Put(BucketObjectKeys, idemKey(objectID, keyID), []byte{}); err != nil {
		return fmt.Errorf("index object %s: %w", objectID, err)
	}
	return nil
}

// unindexObject forgets that keyID counts objectID.
func unindexObject(tx Tx, keyID, objectID string) error {
	if err := tx.Delete(BucketObjectKeys, idemKey(objectID, keyID)); err != nil {
		return fmt.Errorf("unindex object %s: %w", objectID, err)
	}
	return nil
}

// indexUnknown notes the upstream idempotency key of a hold that became
// unknown, which a Stripe event may name.
func indexUnknown(tx Tx, h *holdRec) error {
	if err := tx.Put(BucketUnknownKeys, []byte(vault.UpstreamKey(h.KeyID, h.IdempotencyKey)), []byte(h.ID)); err != nil {
		return fmt.Errorf("index unknown hold %s: %w", h.ID, err)
	}
	return nil
}

// judgeStripeEvent removes an event id kept longer than the retention.
func judgeStripeEvent(_ Tx, now time.Time, k, v []byte) (reapVerdict, error) {
	var rec stripeEventRec
	if err := decodeJSON(k, v, &rec); err != nil {
		return reapVerdict{}, err
	}
	if now.Sub(rec.ReceivedAt) <= vault.StripeEventRetention {
		return reapVerdict{}, nil
	}
	return removeEntry("", BucketStripeEvents, k), nil
}

// judgeUnknownKey removes the index entry of a hold that is no longer unknown
// (resolved, retried, or gone).
func judgeUnknownKey(tx Tx, _ time.Time, k, v []byte) (reapVerdict, error) {
	rec, err := getRecordByHold(tx, string(v))
	if isNotFound(err) {
		return removeEntry("", BucketUnknownKeys, k), nil
	}
	if err != nil {
		return reapVerdict{}, err
	}
	if rec.Hold.State == vault.HoldUnknown && rec.UpstreamKey == string(k) {
		return reapVerdict{}, nil
	}
	return removeEntry(rec.KeyID, BucketUnknownKeys, k), nil
}
