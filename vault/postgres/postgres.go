// Package postgres is the vault's store on PostgreSQL, for several keybrake
// replicas that share one set of caps, keys and idempotency records. The
// vault's rules run in the shared engine (vault/internal/engine), exactly as
// on bbolt; this package gives the engine PostgreSQL transactions.
//
// # Layout
//
// Each bucket of the engine is a table keybrake_<bucket> of (k bytea primary
// key, v bytea): the engine's own encoding, the same bytes a bbolt file holds,
// so the two stores cannot drift and a vault copies from one to the other
// entry by entry. Secrets, stored answers and claim results are sealed
// (AES-256-GCM under the master key) inside the values; tokens are kept only
// as SHA-256 hashes. The schema is versioned by keybrake_schema_migrations and
// brought up to date by Open under an advisory lock; a database with a newer
// schema is refused.
//
// # Transactions, isolation and locks
//
// A write transaction runs at READ COMMITTED and locks the vault key's row
// (SELECT … FOR UPDATE on keybrake_keys) before it reads anything else of the
// key's — records, counters, money objects, claims: the engine asks for the
// lock first in every write of a key (engine.Tx.LockKey; a read of the key row
// itself takes it). Two replicas writing under one key are therefore
// serialized exactly as bbolt's single writer serializes them, and since each
// statement of a READ COMMITTED transaction reads the newest committed data,
// the reads that follow the lock see every write of the transactions that
// held it before — a hold is decided against the counters as they are and
// placed in the same transaction, never a read in one and a write in another.
// A new idempotency record or claim is a plain INSERT under the primary key:
// two transactions that somehow both found it free cannot both commit. A
// serialization failure, a deadlock or a unique violation rolls the
// transaction back and runs it again from the start (the engine's bodies start
// over on every run). Reads run at REPEATABLE READ, READ ONLY: one snapshot
// for everything a read (a listing, the invariant check) looks at.
//
// # Group commit
//
// Reserve and Settle say ahead what they will lock and read (engine.Prefetch).
// Each Store's committer runs every such write queued while the previous
// transaction committed in one transaction, in order: its first round trip
// begins it, locks every key named in key order (so that replicas' batches
// cannot deadlock), reads every entry named (one statement for all buckets)
// and the clock; the bodies find them there; the writes, buffered, go with
// the COMMIT in one more round trip, in one statement (a data-modifying WITH
// per table and kind of write). One commit of the server serves the batch,
// and a hot key's row is locked once per batch. A batch, once its locks are
// held, takes in what was queued meanwhile for the rows it holds, in one more
// round trip, and commits it too; the rest of it begins the next batch
// (docs/decisions/0115 and 0118). A key another session holds for longer
// than batchLockWait is left to a batch of its own, which waits up to
// lock_timeout (docs/decisions/0056 and 0057).
//
// # Time
//
// The store's clock is the database's: each transaction reads
// clock_timestamp() when it begins, so replicas whose own clocks disagree
// still open a new day's window at the same instant, and a lease lapses at the
// same instant for all of them. Options.UnsafeNow replaces it, for tests only.
//
// # Replicas that die
//
// A replica that dies mid-request leaves its record in progress under a
// lease. Nobody waits for its restart: a retry with the same idempotency key
// resumes it once the lease has lapsed, and the reaper, which every replica
// runs (an advisory lock keeps two from reaping at once; each entry is judged
// again under its key's lock), turns it into outcome unknown with its hold
// kept. Open does the same for lapsed leases, and only for them: the live
// leases are other replicas' requests in flight.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// Options configure a Store. Zero values take the documented defaults.
type Options struct {
	// MasterKey is the 32-byte AES-256-GCM key that seals upstream secrets,
	// stored responses and claim results. Every replica must have the same one.
	// Required.
	MasterKey []byte
	// IdempotencyTTL is how long completed records replay (default 24h).
	IdempotencyTTL time.Duration
	// UnknownRetryLimit is the age after which an unknown record is no longer
	// re-forwarded (default 23h).
	UnknownRetryLimit time.Duration
	// Lease is how long an in_progress record is held before another replica
	// may take it over (default 2 minutes; the proxy sets upstream timeout +
	// margin).
	Lease time.Duration
	// LedgerRetention is how long ledger events are kept (default
	// vault.DefaultLedgerRetention); Reap rolls older ones up.
	LedgerRetention time.Duration
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// CommitObserver, when set, is called after every write transaction of the
	// hot path (Reserve, Settle, the claims API) with the number of operations
	// it carried (a group commit carries several) and how long it took.
	CommitObserver func(ops int, d time.Duration)
	// ProcessNow is the process's clock, against which the database's offset
	// is measured (time.Now when nil): Store.Now is ProcessNow plus that
	// offset.
	ProcessNow func() time.Time
	// UnsafeNow replaces the database's clock. It exists for tests, which drive
	// time through a clock of their own; a replica that used its own clock
	// could open a new day's window early. serve never sets it.
	UnsafeNow func() time.Time
}

