package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// Group commit. Reserve and Settle say what they will lock and read
// (engine.Prefetch); each replica's committers take them from one queue and
// run every one queued while the previous transaction was committing in one
// transaction, in the order queued. The transaction begins with one round
// trip that takes every key's lock, in key order (so that two replicas' batches
// cannot deadlock), reads every entry named, and reads the clock; the bodies
// then find what they read in the transaction, and their writes go with the
// COMMIT in one more. One commit, one fsync of the server's log, serves the
// whole batch, and a hot key's row is locked once per batch.
const (
	// maxBatch bounds how many operations share one transaction.
	maxBatch = 256
	// committers is how many batches of one replica are under way at once:
	// while one commits, the next takes its locks and runs.
	committers = 2
	// batchLockWait is how long a batch waits for a key's lock before it
	// leaves the operations of that key to a transaction of their own,
	// which waits up to lock_timeout: a key held by a frozen replica costs
	// the other keys of the batch this much, not lock_timeout.
	batchLockWait = 200 * time.Millisecond
)

// lockRowSQL locks a key's row and reads it; lockBudgetSQL a budget's.
const (
	lockRowSQL    = "SELECT v FROM keybrake_keys WHERE k = $1 FOR UPDATE"
	lockBudgetSQL = "SELECT v FROM keybrake_budgets WHERE k = $1 FOR UPDATE"
)

// batchOp is one group-committed operation: its body, what it will lock and
// read, and where its outcome goes. run starts over on every run (a batch run
// again after a serialization failure, or op by op after a failure).
type batchOp struct {
	run  engine.TxFunc
	pf   *engine.Prefetch
	done chan error
}

// SubmitPrefetch is Submit for a write that says what it locks and reads:
// it is group committed with the other such writes of this replica. Once
// queued, it waits for its outcome even if ctx ends.
func (s *backend) SubmitPrefetch(ctx context.Context, p *engine.Prefetch, fn engine.TxFunc) error {
	op := &batchOp{run: fn, pf: p, done: make(chan error, 1)}
	if err := s.enqueue(ctx, op); err != nil {
		return err
	}
	return <-op.done
}

// QueuePrefetch is SubmitPrefetch, after which done learns the outcome,
// before QueuePrefetch returns: a settle is durable before the proxy answers.
func (s *backend) QueuePrefetch(ctx context.Context, p *engine.Prefetch, fn engine.TxFunc, done func(error)) error {
	op := &batchOp{run: fn, pf: p, done: make(chan error, 1)}
	if err := s.enqueue(ctx, op); err != nil {
		return err
	}
	done(<-op.done)
	return nil
}

// enqueue hands op to the committers, or says why it cannot.
func (s *backend) enqueue(ctx context.Context, op *batchOp) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed.Load() {
		return vault.ErrClosed
	}
	s.ops <- op
	return nil
}

// commitLoop is one committer. It exits when ops is closed and drained.
//
// A batch that locks a key or a budget the replica's other batch under way
// holds would only wait for that row lock on the server, its transaction
// open, while what is queued meanwhile forms a third batch waiting behind it:
// on one hot key a replica's requests were split into ever smaller batches
// (two operations a commit at 16 connections on three replicas). So such a
// batch waits here, until the other one ends, and takes in what is queued
// meanwhile: everything that came during a commit shares the next one.
func (s *backend) commitLoop() {
	defer s.loops.Done()
	batch := make([]*batchOp, 0, maxBatch)
	for op := range s.ops {
		batch = append(batch[:0], op)
		batch = drainOps(s.ops, batch)
		ran, busy := s.running.start(batch)
		if busy != nil {
			// Bounded: a batch under way that waits for a lock held
			// elsewhere (decision 57) must not hold this one up for longer
			// than it holds up its own other keys.
			timeout := time.NewTimer(batchLockWait)
			for busy != nil {
				var expired bool
				if batch, expired = gatherUntil(s.ops, batch, busy, timeout.C); expired {
					ran = s.running.add(batch)
					break
				}
				ran, busy = s.running.start(batch)
			}
			timeout.Stop()
		}
		s.runBatch(slices.Clone(batch), false)
		s.running.remove(ran)
		clear(batch)
	}
}

// drainOps appends whatever is queued, without waiting, up to maxBatch.
func drainOps(ops <-chan *batchOp, batch []*batchOp) []*batchOp {
	for len(batch) < maxBatch {
		select {
		case next, ok := <-ops:
			if !ok {
				return batch
			}
			batch = append(batch, next)
		default:
			return batch
		}
	}
	return batch
}

