package vault

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/policy"
)

// Options configure a Store. Zero values take the documented defaults.
type Options struct {
	// MasterKey is the 32-byte AES-256-GCM key that seals upstream secrets and stored
	// responses. Required.
	MasterKey []byte
	// Now is the clock; time.Now when nil. Captured once per transaction.
	Now func() time.Time
	// IdempotencyTTL is how long completed records replay (default 24h).
	IdempotencyTTL time.Duration
	// UnknownRetryLimit is the age after which an unknown record is no longer
	// re-forwarded (default 23h).
	UnknownRetryLimit time.Duration
	// Lease is how long an in_progress claim is held before it may be taken over
	// (default 2 minutes; the proxy sets upstream timeout + margin).
	Lease time.Duration
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// OpenTimeout is how long Open waits for the file lock (default 5s).
	OpenTimeout time.Duration
	// CommitObserver, when set, is called after every write transaction of the
	// group committer (Reserve, Settle, the claims API) with the number of
	// operations it carried and how long it took, fsyncs included. It runs on the
	// committer's goroutine, so it must return at once (a metrics observation).
	CommitObserver func(ops int, d time.Duration)
}

// Defaults for Options.
const (
	DefaultIdempotencyTTL    = 24 * time.Hour
	DefaultUnknownRetryLimit = 23 * time.Hour
	DefaultLease             = 2 * time.Minute
	DefaultOpenTimeout       = 5 * time.Second
)

// initialMmapSize is mapped up front so that growing the file rarely has to remap
// (a remap waits for every read transaction).
const initialMmapSize = 64 << 20

// Open opens (creating if needed) the bbolt database at path, checks or writes the
// schema version, and recovers: records left in_progress by a previous process
// become unknown (their holds stay held, counted as held).
//
// Errors: ErrInvalid (master key not 32 bytes), ErrLocked (another process has the
// file), ErrSchemaVersion (written by a newer keybrake), ErrSealed (the master key
// is not the one the database was created with), ErrStorage.
func Open(path string, opts Options) (*Store, error) {
	sl, err := newSealer(opts.MasterKey)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	s := &Store{
		seal:         sl,
		now:          opts.Now,
		ttl:          opts.IdempotencyTTL,
		unknownLimit: opts.UnknownRetryLimit,
		lease:        opts.Lease,
		log:          opts.Logger,
		observe:      opts.CommitObserver,
		ops:          make(chan *batchOp, maxBatch),
		loopDone:     make(chan struct{}),
		reapBatch:    reapBatchSize,
		countChunk:   holdCountChunk,
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.ttl <= 0 {
		s.ttl = DefaultIdempotencyTTL
	}
	if s.unknownLimit <= 0 {
		s.unknownLimit = DefaultUnknownRetryLimit
	}
	if s.lease <= 0 {
		s.lease = DefaultLease
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("component", "vault")
	timeout := opts.OpenTimeout
	if timeout <= 0 {
		timeout = DefaultOpenTimeout
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:         timeout,
		FreelistType:    bolt.FreelistMapType,
		InitialMmapSize: initialMmapSize,
		// NoSync, NoGrowSync and NoFreelistSync stay false: every commit is durable.
	})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, translate(err))
	}
	s.db = db
	var recovered int
	err = db.Update(func(tx *bolt.Tx) error {
		if err := s.initBuckets(tx); err != nil {
			return err
		}
		n, err := recoverInProgress(tx, s.now())
		recovered = n
		return err
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open %s: %w", path, translate(err))
	}
	if recovered > 0 {
		s.log.Warn("recovered in-flight requests as outcome unknown", "records", recovered)
	}
	go s.commitLoop()
	return s, nil
}

