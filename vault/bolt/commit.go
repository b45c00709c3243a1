package bolt

import (
	"context"
	"fmt"
	"time"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// maxBatch bounds how many operations share one write transaction (and its fsyncs).
const maxBatch = 256

// batchOp is one group-committed operation. run must be safe to run more than once:
// it resets its result state at the start of every run, because a batch whose
// transaction fails is rolled back and its ops are re-run one by one. run returns an
// error only when the transaction must be rolled back (a storage failure, or a
// domain error found after it has written something); business outcomes and domain
// errors found before any write are recorded in the op's own result instead, so one
// op cannot fail the others.
type batchOp struct {
	run engine.TxFunc
	// done receives the outcome of a Submit; after is called with the outcome
	// of a Queue instead.
	done  chan error
	after func(error)
}

// finish hands the op its outcome.
func (op *batchOp) finish(err error) {
	if op.after != nil {
		op.after(err)
		return
	}
	op.done <- err
}

// Submit queues run for the committer and waits for its transaction to commit.
// Once queued, it waits even if ctx ends: the write may already be durable, and
// the caller must learn its result.
func (s *backend) Submit(ctx context.Context, run engine.TxFunc) error {
	op := &batchOp{run: run, done: make(chan error, 1)}
	if err := s.enqueue(ctx, op); err != nil {
		return err
	}
	return <-op.done
}

// Queue queues run for the committer and returns: the channel keeps the order
// in which operations were queued, and the committer runs them in that order,
// so an operation queued after run sees what run wrote. done learns the
// outcome after the commit.
func (s *backend) Queue(ctx context.Context, run engine.TxFunc, done func(error)) error {
	return s.enqueue(ctx, &batchOp{run: run, after: done})
}

// enqueue hands op to the committer, or says why it cannot.
func (s *backend) enqueue(ctx context.Context, op *batchOp) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return vault.ErrClosed
	}
	s.ops <- op
	return nil
}

// commitLoop is the group committer. It takes every op queued while the previous
// transaction was committing and applies them all in one write transaction, so
// concurrent callers share its fsyncs. It exits when ops is closed and drained.
func (s *Store) commitLoop() {
	defer close(s.loopDone)
	batch := make([]*batchOp, 0, maxBatch)
	var last batchStats
	for op := range s.ops {
		batch = append(batch[:0], op)
		batch = drain(s.ops, batch)
		batch = linger(s.ops, batch, last)
		last = s.runBatch(batch)
		clear(batch)
	}
}

// batchStats is what the committer remembers of its last batch.
type batchStats struct {
	// waiters counts its operations whose callers waited for the commit
	// (Submit): answered, they are about to queue their next operation.
	waiters int
	// took is how long its transaction took, fsyncs included.
	took time.Duration
}

// Lingering: when the previous batch answered several waiting callers, they
// are about to queue their next operations. The committer waits for them, so
// that concurrent callers share one batch instead of alternating between two
// half-size ones — but boundedly and adaptively: only while operations keep
// arriving (each within lingerQuiet of the last), until as many have come as
// the last batch had waiting callers, and for at most a quarter of the last
// commit's duration (lingerMax at most), so that the wait stays small next to
// the commit it fills. A lone caller never waits, nor does a batch of queued
// settles, whose callers wait for nothing.
const (
	lingerQuiet = 50 * time.Microsecond
	lingerMax   = 500 * time.Microsecond
	// lingerPoll is the sleep between two looks at the queue. The runtime's
	// timers wake an idle process up to a millisecond late, longer than
	// the wait itself, so the committer sleeps in the kernel instead, which
	// wakes it within tens of microseconds and spends no CPU meanwhile.
	lingerPoll = 20 * time.Microsecond
)

