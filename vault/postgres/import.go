package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// Source is a store that Import can copy: vault/bolt's Store.
type Source interface {
	// Export calls fn with a snapshot of the whole store, in one read
	// transaction.
	Export(ctx context.Context, fn func(engine.Snapshot) error) error
	// CheckInvariant checks the store's consistency (vault.Store).
	CheckInvariant(ctx context.Context) error
}

// ImportOptions configure Import.
type ImportOptions struct {
	// MasterKey is the master key the source was sealed with. The copy keeps
	// every sealed value as it is, so every replica of the target needs this
	// key. Required.
	MasterKey []byte
	// LockTimeout bounds the wait for keybrake's tables, which a replica
	// writing to the target holds (default 10 s).
	LockTimeout time.Duration
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// BeforeCommit, when set, runs once the copy is checked and before it
	// commits; its error rolls the copy back. migrate-store marks the bbolt
	// vault as migrated there, so that the vault is never served beside a
	// committed copy.
	BeforeCommit func(ctx context.Context) error
}

// ImportStats counts what Import copied.
type ImportStats struct {
	// Entries counts the entries copied, by bucket name ("keys", "idem",
	// "events", …; docs/ARCHITECTURE.md lists them).
	Entries map[string]int64
	// Holds counts the holds by state (every metered request has one; "held"
	// and "unknown" are the open ones).
	Holds map[vault.HoldState]int64
}

// importableMeta are the only entries a target may hold and still count as
// empty: what Open writes into a new database (a replica started once,
// before the vault was migrated).
var importableMeta = [][]byte{engine.MetaSchemaVersion, engine.MetaMasterCheck, engine.MetaPing}

// Import copies the store src into the empty PostgreSQL database at url (keybrake
// migrate-store): every bucket's entries, byte for byte, and every bucket's
// sequence. It first checks src's consistency and brings the target's schema up
// to date; then, in ONE transaction that holds every keybrake table
// exclusively, it checks that the target is empty, copies, and checks the copy —
// entry counts, the master key, the invariant — before it commits. A failure
// at any point leaves the target as it was: a copy is whole or absent, and
// running Import again after one is safe.
//
// The target counts as empty when keybrake's tables hold nothing but what Open
// writes into a new database: the schema version and a master key check, which
// must then open with opts.MasterKey. Records src left in progress are copied as
// they are: their leases lapse and the target's reaper makes them outcome
// unknown (a bbolt store has already done so when it opened).
//
// Errors: ErrInvalid (a master key that is not 32 bytes, a malformed URL),
// ErrConflict (the target is not empty, or its tables stayed locked longer
// than LockTimeout), ErrSealed (the target was started with another master
// key; the source does not open with opts.MasterKey), ErrInvariant (the source
// or, which would be a bug, the copy is not consistent), ErrSchemaVersion,
// ErrStorage.
func Import(ctx context.Context, url string, src Source, opts ImportOptions) (ImportStats, error) {
	stats, err := importStore(ctx, url, src, opts)
	if err != nil {
		return ImportStats{}, fmt.Errorf("import into PostgreSQL: %w", err)
	}
	return stats, nil
}

func importStore(ctx context.Context, url string, src Source, opts ImportOptions) (ImportStats, error) {
	sealer, err := engine.NewSealer(opts.MasterKey)
	if err != nil {
		return ImportStats{}, err
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = 10 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := src.CheckInvariant(ctx); err != nil {
		return ImportStats{}, fmt.Errorf("the source is not consistent, so nothing was copied: %w", err)
	}
	cfg, err := parseURL(url)
	if err != nil {
		return ImportStats{}, err
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return ImportStats{}, translate(err)
	}
	defer pool.Close()
	applied, err := migrate(ctx, pool)
	if err != nil {
		return ImportStats{}, translate(err)
	}
	if len(applied) > 0 {
		log.Info("PostgreSQL schema migrated", "versions", applied, "schema_version", SchemaVersion())
	}
	var stats ImportStats
	err = src.Export(ctx, func(snap engine.Snapshot) error {
		return translate(pgx.BeginFunc(ctx, pool, func(ptx pgx.Tx) error {
			var err error
			stats, err = copyInto(ctx, ptx, snap, sealer, opts.LockTimeout)
			if err == nil && opts.BeforeCommit != nil {
				err = opts.BeforeCommit(ctx)
			}
			return err
		}))
	})
	if err != nil {
		return ImportStats{}, err
	}
	return stats, nil
}

// copyInto is the import's one transaction: lock, check emptiness, copy,
// carry the sequences over, verify.
func copyInto(ctx context.Context, ptx pgx.Tx, snap engine.Snapshot, sealer *engine.Sealer, lockTimeout time.Duration) (ImportStats, error) {
	stats := ImportStats{Entries: map[string]int64{}, Holds: map[vault.HoldState]int64{}}
	// A replica writing to the target holds row locks; a replica starting
	// waits here until the copy is committed, and then sees it.
	if _, err := ptx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", lockTimeout.Milliseconds())); err != nil {
		return stats, err
	}
	tables := tableNames()
	if _, err := ptx.Exec(ctx, "LOCK TABLE "+joinIdentifiers(tables)+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		if isLockTimeout(err) {
			return stats, fmt.Errorf("keybrake's tables in the target stayed locked for %s: a keybrake replica is using the database; stop every replica first: %w",
				lockTimeout, vault.ErrConflict)
		}
		return stats, err
	}
	if err := checkEmpty(ctx, ptx, sealer); err != nil {
		return stats, err
	}
	if _, err := ptx.Exec(ctx, "DELETE FROM "+table(engine.BucketMeta)); err != nil {
		return stats, err
	}
	for _, b := range engine.Buckets() {
		rows := &snapshotRows{c: snap.Cursor(b)}
		if b == engine.BucketHoldIndex {
			rows.visit = func(_, v []byte) { stats.Holds[vault.HoldState(v)]++ }
		}
		n, err := ptx.CopyFrom(ctx, pgx.Identifier{table(b)}, []string{"k", "v"}, rows)
		if err != nil {
			return stats, fmt.Errorf("copy %s: %w", b.Name(), err)
		}
		if n != rows.n {
			return stats, fmt.Errorf("copy %s: %d entries read, %d written: %w", b.Name(), rows.n, n, vault.ErrStorage)
		}
		stats.Entries[b.Name()] = n
		seq, err := snap.Sequence(b)
		if err != nil {
			return stats, fmt.Errorf("sequence of %s: %w", b.Name(), err)
		}
		if seq > math.MaxInt64 {
			return stats, fmt.Errorf("sequence of %s is %d, beyond PostgreSQL's: %w", b.Name(), seq, vault.ErrInvalid)
		}
		if seq > 0 {
			if _, err := ptx.Exec(ctx, "SELECT setval($1::regclass, $2)", table(b)+"_seq", int64(seq)); err != nil {
				return stats, fmt.Errorf("sequence of %s: %w", b.Name(), err)
			}
		}
	}
	return stats, verifyCopy(ctx, ptx, stats, sealer)
}