// gatherUntil appends what is queued until done closes, up to maxBatch, or
// until timeout fires (expired).
func gatherUntil(ops <-chan *batchOp, batch []*batchOp, done <-chan struct{}, timeout <-chan time.Time) (_ []*batchOp, expired bool) {
	for {
		var next <-chan *batchOp
		if len(batch) < maxBatch {
			next = ops
		}
		select {
		case op, ok := <-next:
			if !ok {
				select {
				case <-done:
					return batch, false
				case <-timeout:
					return batch, true
				}
			}
			batch = append(batch, op)
		case <-done:
			return batch, false
		case <-timeout:
			return batch, true
		}
	}
}

// runningBatches is what the replica's batches under way lock.
type runningBatches struct {
	mu      sync.Mutex
	batches []*runningBatch
}

type runningBatch struct {
	locks map[string]bool // "k" or "b" and the key's or budget's id
	done  chan struct{}
}

// locksOf is what ops lock, as runningBatch.locks names it.
func locksOf(ops []*batchOp, into map[string]bool) {
	for _, op := range ops {
		for _, k := range op.pf.Keys {
			into["k"+k] = true
		}
		for _, b := range op.pf.Budgets {
			into["b"+b] = true
		}
	}
}

// start says that batch is under way, unless a batch under way locks
// something batch locks: then it returns that batch's end instead.
func (r *runningBatches) start(batch []*batchOp) (*runningBatch, <-chan struct{}) {
	rb := &runningBatch{locks: map[string]bool{}, done: make(chan struct{})}
	locksOf(batch, rb.locks)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.batches {
		for l := range rb.locks {
			if b.locks[l] {
				return nil, b.done
			}
		}
	}
	r.batches = append(r.batches, rb)
	return rb, nil
}

// add says that batch is under way, whatever else is.
func (r *runningBatches) add(batch []*batchOp) *runningBatch {
	rb := &runningBatch{locks: map[string]bool{}, done: make(chan struct{})}
	locksOf(batch, rb.locks)
	r.mu.Lock()
	r.batches = append(r.batches, rb)
	r.mu.Unlock()
	return rb
}

// remove says that rb has ended, and wakes the batch waiting for it.
func (r *runningBatches) remove(rb *runningBatch) {
	r.mu.Lock()
	r.batches = slices.DeleteFunc(r.batches, func(b *runningBatch) bool { return b == rb })
	r.mu.Unlock()
	close(rb.done)
}

// lockBusy says that a batch's key (or budget) stayed locked beyond
// batchLockWait.
type lockBusy struct {
	key    string
	budget bool
	err    error
}

func (e *lockBusy) Error() string {
	what := "key "
	if e.budget {
		what = "budget "
	}
	return what + e.key + " is locked: " + e.err.Error()
}

// names reports whether op locks what stayed locked.
func (e *lockBusy) names(op *batchOp) bool {
	if e.budget {
		return slices.Contains(op.pf.Budgets, e.key)
	}
	return slices.Contains(op.pf.Keys, e.key)
}
func (e *lockBusy) Unwrap() error { return e.err }

// lockTimedOut says that a lock statement's wait ended at the
// statement_timeout the plan set for it: the lock stayed held for
// lock_timeout.
type lockTimedOut struct{ err error }

func (e *lockTimedOut) Error() string { return "lock wait ended at lock_timeout: " + e.err.Error() }
func (e *lockTimedOut) Unwrap() error { return e.err }

// opFailed is the failure of one operation's body, not of the database.
type opFailed struct{ err error }

func (e *opFailed) Error() string { return e.err.Error() }
func (e *opFailed) Unwrap() error { return e.err }

