package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// Config is what the engine needs of a store's options. Zero values take the
// documented defaults.
type Config struct {
	// MasterKey is the 32-byte AES-256-GCM key that seals upstream secrets,
	// stored responses and claim results. Required.
	MasterKey []byte
	// IdempotencyTTL is how long completed records replay (default 24h).
	IdempotencyTTL time.Duration
	// UnknownRetryLimit is the age after which an unknown record is no longer
	// re-forwarded (default 23h).
	UnknownRetryLimit time.Duration
	// Lease is how long an in_progress claim is held before it may be taken over
	// (default 2 minutes; the proxy sets upstream timeout + margin).
	Lease time.Duration
	// LedgerRetention is how long ledger events are kept (default
	// vault.DefaultLedgerRetention); the reaper removes older ones into
	// roll-ups (retention.go).
	LedgerRetention time.Duration
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// SoleWriter says that no other process writes the store (bbolt's file
	// lock): the engine keeps authenticated keys and unsealed upstream
	// secrets in memory, and forgets them after every write transaction of
	// its own that could change them (see memo). A store shared by replicas
	// (PostgreSQL) leaves it false: another replica's revocation must stop the
	// next request here too.
	SoleWriter bool
	// AppendRecords says that new idempotency records are appended to the
	// records bucket, in the order they are claimed, with their place in the
	// idem bucket (bbolt: fewer pages per commit; see recordRec). PostgreSQL
	// keeps them in place, where a record is read in one round trip.
	AppendRecords bool
	// CheapReads says that a read transaction costs less than a write, which
	// waits for a group commit (bbolt): Reserve first looks for a completed
	// record in a read, so that a replay costs no write transaction.
	CheapReads bool
	// RememberKeys says that AuthenticateRemembered may answer from the
	// keys this process authenticated before, which another process may have
	// changed since (see vault.KeyRememberer): a store shared by replicas.
	RememberKeys bool
}

// Engine is the vault's logic — every rule about keys, money, idempotency,
// claims, the ledger and the audit — over a Backend's transactions. It
// implements vault.Store but for what only a backend can do (Size, Backup,
// Close). It is safe for concurrent use.
type Engine struct {
	b            Backend
	seal         *Sealer
	ttl          time.Duration
	unknownLimit time.Duration
	lease        time.Duration
	retention    time.Duration
	log          *slog.Logger
	keys         keyCache
	budgetHints  budgetHints
	queued       settleQueue
	retries      settleRetries
	commitErr    atomic.Pointer[error] // see CommitError
	// authHints keeps, for each token this replica authenticated, the
	// upstream its key named then: only a choice of which upstream entry to
	// read with the token and its key, never a decision (authenticateTx).
	// With upstreamVersions it spares Authenticate a round trip and a decode
	// on PostgreSQL.
	authHints        Bounded[string, string]
	upstreamVersions decodedCache[uint64]
	// memo holds authenticated keys and upstream secrets on a sole writer;
	// nil otherwise.
	memo *memo
	// remembered holds, on a store that remembers keys (Config.RememberKeys),
	// the keys authenticated here, possibly stale: only
	// AuthenticateRemembered answers from it. nil otherwise.
	remembered    *memo
	cheapReads    bool
	appendRecords bool
	// prefetches says that the backend takes a Prefetch with a hot-path
	// write (Prefetcher); for one that does not (bbolt), none is made.
	prefetches bool
	// webhooks is what the hot path knows of the webhook endpoints (outbox.go).
	webhooks webhookCache

	// reapBatch is the most deletions one reaper transaction makes (reapBatchSize;
	// tests lower it).
	reapBatch int
	// countChunk is the most entries one read transaction of CountHolds and
	// SummarizeUsage looks at (holdCountChunk; tests lower it).
	countChunk int

	// watch wakes the requests that wait for an approval's decision.
	watch approvalWatch
}