// checkEmpty refuses a target that holds anything but what Open writes into
// a new database, and a master key check another key made.
func checkEmpty(ctx context.Context, ptx pgx.Tx, sealer *engine.Sealer) error {
	for _, b := range engine.Buckets() {
		var k, v []byte
		err := ptx.QueryRow(ctx, "SELECT k, v FROM "+table(b)+" WHERE NOT (k = ANY($1::bytea[])) OR $2 LIMIT 1",
			importableMeta, b != engine.BucketMeta).Scan(&k, &v)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("the target database is not empty (%s holds entries): migrate-store copies into an empty database only, "+
			"so that no vault key, cap or idempotency record is mixed with another vault's: %w", table(b), vault.ErrConflict)
	}
	var check []byte
	err := ptx.QueryRow(ctx, "SELECT v FROM "+table(engine.BucketMeta)+" WHERE k = $1", engine.MetaMasterCheck).Scan(&check)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	if err := sealer.CheckMaster(check); err != nil {
		return fmt.Errorf("a keybrake replica already started on the target database with another master key than the source's: "+
			"replicas of the migrated vault need the source's key: %w", err)
	}
	return nil
}

// verifyCopy reads the copy back in its own transaction before it commits:
// each table holds what was copied, the master key opens it, and it passes
// the invariant check.
func verifyCopy(ctx context.Context, ptx pgx.Tx, stats ImportStats, sealer *engine.Sealer) error {
	for _, b := range engine.Buckets() {
		var n int64
		if err := ptx.QueryRow(ctx, "SELECT count(*) FROM "+table(b)).Scan(&n); err != nil {
			return err
		}
		if n != stats.Entries[b.Name()] {
			return fmt.Errorf("verify: %s holds %d entries after copying %d: %w", table(b), n, stats.Entries[b.Name()], vault.ErrStorage)
		}
	}
	var check []byte
	if err := ptx.QueryRow(ctx, "SELECT v FROM "+table(engine.BucketMeta)+" WHERE k = $1", engine.MetaMasterCheck).Scan(&check); err != nil {
		return fmt.Errorf("verify: the master key check: %w", err)
	}
	if err := sealer.CheckMaster(check); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	var now time.Time
	if err := ptx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
		return err
	}
	t := &tx{ctx: ctx, s: &backend{}, conn: ptx.Conn()}
	problems, err := engine.CheckInvariantTx(t, now.UTC())
	if err == nil {
		err = t.err
	}
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if problems != nil {
		return fmt.Errorf("verify: the copy is not consistent: %w", problems)
	}
	return nil
}

// snapshotRows feeds a bucket's entries to COPY, counting them. The values
// are encoded into COPY's buffer as they are read, within the snapshot's
// transaction.
type snapshotRows struct {
	c       engine.Cursor
	started bool
	k, v    []byte
	n       int64
	visit   func(k, v []byte) // called for each entry, if set
}

func (r *snapshotRows) Next() bool {
	if r.started {
		r.k, r.v = r.c.Next()
	} else {
		r.k, r.v = r.c.First()
		r.started = true
	}
	if r.k == nil {
		return false
	}
	r.n++
	if r.visit != nil {
		r.visit(r.k, r.v)
	}
	return true
}

func (r *snapshotRows) Values() ([]any, error) { return []any{r.k, r.v}, nil }

func (r *snapshotRows) Err() error { return nil }

// joinIdentifiers quotes and joins table names for a statement.
func joinIdentifiers(names []string) string {
	var b bytes.Buffer
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(pgx.Identifier{n}.Sanitize())
	}
	return b.String()
}

// isLockTimeout reports whether err is PostgreSQL's lock_not_available.
func isLockTimeout(err error) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && pgErr.SQLState() == "55P03"
}
