package vault

import (
	"bytes"
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// holdCountChunk bounds the hold index entries one read transaction of CountHolds
// looks at. A long read transaction keeps bbolt from remapping a growing file, which
// stalls every writer; chunks of this size take well under a millisecond.
const holdCountChunk = 10000

// StoreStats are the Store's cumulative counters since Open (for /metrics).
type StoreStats struct {
	// Commits counts the write transactions of the group committer (Reserve,
	// Settle and the claims API), retries of a failed batch included.
	Commits int64
	// Ops counts the operations those transactions carried; Ops / Commits is how
	// many callers shared each fsync.
	Ops int64
}

// Stats returns the Store's counters. It reads two atomics: cheap enough for
// every scrape.
func (s *Store) Stats() StoreStats {
	return StoreStats{Commits: s.commits.Load(), Ops: s.batched.Load()}
}

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
	var resume []byte
	for {
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("count holds: %w", err)
		}
		var (
			n    int
			next []byte
		)
		err := s.view(func(tx *bolt.Tx, _ time.Time) error {
			n, next = countHoldsChunk(tx, want, resume, s.countChunk)
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("count holds: %w", err)
		}
		total += n
		if next == nil {
			return total, nil
		}
		resume = next
	}
}

// countHoldsChunk counts the index entries whose value is want among at most chunk
// entries from resume (the start when nil). It returns where the next chunk starts,
// nil at the end of the index.
func countHoldsChunk(tx *bolt.Tx, want, resume []byte, chunk int) (int, []byte) {
	c := tx.Bucket(bucketHoldIndex).Cursor()
	var k, v []byte
	if resume == nil {
		k, v = c.First()
	} else {
		k, v = c.Seek(resume)
	}
	chunk = max(chunk, 1)
	n := 0
	for seen := 0; k != nil; k, v = c.Next() {
		if seen == chunk {
			return n, bytes.Clone(k) // bbolt's key is valid only inside the transaction
		}
		seen++
		if bytes.Equal(v, want) {
			n++
		}
	}
	return n, nil
}