// New returns an engine over b. Errors: ErrInvalid (a master key that is not
// 32 bytes).
func New(b Backend, cfg Config) (*Engine, error) {
	sl, err := NewSealer(cfg.MasterKey)
	if err != nil {
		return nil, err
	}
	e := &Engine{
		b:             b,
		seal:          sl,
		ttl:           cmp.Or(max(cfg.IdempotencyTTL, 0), vault.DefaultIdempotencyTTL),
		unknownLimit:  cmp.Or(max(cfg.UnknownRetryLimit, 0), vault.DefaultUnknownRetryLimit),
		lease:         cmp.Or(max(cfg.Lease, 0), vault.DefaultLease),
		retention:     cmp.Or(max(cfg.LedgerRetention, 0), vault.DefaultLedgerRetention),
		log:           cfg.Logger,
		reapBatch:     reapBatchSize,
		countChunk:    holdCountChunk,
		cheapReads:    cfg.CheapReads,
		appendRecords: cfg.AppendRecords,
	}
	_, e.prefetches = b.(Prefetcher)
	if cfg.SoleWriter {
		e.memo = &memo{}
		e.webhooks.sole = true
	} else if cfg.RememberKeys {
		e.remembered = &memo{}
	}
	if e.log == nil {
		e.log = slog.Default()
	}
	e.log = e.log.With("component", "vault")
	return e, nil
}

// KeepsSecrets reports whether the engine keeps unsealed upstream secrets in
// memory (vault.SecretKeeper): on a store no other process writes.
func (s *Engine) KeepsSecrets() bool { return s.memo != nil }

// Closing tells the engine that its backend is closing: it forgets the keys
// and secrets it kept in memory and keeps no more, so that every call meets
// the closed backend.
func (s *Engine) Closing() {
	s.memo.close()
	s.remembered.close()
	s.closeRetries()
}

// Sealer is the engine's Sealer, for a backend's own sealing needs (rekey).
func (s *Engine) Sealer() *Sealer { return s.seal }

// Log is the engine's logger ("component" vault).
func (s *Engine) Log() *slog.Logger { return s.log }

// update runs fn in one write transaction with the clock read once, after
// every settle queued before (see settleQueue): an admin's change or the
// reaper judges the records as the proxy left them.
func (s *Engine) update(ctx context.Context, fn TxFunc) error {
	if err := s.settled(ctx, ""); err != nil {
		return err
	}
	// Every key and upstream change is such a transaction: what the memo
	// holds may be stale once it commits.
	// Those of another process are caught where a remembered key is used.
	defer s.memo.forget()
	defer s.remembered.forget()
	return s.b.Update(ctx, fn)
}

// view runs fn in one read transaction with the clock read once. It reads
// what settles do not change (keys, upstreams, claims, the audit).
func (s *Engine) view(ctx context.Context, fn TxFunc) error { return s.b.View(ctx, fn) }

// viewSettled is view after every settle of keyID ("" for every key) queued
// before it is durable (see settleQueue): for reads of records, holds,
// counters, money objects and the ledger.
func (s *Engine) viewSettled(ctx context.Context, keyID string, fn TxFunc) error {
	if err := s.settled(ctx, keyID); err != nil {
		return err
	}
	return s.b.View(ctx, fn)
}

// submit runs fn as one hot-path write transaction (see Backend.Submit).
func (s *Engine) submit(ctx context.Context, fn TxFunc) error {
	err := s.b.Submit(ctx, fn)
	s.noteCommit(err)
	return err
}

// NoteCommit remembers the outcome of a hot-path write transaction, or of a
// backend's own write probe (Ping): a storage failure until the next one
// succeeds (CommitError).
func (s *Engine) NoteCommit(err error) { s.noteCommit(err) }

func (s *Engine) noteCommit(err error) {
	switch {
	case err == nil:
		if s.commitErr.Load() != nil {
			s.commitErr.Store(nil)
		}
	case isRetryable(err):
		s.commitErr.Store(&err)
	}
}

// CommitError is the storage failure of the last hot-path write transaction
// (Reserve, Settle, the claims API, Ping), or nil when it committed: what
// keybrake_not_ready reports between two readiness probes, without writing.
func (s *Engine) CommitError() error {
	if p := s.commitErr.Load(); p != nil {
		return *p
	}
	return nil
}

// txResult is what one store operation answers its caller: its value and, when
// the operation was turned down before it wrote anything, the domain error that
// says why (ErrNotFound, ErrConflict, ErrInvalid, ErrKeyRevoked, …). A
// transaction function returns it beside an error kept for failures — storage,
// or a rule broken after a write — which roll the transaction back. Keeping the
// two apart is what lets an operation that is turned down share a batch with
// others without failing them.
type txResult[T any] struct {
	val T
	err error
}