// Store is the vault on bbolt. It is safe for concurrent use. Reserve and Settle
// are group-committed: concurrent callers share fsyncs.
type Store struct {
	db           *bolt.DB
	seal         *sealer
	now          func() time.Time
	ttl          time.Duration
	unknownLimit time.Duration
	lease        time.Duration
	log          *slog.Logger
	keys         keyCache

	// Group commit: ops go to commitLoop through ops. closeMu guards closed and the
	// send on ops, so Close can close ops once no sender is left.
	closeMu  sync.RWMutex
	closed   bool
	ops      chan *batchOp
	loopDone chan struct{}
	observe  func(ops int, d time.Duration) // Options.CommitObserver; may be nil
	commits  atomic.Int64                   // write transactions run by commitLoop

	// reapBatch is the most deletions one reaper transaction makes (reapBatchSize;
	// tests lower it).
	reapBatch int
	// countChunk is the most hold index entries one read transaction of CountHolds
	// looks at (holdCountChunk; tests lower it).
	countChunk int
}

// Close stops the committer (pending Reserve and Settle calls finish first), then
// closes the database. Calls after Close return ErrClosed.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	close(s.ops)
	s.closeMu.Unlock()
	<-s.loopDone
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close: %w", translate(err))
	}
	return nil
}

// update runs fn in one write transaction with the clock read once.
func (s *Store) update(fn func(tx *bolt.Tx, now time.Time) error) error {
	return translate(s.db.Update(func(tx *bolt.Tx) error { return fn(tx, s.now()) }))
}

// view runs fn in one read transaction with the clock read once.
func (s *Store) view(fn func(tx *bolt.Tx, now time.Time) error) error {
	return translate(s.db.View(func(tx *bolt.Tx) error { return fn(tx, s.now()) }))
}

// ---- upstreams ----

// PutUpstream registers or replaces the upstream `name` with a sealed secret.
// Returns ErrInvalid for an empty name/secret or a vendor other than "stripe".
func (s *Store) PutUpstream(ctx context.Context, actor, name, vendor, secret string) (Upstream, error) {
	var up Upstream
	err := s.update(func(tx *bolt.Tx, now time.Time) error {
		var err error
		up, err = s.putUpstreamTx(tx, now, actor, name, vendor, secret)
		return err
	})
	if err != nil {
		return Upstream{}, fmt.Errorf("put upstream: %w", err)
	}
	return up, nil
}

// GetUpstream returns ErrNotFound when there is no such upstream.
func (s *Store) GetUpstream(ctx context.Context, name string) (Upstream, error) {
	var up Upstream
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
		rec, err := getUpstream(tx, name)
		if err == nil {
			up = rec.public()
		}
		return err
	})
	if err != nil {
		return Upstream{}, fmt.Errorf("get upstream: %w", err)
	}
	return up, nil
}

// ListUpstreams lists upstreams by name.
func (s *Store) ListUpstreams(ctx context.Context) ([]Upstream, error) {
	var out []Upstream
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
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
func (s *Store) DeleteUpstream(ctx context.Context, actor, name string) error {
	err := s.update(func(tx *bolt.Tx, now time.Time) error {
		return deleteUpstreamTx(tx, now, actor, name)
	})
	if err != nil {
		return fmt.Errorf("delete upstream: %w", err)
	}
	return nil
}

// UpstreamSecret unseals the upstream's secret (ErrNotFound, ErrSealed).
func (s *Store) UpstreamSecret(ctx context.Context, name string) (string, error) {
	var secret string
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
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
	return secret, nil
}

// ---- keys ----

// MintRequest is what MintKey needs. Policy must already be normalized; MintKey
// validates it with ValidateNew (ErrInvalid wrapping *policy.ValidationError).
type MintRequest struct {
	Name     string
	Upstream string
	Labels   map[string]string
	Policy   policy.Policy
}

// MintKey creates a key and returns it with its token ("vk_" + ≥ 256 random bits,
// base62 or base64url). Only the token's SHA-256 is stored. Errors: ErrInvalid,
// ErrConflict (name taken), ErrNotFound (upstream unknown; wrapped so the message
// names the upstream).
func (s *Store) MintKey(ctx context.Context, actor string, req MintRequest) (Key, string, error) {
	var (
		key   Key
		token string
	)
	err := s.update(func(tx *bolt.Tx, now time.Time) error {
		var err error
		key, token, err = s.mintKeyTx(tx, now, actor, req)
		return err
	})
	if err != nil {
		return Key{}, "", fmt.Errorf("mint key: %w", err)
	}
	return key, token, nil
}

// Authenticate finds the key for a token: ErrKeyInvalid (unknown or malformed),
// ErrKeyRevoked. Expiry and not-yet-valid are the policy's business (Decide), so an
// expired key is returned without error.
func (s *Store) Authenticate(ctx context.Context, token string) (Key, error) {
	var key Key
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
		var err error
		key, err = s.authenticateTx(tx, token)
		return err
	})
	if err != nil {
		return key, fmt.Errorf("authenticate: %w", err)
	}
	return key, nil
}

