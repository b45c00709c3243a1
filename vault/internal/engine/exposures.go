package engine

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// A key's money objects as an operator sees them: the objects with live
// exposure (ListExposures), Stripe's answer about one applied at an operator's
// request (RefreshExposure), and an operator's release without Stripe's word
// (ReleaseExposure). See "The metering model" in docs/ARCHITECTURE.md.

// Audit actions, which are also the operation of the ledger events they write.
const (
	actionRefreshExposure = "exposure.refresh"
	actionReleaseExposure = "exposure.release"
)

// ListExposures lists the money objects keyID has live exposure on, by object
// id, in one read transaction. ErrNotFound for no such key, ErrInvalid for a
// malformed cursor (the id of the last object of the previous page).
func (s *Engine) ListExposures(ctx context.Context, keyID string, limit int, cursor string) ([]vault.ExposedObject, string, error) {
	var (
		out  []vault.ExposedObject
		next string
	)
	err := s.viewSettled(ctx, keyID, func(tx Tx, now time.Time) error {
		if _, err := getKey(tx, keyID); err != nil {
			return err
		}
		var err error
		out, next, err = listExposuresTx(tx, keyID, limit, cursor)
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list exposures: %w", err)
	}
	return out, next, nil
}

// listExposuresTx walks the key's objects in key order from after cursor,
// skipping those without live exposure, for one page.
func listExposuresTx(tx Tx, keyID string, limit int, cursor string) ([]vault.ExposedObject, string, error) {
	limit = clampLimit(limit)
	prefix := idemKey(keyID, "")
	seek := prefix
	if cursor != "" {
		after, err := decodeCursor(cursor)
		if err != nil {
			return nil, "", err
		}
		seek = append(idemKey(keyID, after), 0) // the first key after it
	}
	out := []vault.ExposedObject{}
	c := tx.Cursor(BucketObjects)
	for k, v := c.Seek(seek); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		o, err := decodeObject(k, v)
		if err != nil {
			return nil, "", err
		}
		if len(o.Parts) == 0 {
			continue
		}
		if len(out) == limit {
			return out, encodeCursor(out[len(out)-1].ObjectID), nil
		}
		out = append(out, o.exposed(string(k[len(prefix):])))
	}
	return out, "", nil
}

// exposed is the object as vault.ExposedObject shows it.
func (o *objectRec) exposed(objectID string) vault.ExposedObject {
	e := vault.ExposedObject{ObjectID: objectID, Currency: o.Currency, Exposure: o.public(), CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt}
	at := map[policy.WindowID]int{}
	for _, p := range o.Parts {
		for _, w := range p.WindowIDs {
			i, ok := at[w]
			if !ok {
				i = len(e.Windows)
				at[w] = i
				e.Windows = append(e.Windows, vault.WindowAmount{WindowID: w})
			}
			e.Windows[i].Amount += p.Amount
		}
		if o.CreatedAt.IsZero() && (e.CreatedAt.IsZero() || p.CreatedAt.Before(e.CreatedAt)) {
			// A record written before CreatedAt was kept: its oldest live part.
			e.CreatedAt = p.CreatedAt
		}
	}
	return e
}

// exposureAudit is what the audit log keeps of a money object: snake_case,
// minor units.
type exposureAudit struct {
	ObjectID  string `json:"object_id"`
	Currency  string `json:"currency,omitempty"`
	Held      int64  `json:"held"`
	Committed int64  `json:"committed"`
	Moved     int64  `json:"moved,omitempty"`
	Closed    bool   `json:"closed,omitempty"`
}

func auditOf(e vault.ExposedObject) exposureAudit {
	return exposureAudit{ObjectID: e.ObjectID, Currency: e.Currency, Held: e.Held, Committed: e.Committed, Moved: e.Moved, Closed: e.Closed}
}

