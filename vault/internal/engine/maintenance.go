package engine

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/keybrake/keybrake/vault"
)

const (
	// reapBatchSize bounds the changes of one reaper transaction, so the reaper
	// never holds the writer (or a key's lock) for long.
	reapBatchSize = 1000
	// reapScan bounds the entries one reaper transaction looks at.
	reapScan = 20000
	// counterGrace is how long after its day ended a daily counter is kept.
	counterGrace = 48 * time.Hour
)

// reapVerdict is what the reaper does with one entry: nothing (apply nil), or
// apply, which removes it (removes) or rewrites it.
type reapVerdict struct {
	// owner is the vault key whose lock guards the entry.
	owner   string
	apply   func(tx Tx) error
	removes bool
}

// reapPass is one kind of garbage: a bucket and the judge of its entries.
type reapPass struct {
	bucket Bucket
	judge  func(tx Tx, now time.Time, k, v []byte) (reapVerdict, error)
}

// reapCount is what the reaper did: entries removed, in-flight records whose
// lease lapsed turned unknown, and the write transactions it took.
type reapCount struct {
	removed, recovered, txs int
}

// reap runs every pass.
func (s *Engine) reap(ctx context.Context) (reapCount, error) {
	return s.runPasses(ctx, []reapPass{
		{bucket: BucketIdem, judge: s.judgeRecord},
		{bucket: BucketCounters, judge: judgeCounter},
		{bucket: BucketObjects, judge: judgeObject},
		{bucket: BucketClaims, judge: s.judgeClaim}, // claims.go
	})
}

// RecoverLapsed turns in-progress records whose lease lapsed into outcome
// unknown, keeping their holds (see recoverRecord), and returns how many. It
// leaves live leases alone: on a store that several processes share, they are
// other processes' requests in flight.
func (s *Engine) RecoverLapsed(ctx context.Context) (int, error) {
	c, err := s.runPasses(ctx, []reapPass{{bucket: BucketIdem, judge: func(tx Tx, now time.Time, k, v []byte) (reapVerdict, error) {
		verdict, err := s.judgeRecord(tx, now, k, v)
		if verdict.removes {
			verdict.apply = nil
		}
		return verdict, err
	}}})
	return c.recovered, err
}

func (s *Engine) runPasses(ctx context.Context, passes []reapPass) (reapCount, error) {
	var total reapCount
	for _, p := range passes {
		var resume []byte
		for {
			if err := ctx.Err(); err != nil {
				return total, err
			}
			var (
				c    reapCount
				next []byte
			)
			err := s.update(ctx, func(tx Tx, now time.Time) error {
				var err error
				c, next, err = reapOnce(tx, now, p, resume, s.reapBatch) // a re-run starts over from resume
				return err
			})
			total.txs++
			if err != nil {
				return total, fmt.Errorf("reap %s: %w", p.bucket.Name(), err)
			}
			total.removed += c.removed
			total.recovered += c.recovered
			if next == nil {
				break
			}
			resume = next
		}
	}
	if total.recovered > 0 {
		s.log.Warn("in-flight requests whose lease lapsed are now outcome unknown: their process is gone", "records", total.recovered)
	}
	return total, nil
}

// reapOnce scans from resume, then changes at most batch entries the pass
// judges. Each is judged again, with its current value, once its key is
// locked: where several processes share the store, another may have changed it
// since the scan read it. It returns where to resume, nil at the end of the
// bucket.
func reapOnce(tx Tx, now time.Time, p reapPass, resume []byte, batch int) (reapCount, []byte, error) {
	c := tx.Cursor(p.bucket)
	var k, v []byte
	if resume == nil {
		k, v = c.First()
	} else {
		k, v = c.Seek(resume)
	}
	type candidate struct {
		k     []byte
		owner string
	}
	var found []candidate
	scanned := 0
	for ; k != nil; k, v = c.Next() {
		if len(found) == batch || scanned == reapScan {
			break
		}
		scanned++
		verdict, err := p.judge(tx, now, k, v)
		if err != nil {
			return reapCount{}, nil, err
		}
		if verdict.apply != nil {
			found = append(found, candidate{k: bytes.Clone(k), owner: verdict.owner})
		}
	}
	next := bytes.Clone(k) // nil at the end of the bucket
	var count reapCount
	for _, cand := range found {
		if err := tx.LockKey(cand.owner); err != nil {
			return reapCount{}, nil, err
		}
		v, err := tx.Get(p.bucket, cand.k)
		if err != nil {
			return reapCount{}, nil, err
		}
		if v == nil {
			continue // gone since the scan
		}
		verdict, err := p.judge(tx, now, cand.k, v)
		if err != nil {
			return reapCount{}, nil, err
		}
		if verdict.apply == nil {
			continue
		}
		if err := verdict.apply(tx); err != nil {
			return reapCount{}, nil, err
		}
		if verdict.removes {
			count.removed++
		} else {
			count.recovered++
		}
	}
	return count, next, nil
}

// removeEntry is the verdict that removes the entry k of b.
func removeEntry(owner string, b Bucket, k []byte) reapVerdict {
	k = bytes.Clone(k)
	return reapVerdict{owner: owner, removes: true, apply: func(tx Tx) error {
		if err := tx.Delete(b, k); err != nil {
			return fmt.Errorf("delete %q: %w", k, err)
		}
		return nil
	}}
}

