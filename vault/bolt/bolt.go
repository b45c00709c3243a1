// Package bolt is the vault's store on bbolt: one file, one writer, the
// default. The vault's rules run in the shared engine (vault/internal/engine)
// over this package's transactions; this package owns the file — its buckets,
// the group committer that shares fsyncs between concurrent writers, recovery
// at start, hot backups and rekeying.
//
// Only one process opens the file at a time (a file lock), so Open recovers
// every request a previous process left in flight: its record becomes outcome
// unknown, its hold still counted.
package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
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
	// LedgerRetention is how long ledger events are kept (default
	// vault.DefaultLedgerRetention); Reap rolls older ones up.
	LedgerRetention time.Duration
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// OpenTimeout is how long Open waits for the file lock (default 5s).
	OpenTimeout time.Duration
	// CommitObserver, when set, is called after every write transaction of the
	// group committer (Reserve, Settle, the claims API) with the number of
	// operations it carried and how long it took, fsyncs included. It runs on the
	// committer's goroutine, so it must return at once (a metrics observation).
	CommitObserver func(ops int, d time.Duration)
	// CheckPages runs bbolt's page check before Open returns, and refuses a
	// file that fails it (ErrDamaged): what a server does at start, so that
	// it never serves, nor backs up, a damaged file. It reads every page
	// once: seconds per gigabyte.
	CheckPages bool
	// AllowMigrated opens a vault that migrate-store marked as copied into
	// PostgreSQL (for migrate-store itself); without it Open refuses one
	// (ErrMigrated).
	AllowMigrated bool
}

// probeBytes is what Ping writes beside the database to learn whether its
// file system has room: more than a settle's commit needs.
const probeBytes = 256 << 10

// DefaultOpenTimeout is how long Open waits for the file lock by default.
const DefaultOpenTimeout = 5 * time.Second

// initialMmapSize is mapped up front so that growing the file rarely has to remap
// (a remap waits for every read transaction).
const initialMmapSize = 64 << 20

// Store is the vault on bbolt. It is safe for concurrent use. Reserve, Settle
// and the other hot-path writes are group-committed: concurrent callers share
// fsyncs.
type Store struct {
	*engine.Engine
	db   *bbolt.DB
	path string
	now  func() time.Time
	log  *slog.Logger

	// Group commit: ops go to commitLoop through ops. closeMu guards closed and the
	// send on ops, so Close can close ops once no sender is left.
	closeMu  sync.RWMutex
	closed   bool
	ops      chan *batchOp
	loopDone chan struct{}
	observe  func(ops int, d time.Duration) // Options.CommitObserver; may be nil
	commits  atomic.Int64                   // write transactions run by commitLoop
	// copyMu keeps Compact from waiting for dbMu while a long read (a hot
	// backup, an export) holds it shared: such a read holds copyMu shared,
	// and Compact takes copyMu before dbMu, so that it waits for the backup
	// without blocking the hot path behind its own wait for dbMu (a writer
	// waiting on an RWMutex stops every new reader).
	copyMu sync.RWMutex
	// dbMu guards db: every transaction holds it shared, Compact exclusively
	// while it swaps the file. broken is set when a compaction could not open
	// its copy: the store is closed from then on.
	dbMu     sync.RWMutex
	broken   bool
	openOpts *bbolt.Options
	// testGate, when set (by tests), runs before each batch of the committer:
	// a test stops the committer there to see what a crash at that moment
	// leaves on disk.
	testGate atomic.Pointer[func()]

	// The log (wal.go) and its layers over the tree (overlay.go, fold.go).
	// writeMu is held by the committer over each batch, and by every write
	// straight into the tree (Update, after foldAll): it orders the log's
	// records and keeps the tree's direct writes after every record before
	// them. It guards logw, lastLSN, recBuf, ws and logErr, and the active
	// layer's contents.
	writeMu sync.Mutex
	logw    *logWriter
	lastLSN uint64
	recBuf  []byte
	// ws collects the writes of the committer's batch, reset for each.
	ws     writeSet
	logErr error
	// ovMu guards which layers there are (active, folding), so that a
	// snapshot takes them and the tree's read transaction together.
	ovMu    sync.Mutex
	active  *layer
	folding *layer
	// visible is the LSN of the last record in the active layer: what a
	// read transaction sees.
	visible atomic.Uint64
	// foldMu lets one fold run at a time; spareMu guards spare, the next
	// segment created ahead; segCounter numbers the segments.
	foldMu     sync.Mutex
	spareMu    sync.Mutex
	spare      *logWriter
	segCounter atomic.Uint64
	// segNeed is how many bytes the last full segment took: the next one
	// is laid down with room for twice as many (segmentRoom).
	segNeed  atomic.Int64
	folds    atomic.Int64
	foldKick chan struct{}
	foldStop chan struct{}
	foldDone chan struct{}
	// testCrash, when set (by the crash children), is called at each step
	// of the log and the fold.
	testCrash atomic.Pointer[crashHook]
}

