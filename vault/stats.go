package vault

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/policy"
)

// holdCountChunk bounds the entries one read transaction of CountHolds and
// SummarizeUsage looks at. A long read transaction keeps bbolt from remapping a
// growing file, which stalls every writer; chunks of this size take well under a
// millisecond.
const holdCountChunk = 10000

// CountHolds counts the holds in state (HoldHeld, HoldCommitted, HoldReleased or
// HoldUnknown; ErrInvalid for another). Its cost grows with the hold index, which
// keeps every unsettled hold and the settled ones until the reaper removes them
// with their records (IdempotencyTTL after completion). It walks the index in read
// transactions of a bounded number of entries, so no transaction is long; the
// count is therefore not one snapshot: a hold that changes state during the walk
// counts in the state it had when its entry was read. It stops with ctx's error
// when ctx ends.
func (s *Store) CountHolds(ctx context.Context, state HoldState) (int, error) {
	switch state {
	case HoldHeld, HoldCommitted, HoldReleased, HoldUnknown:
	default:
		return 0, fmt.Errorf("count holds: state %q: %w", state, ErrInvalid)
	}
	want := []byte(state)
	total := 0
	err := s.walkInChunks(ctx, bucketHoldIndex, func(_ *bolt.Tx, _ time.Time, _, v []byte) error {
		if bytes.Equal(v, want) {
			total++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("count holds: %w", err)
	}
	return total, nil
}

// walkInChunks calls visit for every entry of bucket, in key order, in read
// transactions of at most countChunk entries each (see holdCountChunk); now is
// the store clock of the entry's transaction. It stops with ctx's error when ctx
// ends, and with visit's.
func (s *Store) walkInChunks(ctx context.Context, bucket []byte, visit func(tx *bolt.Tx, now time.Time, k, v []byte) error) error {
	chunk := max(s.countChunk, 1)
	var resume []byte
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		var next []byte
		err := s.view(func(tx *bolt.Tx, now time.Time) error {
			c := tx.Bucket(bucket).Cursor()
			var k, v []byte
			if resume == nil {
				k, v = c.First()
			} else {
				k, v = c.Seek(resume)
			}
			for seen := 0; k != nil; k, v = c.Next() {
				if seen == chunk {
					next = bytes.Clone(k) // bbolt's key is valid only inside the transaction
					return nil
				}
				seen++
				if err := visit(tx, now, k, v); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil || next == nil {
			return err
		}
		resume = next
	}
}

// Ping proves the store can write: it runs an empty write transaction through the
// group committer (which bbolt commits with its fsyncs), so a closed store, a
// stopped committer or a file that can no longer be written fails it. It shares
// a batch with concurrent writers. Errors: ErrClosed, ErrStorage, ctx's error.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.submit(ctx, func(*bolt.Tx, time.Time) error { return nil }); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// Size is the size of the database file in bytes: what it takes on disk (bbolt
// grows the file ahead of its data and never shrinks it). ErrClosed after Close.
func (s *Store) Size(ctx context.Context) (int64, error) {
	if s.isClosed() {
		return 0, fmt.Errorf("size: %w", ErrClosed)
	}
	fi, err := os.Stat(s.db.Path())
	if err != nil {
		return 0, fmt.Errorf("size: %w: %s", ErrStorage, err.Error())
	}
	return fi.Size(), nil
}

// isClosed reports whether Close has been called.
func (s *Store) isClosed() bool {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	return s.closed
}

// CurrencyWindow names one total of a UsageSummary: a currency and a window kind.
type CurrencyWindow struct {
	Currency string
	Window   policy.WindowKind
}

// UsageSummary is the money in the current windows of the active keys, summed per
// currency and window kind, and how many keys are close to a cap. It names no
// key, so it can be exposed as metrics of bounded cardinality.
type UsageSummary struct {
	// ActiveKeys counts the keys that are neither revoked nor expired.
	ActiveKeys int
	// Totals sums each active key's counters of its current daily window (today
	// in its time zone) and of its period window, in minor units of the currency.
	Totals map[CurrencyWindow]policy.Counter
	// NearCap counts, per window kind, the active keys whose committed + held in
	// that window has reached the given percentage of its cap.
	NearCap map[policy.WindowKind]int
}

// SummarizeUsage walks the active keys and their current windows' counters (see
// UsageSummary); a key counts as near its cap in a window when committed + held is
// at least nearCapPercent % of the window's cap. Like CountHolds it reads in
// transactions of a bounded number of keys, so the summary is not one snapshot,
// and its cost grows with the number of keys. It stops with ctx's error when ctx
// ends; ErrInvalid when nearCapPercent is not in 1–100.
func (s *Store) SummarizeUsage(ctx context.Context, nearCapPercent int) (UsageSummary, error) {
	if nearCapPercent < 1 || nearCapPercent > 100 {
		return UsageSummary{}, fmt.Errorf("summarize usage: percentage %d: %w", nearCapPercent, ErrInvalid)
	}
	sum := UsageSummary{Totals: map[CurrencyWindow]policy.Counter{}, NearCap: map[policy.WindowKind]int{}}
	err := s.walkInChunks(ctx, bucketKeys, func(tx *bolt.Tx, now time.Time, k, v []byte) error {
		return summarizeKey(tx, now, k, v, nearCapPercent, &sum)
	})
	if err != nil {
		return UsageSummary{}, fmt.Errorf("summarize usage: %w", err)
	}
	return sum, nil
}

// summarizeKey adds the key stored as k, v to sum when it is active.
func summarizeKey(tx *bolt.Tx, now time.Time, k, v []byte, pct int, sum *UsageSummary) error {
	var rec keyRec
	if err := decodeJSON(k, v, &rec); err != nil {
		return err
	}
	if (&Key{Status: rec.Status, Policy: rec.Policy}).StatusAt(now) != KeyActive {
		return nil
	}
	windows, err := rec.Policy.Windows(now)
	if err != nil {
		return fmt.Errorf("key %s windows: %w", rec.ID, err)
	}
	usage, err := readUsage(tx, rec.ID, windows)
	if err != nil {
		return err
	}
	sum.ActiveKeys++
	cur := rec.Policy.EffectiveCurrency()
	for _, w := range windows {
		cnt := usage[w.ID]
		cw := CurrencyWindow{Currency: cur, Window: w.Kind}
		t := sum.Totals[cw]
		t.Committed += cnt.Committed
		t.Held += cnt.Held
		sum.Totals[cw] = t
		if w.HasCap && reachedPercent(cnt.Committed+cnt.Held, w.Cap, pct) {
			sum.NearCap[w.Kind]++
		}
	}
	return nil
}

// reachedPercent reports whether used >= pct % of limit, in integers that cannot
// overflow for any limit (used*100 could): with limit = 100q + r, pct % of it is
// q*pct + r*pct/100, and used is an integer, so the fraction rounds up.
func reachedPercent(used, limit int64, pct int) bool {
	p := int64(pct)
	return used >= (limit/100)*p+((limit%100)*p+99)/100
}