// SessionDefaults are the server settings keybrake gives each of its sessions
// unless the database URL sets them (as a query parameter of that name):
// how long a statement waits for a lock another session holds (a key's row,
// held by another replica), how long a statement may run, and how long a
// session may sit idle inside a transaction before the server ends it and
// rolls the transaction back. lock_timeout is below the others, so that a
// frozen replica's waiting statements have all given up before its lock is
// freed, and none of them takes it next. enable_seqscan is off: every
// statement of keybrake's finds its rows by primary key, and the planner
// would otherwise read a table of a few thousand rows whole for a batch's
// read of a few dozen keys, at three times the cost of the index
// (docs/decisions/0119-lookups-by-key-never-scan-a-table.md).
var SessionDefaults = map[string]string{
	"lock_timeout":                        "10s",
	"statement_timeout":                   "30s",
	"idle_in_transaction_session_timeout": "30s",
	"enable_seqscan":                      "off",
}

// DefaultMaxConns is the pool size when the URL does not set pool_max_conns
// (at least 4 per CPU): enough connections for concurrent requests to share
// PostgreSQL's commits. A pool_max_conns below 2 is raised to 2.
const DefaultMaxConns = 16

// Store is the vault on PostgreSQL. It is safe for concurrent use, and any
// number of Stores, in any number of processes, may share one database.
type Store struct {
	*engine.Engine
	pool *pgxpool.Pool
	log  *slog.Logger
	now  func() time.Time // nil: the database's clock
	// processNow is the process's clock; offset (nanoseconds) is the
	// database's clock minus it, as the last transaction's start measured.
	processNow func() time.Time
	offset     atomic.Int64
	measured   atomic.Bool
	observe    func(ops int, d time.Duration)

	// createdSchema says that this Store's Open created keybrake's schema
	// in an empty database (it applied the first migration).
	createdSchema bool

	closeOnce sync.Once
	closed    atomic.Bool
	// closeMu orders the queueing of operations before Close closes ops.
	closeMu sync.RWMutex

	// ops is the queue of the group committer (batch.go); loops counts
	// it and the batches that wait for a lock on their own, whose number
	// patient bounds.
	ops   chan *batchOp
	loops sync.WaitGroup
	// lookups is the queue of the lookup loops (lookup.go), which loops
	// counts too.
	lookups chan *lookup
	patient chan struct{}
	// lockTimeout is the sessions' lock_timeout (lockTimeoutParam as set),
	// the longest wait for a lock; 0 when it does not parse.
	lockTimeout      time.Duration
	lockTimeoutParam string
	// statementTimeoutParam is the sessions' statement_timeout as set.
	// lockBound is the statement_timeout a batch's lock statements run
	// under, so that a wait for a row lock ends at lock_timeout however
	// many waiters queue before it (lockTimeoutParam); "" when the
	// session's statement_timeout is already no longer, or there is no
	// lock_timeout to keep to (batch.go).
	statementTimeoutParam, lockBound string
	// roundTrips counts the round trips to the database, for the measurement
	// of a Reserve's.
	roundTrips atomic.Int64
	// deadlocks counts the transactions the server aborted to break a
	// deadlock (run again by retry), for the tests.
	deadlocks atomic.Int64
}

var (
	_ vault.Store       = (*Store)(nil)
	_ vault.ClockReader = (*Store)(nil)
)