var (
	_ vault.Store        = (*Store)(nil)
	_ vault.SecretKeeper = (*Store)(nil)
)

// Open opens (creating if needed) the bbolt database at path, checks or writes the
// schema version, and recovers: records left in_progress by a previous process
// become unknown (their holds stay held, counted as held).
//
// Before bbolt maps an existing file, Open reads its meta pages and refuses a
// file shorter than they say (see inspectFile); once it holds the file lock,
// it removes the temporary copies a Compact or a Rekey killed midway left
// beside it.
//
// Errors: ErrInvalid (master key not 32 bytes), ErrLocked (another process has the
// file), ErrSchemaVersion (written by a newer keybrake), ErrSealed (the master key
// is not the one the database was created with), ErrDamaged (see inspectFile and
// Options.CheckPages), ErrMigrated (see Options.AllowMigrated), ErrStorage.
func Open(path string, opts Options) (*Store, error) {
	s := &Store{
		path:     path,
		now:      opts.Now,
		observe:  opts.CommitObserver,
		ops:      make(chan *batchOp, maxBatch),
		loopDone: make(chan struct{}),
		foldKick: make(chan struct{}, 1),
		foldStop: make(chan struct{}),
		foldDone: make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
	}
	var err error
	s.Engine, err = engine.New((*backend)(s), engine.Config{
		MasterKey: opts.MasterKey, IdempotencyTTL: opts.IdempotencyTTL,
		UnknownRetryLimit: opts.UnknownRetryLimit, Lease: opts.Lease, Logger: opts.Logger,
		LedgerRetention: opts.LedgerRetention,
		// The file lock makes this process the only writer, and a read
		// transaction never waits for the group commit.
		SoleWriter: true, CheapReads: true, AppendRecords: true,
	})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	s.log = s.Log()
	timeout := opts.OpenTimeout
	if timeout <= 0 {
		timeout = DefaultOpenTimeout
	}
	s.openOpts = &bbolt.Options{
		Timeout:         timeout,
		FreelistType:    bbolt.FreelistMapType,
		InitialMmapSize: initialMmapSize,
		// NoSync, NoGrowSync and NoFreelistSync stay false: every commit is durable.
	}
	if err := inspectFile(path, s.log); err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db, err := bbolt.Open(path, 0o600, s.openOpts)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, translate(err))
	}
	s.db = db
	if err := s.prepare(path, opts); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// What the hot path made durable in the log and the folder had not
	// written into the tree yet goes in first.
	last, seg, err := replayLog(db, path, s.log.Warn)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	s.lastLSN = last
	s.visible.Store(last)
	s.segCounter.Store(seg)
	var recovered int
	err = db.Update(func(btx *bbolt.Tx) error {
		for _, b := range engine.Buckets() {
			if _, err := btx.CreateBucketIfNotExists([]byte(b.Name())); err != nil {
				return fmt.Errorf("create bucket %s: %w", b.Name(), err)
			}
		}
		tx := newTx(btx)
		if err := s.InitMeta(tx); err != nil {
			return err
		}
		n, err := engine.RecoverInProgress(tx, s.now())
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
	if s.logw, err = createSegment(path, s.segCounter.Add(1), 0); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	s.active = newLayer(s.logw.seg)
	go s.commitLoop()
	go s.foldLoop()
	return s, nil
}

// prepare runs, under the file lock, what comes before the first write:
// the leftovers of a killed Compact or Rekey go, the page check runs when
// asked, and a migrated vault is refused.
func (s *Store) prepare(path string, opts Options) error {
	for _, prefix := range []string{compactTempPrefix(path), rekeyTempPrefix(path)} {
		removed, err := removeLeftovers(path, prefix)
		if err != nil {
			return err
		}
		for _, f := range removed {
			s.log.Warn("removed the temporary copy a killed compact or rekey left behind", "file", f)
		}
	}
	if opts.CheckPages {
		if err := checkStart(s.db, path); err != nil {
			return err
		}
	}
	if opts.AllowMigrated {
		return nil
	}
	var mark []byte
	_ = s.db.View(func(btx *bbolt.Tx) error {
		if meta := btx.Bucket([]byte(engine.BucketMeta.Name())); meta != nil {
			mark = bytes.Clone(meta.Get(engine.MetaMigrated))
		}
		return nil
	})
	if mark != nil {
		return fmt.Errorf("%s was copied into PostgreSQL by keybrake migrate-store (%s) and marked so: serving it too would let its keys spend "+
			"a second time beside the PostgreSQL replicas. Serve the PostgreSQL store (--database-url); to return to this file instead, "+
			"before any replica serves the PostgreSQL store, run keybrake migrate-store --from %s --unmark: %w",
			path, mark, filepath.Dir(path), vault.ErrMigrated)
	}
	return nil
}

// MarkMigrated marks the vault as copied into PostgreSQL at target (its URL
// without a password), durably: a later Open refuses it (ErrMigrated).
// migrate-store marks it before the copy commits.
func (s *Store) MarkMigrated(ctx context.Context, target string, at time.Time) error {
	mark := fmt.Appendf(nil, "to %s at %s", target, at.UTC().Format(time.RFC3339))
	return s.setMeta(ctx, engine.MetaMigrated, mark)
}

// Unmark removes migrate-store's mark (MarkMigrated), so that a server
// serves the vault again.
func (s *Store) Unmark(ctx context.Context) error { return s.setMeta(ctx, engine.MetaMigrated, nil) }

// setMeta writes (or, for nil, deletes) a meta entry in one durable write
// transaction.
func (s *Store) setMeta(ctx context.Context, k, v []byte) error {
	err := (*backend)(s).Update(ctx, func(t engine.Tx, _ time.Time) error {
		if v == nil {
			return t.Delete(engine.BucketMeta, k)
		}
		return t.Put(engine.BucketMeta, k, v)
	})
	if err != nil {
		return fmt.Errorf("write %s: %w", k, err)
	}
	return nil
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
	s.Closing()
	<-s.loopDone
	close(s.foldStop)
	<-s.foldDone
	s.writeMu.Lock()
	ferr := s.foldAll()
	if ferr != nil {
		s.log.Warn("folding the log at close failed; the next start applies it", "error", ferr)
	}
	s.closeLog(ferr == nil)
	s.writeMu.Unlock()
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.broken {
		return nil // closed when it broke
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close: %w", translate(err))
	}
	return nil
}

// isClosed reports whether Close has been called.
func (s *Store) isClosed() bool {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	return s.closed
}

// backend is the Store as the engine's Backend: its transactions.
type backend Store

// Update runs fn in one bbolt write transaction with the clock read once,
// straight into the tree, after folding the log into it (the admin's writes,
// the reaper: rare, and sometimes large). The committer waits meanwhile.
func (s *backend) Update(ctx context.Context, fn engine.TxFunc) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	st := (*Store)(s)
	st.writeMu.Lock()
	defer st.writeMu.Unlock()
	if err := st.foldAll(); err != nil {
		return translate(err)
	}
	return s.run(ctx, (*bbolt.DB).Update, fn)
}

