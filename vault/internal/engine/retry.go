package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// Settles that could not commit. A settle runs after Stripe answered: the
// caller has its answer and will not retry, so a settle lost to a full disk
// would leave its record in progress, and after a restart outcome unknown,
// for an operator to resolve although this process knew the outcome. So a
// settle whose transaction failed for a storage reason is kept here and
// retried, oldest first, until it commits (or the store closes: then the
// record is in progress on disk, and the next start makes it unknown, as
// after a crash). Meanwhile the reaper leaves its record alone (judgeInflight),
// so that the lapse of its lease does not make it unknown either.

// maxPendingSettles bounds the settles kept for a retry: past it, a failed
// settle is given up (logged), its record left to the recovery. Each is a
// few kilobytes (the sealed answer).
const maxPendingSettles = 10000

// Retry delays: the first retry after retryFirst, each next one twice as late,
// at most retryMax. A full disk is freed by a person, so the retries need not
// be eager; a settle queued meanwhile that commits retries the rest at once.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 5 * time.Second
)

// pendingSettle is one settle kept for a retry.
type pendingSettle struct {
	req  vault.SettleRequest
	resp settleSealed
	k    []byte
	done func(error)
}

// settleRetries holds the settles waiting for a retry and runs them.
type settleRetries struct {
	mu      sync.Mutex
	pending []*pendingSettle
	records map[string]int // pending settles by record key
	running bool           // a retry loop is running
	closed  bool
	kick    chan struct{} // wakes the loop before its delay ends
	given   int64         // settles given up (the bound, or a closed store)
	retried int64         // retry transactions run
}

// keep adds p for a retry and reports whether it was kept (false past the
// bound or after close).
func (r *settleRetries) keep(p *pendingSettle) (kept, start bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || len(r.pending) >= maxPendingSettles {
		r.given++
		return false, false
	}
	if r.records == nil {
		r.records = map[string]int{}
		r.kick = make(chan struct{}, 1)
	}
	r.pending = append(r.pending, p)
	r.records[string(p.k)]++
	start = !r.running
	r.running = true
	return true, start
}

// has reports whether a settle of the record k waits for a retry.
func (r *settleRetries) has(k []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.records[string(k)] > 0
}

// count is how many settles wait for a retry.
func (r *settleRetries) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending)
}

// wake makes a running retry loop try at once: a commit just succeeded.
func (r *settleRetries) wake() {
	r.mu.Lock()
	kick, n := r.kick, len(r.pending)
	r.mu.Unlock()
	if n == 0 || kick == nil {
		return
	}
	select {
	case kick <- struct{}{}:
	default:
	}
}

// isRetryable reports whether a settle's failure is one a retry can cure: the
// store could not write (a full disk, an I/O error), not a refusal.
func isRetryable(err error) bool {
	return err != nil && errors.Is(err, vault.ErrStorage) && !errors.Is(err, vault.ErrClosed)
}

// PendingSettles is how many settles wait for a retry (vault.Store).
func (s *Engine) PendingSettles() int { return s.retries.count() }

// SettleRetryStats is what the retries did so far: how many retry
// transactions ran, and how many settles were given up (past the bound, or
// still pending when the store closed).
func (s *Engine) SettleRetryStats() (retried, givenUp int64) {
	s.retries.mu.Lock()
	defer s.retries.mu.Unlock()
	return s.retries.retried, s.retries.given
}

// keepForRetry keeps a settle whose commit failed with err for a retry, and
// reports whether it did. It runs on the committer: it logs from a goroutine.
func (s *Engine) keepForRetry(p *pendingSettle, err error) bool {
	kept, start := s.retries.keep(p)
	if start {
		go s.retryLoop()
	}
	go func() {
		if !kept {
			s.log.Error("a settle that could not commit is given up: its record stays in progress until recovered as unknown",
				"key_id", p.req.KeyID, "outcome", string(p.req.Outcome), "error", err)
			return
		}
		s.log.Warn("a settle could not commit; it is kept in memory and retried until it is durable",
			"key_id", p.req.KeyID, "outcome", string(p.req.Outcome), "error", err)
	}()
	return kept
}

// retryLoop retries the pending settles, oldest first, until none is left or
// the store closes.
func (s *Engine) retryLoop() {
	delay := retryFirst
	r := &s.retries
	for {
		r.mu.Lock()
		kick := r.kick
		r.mu.Unlock()
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-kick:
			t.Stop()
		}
		for {
			r.mu.Lock()
			if len(r.pending) == 0 || r.closed {
				r.running = false
				r.mu.Unlock()
				return
			}
			p := r.pending[0]
			r.retried++
			r.mu.Unlock()
			var res txResult[noValue]
			err := s.b.Submit(context.Background(), func(tx Tx, now time.Time) error {
				var err error
				res, err = s.settleTx(tx, now, &p.req, p.resp, p.k) // a re-run starts over
				return err
			})
			s.noteCommit(err)
			if isRetryable(err) {
				delay = min(delay*2, retryMax)
				break
			}
			delay = retryFirst
			r.mu.Lock()
			r.pending = r.pending[1:]
			if r.records[string(p.k)]--; r.records[string(p.k)] <= 0 {
				delete(r.records, string(p.k))
			}
			r.mu.Unlock()
			if err == nil {
				err = res.err
			}
			if err == nil {
				s.log.Info("a settle kept for a retry is durable", "key_id", p.req.KeyID, "outcome", string(p.req.Outcome))
			} else {
				err = fmt.Errorf("settle: %w", err)
				s.log.Error("a settle kept for a retry failed", "key_id", p.req.KeyID, "error", err)
			}
			if p.done != nil {
				p.done(err)
			}
		}
	}
}

// closeRetries gives up the settles still pending: the store is closing.
// Their records stay in progress on disk, and the next start makes them
// outcome unknown.
func (s *Engine) closeRetries() {
	r := &s.retries
	r.mu.Lock()
	pending := r.pending
	r.pending, r.records, r.closed = nil, nil, true
	r.given += int64(len(pending))
	r.mu.Unlock()
	if len(pending) > 0 {
		s.log.Error("the store closes with settles that never became durable: their records are outcome unknown at the next start",
			"settles", len(pending))
	}
	for _, p := range pending {
		if p.done != nil {
			p.done(fmt.Errorf("settle: the store closed before the settle was durable: %w", vault.ErrClosed))
		}
	}
}
