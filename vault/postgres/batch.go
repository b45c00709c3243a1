package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// Group commit. Reserve and Settle say what they will lock and read
// (engine.Prefetch); each replica's one committer takes them from one queue
// and runs every one queued while the previous transaction was committing in
// one transaction, in the order queued. The transaction begins with one round
// trip that takes every key's lock, in key order (so that two replicas'
// batches cannot deadlock), reads every entry named, and reads the clock; the
// bodies then find what they read in the transaction, and their writes go with
// the COMMIT in one more. One commit, one fsync of the server's log, serves the
// whole batch, and a hot key's row is locked once per batch. A batch, once its
// locks are held and its bodies have run, takes in what was queued meanwhile
// of the rows it holds (one more round trip: their reads and the clock)
// before it commits; the rest of what was queued meanwhile begins the next
// batch (docs/decisions/0118).
const (
	// maxBatch bounds how many operations share one transaction.
	maxBatch = 256
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

// enqueue hands op to the committer, or says why it cannot.
func (s *backend) enqueue(ctx context.Context, op *batchOp) error {
	return s.whileOpen(ctx, func() error {
		s.ops <- op
		return nil
	})
}

// whileOpen runs send, which puts something on one of the store's queues,
// unless ctx has ended or the store is closed; Close closes the queues
// under closeMu, so send never meets a closed one.
func (s *backend) whileOpen(ctx context.Context, send func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed.Load() {
		return vault.ErrClosed
	}
	return send()
}

// commitLoop is the replica's committer: one, so one batch under way. A
// second gained nothing over many keys and, on one hot key, only waited for
// the row the first held; what comes for the rows a batch holds joins it
// instead (runOps, docs/decisions/0118). It exits when ops is closed and
// drained and nothing is pending: what Close leaves queued or pending goes
// through runBatch like the rest, and is answered ErrClosed (retry).
//
// pending holds what a batch's transaction drained from ops to take in and
// left (runOps): operations received, in the order queued, that have not
// run. At most maxBatch, it all begins the next batch, ahead of what is
// still queued; so each operation runs in one batch, and a key's operations
// in the order they were queued.
func (s *backend) commitLoop() {
	defer s.loops.Done()
	batch := make([]*batchOp, 0, maxBatch)
	pending := make([]*batchOp, 0, maxBatch)
	for {
		batch = append(batch, pending...)
		clear(pending)
		pending = pending[:0]
		batch = drainOps(s.ops, batch)
		if len(batch) == 0 {
			op, ok := <-s.ops
			if !ok {
				return // closed, and nothing pending: Close may end
			}
			batch = drainOps(s.ops, append(batch, op))
		}
		s.runBatch(slices.Clone(batch), false, &pending)
		clear(batch)
		batch = batch[:0]
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

// split parts batch, in order and in place, into what a transaction that
// holds held takes (at most n) and what stays; held names each row the
// transaction found and locked ("k" or "b" and the key's or budget's id). An
// operation is taken if everything it locks is held and no operation before
// it that stays locks any of it: the operations of a key keep the order they
// were queued in, those taken, which commit first, ahead of those that stay.
// An operation that names no lock is not taken: it has no reason to share a
// hot key's transaction.
func split(batch []*batchOp, held map[string]bool, n int) (taken, kept []*batchOp) {
	staying := map[string]bool{}
	kept = batch[:0]
	for _, op := range batch {
		if len(taken) < n && covers(op, held, staying) {
			taken = append(taken, op)
			continue
		}
		kept = append(kept, op)
		locksOf([]*batchOp{op}, staying)
	}
	clear(batch[len(kept):])
	return taken, kept
}

// covers reports whether op locks something, only what held names, and
// nothing of staying.
func covers(op *batchOp, held, staying map[string]bool) bool {
	if len(op.pf.Keys)+len(op.pf.Budgets) == 0 {
		return false
	}
	for _, k := range op.pf.Keys {
		if !held["k"+k] || staying["k"+k] {
			return false
		}
	}
	for _, b := range op.pf.Budgets {
		if !held["b"+b] || staying["b"+b] {
			return false
		}
	}
	return true
}

// locksOf is what ops lock, as tx.held names it.
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
// outcome. patient batches wait up to lock_timeout for their locks. pending,
// when set, is the committer's: the transaction takes in from it, and from
// the queue, what comes for the rows it holds (runOps); each operation it
// takes in is this batch's from then on, and gets its outcome here.
func (s *backend) runBatch(batch []*batchOp, patient bool, pending *[]*batchOp) {
	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	defer cancel()
	start := time.Now()
	batch, err := s.runOps(ctx, batch, patient, pending)
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
		// others again at once. batch includes what the transaction took in
		// (a retry's plan locks their rows too, and one may be the busy
		// one); the others' batch may take in again.
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
			s.runBatch(rest, false, pending)
		}
	case errors.As(err, &failed) && len(batch) > 1:
		// One body failed and rolled the whole batch back: run each alone,
		// so that only the one that fails sees its failure.
		s.log.Warn("group commit failed; retrying its operations one by one", "ops", len(batch), "error", failed.err)
		for _, op := range batch {
			start := time.Now()
			_, err := s.runOps(ctx, []*batchOp{op}, true, nil)
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
			s.runBatch(ops, true, nil)
		}()
	default:
		s.runBatch(ops, true, nil)
	}
}

// runOps runs the bodies of ops in one transaction, again from the start
// after a serialization failure, a deadlock or a unique violation, and
// returns the operations it ran: ops, and those the transaction took in.
//
// With pending (the committer's batch, see commitLoop), once ops' bodies have
// run, their locks held, the transaction takes what was queued meanwhile
// into pending and takes in, of pending, the operations that lock nothing
// but rows it holds (split): one more round trip reads what they name and
// the clock, their bodies run, and their writes go with the same COMMIT. The
// rest stays pending, for the next batch. On one hot key shared by replicas
// the batch's transaction waited for the other replicas' commits with its
// content fixed when it began; what came meanwhile would otherwise wait for
// the next lock of the row, a commit of its own. An operation taken in is the
// batch's from then on: it runs again with it, and shares its outcome.
func (s *backend) runOps(ctx context.Context, ops []*batchOp, patient bool, pending *[]*batchOp) ([]*batchOp, error) {
	err := s.retry(ctx, func() error {
		pl := s.planOf(ops, patient)
		return s.once(ctx, true, pl, func(t *tx, now time.Time) error {
			if err := runBodies(t, ops, now); err != nil {
				return err
			}
			more := takeIn(pending, s.ops, t.held, maxBatch-len(ops))
			if len(more) == 0 {
				return nil
			}
			ops = append(ops, more...)
			now, err := t.readFor(more)
			if err != nil {
				return err
			}
			return runBodies(t, more, now)
		})
	})
	return ops, err
}

// takeIn moves what is queued on ops into pending, up to maxBatch, and
// returns what of pending a transaction that holds held takes in, at most n
// (split); the rest stays in pending, in order.
func takeIn(pending *[]*batchOp, ops <-chan *batchOp, held map[string]bool, n int) []*batchOp {
	if pending == nil || n <= 0 || len(held) == 0 {
		return nil
	}
	*pending = drainOps(ops, *pending)
	var taken []*batchOp
	taken, *pending = split(*pending, held, n)
	return taken
}

// runBodies runs the bodies of ops in t, in order.
func runBodies(t *tx, ops []*batchOp, now time.Time) error {
	for _, op := range ops {
		if err := safeRun(op, t, now); err != nil {
			if t.dbErr != nil {
				return t.dbErr
			}
			return &opFailed{err: err}
		}
	}
	return nil
}

// readFor reads, in one round trip, what ops name that t does not know yet,
// and the database's clock, which ops' bodies then run at: ops came after
// t began, and must not see a clock older than they are.
func (t *tx) readFor(ops []*batchOp) (time.Time, error) {
	var reads [engine.NumBuckets][][]byte
	est := (*Store)(t.s).Now()
	seen := map[opKey]bool{}
	for _, op := range ops {
		if op.pf.Reads == nil {
			continue
		}
		for _, r := range op.pf.Reads(est) {
			k := opKey{r.Bucket, string(r.Key)}
			if _, ok := t.cached(r.Bucket, r.Key); ok || seen[k] {
				continue
			}
			seen[k] = true
			reads[r.Bucket] = append(reads[r.Bucket], r.Key)
		}
	}
	b := &pgx.Batch{}
	queueReads(b, &reads)
	before := t.s.processNow()
	now, err := t.sendWithClock(b, func(br pgx.BatchResults) error { return readEntries(br, t, &reads) })
	if err != nil {
		return time.Time{}, err
	}
	(*Store)(t.s).measure(before, now, t.s.processNow())
	if t.s.now != nil {
		now = t.s.now()
	}
	return now.UTC(), nil
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
	queueReads(b, &pl.reads)
}

// queueReads queues one statement for the entries of every bucket reads names.
func queueReads(b *pgx.Batch, reads *[engine.NumBuckets][][]byte) {
	var set uint64
	var args []any
	for bucket, keys := range reads {
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
	t.held = make(map[string]bool, len(pl.keys)+len(pl.budgets))
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
			t.held["k"+k] = true
		}
	}
	for _, id := range pl.budgets {
		found, err := pl.readLocked(br, t, engine.BucketBudgets, id)
		if err != nil {
			return err
		}
		if found {
			t.held["b"+id] = true
		}
	}
	if pl.bounded() {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	return readEntries(br, t, &pl.reads)
}

// readEntries reads the answer to queueReads' statement into t.seen: what it
// did not find is known not to exist.
func readEntries(br pgx.BatchResults, t *tx, reads *[engine.NumBuckets][][]byte) error {
	named := false
	for bucket, keys := range reads {
		for _, k := range keys {
			t.seen[opKey{engine.Bucket(bucket), string(k)}] = known{}
			named = true
		}
	}
	if !named {
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