// linger collects operations for the batch; see lingerQuiet.
func linger(ops <-chan *batchOp, batch []*batchOp, last batchStats) []*batchOp {
	if last.waiters < 2 {
		return batch
	}
	start := time.Now()
	deadline := start.Add(min(lingerMax, last.took/4))
	quietSince := start
	for came := 0; len(batch) < maxBatch && came < last.waiters; {
		select {
		case next, ok := <-ops:
			if !ok {
				return batch
			}
			batch = append(batch, next)
			came++
			quietSince = time.Now()
			continue
		default:
		}
		now := time.Now()
		if now.Sub(quietSince) >= lingerQuiet || !now.Before(deadline) {
			return batch
		}
		sleepInKernel(lingerPoll)
	}
	return batch
}

// drain appends whatever is queued, without waiting, up to maxBatch.
func drain(ops <-chan *batchOp, batch []*batchOp) []*batchOp {
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

// runBatch runs batch as one record of the log (see commitOps) and returns
// what linger needs to know of it.
func (s *Store) runBatch(batch []*batchOp) batchStats {
	if gate := s.testGate.Load(); gate != nil {
		(*gate)()
	}
	stats := batchStats{}
	for _, op := range batch {
		if op.after == nil {
			stats.waiters++
		}
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	start := time.Now()
	err := s.commitOps(batch)
	stats.took = time.Since(start)
	s.observeCommit(len(batch), start)
	if err == nil || len(batch) == 1 {
		for _, op := range batch {
			op.finish(translate(err))
		}
		return stats
	}
	// Something failed and rolled the whole batch back: run each op alone so that
	// only the op that fails sees the failure.
	s.log.Warn("group commit failed; retrying its operations one by one", "ops", len(batch), "error", err)
	for _, op := range batch {
		start := time.Now()
		err := s.commitOps([]*batchOp{op})
		s.observeCommit(1, start)
		op.finish(translate(err))
	}
	return stats
}

// commitOps runs ops, in order, in one transaction over the tree and the
// layers, and makes what they wrote durable as one log record (commitWrites).
// An op that fails rolls them all back: nothing of theirs is written. The
// caller holds writeMu.
func (s *Store) commitOps(ops []*batchOp) error {
	if s.logErr != nil {
		return s.logErr
	}
	db, release, err := s.useDB()
	if err != nil {
		return err
	}
	defer release()
	s.ws.reset()
	t, err := s.snapshot(db, &s.ws)
	if err != nil {
		return err
	}
	now := s.now()
	for _, op := range ops {
		if err := safeRun(op, t, now); err != nil {
			t.rollback()
			return err
		}
	}
	t.rollback()
	return s.commitWrites(t.w)
}

// commitWrites appends w to the log as the next record, waits for its
// fdatasync, and only then adds it to the active layer, where every read
// after sees it: nothing is seen that a crash could take back. The caller
// holds writeMu.
func (s *Store) commitWrites(w *writeSet) error {
	if w.empty() {
		return nil // nothing to make durable
	}
	lsn := s.lastLSN + 1
	s.recBuf = encodeRecord(s.recBuf[:0], s.logw.seg, lsn, w)
	n := len(s.recBuf)
	// The zero header after it marks the end (see wal.go).
	s.recBuf = append(s.recBuf, make([]byte, recHeader)...)
	if err := s.appendRecord(s.recBuf, n); err != nil {
		return err
	}
	s.lastLSN = lsn
	l := s.active
	first := l.empty()
	l.mu.Lock()
	l.apply(lsn, w, int64(n))
	l.mu.Unlock()
	s.visible.Store(lsn)
	if first {
		select {
		case s.foldKick <- struct{}{}:
		default:
		}
	}
	return nil
}

// observeCommit counts one write transaction of the committer and reports it to
// the CommitObserver, if there is one.
func (s *Store) observeCommit(ops int, start time.Time) {
	s.commits.Add(1)
	if s.observe != nil {
		s.observe(ops, time.Since(start))
	}
}

// safeRun runs one op, turning a panic into an error so that a bug in one op can
// neither kill the committer (and hang every caller) nor commit half an op.
func safeRun(op *batchOp, tx engine.Tx, now time.Time) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in store operation: %v", r)
		}
	}()
	return op.run(tx, now)
}