// runBatch runs batch in one transaction and gives each operation its
// outcome. patient batches wait up to lock_timeout for their locks.
func (s *backend) runBatch(batch []*batchOp, patient bool) {
	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	defer cancel()
	start := time.Now()
	err := s.runOps(ctx, batch, patient)
	if err == nil {
		if s.observe != nil {
			s.observe(len(batch), time.Since(start))
		}
		for _, op := range batch {
			op.done <- nil
		}
		return
	}
	var busy *lockBusy
	var failed *opFailed
	switch {
	case errors.As(err, &busy) && !patient:
		// Leave the key's operations to wait for it on their own; run the
		// others again at once.
		var waiting, rest []*batchOp
		for _, op := range batch {
			if busy.names(op) {
				waiting = append(waiting, op)
			} else {
				rest = append(rest, op)
			}
		}
		s.runPatient(waiting)
		if len(rest) > 0 {
			s.runBatch(rest, false)
		}
	case errors.As(err, &failed) && len(batch) > 1:
		// One body failed and rolled the whole batch back: run each alone,
		// so that only the one that fails sees its failure.
		s.log.Warn("group commit failed; retrying its operations one by one", "ops", len(batch), "error", failed.err)
		for _, op := range batch {
			start := time.Now()
			err := s.runOps(ctx, []*batchOp{op}, true)
			if err == nil && s.observe != nil {
				s.observe(1, time.Since(start))
			}
			op.done <- translate(unwrapOp(err))
		}
	default:
		err = translate(unwrapOp(err))
		for _, op := range batch {
			op.done <- err
		}
	}
}

// unwrapOp is err without its opFailed.
func unwrapOp(err error) error {
	var failed *opFailed
	if errors.As(err, &failed) {
		return failed.err
	}
	return err
}

// runPatient runs ops, whose key stayed locked, in a batch of their own that
// waits up to lock_timeout: on a goroutine of its own while fewer such
// batches wait than the pool can spare, else on the calling committer, which
// then takes no new batch until it is done — a wait for a lock is not a
// failure until lock_timeout says so.
func (s *backend) runPatient(ops []*batchOp) {
	select {
	case s.patient <- struct{}{}:
		s.loops.Add(1)
		go func() {
			defer s.loops.Done()
			defer func() { <-s.patient }()
			s.runBatch(ops, true)
		}()
	default:
		s.runBatch(ops, true)
	}
}

// runOps runs the bodies of ops in one transaction, again from the start
// after a serialization failure, a deadlock or a unique violation.
func (s *backend) runOps(ctx context.Context, ops []*batchOp, patient bool) error {
	pl := s.planOf(ops, patient)
	return s.retry(ctx, func() error {
		return s.once(ctx, true, pl, func(t *tx, now time.Time) error {
			for _, op := range ops {
				if err := safeRun(op, t, now); err != nil {
					if t.dbErr != nil {
						return t.dbErr
					}
					return &opFailed{err: err}
				}
			}
			return nil
		})
	})
}

// safeRun runs one op, turning a panic into an error so that a bug in one op
// can neither kill a committer (and hang every caller) nor commit half an op.
func safeRun(op *batchOp, t *tx, now time.Time) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in store operation: %v", r)
		}
	}()
	return op.run(t, now)
}

// plan is what a batch's transaction locks and reads as it begins. Every
// batch takes its locks in one order — its keys' rows by id, then its
// budgets' rows by id — so two batches (of one replica or of two) never wait
// for each other in a circle. A lock taken later by a body (a budget the hint
// did not name: a chain changed since) or by a transaction outside the
// batches (which takes a key, then its budgets closest first) can still close
// a circle; the server then aborts one of them (deadlock_detected) and it
// runs again from the start (retry).
type plan struct {
	keys    []string // in key order, each once
	budgets []string // in id order, each once
	reads   [engine.NumBuckets][][]byte
	// wait, when set, is the lock_timeout and the statement_timeout under
	// which the lock statements run (SET LOCAL), and restore the session's,
	// set again after them. lock_timeout bounds each lock a statement waits
	// for, and a row's second waiter waits for two: for the first waiter's
	// place in the row's queue (its tuple lock), then for the row's holder —
	// two lock_timeouts in all when the holder is frozen. statement_timeout
	// bounds the statement's whole wait. short says the wait is
	// batchLockWait's: a key whose lock does not come in it is left to a
	// batch of its own (lockBusy).
	wait, restore [2]string
	short         bool
}

// planOf is the plan of ops' transaction.
func (s *backend) planOf(ops []*batchOp, patient bool) *plan {
	pl := &plan{}
	switch {
	case !patient && s.lockTimeout > 2*batchLockWait:
		pl.wait = [2]string{batchLockWait.String(), batchLockWait.String()}
		pl.short = true
	case s.lockBound != "":
		pl.wait = [2]string{s.lockTimeoutParam, s.lockBound}
	}
	if pl.wait[0] != "" {
		pl.restore = [2]string{s.lockTimeoutParam, s.statementTimeoutParam}
	}
	now := (*Store)(s).Now()
	seen := map[opKey]bool{}
	for _, op := range ops {
		pl.keys = append(pl.keys, op.pf.Keys...)
		pl.budgets = append(pl.budgets, op.pf.Budgets...)
		if op.pf.Reads == nil {
			continue
		}
		for _, r := range op.pf.Reads(now) {
			if k := (opKey{r.Bucket, string(r.Key)}); !seen[k] {
				seen[k] = true
				pl.reads[r.Bucket] = append(pl.reads[r.Bucket], r.Key)
			}
		}
	}
	slices.Sort(pl.keys)
	pl.keys = slices.Compact(pl.keys)
	slices.Sort(pl.budgets)
	pl.budgets = slices.Compact(pl.budgets)
	return pl
}