// judgeRecord judges an idempotency record. It removes completed records whose
// replay window (IdempotencyTTL from completion) has passed, with their
// settled hold (and its index entry). In-progress and unknown records are never
// removed: their holds are live money. Nor are records an operator resolved:
// like the unknown record they were, they are kept for good, so that a caller
// still retrying the key days later is told it was resolved instead of moving
// the money again as a new request. An in-progress record whose lease lapsed
// becomes unknown (recoverRecord): its process is gone.
func (s *Engine) judgeRecord(_ Tx, now time.Time, k, v []byte) (reapVerdict, error) {
	r, err := decodeRecord(k, v)
	if err != nil {
		return reapVerdict{}, err
	}
	if r.State == vault.RecordInProgress && !now.Before(r.LeaseUntil) {
		return reapVerdict{owner: r.KeyID, apply: func(tx Tx) error { return recoverRecord(tx, now, r) }}, nil
	}
	done := r.CompletedAt
	if done.IsZero() {
		done = r.UpdatedAt
	}
	if r.State != vault.RecordCompleted || r.Resolved || now.Sub(done) <= s.ttl {
		return reapVerdict{}, nil
	}
	if r.Hold != nil && r.Hold.State != vault.HoldCommitted && r.Hold.State != vault.HoldReleased {
		return reapVerdict{}, fmt.Errorf("hold %s of a completed record is %s: %w", r.Hold.ID, r.Hold.State, vault.ErrInvariant)
	}
	return reapVerdict{owner: r.KeyID, removes: true, apply: func(tx Tx) error { return deleteRecord(tx, r) }}, nil
}

// judgeCounter removes daily counters with nothing held whose day ended more than 48 hours
// ago. The day's end depends on the key's time zone; the test uses the latest end
// any zone can have (UTC−12: the next day at 12:00 UTC), so it never deletes early.
// Period counters live as long as the key.
//
// The clock alone is not trusted with a counter that holds spend: a clock that
// jumps days ahead would make today's counter look old, and once the clock is
// corrected the day's cap would open again. So a counter with committed money is
// reaped only when the key also has a daily counter at least counterKeepDays
// later by the counters' own dates — spend the key made that much later — which
// no clock jump of less than that can fake. A key's latest counters therefore
// stay until it is used again a week later. A counter with nothing committed
// holds no usage and goes by the clock.
func judgeCounter(tx Tx, now time.Time, k, v []byte) (reapVerdict, error) {
	keyID, window, ok := strings.Cut(string(k), "/")
	if !ok {
		return reapVerdict{}, nil
	}
	day, ok := counterDay(window)
	if !ok {
		return reapVerdict{}, nil
	}
	latestEnd := day.Add(24*time.Hour + 12*time.Hour)
	if now.Sub(latestEnd) <= counterGrace {
		return reapVerdict{}, nil
	}
	c, err := decodeCounter(v)
	if err != nil || c.Held != 0 {
		return reapVerdict{}, err
	}
	if c.Committed != 0 {
		if latest, ok := latestCounterDay(tx, keyID); !ok || latest.Before(day.AddDate(0, 0, counterKeepDays)) {
			return reapVerdict{}, nil
		}
	}
	return removeEntry(keyID, BucketCounters, k), nil
}

// counterKeepDays is how many days of its own later use a key needs before a
// daily counter with spend may be reaped (see judgeCounter).
const counterKeepDays = 7

// counterDay parses the date of a daily window id ("day:2026-09-14").
func counterDay(window string) (time.Time, bool) {
	date, ok := strings.CutPrefix(window, "day:")
	if !ok {
		return time.Time{}, false
	}
	day, err := time.Parse(time.DateOnly, date)
	return day, err == nil
}

// latestCounterDay is the date of the key's latest daily counter. Counter keys
// sort by date within a key ("key/day:2026-09-14" < "key/day:2026-09-15" <
// "key/period"), so it is the last key before "key/day;" (';' follows ':').
func latestCounterDay(tx Tx, keyID string) (time.Time, bool) {
	c := tx.Cursor(BucketCounters)
	k, _ := c.Seek([]byte(keyID + "/day;"))
	if k == nil {
		k, _ = c.Last()
	} else {
		k, _ = c.Prev()
	}
	window, ok := strings.CutPrefix(string(k), keyID+"/")
	if !ok {
		return time.Time{}, false
	}
	return counterDay(window)
}

// judgeObject removes money-object records untouched for ObjectRetention whose exposure
// is all settled (live exposure is money held: never reaped).
func judgeObject(_ Tx, now time.Time, k, v []byte) (reapVerdict, error) {
	var o objectRec
	if err := decodeJSON(k, v, &o); err != nil {
		return reapVerdict{}, err
	}
	if len(o.Parts) != 0 || now.Sub(o.UpdatedAt) <= vault.ObjectRetention {
		return reapVerdict{}, nil
	}
	keyID, _, _ := splitNul(k)
	return removeEntry(keyID, BucketObjects, k), nil
}
