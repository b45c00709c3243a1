package engine

import (
	"context"
	"time"

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
// key keyID, locks and reads: the key, the record and the counters of the
// windows the key's policy has at now — as the last decoded copy of the key
// knows them: a policy changed since costs a round trip for the counters.
func (s *Engine) keyPrefetch(keyID string, record []byte) *Prefetch {
	return &Prefetch{
		Keys: []string{keyID},
		Reads: func(now time.Time) []Read {
			reads := []Read{{Bucket: BucketIdem, Key: record}}
			key := s.keys.peek(keyID)
			if key == nil {
				return reads
			}
			windows, err := key.Policy.Windows(now)
			if err != nil {
				return reads
			}
			for _, w := range windows {
				reads = append(reads, Read{Bucket: BucketCounters, Key: counterKey(keyID, w.ID)})
			}
			return reads
		},
	}
}

// settlePrefetch is what a Settle of req, whose record is under record,
// locks and reads: keyPrefetch's, and the money object it names.
func (s *Engine) settlePrefetch(req *vault.SettleRequest, record []byte) *Prefetch {
	p := s.keyPrefetch(req.KeyID, record)
	if req.ObjectID == "" {
		return p
	}
	reads := p.Reads
	object := idemKey(req.KeyID, req.ObjectID)
	p.Reads = func(now time.Time) []Read {
		return append(reads(now), Read{Bucket: BucketObjects, Key: object})
	}
	return p
}
