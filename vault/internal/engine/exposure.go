package engine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// Money objects: a Stripe object that can move money after the request that made
// it (a PaymentIntent confirmed later, an authorisation captured in pieces, a
// Checkout Session paid in a browser, an invoice Stripe collects by itself) keeps
// what a key counted for it and has not yet seen move as live exposure: parts,
// each held on the windows its request was placed on, exactly like a hold. A
// commit against the object takes from its parts first (oldest first), so money
// that moves later is not counted twice; an answer that proves the object can move
// no more money releases them. See "The metering model" in docs/ARCHITECTURE.md.

// objectRec is what one key has metered for one Stripe object.
type objectRec struct {
	// Amount is the money committed for the object through the key (minor units).
	Amount int64 `json:"amount"`
	// Parts are the object's live exposure, oldest first.
	Parts []exposurePart `json:"parts,omitempty"`
	// Moved is the object's cumulative money moved as Stripe last reported it in an
	// answer to this key (amount_received, amount_captured, amount_paid, …);
	// MovedSeen says whether any answer reported it.
	Moved     int64 `json:"moved,omitempty"`
	MovedSeen bool  `json:"moved_seen,omitempty"`
	// Own is set when a request of this key created the object.
	Own bool `json:"own,omitempty"`
	// Closed is set when an answer proved that the object can move no more money.
	Closed   bool   `json:"closed,omitempty"`
	Currency string `json:"cur,omitempty"`
	// StripeAccount and StripeContext are the headers Stripe last answered for
	// the object under (vault.Exposure).
	StripeAccount string `json:"acct,omitempty"`
	StripeContext string `json:"sctx,omitempty"`
	// CreatedAt is when the key first counted the object (zero in records
	// written before it was kept).
	CreatedAt time.Time `json:"created_at,omitzero"`
	UpdatedAt time.Time `json:"updated_at"`
}

// exposurePart is exposure placed by one hold, on that hold's windows.
type exposurePart struct {
	HoldID    string            `json:"h"`
	WindowIDs []policy.WindowID `json:"w"`
	Amount    int64             `json:"amt"`
	CreatedAt time.Time         `json:"c"`
}

// held is the object's live exposure.
func (o *objectRec) held() int64 {
	var n int64
	for _, p := range o.Parts {
		n += p.Amount
	}
	return n
}

// partChange is what a commit or release did to one part.
type partChange struct {
	part      exposurePart // the part as it was
	committed int64
	released  int64
}

// commit takes amount (at most held()) from the parts, oldest first.
func (o *objectRec) commit(amount int64) []partChange {
	var out []partChange
	keep := o.Parts[:0]
	for _, p := range o.Parts {
		take := min(amount, p.Amount)
		amount -= take
		if take > 0 {
			out = append(out, partChange{part: p, committed: take})
			p.Amount -= take
		}
		if p.Amount > 0 {
			keep = append(keep, p)
		}
	}
	o.Parts = keep
	return out
}

// releaseAll releases every part.
func (o *objectRec) releaseAll() []partChange {
	out := make([]partChange, 0, len(o.Parts))
	for _, p := range o.Parts {
		out = append(out, partChange{part: p, released: p.Amount})
	}
	o.Parts = nil
	return out
}

// addPart adds exposure on windowIDs, merged into an existing part on the same
// windows.
func (o *objectRec) addPart(holdID string, windowIDs []policy.WindowID, amount int64, now time.Time) {
	if amount <= 0 {
		return
	}
	for i := range o.Parts {
		if slices.Equal(o.Parts[i].WindowIDs, windowIDs) {
			o.Parts[i].Amount += amount
			return
		}
	}
	o.Parts = append(o.Parts, exposurePart{HoldID: holdID, WindowIDs: slices.Clone(windowIDs), Amount: amount, CreatedAt: now})
}

// getObject reads a money object's record; a missing one is an empty record
// and ok false.
func getObject(tx Tx, keyID, objectID string) (*objectRec, bool, error) {
	k := idemKey(keyID, objectID)
	v, err := tx.Get(BucketObjects, k)
	if err != nil || v == nil {
		return &objectRec{}, false, err
	}
	o, err := decodeObject(k, v)
	return o, err == nil, err
}

func putObject(tx Tx, keyID, objectID string, o *objectRec) error {
	if err := tx.Put(BucketObjects, idemKey(keyID, objectID), encodeObject(o)); err != nil {
		return fmt.Errorf("put object %s: %w", objectID, err)
	}
	return nil
}

// applyPartChanges books part changes on their windows and writes one ledger
// event per change and kind (decision "exposure", reason "commit" or "release").
func applyPartChanges(tx Tx, now time.Time, keyID, objectID, operation, currency string, changes []partChange) error {
	return applyPartChangesBy(tx, now, keyID, objectID, operation, "", currency, changes)
}