// changeExposure runs fn on keyID's record of objectID in one admin write
// transaction, after locking the key, and writes the audit entry action with
// the object before and after. fn changes the record and books what it did
// on the windows and in the ledger.
func (s *Engine) changeExposure(ctx context.Context, actor, action, keyID, objectID string,
	fn func(tx Tx, now time.Time, o *objectRec, res *vault.ExposureChange) error) (vault.ExposureChange, error) {
	if keyID == "" || objectID == "" {
		return vault.ExposureChange{}, fmt.Errorf("%s: an empty key or object id: %w", action, vault.ErrInvalid)
	}
	var res vault.ExposureChange
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		res = vault.ExposureChange{} // a re-run starts over
		if err := tx.LockKey(keyID); err != nil {
			return err
		}
		if _, err := getKey(tx, keyID); err != nil {
			return err
		}
		o, ok, err := getObject(tx, keyID, objectID)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("key %s has counted no money object %q: %w", keyID, objectID, vault.ErrNotFound)
		}
		res.Before = o.exposed(objectID)
		if err := fn(tx, now, o, &res); err != nil {
			return err
		}
		res.After = o.exposed(objectID)
		return putAudit(tx, now, actor, action, keyID, auditOf(res.Before), auditOf(res.After))
	})
	if err != nil {
		return vault.ExposureChange{}, fmt.Errorf("%s %s: %w", action, objectID, err)
	}
	return res, nil
}

// RefreshExposure applies Stripe's answer about a money object, read at an
// operator's request, to keyID's exposure on it as ObserveObject does, with
// the audit entry (see vault.Store).
func (s *Engine) RefreshExposure(ctx context.Context, actor, keyID, objectID string, ob vault.Observation) (vault.ExposureChange, error) {
	if ob.Moved < 0 {
		return vault.ExposureChange{}, fmt.Errorf("%s: a negative amount moved: %w", actionRefreshExposure, vault.ErrInvalid)
	}
	return s.changeExposure(ctx, actor, actionRefreshExposure, keyID, objectID,
		func(tx Tx, now time.Time, o *objectRec, res *vault.ExposureChange) error {
			if len(o.Parts) == 0 {
				return nil // no live exposure: nothing to apply it to (as ObserveObject)
			}
			changes := o.observe(ob)
			if len(changes) == 0 {
				return nil
			}
			for _, ch := range changes {
				res.Committed += ch.committed
				res.Released += ch.released
			}
			return writeObjectChanges(tx, now, keyID, objectID, actionRefreshExposure, o, changes)
		})
}

// ReleaseExposure releases keyID's exposure on a money object by an operator's
// decision, without Stripe's word (see vault.Store): like ResolveHold, each
// part's event is "resolved" with reason "operator:released".
func (s *Engine) ReleaseExposure(ctx context.Context, actor, keyID, objectID string) (vault.ExposureChange, error) {
	return s.changeExposure(ctx, actor, actionReleaseExposure, keyID, objectID,
		func(tx Tx, now time.Time, o *objectRec, res *vault.ExposureChange) error {
			if len(o.Parts) == 0 {
				return fmt.Errorf("no exposure is left on %s: %w", objectID, vault.ErrConflict)
			}
			for _, ch := range o.releaseAll() {
				p := ch.part
				if err := addToWindows(tx, keyID, p.WindowIDs, -p.Amount, 0, 0); err != nil {
					return err
				}
				err := putEvent(tx, &vault.Event{
					Time: now, KeyID: keyID, Operation: actionReleaseExposure, Amount: p.Amount, Currency: o.Currency,
					Decision: vault.DecisionResolved, Reason: "operator:" + string(vault.HoldReleased), HoldID: p.HoldID,
					ObjectID: objectID, WindowIDs: p.WindowIDs, HeldDelta: -p.Amount,
				})
				if err != nil {
					return err
				}
				res.Released += p.Amount
			}
			o.UpdatedAt = now
			return putObject(tx, keyID, objectID, o)
		})
}