// noValue is the value of an operation that answers only whether it was done.
type noValue = struct{}

// accept is the result of an operation that did what it was asked.
func accept[T any](v T) txResult[T] { return txResult[T]{val: v} }

// reject is the result of an operation turned down before any write.
func reject[T any](err error) txResult[T] { return txResult[T]{err: err} }

// submitResult runs fn as one hot-path write and returns its result: its value
// and its domain error, or the failure of its transaction.
func submitResult[T any](ctx context.Context, s *Engine, fn func(tx Tx, now time.Time) (txResult[T], error)) (T, error) {
	return submitPrefetched(ctx, s, nil, fn)
}

// submitPrefetched is submitResult with what fn will lock and read (see
// Prefetch; nil: nothing said).
func submitPrefetched[T any](ctx context.Context, s *Engine, p *Prefetch, fn func(tx Tx, now time.Time) (txResult[T], error)) (T, error) {
	var r txResult[T]
	err := s.submitPrefetch(ctx, p, func(tx Tx, now time.Time) error {
		var err error
		r, err = fn(tx, now) // a re-run starts over
		return err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return r.val, r.err
}

// ---- upstreams ----

// PutUpstream registers or replaces the upstream `name` with a sealed secret.
// Returns ErrInvalid for an empty name/secret or a vendor other than "stripe".
// created says whether the transaction that wrote it found no upstream of
// that name: decided under the upstream's row lock (or by the insert's
// conflict), so of two replicas registering one new name at once only one
// answers created.
func (s *Engine) PutUpstream(ctx context.Context, actor, name, vendor, secret string) (up vault.Upstream, created bool, err error) {
	err = s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		up, created, err = s.putUpstreamTx(tx, now, actor, name, vendor, secret)
		return err
	})
	if err != nil {
		return vault.Upstream{}, false, fmt.Errorf("put upstream: %w", err)
	}
	return up, created, nil
}

// GetUpstream returns ErrNotFound when there is no such upstream.
func (s *Engine) GetUpstream(ctx context.Context, name string) (vault.Upstream, error) {
	var up vault.Upstream
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		rec, err := getUpstream(tx, name)
		if err == nil {
			up = rec.public()
		}
		return err
	})
	if err != nil {
		return vault.Upstream{}, fmt.Errorf("get upstream: %w", err)
	}
	return up, nil
}

// ListUpstreams lists upstreams by name.
func (s *Engine) ListUpstreams(ctx context.Context) ([]vault.Upstream, error) {
	var out []vault.Upstream
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		var err error
		out, err = listUpstreamsTx(tx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list upstreams: %w", err)
	}
	return out, nil
}

// DeleteUpstream returns ErrNotFound, or ErrConflict while an active key uses it.
func (s *Engine) DeleteUpstream(ctx context.Context, actor, name string) error {
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		return deleteUpstreamTx(tx, now, actor, name)
	})
	if err != nil {
		return fmt.Errorf("delete upstream: %w", err)
	}
	return nil
}

// UpstreamSecret unseals the upstream's secret (ErrNotFound, ErrSealed).
func (s *Engine) UpstreamSecret(ctx context.Context, name string) (string, error) {
	if secret, ok := s.memo.secret(name); ok {
		return secret, nil
	}
	gen := s.memo.generation()
	var secret string
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		rec, err := getUpstream(tx, name)
		if err != nil {
			return err
		}
		pt, err := s.seal.open(rec.SealedSecret, upstreamAD(name))
		if err != nil {
			return err
		}
		secret = string(pt)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("upstream secret: %w", err)
	}
	s.memo.keepSecret(gen, name, secret)
	return secret, nil
}

// ---- keys ----

// MintKey creates a key and returns it with its token ("vk_" + ≥ 256 random bits,
// base62 or base64url). Only the token's SHA-256 is stored. Errors: ErrInvalid,
// ErrConflict (name taken), ErrNotFound (upstream unknown; wrapped so the message
// names the upstream).
func (s *Engine) MintKey(ctx context.Context, actor string, req vault.MintRequest) (vault.Key, string, error) {
	var (
		key   vault.Key
		token string
	)
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		key, token, err = s.mintKeyTx(tx, now, actor, req)
		return err
	})
	if err != nil {
		return vault.Key{}, "", fmt.Errorf("mint key: %w", err)
	}
	return key, token, nil
}

