package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

const (
	// reapBatchSize bounds the changes of one reaper transaction, so the reaper
	// never holds the writer (or a key's lock) for long.
	reapBatchSize = 256
	// reapScan bounds the entries one reaper read transaction looks at.
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
	// stop ends the scan of the pass at this entry: its bucket is ordered so
	// that nothing after it is due yet (completions, by time).
	stop bool
	// skipTo, when set, moves the scan on to this key: the rest of the
	// entries before it are not due yet (a vault key's later events).
	skipTo []byte
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
	defer s.watch.flushLater() // wake the waiters of the approvals that expired
	return s.runPasses(ctx, []reapPass{
		{bucket: BucketInflight, judge: s.judgeInflight},
		{bucket: BucketCompletions, judge: s.judgeCompletion},
		{bucket: BucketCounters, judge: judgeCounter},
		{bucket: BucketObjects, judge: judgeObject},
		{bucket: BucketClaims, judge: s.judgeClaim},           // claims.go
		{bucket: BucketEvents, judge: s.judgeEvent},           // retention.go
		{bucket: BucketRollups, judge: judgeRollup},           // retention.go
		{bucket: BucketApprovalsOpen, judge: s.judgeApproval}, // approvals.go
		{bucket: BucketStripeEvents, judge: judgeStripeEvent}, // stripeevents.go
		{bucket: BucketUnknownKeys, judge: judgeUnknownKey},   // stripeevents.go
	})
}

// RecoverLapsed turns in-progress records whose lease lapsed into outcome
// unknown, keeping their holds (see recoverRecord), and returns how many. It
// leaves live leases alone: on a store that several processes share, they are
// other processes' requests in flight. It reads only the in-flight index and
// the records it lists.
func (s *Engine) RecoverLapsed(ctx context.Context) (int, error) {
	c, err := s.runPasses(ctx, []reapPass{{bucket: BucketInflight, judge: s.judgeInflight}})
	return c.recovered, err
}