// GetKey returns ErrNotFound when there is no such key.
func (s *Store) GetKey(ctx context.Context, id string) (Key, error) {
	var key Key
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
		rec, err := getKey(tx, id)
		if err == nil {
			key = rec.public()
		}
		return err
	})
	if err != nil {
		return Key{}, fmt.Errorf("get key: %w", err)
	}
	return key, nil
}

// KeyFilter selects keys for ListKeys. Status may be "active", "revoked" or
// "expired" (evaluated at the store clock). Labels must all match. Limit defaults
// to 50, max 500. Cursor is an opaque value from a previous page's next cursor.
type KeyFilter struct {
	Status     KeyStatus
	Labels     map[string]string
	Upstream   string
	NamePrefix string
	Limit      int
	Cursor     string
}

// ListKeys lists keys oldest first (by id). next is "" on the last page.
func (s *Store) ListKeys(ctx context.Context, f KeyFilter) (keys []Key, next string, err error) {
	err = s.view(func(tx *bolt.Tx, now time.Time) error {
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
func (s *Store) UpdateKey(ctx context.Context, actor, id string, p policy.Policy, labels map[string]string) (Key, error) {
	var key Key
	err := s.update(func(tx *bolt.Tx, now time.Time) error {
		var err error
		key, err = updateKeyTx(tx, now, actor, id, p, labels)
		return err
	})
	if err != nil {
		return Key{}, fmt.Errorf("update key: %w", err)
	}
	return key, nil
}

// RevokeKey revokes at once (idempotent: revoking a revoked key returns it).
func (s *Store) RevokeKey(ctx context.Context, actor, id string) (Key, error) {
	var key Key
	err := s.update(func(tx *bolt.Tx, now time.Time) error {
		var err error
		key, err = revokeKeyTx(tx, now, actor, id)
		return err
	})
	if err != nil {
		return Key{}, fmt.Errorf("revoke key: %w", err)
	}
	return key, nil
}

// RotateKey gives the key a new token; the old one stops working at once.
// ErrConflict for a revoked key.
func (s *Store) RotateKey(ctx context.Context, actor, id string) (Key, string, error) {
	var (
		key   Key
		token string
	)
	err := s.update(func(tx *bolt.Tx, now time.Time) error {
		var err error
		key, token, err = rotateKeyTx(tx, now, actor, id)
		return err
	})
	if err != nil {
		return Key{}, "", fmt.Errorf("rotate key: %w", err)
	}
	return key, token, nil
}

// KeyUsage returns the key, its windows at the store clock and their counters, in one
// read transaction.
func (s *Store) KeyUsage(ctx context.Context, id string) (Key, []policy.Window, policy.Usage, error) {
	var (
		key     Key
		windows []policy.Window
		usage   policy.Usage
	)
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
		var err error
		key, windows, usage, err = keyUsageTx(tx, now, id)
		return err
	})
	if err != nil {
		return Key{}, nil, nil, fmt.Errorf("key usage: %w", err)
	}
	return key, windows, usage, nil
}

// ---- metering ----

// ReserveRequest is one request that wants to be forwarded under a vault key.
// IdempotencyKey is required (the proxy derives or demands one for every request
// it meters or remembers). Amount is in minor units of Currency; a request that
// moves no money has Amount 0 and Currency "" and places no hold, but its record
// is still claimed. Metered says whether the request can move money (then an
// Event is written and a hold placed, even for amount 0).
type ReserveRequest struct {
	KeyID          string
	IdempotencyKey string
	Fingerprint    string
	Request        policy.Request
	Metered        bool
	// Tool is the MCP tool that made the request, recorded in its event ("" for
	// none).
	Tool string
}

// ReserveOutcome says what Reserve did.
type ReserveOutcome int

// Reserve outcomes.
const (
	// ReserveClaimed: a new record (in_progress, with lease) and, if metered, a hold on every window.
	ReserveClaimed ReserveOutcome = iota + 1
	// ReserveReplay: the record is completed; Record.Response is Stripe's stored answer.
	ReserveReplay
	// ReserveInFlight: the record is in_progress under a live lease (409, Retry-After).
	ReserveInFlight
	// ReserveMismatch: same idempotency key, different fingerprint (422).
	ReserveMismatch
	// ReserveResume: the record was unknown (or its lease lapsed); it is in_progress again under a
	// new lease and keeps its existing hold. Forward again with the SAME upstream key.
	ReserveResume
	// ReserveStale: the record is unknown and older than UnknownRetryLimit: not re-forwarded;
	// an operator must resolve it.
	ReserveStale
	// ReserveRefused: the policy refused (Decision says why). Nothing was written except the event.
	ReserveRefused
)

// ReserveResult is what Reserve returns. Decision is set for ReserveClaimed (possibly
// with WouldRefuse in report mode) and ReserveRefused. Record is set for every
// outcome but ReserveRefused.
type ReserveResult struct {
	Outcome  ReserveOutcome
	Decision policy.Decision
	Key      Key
	Record   IdempotencyRecord
	Hold     *Hold
}

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
// set), ErrInvalid (empty or over-255-byte idempotency key, negative amount, an
// amount on an unmetered request), ErrSealed (a stored response does not open),
// ErrClosed, ctx's error when ctx ends before the request is queued. Once queued,
// Reserve waits for its transaction even if ctx ends, so its result is never lost.
func (s *Store) Reserve(ctx context.Context, req ReserveRequest) (ReserveResult, error) {
	res, err := submitResult(ctx, s, func(tx *bolt.Tx, now time.Time) (txResult[ReserveResult], error) {
		return s.reserveTx(tx, now, &req)
	})
	if err != nil {
		return res, fmt.Errorf("reserve: %w", err)
	}
	return res, nil
}

// SettleOutcome is how a forwarded request ended.
type SettleOutcome string

// Settle outcomes.
const (
	SettleCommit  SettleOutcome = "commit"  // 2xx: held → committed (Amount may differ from the hold)
	SettleRelease SettleOutcome = "release" // definitive 4xx: held → 0; record completed
	SettleUnknown SettleOutcome = "unknown" // 5xx / no answer: stays held; record unknown
	SettleAbandon SettleOutcome = "abandon" // upstream 429 or never forwarded: record back to its previous state; hold unchanged if it pre-existed, released if this claim created it
)

// SettleRequest settles the record (KeyID, IdempotencyKey). Amount is the money the
// request moved, to commit (minor units). It may be lower than what was held (a
// partial capture); it may exceed the hold plus the exposure of ObjectID only with
// AllowOverrun (see Settle). Response is stored for replay with Commit and Release
// (and Unknown when Stripe answered 5xx: Stripe replays 5xx too).
type SettleRequest struct {
	KeyID           string
	IdempotencyKey  string
	Outcome         SettleOutcome
	Amount          int64
	Response        *StoredResponse
	UpstreamStatus  int
	StripeRequestID string
	// ObjectID is the Stripe object the request created or acted on (recorded in
	// the settle event). A commit whose Object is set is settled against that
	// money object (Object says how).
	ObjectID string
	Object   ObjectSettle
	// Tool is the MCP tool that made the request, recorded in the settle event.
	Tool string
	// AllowOverrun lets a commit exceed the hold plus the object's exposure: Stripe
	// reported that the request moved more than keybrake held, because the object
	// was changed outside keybrake between the amount lookup and the request. The
	// money has moved, so it is booked in full; the excess is added to the windows'
	// allowance and recorded in the settle event. Without it such a commit is
	// ErrInvalid.
	AllowOverrun bool
}

// ObjectSettle says how a commit changes the money object ObjectID.
type ObjectSettle struct {
	// Created: the request created the object (it is the key's own from now on).
	Created bool
	// Expose: what the request held and did not commit stays counted as the
	// object's exposure, instead of being released.
	Expose bool
	// Terminal: Stripe's answer proves the object can move no more money; the rest
	// of its exposure (and of the request's hold) is released.
	Terminal bool
	// Moved is the object's cumulative money moved as the answer reports it
	// (MovedKnown false when it does not), kept for later observations.
	Moved      int64
	MovedKnown bool
}

// Settle applies the outcome in one write transaction, group committed, and writes
// the settle event. A commit takes Amount first from the live exposure of ObjectID
// (oldest part first), then from the request's hold; what is left of the hold
// becomes the object's exposure (Object.Expose) or is released, and a terminal
// answer (Object.Terminal) releases the object's remaining exposure too. Every
// change of the object's exposure writes an "exposure" event on the windows it was
// placed on. ErrNotFound when there is no such record; ErrConflict when the record
// is not in_progress; ErrInvalid for an unknown outcome, a negative amount, or a
// commit above the hold plus the object's exposure without AllowOverrun.
func (s *Store) Settle(ctx context.Context, req SettleRequest) error {
	_, err := submitResult(ctx, s, func(tx *bolt.Tx, now time.Time) (txResult[noValue], error) {
		return s.settleTx(tx, now, &req)
	})
	if err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	return nil
}

// ListHolds lists holds in the given state ("" for all), newest first (by creation).
// Limit defaults to 50, max 500; cursor is the previous page's next (ErrInvalid when
// malformed, as is an unknown state).
func (s *Store) ListHolds(ctx context.Context, state HoldState, limit int, cursor string) ([]Hold, string, error) {
	var (
		holds []Hold
		next  string
	)
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
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
// Keybrake never saw Stripe's answer, so the record stores a synthetic one that a
// retry with the same idempotency key replays: 409, Stripe-Should-Retry: false,
// {"error": {"type": "idempotency_error", "code": "idempotency_key_resolved",
// "message": ..., "keybrake": {"hold_id", "outcome"}}}.
func (s *Store) ResolveHold(ctx context.Context, actor, holdID string, outcome HoldState) (Hold, error) {
	var hold Hold
	err := s.update(func(tx *bolt.Tx, now time.Time) error {
		var err error
		hold, err = s.resolveHoldTx(tx, now, actor, holdID, outcome)
		return err
	})
	if err != nil {
		return Hold{}, fmt.Errorf("resolve hold: %w", err)
	}
	return hold, nil
}

// ---- ledger and audit ----

// RecordEvent appends an event that no hold belongs to — a request that moves no
// money but that report mode let through although the policy would refuse it —
// to its key's ledger, stamped with the store clock. One group-committed write.
// Errors: ErrInvalid (no key id, or an event that carries money: holds write
// their own events), ErrClosed.
func (s *Store) RecordEvent(ctx context.Context, e Event) error {
	if e.KeyID == "" || e.Amount != 0 || e.HoldID != "" || e.HeldDelta != 0 || e.CommittedDelta != 0 {
		return fmt.Errorf("record event: only events without money: %w", ErrInvalid)
	}
	err := s.submit(ctx, func(tx *bolt.Tx, now time.Time) error {
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
func (s *Store) ListEvents(ctx context.Context, keyID string, limit int, cursor string) ([]Event, string, error) {
	var (
		events []Event
		next   string
	)
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
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
func (s *Store) ListAudit(ctx context.Context, limit int, cursor string) ([]AuditEntry, string, error) {
	var (
		entries []AuditEntry
		next    string
	)
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
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
func (s *Store) Reap(ctx context.Context) (int, error) {
	n, _, err := s.reap(ctx) // the caller logs what it removed (once)
	return n, err
}

// Backup writes a hot, consistent copy of the database to w.
func (s *Store) Backup(ctx context.Context, w io.Writer) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var n int64
	err := translate(s.db.View(func(tx *bolt.Tx) error {
		var err error
		n, err = tx.WriteTo(w)
		return err
	}))
	if err != nil {
		return n, fmt.Errorf("backup: %w", err)
	}
	return n, nil
}