// Authenticate finds the key for a token: ErrKeyInvalid (unknown or malformed),
// ErrKeyRevoked. Expiry and not-yet-valid are the policy's business (Decide), so an
// expired key is returned without error.
func (s *Engine) Authenticate(ctx context.Context, token string) (vault.Key, error) {
	if !wellFormedToken(token) {
		return vault.Key{}, fmt.Errorf("authenticate: %w", vault.ErrKeyInvalid)
	}
	hash := tokenHash(token)
	ar, ok := s.memo.key(hash)
	if !ok {
		gen, rgen := s.memo.generation(), s.remembered.generation()
		read := s.view
		if r, ok := s.b.(Reader); ok {
			// The token and its key are read in one statement, the
			// upstream's version after them: a newer version than the
			// key's snapshot is the one the next request would see.
			read = r.Read
		}
		err := read(ctx, func(tx Tx, now time.Time) error {
			var err error
			ar, err = s.authenticateTx(tx, hash)
			return err
		})
		if err != nil {
			if errors.Is(err, vault.ErrKeyInvalid) {
				s.remembered.dropKey(hash) // a token rotated out, through another replica
			}
			return vault.Key{}, fmt.Errorf("authenticate: %w", err)
		}
		s.memo.keepKey(gen, hash, ar)
		if ar.key.Status == vault.KeyRevoked {
			s.remembered.dropKey(hash)
		} else {
			s.remembered.keepKey(rgen, hash, ar)
		}
	}
	return authenticated(ar)
}

// AuthenticateRemembered is Authenticate answered, where the store remembers
// keys (Config.RememberKeys), from the key this process last authenticated
// for token, if any: remembered is then true, and the key may have changed
// since (see vault.KeyRememberer). Elsewhere it is Authenticate.
func (s *Engine) AuthenticateRemembered(ctx context.Context, token string) (vault.Key, bool, error) {
	if wellFormedToken(token) {
		if ar, ok := s.remembered.key(tokenHash(token)); ok {
			key, err := authenticated(ar)
			return key, true, err
		}
	}
	key, err := s.Authenticate(ctx, token)
	return key, false, err
}

// authenticated is Authenticate's answer for the key ar.
func authenticated(ar authRec) (vault.Key, error) {
	key := ar.key.public()
	key.UpstreamVersion = ar.upstreamVersion
	if key.Status == vault.KeyRevoked {
		return key, fmt.Errorf("authenticate: key %s: %w", key.ID, vault.ErrKeyRevoked)
	}
	return key, nil
}

// GetKey returns ErrNotFound when there is no such key.
func (s *Engine) GetKey(ctx context.Context, id string) (vault.Key, error) {
	var key vault.Key
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		rec, err := getKey(tx, id)
		if err == nil {
			key = rec.public()
		}
		return err
	})
	if err != nil {
		return vault.Key{}, fmt.Errorf("get key: %w", err)
	}
	return key, nil
}

// ListKeys lists keys oldest first (by id). next is "" on the last page.
func (s *Engine) ListKeys(ctx context.Context, f vault.KeyFilter) (keys []vault.Key, next string, err error) {
	err = s.view(ctx, func(tx Tx, now time.Time) error {
		var err error
		keys, next, err = listKeysTx(tx, now, f)
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list keys: %w", err)
	}
	return keys, next, nil
}

// UpdateKey replaces the key's policy and labels in one transaction, validating the
// policy with ValidateNew. Usage is never touched. Errors: ErrNotFound,
// ErrInvalid, ErrConflict (revoked keys cannot be changed).
func (s *Engine) UpdateKey(ctx context.Context, actor, id string, p policy.Policy, labels map[string]string) (vault.Key, error) {
	var key vault.Key
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		key, err = updateKeyTx(tx, now, actor, id, p, labels)
		return err
	})
	if err != nil {
		return vault.Key{}, fmt.Errorf("update key: %w", err)
	}
	return key, nil
}