// Open connects to the database at url (postgres://…), brings its schema up
// to date, checks or writes the master key check, and turns the in-progress
// records whose lease lapsed into outcome unknown. The pool takes
// pool_max_conns and the other pgxpool parameters from url.
//
// Errors: ErrInvalid (a master key that is not 32 bytes, a malformed URL),
// ErrSchemaVersion (the database was written by a newer keybrake), ErrSealed
// (the database was created with another master key), ErrStorage (the
// database cannot be reached, or fails).
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	s, err := open(ctx, url, opts)
	if err != nil {
		return nil, fmt.Errorf("open PostgreSQL store: %w", err)
	}
	return s, nil
}

func open(ctx context.Context, url string, opts Options) (*Store, error) {
	cfg, err := parseURL(url)
	if err != nil {
		return nil, err
	}
	if !hasParam(url, "pool_max_conns") {
		cfg.MaxConns = max(DefaultMaxConns, 4*int32(runtime.GOMAXPROCS(0)))
	}
	// The reaper keeps one connection for its advisory lock while it reaps
	// on another.
	cfg.MaxConns = max(cfg.MaxConns, 2)
	cfg.AfterConnect = registerByteaArray
	params := cfg.ConnConfig.RuntimeParams
	if params["application_name"] == "" {
		params["application_name"] = "keybrake"
	}
	// A replica frozen inside a transaction (SIGSTOP, a pause of its VM)
	// must not hold a key's lock for long: its session ends, the transaction
	// rolls back. The others meanwhile wait at most lock_timeout for the key
	// and answer 503 store_unavailable (retryable); no statement runs longer
	// than statement_timeout. No transaction of keybrake's waits on anything
	// but the database while it is open, so none of them comes near these.
	for name, value := range SessionDefaults {
		if params[name] == "" {
			params[name] = value
		}
	}
	s := &Store{now: opts.UnsafeNow, processNow: opts.ProcessNow, observe: opts.CommitObserver,
		ops: make(chan *batchOp, 4*maxBatch), lookups: make(chan *lookup, maxLookups), patient: make(chan struct{}, max(1, cfg.MaxConns/4)),
		lockTimeoutParam: params["lock_timeout"], statementTimeoutParam: params["statement_timeout"]}
	if d, ok := parseSetting(s.lockTimeoutParam); ok {
		if d == 0 {
			d = math.MaxInt64 // no limit
		}
		s.lockTimeout = d
	}
	if s.lockTimeout > 0 && s.lockTimeout < math.MaxInt64 {
		s.lockBound = s.lockTimeoutParam
		if d, ok := parseSetting(s.statementTimeoutParam); ok && d > 0 && d <= s.lockTimeout {
			s.lockBound = ""
		}
	}
	if s.processNow == nil {
		s.processNow = time.Now
	}
	s.Engine, err = engine.New((*backend)(s), engine.Config{
		MasterKey: opts.MasterKey, IdempotencyTTL: opts.IdempotencyTTL,
		UnknownRetryLimit: opts.UnknownRetryLimit, Lease: opts.Lease, Logger: opts.Logger,
		LedgerRetention: opts.LedgerRetention, RememberKeys: true,
	})
	if err != nil {
		return nil, err
	}
	s.log = s.Log()
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, translate(err)
	}
	s.loops.Add(1 + lookupLoops)
	go (*backend)(s).commitLoop()
	for range lookupLoops {
		go (*backend)(s).lookupLoop()
	}
	if err := s.start(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// start migrates the schema, checks the master key and recovers lapsed leases.
func (s *Store) start(ctx context.Context) error {
	applied, err := migrate(ctx, s.pool)
	if err != nil {
		return translate(err)
	}
	s.createdSchema = len(applied) > 0 && applied[0] == 1
	if len(applied) > 0 {
		s.log.Info("PostgreSQL schema migrated", "versions", applied, "schema_version", SchemaVersion())
	}
	if err := (*backend)(s).Update(ctx, func(tx engine.Tx, _ time.Time) error { return s.InitMeta(tx) }); err != nil {
		return err
	}
	_, err = s.RecoverLapsed(ctx)
	return err
}

// Now is the store's clock: the database's (UnsafeNow under test), read as
// the process's clock plus the offset measured at the start of the latest
// transaction (every transaction reads clock_timestamp() as it begins, so a
// replica that serves measures it all the time, and /readyz's Ping refreshes
// it on one that does not). The offset is known to within half a round trip.
func (s *Store) Now() time.Time {
	if s.now != nil {
		return s.now()
	}
	return s.processNow().Add(time.Duration(s.offset.Load()))
}

// ClockOffset is how far the database's clock is ahead of the process's (a
// negative offset: behind), as last measured; ok is false before the first
// measurement and under UnsafeNow.
func (s *Store) ClockOffset() (offset time.Duration, ok bool) {
	if s.now != nil || !s.measured.Load() {
		return 0, false
	}
	return time.Duration(s.offset.Load()), true
}

// measure records the offset of the database's clock read as db, between the
// process's instants before and after the round trip that read it.
func (s *Store) measure(before, db, after time.Time) {
	mid := before.Add(after.Sub(before) / 2)
	s.offset.Store(int64(db.Sub(mid)))
	s.measured.Store(true)
}

// CreatedSchema reports whether this Store's Open created keybrake's schema in
// an empty database: of several replicas starting together on one, exactly
// one did (migrations run under an advisory lock).
func (s *Store) CreatedSchema() bool { return s.createdSchema }

// Close closes the pool; transactions under way finish first, and operations
// queued for the group committer (those it took from the queue and has not
// run yet included) are answered, with ErrClosed if they had not begun.
// Calls after Close return ErrClosed.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closeMu.Lock()
		s.closed.Store(true)
		close(s.ops)
		close(s.lookups)
		s.closeMu.Unlock()
		s.loops.Wait()
		s.pool.Close()
	})
	return nil
}