// applyPartChangesBy is applyPartChanges with the ledger events naming what at
// Stripe caused them (a Stripe event's id) in StripeRequestID.
func applyPartChangesBy(tx Tx, now time.Time, keyID, objectID, operation, stripeID, currency string, changes []partChange) error {
	for _, ch := range changes {
		if err := addToWindows(tx, keyID, ch.part.WindowIDs, -(ch.committed + ch.released), ch.committed, 0); err != nil {
			return err
		}
		for _, e := range [...]struct {
			reason string
			amount int64
		}{{"commit", ch.committed}, {"release", ch.released}} {
			if e.amount == 0 {
				continue
			}
			ev := &vault.Event{
				Time: now, KeyID: keyID, Operation: operation, Amount: e.amount, Currency: currency,
				Decision: vault.DecisionExposure, Reason: e.reason, HoldID: ch.part.HoldID, ObjectID: objectID,
				WindowIDs: ch.part.WindowIDs, HeldDelta: -e.amount, StripeRequestID: stripeID,
			}
			if e.reason == "commit" {
				ev.CommittedDelta = e.amount
			}
			if err := putEvent(tx, ev); err != nil {
				return err
			}
		}
	}
	return nil
}

// ObjectExposure returns what keyID has counted for the Stripe object objectID;
// ok is false when the key never metered anything for it (or its record was
// reaped).
func (s *Engine) ObjectExposure(ctx context.Context, keyID, objectID string) (exp vault.Exposure, ok bool, err error) {
	err = s.viewSettled(ctx, keyID, func(tx Tx, now time.Time) error {
		var o *objectRec
		o, ok, err = getObject(tx, keyID, objectID)
		if ok {
			exp = o.public()
		}
		return err
	})
	if err != nil {
		return vault.Exposure{}, false, fmt.Errorf("object exposure: %w", err)
	}
	return exp, ok, nil
}

func (o *objectRec) public() vault.Exposure {
	return vault.Exposure{Held: o.held(), Committed: o.Amount, Moved: o.Moved, MovedSeen: o.MovedSeen, Own: o.Own, Closed: o.Closed,
		StripeAccount: o.StripeAccount, StripeContext: o.StripeContext}
}

// ObserveObject applies a Stripe answer about a money object to the key's live
// exposure on it: money the object moved since the last answer the key saw is
// committed from the exposure (never more than the exposure: what moved beyond it
// was not this key's to count), and a terminal answer releases the rest. It
// returns whether anything changed; an object without live exposure is left alone
// (one read transaction, no write). ErrInvalid for an empty key or object id.
func (s *Engine) ObserveObject(ctx context.Context, keyID, objectID string, ob vault.Observation) (bool, error) {
	if keyID == "" || objectID == "" || ob.Moved < 0 {
		return false, fmt.Errorf("observe object: %w", vault.ErrInvalid)
	}
	exp, ok, err := s.ObjectExposure(ctx, keyID, objectID)
	if err != nil || !ok || exp.Held == 0 {
		return false, err
	}
	var changed bool
	err = s.submit(ctx, func(tx Tx, now time.Time) error {
		changed = false // a re-run starts over
		if err := tx.LockKey(keyID); err != nil {
			return err
		}
		o, ok, err := getObject(tx, keyID, objectID)
		if err != nil || !ok || len(o.Parts) == 0 {
			return err
		}
		changes := o.observe(ob)
		if len(changes) == 0 {
			return nil
		}
		changed = true
		return writeObjectChanges(tx, now, keyID, objectID, ob.Operation, o, changes)
	})
	if err != nil {
		return false, fmt.Errorf("observe object: %w", err)
	}
	return changed, nil
}

// observe applies ob to the object's exposure (see ObserveObject) and returns
// the part changes it made; nothing is written.
func (o *objectRec) observe(ob vault.Observation) []partChange {
	var changes []partChange
	if ob.MovedKnown {
		if moved := ob.Moved - o.Moved; moved > 0 {
			c := min(moved, o.held())
			changes = append(changes, o.commit(c)...)
			o.Amount += c
		}
		o.Moved, o.MovedSeen = max(o.Moved, ob.Moved), true
	}
	if ob.Terminal {
		changes = append(changes, o.releaseAll()...)
		o.Closed = true
	}
	return changes
}

// writeObjectChanges writes the object o, changed by changes, and books them
// (applyPartChanges).
func writeObjectChanges(tx Tx, now time.Time, keyID, objectID, operation string, o *objectRec, changes []partChange) error {
	o.UpdatedAt = now
	if err := putObject(tx, keyID, objectID, o); err != nil {
		return err
	}
	return applyPartChanges(tx, now, keyID, objectID, operation, o.Currency, changes)
}