// PatchKey changes the key as change.Apply says, from the key as it is, in
// one write transaction that holds the key's lock (see vault.Store.PatchKey).
func (s *Engine) PatchKey(ctx context.Context, actor, id string, change vault.KeyChange) (vault.Key, error) {
	if change.Apply == nil {
		return vault.Key{}, fmt.Errorf("patch key: no change: %w", vault.ErrInvalid)
	}
	var (
		key     vault.Key
		refused error
	)
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		key, refused, err = patchKeyTx(tx, now, actor, id, change) // a re-run starts over
		return err
	})
	switch {
	case err != nil:
		return vault.Key{}, fmt.Errorf("patch key: %w", err)
	case refused != nil:
		return vault.Key{}, refused
	}
	return key, nil
}

// RevokeKey revokes at once (idempotent: revoking a revoked key returns it).
func (s *Engine) RevokeKey(ctx context.Context, actor, id string) (vault.Key, error) {
	var key vault.Key
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		key, err = revokeKeyTx(tx, now, actor, id)
		return err
	})
	if err != nil {
		return vault.Key{}, fmt.Errorf("revoke key: %w", err)
	}
	return key, nil
}

// RecordKeyRefusal counts a request refused for the key's status. A hot-path
// write: it does not empty the memo, since nothing the proxy reads changes.
func (s *Engine) RecordKeyRefusal(ctx context.Context, id string, r vault.KeyRefusal) error {
	if r.Code == "" {
		return fmt.Errorf("record key refusal: no code: %w", vault.ErrInvalid)
	}
	if r.Count < 0 {
		return fmt.Errorf("record key refusal: negative count %d: %w", r.Count, vault.ErrInvalid)
	}
	_, err := submitResult(ctx, s, func(tx Tx, now time.Time) (txResult[noValue], error) {
		rec, err := getKey(tx, id)
		if errors.Is(err, vault.ErrNotFound) {
			return reject[noValue](err), nil
		}
		if err != nil {
			return txResult[noValue]{}, err
		}
		f := rec.Refused
		if f == nil {
			f = &refusedRec{First: now}
			rec.Refused = f
		}
		f.Count += max(r.Count, 1)
		f.Code, f.Last = r.Code, now
		f.RemoteAddr, f.Path = r.RemoteAddr, r.Path
		return accept(noValue{}), putJSON(tx, BucketKeys, []byte(id), rec)
	})
	if err != nil {
		return fmt.Errorf("record key refusal %s: %w", id, err)
	}
	return nil
}

// RotateKey gives the key a new token; the old one stops working at once.
// ErrConflict for a revoked key.
func (s *Engine) RotateKey(ctx context.Context, actor, id string) (vault.Key, string, error) {
	var (
		key   vault.Key
		token string
	)
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		key, token, err = rotateKeyTx(tx, now, actor, id)
		return err
	})
	if err != nil {
		return vault.Key{}, "", fmt.Errorf("rotate key: %w", err)
	}
	return key, token, nil
}

// KeyUsage returns the key, its windows at the store clock and their counters, in one
// read transaction.
func (s *Engine) KeyUsage(ctx context.Context, id string) (vault.Key, []policy.Window, policy.Usage, error) {
	var (
		key     vault.Key
		windows []policy.Window
		usage   policy.Usage
	)
	err := s.viewSettled(ctx, id, func(tx Tx, now time.Time) error {
		var err error
		key, windows, usage, err = s.keyUsageTx(tx, now, id)
		return err
	})
	if err != nil {
		return vault.Key{}, nil, nil, fmt.Errorf("key usage: %w", err)
	}
	return key, windows, usage, nil
}

// ---- metering ----

// Reserve authenticates nothing (the caller has the key) but re-reads the key in the
// same write transaction: a revoked key gives ErrKeyRevoked. Then, atomically, it
// looks up the idempotency record (ReserveReplay, ReserveInFlight, ReserveMismatch,
// ReserveResume, ReserveStale),
// else runs policy.Decide against the current window counters and, if allowed,
// writes the record (in_progress with a lease) and adds Amount to `held` of every
// window — or writes nothing but a refusal event. One write transaction, group
// committed. Business outcomes are results, not errors.
//
// Errors: ErrNotFound (no such key), ErrKeyRevoked (ReserveResult.Key is still
// set), ErrKeyChanged (req.KeyVersion set, and the key or its upstream at
// another version), ErrInvalid (empty or over-255-byte idempotency key, negative amount, an
// amount on an unmetered request), ErrSealed (a stored response does not open),
// ErrClosed, ctx's error when ctx ends before the request is queued. Once queued,
// Reserve waits for its transaction even if ctx ends, so its result is never lost.
func (s *Engine) Reserve(ctx context.Context, req vault.ReserveRequest) (vault.ReserveResult, error) {
	pk := newPairKeys(req.KeyID, req.IdempotencyKey)
	if s.cheapReads {
		if res, ok, err := s.reserveFromRead(ctx, &req, &pk); err != nil || ok {
			if err != nil {
				return res, fmt.Errorf("reserve: %w", err)
			}
			return res, nil
		}
	}
	res, err := submitPrefetched(ctx, s, s.keyPrefetch(req.KeyID, pk.record, req.KeyVersion != 0), func(tx Tx, now time.Time) (txResult[vault.ReserveResult], error) {
		return s.reserveTx(tx, now, &req, &pk)
	})
	if err != nil {
		return res, fmt.Errorf("reserve: %w", err)
	}
	return res, nil
}

