package bolt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// Compaction. bbolt never gives the file's free pages back to the file
// system: the reaper's deletions become free pages that later writes reuse,
// so the file stops growing once the retentions are reached, but it does not
// shrink after a burst or a shorter retention. Compacting writes a copy of the
// database without the free pages and puts it in the file's place, like Rekey
// (and with the same guarantee: the old file or the complete copy, never a
// mix).

// compactTempPrefix is the name prefix of a compaction's copy of the database
// at path.
func compactTempPrefix(path string) string { return "." + filepath.Base(path) + ".compact-" }

// identity is the transform of a copy that changes no value.
func identity(_, _, v []byte) ([]byte, error) { return v, nil }

// checkCopy checks that a copy is a keybrake database this code can read.
func checkCopy(tx *bbolt.Tx) error {
	meta := tx.Bucket([]byte(engine.BucketMeta.Name()))
	if meta == nil {
		return fmt.Errorf("not a keybrake database (no meta bucket): %w", vault.ErrStorage)
	}
	v := meta.Get(engine.MetaSchemaVersion)
	if len(v) != 8 {
		return fmt.Errorf("schema version missing or malformed: %w", vault.ErrSchemaVersion)
	}
	if got := binary.BigEndian.Uint64(v); got > engine.SchemaVersion {
		return fmt.Errorf("database schema version %d is newer than this keybrake's %d: %w", got, engine.SchemaVersion, vault.ErrSchemaVersion)
	}
	return nil
}

// Compact compacts the database at path while no server runs (it takes the
// file lock: ErrLocked when a server holds it, within openTimeout, default
// DefaultOpenTimeout) and returns its size before and after. No key is
// needed: nothing is opened, only copied. Errors: ErrNotFound (no database at
// path), ErrLocked, ErrSchemaVersion (written by a newer keybrake), ErrStorage.
func Compact(ctx context.Context, path string, openTimeout time.Duration) (vault.CompactResult, error) {
	res, err := compactFile(ctx, path, openTimeout)
	if err != nil {
		return vault.CompactResult{}, fmt.Errorf("compact %s: %w", path, err)
	}
	return res, nil
}

func compactFile(ctx context.Context, path string, openTimeout time.Duration) (vault.CompactResult, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return vault.CompactResult{}, fmt.Errorf("no database: %w", vault.ErrNotFound)
	}
	if openTimeout <= 0 {
		openTimeout = DefaultOpenTimeout
	}
	if err := inspectFile(path, slog.Default()); err != nil {
		return vault.CompactResult{}, err
	}
	src, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: openTimeout})
	if err != nil {
		return vault.CompactResult{}, translate(err)
	}
	defer src.Close()
	if err := checkStart(src, path); err != nil {
		return vault.CompactResult{}, err // a walk of a damaged page would panic
	}
	// The copy is of the tree: the log a killed server left goes in first.
	if _, _, err := replayLog(src, path, slog.Default().Warn); err != nil {
		return vault.CompactResult{}, err
	}
	if err := translate(src.View(checkCopy)); err != nil {
		return vault.CompactResult{}, err
	}
	before, err := fileSize(path)
	if err != nil {
		return vault.CompactResult{}, err
	}
	c := &dbCopy{transform: identity, batch: rekeyBatch, hook: func(string) {}}
	if err := c.replace(ctx, src, path, compactTempPrefix(path), openTimeout, checkCopy); err != nil {
		return vault.CompactResult{}, err
	}
	after, err := fileSize(path)
	return vault.CompactResult{Before: before, After: after}, err
}

// Compact compacts the open store's file (vault.Store.Compact). Every other
// call waits meanwhile — reads, writes and the group commit — since the copy
// must be all there is; the queued operations then run on the compacted file.
// The copy is written and synced beside the file, renamed over it, and opened
// in its place; the old file is closed last. Should the copy fail, the store
// goes on with the old file; should opening the copy fail after the rename,
// the store closes itself (ErrClosed from then on), and a restart opens the
// complete copy.
func (s *Store) Compact(ctx context.Context) (vault.CompactResult, error) {
	res, err := s.compact(ctx)
	if err != nil {
		return vault.CompactResult{}, fmt.Errorf("compact: %w", err)
	}
	return res, nil
}

func (s *Store) compact(ctx context.Context) (vault.CompactResult, error) {
	// A hot backup holds copyMu shared for as long as its client reads:
	// Compact waits for it here, while the hot path goes on, and takes dbMu
	// only once no backup runs (see copyMu).
	s.copyMu.Lock()
	defer s.copyMu.Unlock()
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.isClosed() || s.broken {
		return vault.CompactResult{}, vault.ErrClosed
	}
	path := s.db.Path()
	before, err := fileSize(path)
	if err != nil {
		return vault.CompactResult{}, err
	}
	started := time.Now()
	c := &dbCopy{transform: identity, batch: rekeyBatch, hook: func(string) {}}
	if err := c.replace(ctx, s.db, path, compactTempPrefix(path), s.openOpts.Timeout, checkCopy); err != nil {
		return vault.CompactResult{}, err
	}
	// The renamed copy is the database now: the old file must not take
	// another write.
	db, err := bbolt.Open(path, 0o600, s.openOpts)
	if cerr := s.db.Close(); cerr != nil {
		s.log.Warn("closing the database file replaced by its compacted copy failed", "error", cerr)
	}
	if err != nil {
		s.broken = true
		s.Closing()
		s.log.Error("the compacted database could not be opened in place of the old one: the store is closed until a restart", "error", err)
		return vault.CompactResult{}, translate(err)
	}
	s.db = db
	after, err := fileSize(path)
	if err != nil {
		return vault.CompactResult{}, err
	}
	s.log.Info("database compacted", "bytes_before", before, "bytes_after", after, "took", time.Since(started).Round(time.Millisecond))
	return vault.CompactResult{Before: before, After: after}, nil
}

// fileSize is the size of the file at path.
func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("%w: %s", vault.ErrStorage, err.Error())
	}
	return fi.Size(), nil
}