// View runs fn in one read transaction over the tree and the log's layers
// with the clock read once.
func (s *backend) View(ctx context.Context, fn engine.TxFunc) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	st := (*Store)(s)
	db, release, err := st.useDB()
	if err != nil {
		return err
	}
	defer release()
	t, err := st.snapshot(db, nil)
	if err != nil {
		return err
	}
	defer t.rollback()
	return translate(fn(t, s.now()))
}

// foldForCopy folds the log into the tree before a copy of the file.
func (s *Store) foldForCopy() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return s.foldAll()
}

// run runs fn in one transaction that txn (DB.Update or DB.View) opens on the
// database, shared with Compact through useDB.
func (s *backend) run(ctx context.Context, txn func(*bbolt.DB, func(*bbolt.Tx) error) error, fn engine.TxFunc) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	db, release, err := (*Store)(s).useDB()
	if err != nil {
		return err
	}
	defer release()
	return translate(txn(db, func(btx *bbolt.Tx) error { return fn(newTx(btx), s.now()) }))
}

// useDB returns the database for one transaction, shared with every other
// until release is called (Compact waits for it).
func (s *Store) useDB() (*bbolt.DB, func(), error) {
	s.dbMu.RLock()
	if s.broken {
		s.dbMu.RUnlock()
		return nil, nil, vault.ErrClosed
	}
	return s.db, s.dbMu.RUnlock, nil
}