// Settle applies the outcome in one hot-path write transaction and writes
// the settle event. A commit takes Amount first from the live exposure of ObjectID
// (oldest part first), then from the request's hold; what is left of the hold
// becomes the object's exposure (Object.Expose) or is released, and a terminal
// answer (Object.Terminal) releases the object's remaining exposure too. Every
// change of the object's exposure writes an "exposure" event on the windows it was
// placed on. ErrNotFound when there is no such record; ErrConflict when the record
// is not in_progress; ErrInvalid for an unknown outcome, a negative amount, or a
// commit above the hold plus the object's exposure without AllowOverrun.
func (s *Engine) Settle(ctx context.Context, req vault.SettleRequest) error {
	resp, err := s.settleResponse(&req)
	if err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	k := recordKey(req.KeyID, req.IdempotencyKey) // hashed before the committer
	_, err = submitPrefetched(ctx, s, s.settlePrefetch(&req, k), func(tx Tx, now time.Time) (txResult[noValue], error) {
		return s.settleTx(tx, now, &req, resp, k)
	})
	if err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	return nil
}

// SettleQueued is Settle for a caller that need not wait until the settle is
// durable (see vault.Store.SettleQueued): it queues the settle behind the
// hot-path writes queued before it and returns; done, when set, learns Settle's
// error once the transaction is durable or failed. It runs on the store's
// committer and must return at once.
func (s *Engine) SettleQueued(ctx context.Context, req vault.SettleRequest, done func(error)) error {
	resp, err := s.settleResponse(&req)
	if err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	var r txResult[noValue]
	k := recordKey(req.KeyID, req.IdempotencyKey) // hashed before the committer
	s.queued.add(req.KeyID)
	err = s.queuePrefetch(ctx, s.settlePrefetch(&req, k), func(tx Tx, now time.Time) error {
		var err error
		r, err = s.settleTx(tx, now, &req, resp, k) // a re-run starts over
		return err
	}, func(err error) {
		s.queued.finish(req.KeyID)
		s.noteCommit(err)
		if isRetryable(err) && s.keepForRetry(&pendingSettle{req: req, resp: resp, k: k, done: done}, err) {
			return // done is called once the retry ends
		}
		if err == nil {
			s.retries.wake()
		}
		if done == nil {
			return
		}
		if err == nil {
			err = r.err
		}
		if err != nil {
			err = fmt.Errorf("settle: %w", err)
		}
		done(err)
	})
	if err != nil {
		s.queued.finish(req.KeyID) // never queued
		return fmt.Errorf("settle: %w", err)
	}
	return nil
}

// settled waits until every settle of keyID ("" for every key) queued before it
// was called is durable, so that the read that follows sees it.
func (s *Engine) settled(ctx context.Context, keyID string) error {
	return s.queued.wait(ctx, keyID)
}

// settleSealed is what a settle stores sealed: the answer, and the request
// of an unknown outcome.
type settleSealed struct {
	resp    *responseRec
	request []byte
}

// settleResponse seals what a settle stores, before its transaction: the
// committer's time is the scarce one.
func (s *Engine) settleResponse(req *vault.SettleRequest) (settleSealed, error) {
	var out settleSealed
	if req.Outcome == vault.SettleUnknown && req.Request != nil {
		var err error
		if out.request, err = s.sealRequest(req.KeyID, req.IdempotencyKey, req.Request); err != nil {
			return settleSealed{}, err
		}
	}
	if req.Response == nil || req.Outcome == vault.SettleAbandon {
		return out, nil
	}
	var err error
	out.resp, err = s.sealResponse(req.KeyID, req.IdempotencyKey, req.Response)
	return out, err
}

