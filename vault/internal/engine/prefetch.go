package engine

import (
	"context"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// Read names one entry a transaction will read.
type Read struct {
	Bucket Bucket
	Key    []byte
}

// Prefetch says ahead what a hot-path write will lock and read, so that a
// backend over a network (PostgreSQL) can take the locks and read the entries
// in one round trip before the transaction's body runs, and take the locks of
// several callers' writes in one order. It is a hint, never a contract: the
// body still calls LockKey and reads through Get and GetMany, and whatever
// the hint missed (a key it did not name, a window that began since) is read
// then, as without it. A backend with nothing to gain (bbolt) ignores it.
type Prefetch struct {
	// Keys are the vault keys the write locks (LockKey, or a Get of the key's
	// own entry); their entries in BucketKeys are read with the locks.
	Keys []string
	// Budgets are the budgets the write locks (a Get from BucketBudgets): the
	// chain of the key's budget as last seen. A backend locks them after
	// every key, in id order, and reads their entries with the locks.
	Budgets []string
	// Reads lists the entries the write reads under those locks, at now: the
	// backend's best estimate of the clock the transaction will read.
	Reads func(now time.Time) []Read
}

// Prefetcher is a Backend that takes a Prefetch with a hot-path write; its
// methods are Submit and Queue otherwise.
type Prefetcher interface {
	SubmitPrefetch(ctx context.Context, p *Prefetch, fn TxFunc) error
	QueuePrefetch(ctx context.Context, p *Prefetch, fn TxFunc, done func(error)) error
}

// submitPrefetch is submit with what fn will lock and read (see Prefetch).
func (s *Engine) submitPrefetch(ctx context.Context, p *Prefetch, fn TxFunc) error {
	pb, ok := s.b.(Prefetcher)
	if !ok || p == nil {
		return s.submit(ctx, fn)
	}
	err := pb.SubmitPrefetch(ctx, p, fn)
	s.noteCommit(err)
	return err
}

// queuePrefetch is the backend's Queue with what fn will lock and read.
func (s *Engine) queuePrefetch(ctx context.Context, p *Prefetch, fn TxFunc, done func(error)) error {
	if pb, ok := s.b.(Prefetcher); ok {
		return pb.QueuePrefetch(ctx, p, fn, done)
	}
	return s.b.Queue(ctx, fn, done)
}

// keyPrefetch is what a Reserve or a Settle of the record under record, of
// key keyID, locks and reads: the key, the budgets of its chain, the record,
// the counters of the windows the key's policy and its budgets' have at now,
// and with upstream the key's upstream (a Reserve with a remembered key,
// keyChanged) — as the last decoded copies of the key and its budgets know
// them: a policy or a chain changed since costs a round trip for what it adds (and,
// on PostgreSQL, a budget lock taken out of the batch's order, which a
// deadlock the server breaks and the batch's retry cures). It is nil for a
// backend that takes no Prefetch: the hint, its closure and the cache's lock
// cost every Reserve and Settle something, for nothing.
func (s *Engine) keyPrefetch(keyID string, record []byte, upstream bool) *Prefetch {
	if !s.prefetches {
		return nil
	}
	key := s.keys.peek(keyID)
	var chain []*budgetRec
	if key != nil {
		chain = s.budgetHints.chain(key.Policy.Budget)
	}
	p := &Prefetch{
		Keys: []string{keyID},
		Reads: func(now time.Time) []Read {
			reads := []Read{{Bucket: BucketIdem, Key: record}}
			if key == nil {
				return reads
			}
			if upstream {
				reads = append(reads, Read{Bucket: BucketUpstreams, Key: []byte(key.Upstream)})
			}
			if windows, err := key.Policy.Windows(now); err == nil {
				for _, w := range windows {
					reads = append(reads, Read{Bucket: BucketCounters, Key: counterKey(keyID, w.ID)})
				}
			}
			for _, b := range chain {
				windows, err := b.policy().Windows(now)
				if err != nil {
					continue
				}
				for _, w := range windows {
					reads = append(reads, Read{Bucket: BucketCounters, Key: counterKey("", scopedWindowID(b.ID, w.ID))})
				}
			}
			return reads
		},
	}
	// A budget's counters are named only with the budget itself: read
	// before its lock, they could be stale by the time the body writes them.
	for _, b := range chain {
		p.Budgets = append(p.Budgets, b.ID)
	}
	return p
}

// budgetHints keeps the budgets a Reserve last decoded, for Prefetch only:
// possibly stale, never used for a decision (the body reads every budget
// again under its lock).
type budgetHints struct {
	byID Bounded[string, *budgetRec] // never modified once kept
}

// note keeps chain's budgets, as a Reserve read them.
func (h *budgetHints) note(chain []*budgetRec) {
	for _, b := range chain {
		h.byID.Put(b.ID, b)
	}
}

// chain is the chain of budget id, closest first, as far as the hints know
// it (nothing past a budget they do not know, at most policy.MaxChainDepth).
func (h *budgetHints) chain(id string) []*budgetRec {
	var out []*budgetRec
	for id != "" && len(out) < policy.MaxChainDepth {
		b, ok := h.byID.Get(id)
		if !ok {
			break
		}
		out = append(out, b)
		id = b.Parent
	}
	return out
}

// settlePrefetch is what a Settle of req, whose record is under record,
// locks and reads: keyPrefetch's, and the money object it names.
func (s *Engine) settlePrefetch(req *vault.SettleRequest, record []byte) *Prefetch {
	p := s.keyPrefetch(req.KeyID, record, false)
	if p == nil || req.ObjectID == "" {
		return p
	}
	reads := p.Reads
	object := idemKey(req.KeyID, req.ObjectID)
	p.Reads = func(now time.Time) []Read {
		return append(reads(now), Read{Bucket: BucketObjects, Key: object})
	}
	return p
}