// Ping proves the store can commit now (vault.Store.Ping). bbolt reuses the
// free pages inside its file without asking the file system for room, so a
// commit that fits in them succeeds on a full disk while the next larger one
// fails: Ping first writes and syncs a probe file beside the database (then
// removes it), which a full disk refuses (ErrNoSpace), and then commits the
// engine's probe through the group committer.
func (s *Store) Ping(ctx context.Context) error {
	if s.isClosed() {
		return fmt.Errorf("ping: %w", vault.ErrClosed)
	}
	if err := probeSpace(s.path); err != nil {
		s.NoteCommit(err)
		return fmt.Errorf("ping: %w", err)
	}
	return s.Engine.Ping(ctx)
}

// probeSpace writes probeBytes to a file beside path, syncs it and removes it.
func probeSpace(path string) error {
	probe := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".probe")
	f, err := os.OpenFile(probe, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return translate(err)
	}
	_, err = f.Write(make([]byte, probeBytes))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if rerr := os.Remove(probe); err == nil {
		err = rerr
	}
	if err != nil {
		return translate(fmt.Errorf("write probe %s: %w", probe, err))
	}
	return nil
}

// Size is the size of the database file in bytes: what it takes on disk (bbolt
// grows the file ahead of its data and never shrinks it). ErrClosed after Close.
func (s *Store) Size(ctx context.Context) (int64, error) {
	if s.isClosed() {
		return 0, fmt.Errorf("size: %w", vault.ErrClosed)
	}
	n, err := fileSize(s.path)
	if err != nil {
		return 0, fmt.Errorf("size: %w", err)
	}
	return n, nil
}

// Backup writes a hot, consistent copy of the database to w: tx.WriteTo in
// one read transaction, while writers go on.
func (s *Store) Backup(ctx context.Context, w io.Writer) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	// The copy is of the tree: everything acknowledged before goes in first.
	if err := s.foldForCopy(); err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	s.copyMu.RLock()
	defer s.copyMu.RUnlock()
	db, release, err := s.useDB()
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	defer release()
	var n int64
	err = translate(db.View(func(tx *bbolt.Tx) error {
		var err error
		n, err = tx.WriteTo(w)
		return err
	}))
	if err != nil {
		return n, fmt.Errorf("backup: %w", err)
	}
	return n, nil
}

// Export calls fn with a snapshot of the whole store — every bucket's entries
// and sequence — in one read transaction, for copying it into another store
// (postgres.Import). Writers go on meanwhile; the snapshot does not see them.
func (s *Store) Export(ctx context.Context, fn func(engine.Snapshot) error) error {
	if s.isClosed() {
		return fmt.Errorf("export: %w", vault.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.copyMu.RLock()
	defer s.copyMu.RUnlock()
	db, release, err := s.useDB()
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer release()
	t, err := s.snapshot(db, nil)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer t.rollback()
	return translate(fn(t))
}

// Now is the store's clock (Options.Now, else the process's).
func (s *Store) Now() time.Time { return s.now() }

// translate maps bbolt's errors to the vault's vocabulary so that nothing above this
// package sees bbolt. Errors that already belong to the vault pass through.
func translate(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, bolterrors.ErrDatabaseNotOpen), errors.Is(err, bolterrors.ErrTxClosed):
		return vault.ErrClosed
	case errors.Is(err, bolterrors.ErrTimeout):
		return vault.ErrLocked
	case errors.Is(err, bolterrors.ErrKeyTooLarge), errors.Is(err, bolterrors.ErrKeyRequired),
		errors.Is(err, bolterrors.ErrValueTooLarge):
		return fmt.Errorf("%w: %s", vault.ErrInvalid, err.Error())
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrVersionMismatch),
		errors.Is(err, bolterrors.ErrChecksum), errors.Is(err, bolterrors.ErrDatabaseReadOnly),
		errors.Is(err, bolterrors.ErrTxNotWritable), errors.Is(err, bolterrors.ErrBucketNotFound),
		errors.Is(err, bolterrors.ErrIncompatibleValue), errors.Is(err, bolterrors.ErrMaxSizeReached):
		return fmt.Errorf("%w: %s", vault.ErrStorage, err.Error())
	}
	if errors.Is(err, vault.ErrNoSpace) || errors.Is(err, vault.ErrDamaged) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("%w: %w: %s", vault.ErrStorage, vault.ErrNoSpace, err.Error())
	}
	if engine.IsVaultError(err) {
		return err
	}
	// I/O errors and anything else from the engine: keep the text, not the chain.
	return fmt.Errorf("%w: %s", vault.ErrStorage, err.Error())
}