// runPasses runs each pass in turn: a read transaction finds the entries due
// (at most reapScan looked at, reapBatch found), a short write transaction
// judges each again and applies the verdicts, and so on to the end of the
// bucket. The scans never hold the writer; the writes are bounded.
func (s *Engine) runPasses(ctx context.Context, passes []reapPass) (reapCount, error) {
	var total reapCount
	for _, p := range passes {
		var resume []byte
		for {
			if err := ctx.Err(); err != nil {
				return total, err
			}
			var (
				found []reapCandidate
				next  []byte
			)
			err := s.view(ctx, func(tx Tx, now time.Time) error {
				var err error
				found, next, err = scanOnce(tx, now, p, resume, s.reapBatch) // a re-run starts over from resume
				return err
			})
			if err != nil {
				return total, fmt.Errorf("reap %s: %w", p.bucket.Name(), err)
			}
			if len(found) > 0 {
				var c reapCount
				err = s.update(ctx, func(tx Tx, now time.Time) error {
					var err error
					c, err = applyOnce(tx, now, p, found) // a re-run starts over
					return err
				})
				total.txs++
				if err != nil {
					return total, fmt.Errorf("reap %s: %w", p.bucket.Name(), err)
				}
				total.removed += c.removed
				total.recovered += c.recovered
			}
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

// reapCandidate is an entry a scan found due, and the key whose lock guards it.
type reapCandidate struct {
	k     []byte
	owner string
}

// scanOnce scans the pass's bucket from resume, in a read transaction, for at
// most batch entries due. It returns them and where to resume, nil at the end
// of what is due.
func scanOnce(tx Tx, now time.Time, p reapPass, resume []byte, batch int) ([]reapCandidate, []byte, error) {
	c := tx.Cursor(p.bucket)
	var k, v []byte
	if resume == nil {
		k, v = c.First()
	} else {
		k, v = c.Seek(resume)
	}
	var found []reapCandidate
	for scanned := 0; k != nil; scanned++ {
		if len(found) == batch || scanned == reapScan {
			return found, bytes.Clone(k), nil
		}
		verdict, err := p.judge(tx, now, k, v)
		if err != nil {
			return nil, nil, err
		}
		if verdict.apply != nil {
			found = append(found, reapCandidate{k: bytes.Clone(k), owner: verdict.owner})
		}
		switch {
		case verdict.stop:
			return found, nil, nil
		case verdict.skipTo != nil:
			k, v = c.Seek(verdict.skipTo)
		default:
			k, v = c.Next()
		}
	}
	return found, nil, nil
}

// applyOnce judges each candidate again, with its current value, once its key
// is locked — where several processes share the store, another may have
// changed it since the scan read it, and the scan read it in another
// transaction anyway — and applies the verdicts.
func applyOnce(tx Tx, now time.Time, p reapPass, found []reapCandidate) (reapCount, error) {
	var count reapCount
	for _, cand := range found {
		if cand.owner != "" {
			if err := tx.LockKey(cand.owner); err != nil {
				return reapCount{}, err
			}
		}
		v, err := tx.Get(p.bucket, cand.k)
		if err != nil {
			return reapCount{}, err
		}
		if v == nil {
			continue // gone since the scan
		}
		verdict, err := p.judge(tx, now, cand.k, v)
		if err != nil {
			return reapCount{}, err
		}
		if verdict.apply == nil {
			continue
		}
		if err := verdict.apply(tx); err != nil {
			return reapCount{}, err
		}
		if verdict.removes {
			count.removed++
		} else {
			count.recovered++
		}
	}
	return count, nil
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

// judgeInflight judges an entry of the in-flight index: a record whose lease
// lapsed becomes unknown (recoverRecord), its hold kept: its process is gone.
// The index holds each lease's end, so live leases are passed over without
// reading their records.
func (s *Engine) judgeInflight(tx Tx, now time.Time, k, v []byte) (reapVerdict, error) {
	if len(v) != 8 || now.Before(time.Unix(0, int64(binary.BigEndian.Uint64(v)))) {
		return reapVerdict{}, nil
	}
	if s.retries.has(k) {
		return reapVerdict{}, nil // this process knows its outcome and retries its settle
	}
	r, err := readRecord(tx, k)
	if err != nil || r == nil || r.State != vault.RecordInProgress || now.Before(r.LeaseUntil) {
		return reapVerdict{}, err
	}
	return reapVerdict{owner: r.KeyID, apply: func(tx Tx) error { return recoverRecord(tx, now, r) }}, nil
}

// judgeCompletion judges an entry of the completions index, which lists the
// completed records by completion time: it removes a record whose replay
// window (IdempotencyTTL from completion) has passed, with its settled hold
// and its index entries, and stops at the first that is still replayable.
// Records in progress or unknown are never listed (their holds are live
// money), nor are records an operator resolved: like the unknown record they
// were, they are kept for good, so that a caller still retrying the key days
// later is told it was resolved instead of moving the money again as a new
// request.
func (s *Engine) judgeCompletion(tx Tx, now time.Time, k, _ []byte) (reapVerdict, error) {
	if len(k) < 8 {
		return reapVerdict{}, fmt.Errorf("completions key %x: %w", k, vault.ErrStorage)
	}
	if now.Sub(time.Unix(0, int64(binary.BigEndian.Uint64(k)))) <= s.ttl {
		return reapVerdict{stop: true}, nil
	}
	r, err := readRecord(tx, k[8:])
	if err != nil {
		return reapVerdict{}, err
	}
	if r == nil || !reapable(r) || !bytes.Equal(completionKey(k[8:], r), k) {
		// Not this entry's record (any more): the entry goes alone.
		return removeEntry("", BucketCompletions, k), nil
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
	keyID, window, ok := splitCounterKey(k)
	if !ok {
		return reapVerdict{}, nil
	}
	day, ok := window.Day()
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
	return policy.WindowID(window).Day()
}

// judgeObject removes money-object records untouched for ObjectRetention whose exposure
// is all settled (live exposure is money held: never reaped).
func judgeObject(_ Tx, now time.Time, k, v []byte) (reapVerdict, error) {
	o, err := decodeObject(k, v)
	if err != nil {
		return reapVerdict{}, err
	}
	if len(o.Parts) != 0 || now.Sub(o.UpdatedAt) <= vault.ObjectRetention {
		return reapVerdict{}, nil
	}
	keyID, objectID, _ := splitNul(k)
	k = bytes.Clone(k)
	return reapVerdict{owner: keyID, removes: true, apply: func(tx Tx) error {
		if err := tx.Delete(BucketObjects, k); err != nil {
			return fmt.Errorf("delete %q: %w", k, err)
		}
		return unindexObject(tx, keyID, objectID)
	}}, nil
}