// Size is how many bytes keybrake's tables take in the database, with their
// indexes and TOAST data (not the rest of a database keybrake shares).
func (s *Store) Size(ctx context.Context) (int64, error) {
	if s.closed.Load() {
		return 0, fmt.Errorf("size: %w", vault.ErrClosed)
	}
	var n int64
	err := s.pool.QueryRow(ctx, "SELECT coalesce(sum(pg_total_relation_size(t::regclass)), 0)::bigint FROM unnest($1::text[]) AS t", tableNames()).Scan(&n)
	s.roundTrips.Add(1)
	if err != nil {
		return 0, fmt.Errorf("size: %w", translate(err))
	}
	return n, nil
}

// Backup is not what this store does: a PostgreSQL database is backed up with
// pg_dump (or the server's own backups), which copy it consistently while
// replicas write. It returns errors.ErrUnsupported.
func (s *Store) Backup(ctx context.Context, w io.Writer) (int64, error) {
	return 0, fmt.Errorf("backup: the PostgreSQL store is backed up with pg_dump: %w", errors.ErrUnsupported)
}

// Compact is not what this store does: PostgreSQL's autovacuum makes the space
// of deleted rows reusable, and VACUUM FULL gives it back to the file system.
// It returns errors.ErrUnsupported.
func (s *Store) Compact(ctx context.Context) (vault.CompactResult, error) {
	return vault.CompactResult{}, fmt.Errorf("compact: PostgreSQL's autovacuum reclaims the space of deleted rows (VACUUM FULL gives it back to the file system): %w", errors.ErrUnsupported)
}

// reapLock is the advisory lock key that keeps two replicas from reaping at
// once ("keybrake" + 1).
const reapLock = migrateLock + 1

// Reap reaps like every store (vault.Store.Reap) unless another replica is
// reaping right now, in which case it returns at once: the work would be the
// same. Each entry is judged again under its key's lock, so running it
// anyway would be harmless.
func (s *Store) Reap(ctx context.Context) (int, error) {
	if s.closed.Load() {
		return 0, fmt.Errorf("reap: %w", vault.ErrClosed)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("reap: %w", translate(err))
	}
	defer conn.Release()
	var mine bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", reapLock).Scan(&mine); err != nil {
		return 0, fmt.Errorf("reap: %w", translate(err))
	}
	if !mine {
		return 0, nil
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", reapLock); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx)) // the session's end releases it
		}
	}()
	return s.Engine.Reap(ctx)
}
