package engine

import (
	"context"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// This file is for tests only: the conformance suite (vault/vaulttest) and the
// backends' own tests reach the engine's records through it, whichever
// backend stores them, to look at what the contract does not show and to
// corrupt a store on purpose. Nothing else uses it.

// Update runs fn in one write transaction of e's backend.
func Update(e *Engine, ctx context.Context, fn TxFunc) error { return e.update(ctx, fn) }

// View runs fn in one read transaction of e's backend, after every queued
// settle.
func View(e *Engine, ctx context.Context, fn TxFunc) error { return e.viewSettled(ctx, "", fn) }

// Counter is a window's counter as stored.
type Counter = counter

// GetCounter reads a counter; ok is false when there is none.
func GetCounter(tx Tx, keyID string, windowID policy.WindowID) (c Counter, ok bool, err error) {
	return getCounter(tx, keyID, windowID)
}

// PutCounter writes a counter.
func PutCounter(tx Tx, keyID string, windowID policy.WindowID, c Counter) error {
	return putCounter(tx, keyID, windowID, c)
}

// AddToWindows moves money on a hold's windows.
func AddToWindows(tx Tx, keyID string, windowIDs []policy.WindowID, held, committed, allowance int64) error {
	return addToWindows(tx, keyID, windowIDs, held, committed, allowance)
}

// Record is an idempotency record as stored, HoldRec its hold.
type (
	Record  = recordRec
	HoldRec = holdRec
)

// RecordKey is the idem bucket key of (keyID, idem).
func RecordKey(keyID, idem string) []byte { return recordKey(keyID, idem) }

// RawRecord returns the stored value of the record of (keyID, idem), wherever
// it lives (see recordRec), and whether it was appended; nil when there is
// none.
func RawRecord(tx Tx, keyID, idem string) (v []byte, appended bool, err error) {
	v, err = tx.Get(BucketIdem, recordKey(keyID, idem))
	if err != nil || len(v) != seqLen {
		return v, false, err
	}
	v, err = tx.Get(BucketRecords, v)
	return v, true, err
}

// GetRecord reads the record of (keyID, idem), nil when there is none.
func GetRecord(tx Tx, keyID, idem string) (*Record, error) { return getRecord(tx, keyID, idem) }

// PutRecord writes a record and its hold's index entry.
func PutRecord(tx Tx, r *Record) error { return putRecord(tx, r) }

// HoldIndexKey is the hold index key of h.
func HoldIndexKey(h *HoldRec) []byte { return holdIndexKey(h) }

// PutEvent appends an event to its key's ledger.
func PutEvent(tx Tx, e *vault.Event) error { return putEvent(tx, e) }

// SealResponse seals a response for storage in a record of (keyID, idem).
func SealResponse(e *Engine, keyID, idem string, resp *vault.StoredResponse) (*responseRec, error) {
	return e.sealResponse(keyID, idem, resp)
}

// Object is what a key counts on a money object, as stored.
type Object = objectRec

// GetObject reads a money object's record; ok is false when there is none.
func GetObject(tx Tx, keyID, objectID string) (*Object, bool, error) {
	return getObject(tx, keyID, objectID)
}

// PutObject writes a money object's record.
func PutObject(tx Tx, keyID, objectID string, o *Object) error {
	if err := putObject(tx, keyID, objectID, o); err != nil {
		return err
	}
	return indexObject(tx, keyID, objectID)
}

// AddPart adds exposure to o.
func AddPart(o *Object, holdID string, windowIDs []policy.WindowID, amount int64, now time.Time) {
	o.addPart(holdID, windowIDs, amount, now)
}

// ClaimKey is the claims bucket key of a claim.
func ClaimKey(keyID, key string) []byte { return idemKey(keyID, key) }

// RecordStates counts the idempotency records by state.
func RecordStates(e *Engine, ctx context.Context) (map[vault.RecordState]int, error) {
	out := map[vault.RecordState]int{}
	err := e.viewSettled(ctx, "", func(tx Tx, _ time.Time) error {
		clear(out)
		return forEachRecord(tx, func(_ []byte, r *recordRec) error {
			out[r.State]++
			return nil
		})
	})
	return out, err
}

// AllHolds returns every hold, by id.
func AllHolds(e *Engine, ctx context.Context) (map[string]vault.Hold, error) {
	out := map[string]vault.Hold{}
	err := e.viewSettled(ctx, "", func(tx Tx, _ time.Time) error {
		clear(out)
		return forEachRecord(tx, func(_ []byte, r *recordRec) error {
			if r.Hold != nil {
				out[r.Hold.ID] = r.Hold.public()
			}
			return nil
		})
	})
	return out, err
}

// AllCounters returns every counter, by bucket key (key id "/" window id).
func AllCounters(e *Engine, ctx context.Context) (map[string]Counter, error) {
	out := map[string]Counter{}
	err := e.viewSettled(ctx, "", func(tx Tx, _ time.Time) error {
		clear(out)
		return forEach(tx, BucketCounters, func(k, v []byte) error {
			c, err := decodeCounter(v)
			out[string(k)] = c
			return err
		})
	})
	return out, err
}

// SetReapBatch sets the most changes one reaper transaction makes.
func SetReapBatch(e *Engine, n int) { e.reapBatch = n }

// SetCountChunk sets the most entries one read transaction of CountHolds and
// SummarizeUsage looks at.
func SetCountChunk(e *Engine, n int) { e.countChunk = n }

// ReserveInTwoTransactions is a broken Reserve, for the mutation test: it
// decides in one transaction and writes in another, calling between in
// between — the check-then-write race the model test must catch.
func ReserveInTwoTransactions(e *Engine, ctx context.Context, req vault.ReserveRequest, between func()) (vault.ReserveResult, error) {
	var pl *reservePlan
	err := e.view(ctx, func(tx Tx, now time.Time) error {
		var err error
		pk := newPairKeys(req.KeyID, req.IdempotencyKey)
		pl, err = e.planReserve(tx, now, &req, &pk)
		return err
	})
	if err != nil {
		return vault.ReserveResult{}, err
	}
	between()
	err = e.submit(ctx, func(tx Tx, _ time.Time) error {
		// The write itself takes the key's lock, as every writer of a key's
		// counters does: the mutant's only fault is the split, not a lost
		// update, which a concurrent settle's write could otherwise undo —
		// hiding the very excess the model looks for.
		if err := tx.LockKey(req.KeyID); err != nil {
			return err
		}
		if pl.newHold { // the hold is added to the counters as they are now
			var err error
			if pl.counters, err = getCounters(tx, pl.record.KeyID, windowIDs(pl.windows)); err != nil {
				return err
			}
		}
		return pl.apply(tx)
	})
	if err != nil {
		return vault.ReserveResult{}, err
	}
	return pl.res.val, pl.res.err
}

// ReapCountingTransactions reaps like Reap and also returns how many write
// transactions it took.
func ReapCountingTransactions(e *Engine, ctx context.Context) (removed, txs int, err error) {
	c, err := e.reap(ctx)
	return c.removed, c.txs, err
}

// KeyRec is a vault key as stored.
type KeyRec = keyRec

// PutKey writes a key record (not its name or token index entries).
func PutKey(tx Tx, r *KeyRec) error { return putKey(tx, r) }

// ReserveTx runs one Reserve in tx: its result, the domain error that turned it
// down before any write, and the failure that must roll tx back.
func ReserveTx(e *Engine, tx Tx, now time.Time, req vault.ReserveRequest) (res vault.ReserveResult, turnedDown, failure error) {
	pk := newPairKeys(req.KeyID, req.IdempotencyKey)
	r, err := e.reserveTx(tx, now, &req, &pk)
	return r.val, r.err, err
}

// StoredResponse returns the answer stored in the record of (keyID, idem),
// unsealed: nil without a record or an answer.
func StoredResponse(e *Engine, ctx context.Context, keyID, idem string) (*vault.StoredResponse, error) {
	var out *vault.StoredResponse
	err := e.viewSettled(ctx, "", func(tx Tx, _ time.Time) error {
		rec, err := getRecord(tx, keyID, idem)
		if err != nil || rec == nil {
			return err
		}
		pub, err := e.publicRecord(rec)
		out = pub.Response
		return err
	})
	return out, err
}
