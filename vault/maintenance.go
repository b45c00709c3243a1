package vault

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

const (
	// reapBatchSize bounds the deletions of one reaper transaction, so the reaper
	// never holds the writer for long.
	reapBatchSize = 1000
	// reapScan bounds the entries one reaper transaction looks at.
	reapScan = 20000
	// counterGrace is how long after its day ended a daily counter is kept.
	counterGrace = 48 * time.Hour
	// ObjectRetention is how long a metered-object total is kept after its last
	// change: longer than a PaymentIntent or an uncaptured Charge stays confirmable
	// or capturable at Stripe (at most 30 days with extended authorization).
	ObjectRetention = 35 * 24 * time.Hour
)

// reapPass is one kind of garbage: a bucket and a predicate over its entries. The
// predicate may return extra deletions (other buckets) to do with the entry.
type reapPass struct {
	bucket []byte
	dead   func(tx *bolt.Tx, now time.Time, k, v []byte) (bool, func(tx *bolt.Tx) error, error)
}

// reap runs every pass; it also returns how many write transactions it used.
func (s *Store) reap(ctx context.Context) (int, int, error) {
	passes := []reapPass{
		{bucket: bucketIdem, dead: s.deadRecord},
		{bucket: bucketCounters, dead: deadCounter},
		{bucket: bucketObjects, dead: deadObject},
		{bucket: bucketClaims, dead: s.deadClaim}, // claims.go: completed or abandoned claims after IdempotencyTTL
	}
	total, txs := 0, 0
	for _, p := range passes {
		var resume []byte
		for {
			if err := ctx.Err(); err != nil {
				return total, txs, err
			}
			var n int
			var done bool
			err := s.update(func(tx *bolt.Tx, now time.Time) error {
				var err error
				n, resume, done, err = reapOnce(tx, now, p, resume, s.reapBatch)
				return err
			})
			txs++
			if err != nil {
				return total, txs, fmt.Errorf("reap %s: %w", p.bucket, err)
			}
			total += n
			if done {
				break
			}
		}
	}
	return total, txs, nil
}

// reapOnce scans from resume and deletes at most batch dead entries. It returns
// where to resume and whether the bucket has been scanned to its end.
func reapOnce(tx *bolt.Tx, now time.Time, p reapPass, resume []byte, batch int) (int, []byte, bool, error) {
	b := tx.Bucket(p.bucket)
	c := b.Cursor()
	var k, v []byte
	if resume == nil {
		k, v = c.First()
	} else {
		k, v = c.Seek(resume)
	}
	var keys [][]byte
	var extras []func(tx *bolt.Tx) error
	scanned := 0
	for ; k != nil; k, v = c.Next() {
		if len(keys) == batch || scanned == reapScan {
			break
		}
		scanned++
		dead, extra, err := p.dead(tx, now, k, v)
		if err != nil {
			return 0, nil, false, err
		}
		if dead {
			keys = append(keys, bytes.Clone(k))
			if extra != nil {
				extras = append(extras, extra)
			}
		}
	}
	next := bytes.Clone(k) // nil at the end of the bucket
	for _, key := range keys {
		if err := b.Delete(key); err != nil {
			return 0, nil, false, fmt.Errorf("delete %q: %w", key, err)
		}
	}
	for _, extra := range extras {
		if err := extra(tx); err != nil {
			return 0, nil, false, err
		}
	}
	return len(keys), next, next == nil, nil
}

// deadRecord: completed records whose replay window (IdempotencyTTL from completion)
// has passed, with their settled hold (and its index entry). In-progress and unknown records are never
// reaped: their holds are live money. Nor are records an operator resolved: like
// the unknown record they were, they are kept for good, so that a caller still
// retrying the key days later is told it was resolved instead of moving the
// money again as a new request.
func (s *Store) deadRecord(tx *bolt.Tx, now time.Time, k, v []byte) (bool, func(tx *bolt.Tx) error, error) {
	r, err := decodeRecord(k, v)
	if err != nil {
		return false, nil, err
	}
	done := r.CompletedAt
	if done.IsZero() {
		done = r.UpdatedAt
	}
	if r.State != RecordCompleted || r.Resolved || now.Sub(done) <= s.ttl {
		return false, nil, nil
	}
	if r.Hold == nil {
		return true, nil, nil
	}
	if r.Hold.State != HoldCommitted && r.Hold.State != HoldReleased {
		return false, nil, fmt.Errorf("hold %s of a completed record is %s: %w", r.Hold.ID, r.Hold.State, ErrInvariant)
	}
	index := holdIndexKey(r.Hold)
	return true, func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketHoldIndex).Delete(index); err != nil {
			return fmt.Errorf("delete hold index: %w", err)
		}
		return nil
	}, nil
}

// deadCounter: daily counters with nothing held whose day ended more than 48 hours
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
func deadCounter(tx *bolt.Tx, now time.Time, k, v []byte) (bool, func(tx *bolt.Tx) error, error) {
	keyID, window, ok := strings.Cut(string(k), "/")
	if !ok {
		return false, nil, nil
	}
	day, ok := counterDay(window)
	if !ok {
		return false, nil, nil
	}
	latestEnd := day.Add(24*time.Hour + 12*time.Hour)
	if now.Sub(latestEnd) <= counterGrace {
		return false, nil, nil
	}
	c, err := decodeCounter(v)
	if err != nil {
		return false, nil, err
	}
	if c.Held != 0 {
		return false, nil, nil
	}
	if c.Committed == 0 {
		return true, nil, nil
	}
	latest, ok := latestCounterDay(tx, keyID)
	return ok && !latest.Before(day.AddDate(0, 0, counterKeepDays)), nil, nil
}

// counterKeepDays is how many days of its own later use a key needs before a
// daily counter with spend may be reaped (see deadCounter).
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
func latestCounterDay(tx *bolt.Tx, keyID string) (time.Time, bool) {
	c := tx.Bucket(bucketCounters).Cursor()
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

// deadObject: money-object records untouched for ObjectRetention whose exposure
// is all settled (live exposure is money held: never reaped).
func deadObject(tx *bolt.Tx, now time.Time, k, v []byte) (bool, func(tx *bolt.Tx) error, error) {
	var o objectRec
	if err := decodeJSON(k, v, &o); err != nil {
		return false, nil, err
	}
	return len(o.Parts) == 0 && now.Sub(o.UpdatedAt) > ObjectRetention, nil, nil
}
