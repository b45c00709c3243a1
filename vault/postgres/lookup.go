package postgres

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/keybrake/keybrake/vault/internal/engine"
)

// Concurrent reads of a token, its key and its upstream (GetThroughWith
// outside a transaction: Authenticate, on every proxied request) share one
// statement (docs/decisions/0120-authentications-share-a-statement.md).
// A lookup is queued, and a lookup loop takes it with whatever else is
// queued and reads them all in one statement, which begins after each of
// them was queued: each sees every write committed before its request
// asked, as a statement of its own would.

// lookup is one GetThroughWith, waiting for its statement.
type lookup struct {
	ctx     context.Context  // the asker's: the statement ends once all have
	buckets [3]engine.Bucket // b, via, with
	k, with []byte

	ref, v, withV []byte
	err           error
	done          chan struct{}
}

const (
	// lookupLoops is how many statements of lookups a replica runs at once:
	// while one is on its way, the next gathers.
	lookupLoops = 2
	// maxLookups bounds the lookups one statement reads.
	maxLookups = 256
)

// lookupThroughWith queues a GetThroughWith of k in b, through via, with
// with's entry, and waits for it; ctx ending stops the wait, and the
// statement once nobody else waits for it either (whileAnyWaits).
func (s *backend) lookupThroughWith(ctx context.Context, b engine.Bucket, k []byte, via engine.Bucket, with engine.Read) (ref, v, withV []byte, err error) {
	l := &lookup{ctx: ctx, buckets: [3]engine.Bucket{b, via, with.Bucket}, k: k, with: with.Key, done: make(chan struct{})}
	if err := s.queueLookup(ctx, l); err != nil {
		return nil, nil, nil, err
	}
	select {
	case <-l.done:
		return l.ref, l.v, l.withV, l.err
	case <-ctx.Done():
		return nil, nil, nil, ctx.Err()
	}
}

func (s *backend) queueLookup(ctx context.Context, l *lookup) error {
	return s.whileOpen(ctx, func() error {
		select {
		case s.lookups <- l:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// lookupLoop reads what is queued on lookups, as many as are waiting (up to
// maxLookups) in each statement, until Close closes the queue.
func (s *backend) lookupLoop() {
	defer s.loops.Done()
	batch := make([]*lookup, 0, maxLookups)
	for l := range s.lookups {
		batch = append(batch[:0], l)
	gather:
		for len(batch) < maxLookups {
			select {
			case l, ok := <-s.lookups:
				if !ok {
					break gather
				}
				batch = append(batch, l)
			default:
				break gather
			}
		}
		s.runLookups(batch)
		clear(batch)
	}
}

// runLookups reads batch, one statement for the lookups of each kind (there
// is one kind: Authenticate's), and answers each.
func (s *backend) runLookups(batch []*lookup) {
	for len(batch) > 0 {
		kind := batch[0].buckets
		var these, rest []*lookup
		for _, l := range batch {
			if l.buckets == kind {
				these = append(these, l)
			} else {
				rest = append(rest, l)
			}
		}
		err := s.readLookups(these)
		for _, l := range these {
			if err != nil {
				l.err = err
			}
			close(l.done)
		}
		batch = rest
	}
}

// readLookups reads ls, all of one kind, in one statement: a row for each,
// in their order.
func (s *backend) readLookups(ls []*lookup) error {
	keys, withs := make(byteaArray, len(ls)), make(byteaArray, len(ls))
	for i, l := range ls {
		keys[i], withs[i] = l.k, l.with
	}
	ctx, cancel := whileAnyWaits(ls)
	defer cancel()
	rows, err := s.pool.Query(ctx, lookupSQL(ls[0].buckets), keys, withs)
	s.roundTrips.Add(1)
	if err != nil {
		return err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		if n == len(ls) {
			return fmt.Errorf("lookups: more rows than the %d asked", len(ls))
		}
		l := ls[n]
		if err := rows.Scan(&l.ref, &l.v, &l.withV); err != nil {
			return err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n != len(ls) {
		return fmt.Errorf("lookups: %d rows for %d asked", n, len(ls))
	}
	return nil
}

// lookupStatements are the statements of lookups, by their buckets.
var lookupStatements statements[[3]engine.Bucket]

// lookupSQL reads, for each pair of its two arrays (a key of b, a key of
// with), the entry of b, the entry of via that entry's value names and the
// entry of with, as of one moment: a row for each pair, in their order, with
// NULL where an entry is missing, and all three NULL where b's is.
func lookupSQL(buckets [3]engine.Bucket) string {
	return lookupStatements.of(buckets, func() string {
		b, via, with := buckets[0], buckets[1], buckets[2]
		return "SELECT a.v, b.v, c.v FROM unnest($1::bytea[], $2::bytea[]) WITH ORDINALITY AS r(k, w, n) " +
			"LEFT JOIN " + table(b) + " a ON a.k = r.k LEFT JOIN " + table(via) + " b ON b.k = a.v " +
			"LEFT JOIN " + table(with) + " c ON c.k = r.w AND a.k IS NOT NULL ORDER BY r.n"
	})
}

// whileAnyWaits is a context that ends once every lookup of ls has stopped
// waiting (its asker's context ended), or cancel is called: a statement
// nobody waits for any more, on a server that does not answer, is given up
// as each asker's own statement used to be.
func whileAnyWaits(ls []*lookup) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	waiting := atomic.Int64{}
	waiting.Store(int64(len(ls)))
	stops := make([]func() bool, len(ls))
	for i, l := range ls {
		stops[i] = context.AfterFunc(l.ctx, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