// ListHolds lists holds in the given state ("" for all), newest first (by creation).
// Limit defaults to 50, max 500; cursor is the previous page's next (ErrInvalid when
// malformed, as is an unknown state).
func (s *Engine) ListHolds(ctx context.Context, state vault.HoldState, limit int, cursor string) ([]vault.Hold, string, error) {
	var (
		holds []vault.Hold
		next  string
	)
	err := s.viewSettled(ctx, "", func(tx Tx, now time.Time) error {
		var err error
		holds, next, err = listHoldsTx(tx, state, limit, cursor)
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list holds: %w", err)
	}
	return holds, next, nil
}

// ResolveHold settles an unknown hold by an operator's decision (HoldCommitted or
// HoldReleased) and completes its record. ErrNotFound; ErrConflict unless the hold
// is unknown (or held with its lease lapsed); ErrInvalid for another outcome.
//
// Keybrake never saw Stripe's answer, so no answer is stored: the record is
// marked resolved, and the proxy answers a retry with the same idempotency key
// with its own 409 idempotency_key_resolved.
func (s *Engine) ResolveHold(ctx context.Context, actor, holdID string, outcome vault.HoldState) (vault.Hold, error) {
	var hold vault.Hold
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		hold, err = s.resolveHoldTx(tx, now, actor, holdID, outcome)
		return err
	})
	if err != nil {
		return vault.Hold{}, fmt.Errorf("resolve hold: %w", err)
	}
	return hold, nil
}

// ---- ledger and audit ----

// RecordEvent appends an event that no hold belongs to — a request that moves no
// money but that report mode let through although the policy would refuse it —
// to its key's ledger, stamped with the store clock. One hot-path write.
// Errors: ErrInvalid (no key id, or an event that carries money: holds write
// their own events), ErrClosed.
func (s *Engine) RecordEvent(ctx context.Context, e vault.Event) error {
	if e.KeyID == "" || e.Amount != 0 || e.HoldID != "" || e.HeldDelta != 0 || e.CommittedDelta != 0 {
		return fmt.Errorf("record event: only events without money: %w", vault.ErrInvalid)
	}
	err := s.submit(ctx, func(tx Tx, now time.Time) error {
		ev := e
		ev.Time = now
		return putEvent(tx, &ev)
	})
	if err != nil {
		return fmt.Errorf("record event: %w", err)
	}
	return nil
}

// ListEvents lists a key's events newest first. Limit defaults to 50, max 500;
// cursor is the previous page's next.
func (s *Engine) ListEvents(ctx context.Context, keyID string, limit int, cursor string) ([]vault.Event, string, error) {
	var (
		events []vault.Event
		next   string
	)
	err := s.viewSettled(ctx, keyID, func(tx Tx, now time.Time) error {
		var err error
		events, next, err = listEventsTx(tx, keyID, limit, cursor)
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list events: %w", err)
	}
	return events, next, nil
}

// ListAudit lists audit entries newest first. Limit defaults to 50, max 500;
// cursor is the previous page's next.
func (s *Engine) ListAudit(ctx context.Context, limit int, cursor string) ([]vault.AuditEntry, string, error) {
	var (
		entries []vault.AuditEntry
		next    string
	)
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		var err error
		entries, next, err = listAuditTx(tx, limit, cursor)
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list audit: %w", err)
	}
	return entries, next, nil
}

// ---- maintenance ----

// Reap deletes completed idempotency records older than IdempotencyTTL and daily
// counters of days that ended more than 48 hours ago with nothing held, in small
// transactions. It returns how many entries it removed. It also deletes the settled
// holds of the records it removes and metered-object totals unchanged for
// ObjectRetention; unknown and in_progress records are never removed.
func (s *Engine) Reap(ctx context.Context) (int, error) {
	c, err := s.reap(ctx) // the caller logs what it removed (once)
	return c.removed, err
}

// ---- budgets ----