// locks reports whether the plan takes locks.
func (pl *plan) locks() bool { return len(pl.keys)+len(pl.budgets) > 0 }

// bounded reports whether the plan's lock statements run under timeouts of
// their own.
func (pl *plan) bounded() bool { return pl.wait[0] != "" && pl.locks() }

const setLockWaitSQL = "SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)"

// queue queues the plan's statements.
func (pl *plan) queue(b *pgx.Batch) {
	if pl.bounded() {
		b.Queue(setLockWaitSQL, pl.wait[0], pl.wait[1])
	}
	for _, k := range pl.keys {
		b.Queue(lockRowSQL, []byte(k))
	}
	for _, id := range pl.budgets {
		b.Queue(lockBudgetSQL, []byte(id))
	}
	if pl.bounded() {
		b.Queue(setLockWaitSQL, pl.restore[0], pl.restore[1])
	}
	// The entries of every bucket in one statement.
	var set uint64
	var args []any
	for bucket, keys := range pl.reads {
		if len(keys) > 0 {
			set |= 1 << bucket
			args = append(args, byteaArray(keys))
		}
	}
	if set != 0 {
		b.Queue(readSQL(set), args...)
	}
}

// read reads the answers to the plan's statements into t.
func (pl *plan) read(br pgx.BatchResults, t *tx) error {
	n := len(pl.keys) + len(pl.budgets)
	for _, keys := range pl.reads {
		n += len(keys)
	}
	t.seen = make(map[opKey]known, n)
	if pl.bounded() {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	for _, k := range pl.keys {
		found, err := pl.readLocked(br, t, engine.BucketKeys, k)
		if err != nil {
			return err
		}
		if found {
			t.markLocked(k)
		}
	}
	for _, id := range pl.budgets {
		if _, err := pl.readLocked(br, t, engine.BucketBudgets, id); err != nil {
			return err
		}
	}
	if pl.bounded() {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	reads := false
	for bucket, keys := range pl.reads {
		for _, k := range keys {
			t.seen[opKey{engine.Bucket(bucket), string(k)}] = known{}
			reads = true
		}
	}
	if !reads {
		return nil
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	for rows.Next() {
		var bucket int16
		var k, v []byte
		if err := rows.Scan(&bucket, &k, &v); err != nil {
			rows.Close()
			return err
		}
		t.seen[opKey{engine.Bucket(bucket), string(k)}] = known{v: v, found: true}
	}
	return rows.Err()
}

// readLocked reads the answer to one lock statement, of k in b, into t, and
// reports whether the row exists (and is now locked).
func (pl *plan) readLocked(br pgx.BatchResults, t *tx, b engine.Bucket, k string) (bool, error) {
	var v []byte
	err := br.QueryRow().Scan(&v)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		t.seen[opKey{b, k}] = known{}
		return false, nil
	case err != nil:
		var pgErr *pgconn.PgError
		if !pl.bounded() || !errors.As(err, &pgErr) || (pgErr.Code != "55P03" && pgErr.Code != "57014") {
			return false, err
		}
		// lock_not_available or query_canceled: the lock did not come
		// within lock_timeout or statement_timeout, which the plan set.
		if pl.short {
			return false, &lockBusy{key: k, budget: b == engine.BucketBudgets, err: err}
		}
		return false, &lockTimedOut{err: err}
	}
	t.seen[opKey{b, k}] = known{v: v, found: true}
	return true, nil
}

// parseSetting reads a PostgreSQL time setting (lock_timeout's "10s",
// "250ms", "1min", a bare number of milliseconds); ok is false when it does
// not parse. 0 means no limit.
func parseSetting(v string) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	i := strings.IndexFunc(v, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := v, "ms"
	if i >= 0 {
		num, unit = v[:i], strings.TrimSpace(v[i:])
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	scale := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second,
		"min": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[unit]
	if scale == 0 {
		return 0, false
	}
	return time.Duration(n * float64(scale)), true
}