// tx is a bbolt transaction as the engine sees it.
type tx struct {
	btx     *bbolt.Tx
	buckets [engine.NumBuckets]*bbolt.Bucket
	// gets are the cursors get seeks with, one per bucket per transaction.
	gets [engine.NumBuckets]*bbolt.Cursor
}

func newTx(btx *bbolt.Tx) *tx { return &tx{btx: btx} }

// appendFill is the fill percent of buckets whose keys only grow (events, audit,
// the hold index): pages split full rather than half full.
const appendFill = 0.9

// bucket returns b's bbolt bucket, looked up once per transaction.
func (t *tx) bucket(b engine.Bucket) *bbolt.Bucket {
	if bk := t.buckets[b]; bk != nil {
		return bk
	}
	bk := t.btx.Bucket([]byte(b.Name()))
	switch b {
	case engine.BucketEvents, engine.BucketAudit, engine.BucketHoldIndex, engine.BucketRecords, engine.BucketCompletions:
		bk.FillPercent = appendFill
	}
	t.buckets[b] = bk
	return bk
}

// get is bbolt's Bucket.Get through a cursor kept for the transaction.
// Bucket.Get makes a new cursor every time, and its stack grows level by
// level as it descends: several allocations per lookup, a dozen lookups per
// request, most in the committer. A cursor holds nothing but its bucket and
// that stack, and every Seek starts again from the bucket's root (seeing
// this transaction's own writes), so one per bucket does the same. A key
// that is absent, or names a nested bucket (whose value Seek gives as nil),
// gives nil, as Bucket.Get does.
func (t *tx) get(b engine.Bucket, k []byte) []byte {
	c := t.gets[b]
	if c == nil {
		c = t.bucket(b).Cursor()
		t.gets[b] = c
	}
	if got, v := c.Seek(k); bytes.Equal(got, k) {
		return v
	}
	return nil
}

func (t *tx) Get(b engine.Bucket, k []byte) ([]byte, error) { return t.get(b, k), nil }

func (t *tx) GetMany(b engine.Bucket, keys [][]byte) ([][]byte, error) {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = t.get(b, k)
	}
	return out, nil
}

func (t *tx) Put(b engine.Bucket, k, v []byte) error { return t.bucket(b).Put(k, v) }

func (t *tx) Append(b engine.Bucket, prefix, v []byte) error {
	bk := t.bucket(b)
	seq, err := bk.NextSequence()
	if err != nil {
		return err
	}
	return bk.Put(binary.BigEndian.AppendUint64(bytes.Clone(prefix), seq), v)
}

// Insert is Put after a check: with one writer at a time, a key the engine
// found free in this transaction is still free, so a key that is taken is a
// bug, refused rather than overwritten.
func (t *tx) Insert(b engine.Bucket, k, v []byte) error {
	if t.get(b, k) != nil {
		return fmt.Errorf("insert into %s: the key is taken: %w", b.Name(), vault.ErrConflict)
	}
	return t.bucket(b).Put(k, v)
}

func (t *tx) Delete(b engine.Bucket, k []byte) error { return t.bucket(b).Delete(k) }

func (t *tx) NextSequence(b engine.Bucket) (uint64, error) { return t.bucket(b).NextSequence() }

func (t *tx) Sequence(b engine.Bucket) (uint64, error) { return t.bucket(b).Sequence(), nil }

func (t *tx) Cursor(b engine.Bucket) engine.Cursor { return t.bucket(b).Cursor() }

// LockKey has nothing to do: bbolt runs one write transaction at a time.
func (t *tx) LockKey(string) error { return nil }