// CreateBudget creates a budget (see vault.Store).
func (s *Engine) CreateBudget(ctx context.Context, actor string, spec vault.BudgetSpec) (vault.Budget, error) {
	var b vault.Budget
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		b, err = s.createBudgetTx(tx, now, actor, spec)
		return err
	})
	if err != nil {
		return vault.Budget{}, fmt.Errorf("create budget: %w", err)
	}
	return b, nil
}

// GetBudget returns one budget (see vault.Store).
func (s *Engine) GetBudget(ctx context.Context, id string) (vault.Budget, error) {
	var b vault.Budget
	err := s.view(ctx, func(tx Tx, _ time.Time) error {
		r, err := getBudget(tx, id)
		if err == nil {
			b = r.public()
		}
		return err
	})
	if err != nil {
		return vault.Budget{}, fmt.Errorf("get budget: %w", err)
	}
	return b, nil
}

// ListBudgets lists budgets oldest first (see vault.Store).
func (s *Engine) ListBudgets(ctx context.Context, f vault.BudgetFilter) (budgets []vault.Budget, next string, err error) {
	err = s.view(ctx, func(tx Tx, _ time.Time) error {
		var err error
		budgets, next, err = listBudgetsTx(tx, f)
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list budgets: %w", err)
	}
	return budgets, next, nil
}

// PatchBudget changes a budget under its lock (see vault.Store).
func (s *Engine) PatchBudget(ctx context.Context, actor, id string, change vault.BudgetChange) (vault.Budget, error) {
	if change.Apply == nil {
		return vault.Budget{}, fmt.Errorf("patch budget: no change: %w", vault.ErrInvalid)
	}
	var (
		b       vault.Budget
		refused error
	)
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		b, refused, err = s.patchBudgetTx(tx, now, actor, id, change) // a re-run starts over
		return err
	})
	switch {
	case err != nil:
		return vault.Budget{}, fmt.Errorf("patch budget: %w", err)
	case refused != nil:
		return vault.Budget{}, refused
	}
	return b, nil
}

// DeleteBudget deletes a budget no key or budget names (see vault.Store).
func (s *Engine) DeleteBudget(ctx context.Context, actor, id string) error {
	err := s.update(ctx, func(tx Tx, now time.Time) error { return deleteBudgetTx(tx, now, actor, id) })
	if err != nil {
		return fmt.Errorf("delete budget: %w", err)
	}
	return nil
}

// BudgetChain returns a budget and its ancestors with their usage (see
// vault.Store).
func (s *Engine) BudgetChain(ctx context.Context, id string) ([]vault.BudgetState, error) {
	var out []vault.BudgetState
	err := s.viewSettled(ctx, "", func(tx Tx, now time.Time) error {
		var err error
		out, err = budgetChainTx(tx, now, id)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("budget chain: %w", err)
	}
	return out, nil
}

// UnknownRequest returns the record of an unknown hold and the request it was
// forwarded with (see vault.Store).
func (s *Engine) UnknownRequest(ctx context.Context, holdID string) (vault.IdempotencyRecord, vault.StoredRequest, error) {
	var rec *recordRec
	err := s.viewSettled(ctx, "", func(tx Tx, now time.Time) error {
		var err error
		rec, err = getRecordByHold(tx, holdID)
		return err
	})
	if err != nil {
		return vault.IdempotencyRecord{}, vault.StoredRequest{}, fmt.Errorf("unknown request: %w", err)
	}
	if rec.Hold.State != vault.HoldUnknown || rec.State != vault.RecordUnknown {
		return vault.IdempotencyRecord{}, vault.StoredRequest{}, fmt.Errorf("hold %s is %s, not unknown: %w", holdID, rec.Hold.State, vault.ErrConflict)
	}
	if rec.SealedRequest == nil {
		return vault.IdempotencyRecord{}, vault.StoredRequest{}, fmt.Errorf(
			"the request of hold %s was not kept (its outcome became unknown in a crash, or before keybrake kept requests): %w", holdID, vault.ErrConflict)
	}
	req, err := s.openRequest(rec)
	if err != nil {
		return vault.IdempotencyRecord{}, vault.StoredRequest{}, fmt.Errorf("unknown request of hold %s: %w", holdID, err)
	}
	pub, err := s.publicRecord(rec)
	if err != nil {
		return vault.IdempotencyRecord{}, vault.StoredRequest{}, fmt.Errorf("unknown request: %w", err)
	}
	return pub, req, nil
}
