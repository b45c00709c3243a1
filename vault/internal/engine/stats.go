package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
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
func (s *Engine) CountHolds(ctx context.Context, state vault.HoldState) (int, error) {
	switch state {
	case vault.HoldHeld, vault.HoldCommitted, vault.HoldReleased, vault.HoldUnknown:
	default:
		return 0, fmt.Errorf("count holds: state %q: %w", state, vault.ErrInvalid)
	}
	want := []byte(state)
	total := 0
	err := s.walkInChunks(ctx, BucketHoldIndex, func(_ Tx, _ time.Time, _, v []byte) error {
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
func (s *Engine) walkInChunks(ctx context.Context, bucket Bucket, visit func(tx Tx, now time.Time, k, v []byte) error) error {
	if err := s.settled(ctx, ""); err != nil {
		return err
	}
	chunk := max(s.countChunk, 1)
	var resume []byte
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		var next []byte
		err := s.view(ctx, func(tx Tx, now time.Time) error {
			c := tx.Cursor(bucket)
			var k, v []byte
			if resume == nil {
				k, v = c.First()
			} else {
				k, v = c.Seek(resume)
			}
			for seen := 0; k != nil; k, v = c.Next() {
				if seen == chunk {
					next = bytes.Clone(k) // a key is valid only inside the transaction
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

// Ping proves the store can commit: it writes a probe (the meta entry
// MetaPing, a new value each time) in a hot-path write transaction (on bbolt
// through the group committer, sharing a batch with concurrent writers; on
// PostgreSQL a READ WRITE transaction, which a standby refuses), so a closed
// store, a stopped committer, a file that can no longer be written or a
// database that cannot take writes fails it. A backend adds what a commit
// cannot show (bbolt: whether its file system has room left, since bbolt
// reuses its free pages without asking for any). Errors: ErrClosed,
// ErrNoSpace, ErrStorage, ctx's error.
func (s *Engine) Ping(ctx context.Context) error {
	probe := binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano()))
	if err := s.submit(ctx, func(tx Tx, _ time.Time) error { return tx.Put(BucketMeta, MetaPing, probe) }); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// SummarizeUsage walks the active keys and their current windows' counters (see
// UsageSummary); a key counts as near its cap in a window when committed + held is
// at least nearCapPercent % of the window's cap. Like CountHolds it reads in
// transactions of a bounded number of keys, so the summary is not one snapshot,
// and its cost grows with the number of keys. It stops with ctx's error when ctx
// ends; ErrInvalid when nearCapPercent is not in 1–100.
func (s *Engine) SummarizeUsage(ctx context.Context, nearCapPercent int) (vault.UsageSummary, error) {
	if nearCapPercent < 1 || nearCapPercent > 100 {
		return vault.UsageSummary{}, fmt.Errorf("summarize usage: percentage %d: %w", nearCapPercent, vault.ErrInvalid)
	}
	sum := vault.UsageSummary{Totals: map[vault.CurrencyWindow]policy.Counter{}, NearCap: map[policy.WindowKind]int{}}
	err := s.walkInChunks(ctx, BucketKeys, func(tx Tx, now time.Time, k, v []byte) error {
		return summarizeKey(tx, now, k, v, nearCapPercent, &sum)
	})
	if err != nil {
		return vault.UsageSummary{}, fmt.Errorf("summarize usage: %w", err)
	}
	return sum, nil
}

// summarizeKey adds the key stored as k, v to sum when it is active.
func summarizeKey(tx Tx, now time.Time, k, v []byte, pct int, sum *vault.UsageSummary) error {
	var rec keyRec
	if err := decodeJSON(k, v, &rec); err != nil {
		return err
	}
	if (&vault.Key{Status: rec.Status, Policy: rec.Policy}).StatusAt(now) != vault.KeyActive {
		return nil
	}
	windows, err := keyWindows(tx, &rec, now)
	if err != nil {
		return err
	}
	usage, err := readUsage(tx, rec.ID, windows)
	if err != nil {
		return err
	}
	sum.ActiveKeys++
	cur := rec.Policy.EffectiveCurrency()
	for _, w := range windows {
		cnt := usage[w.ID]
		cw := vault.CurrencyWindow{Currency: cur, Window: w.Kind}
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
