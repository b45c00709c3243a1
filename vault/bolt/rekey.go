package bolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
	bbolt "go.etcd.io/bbolt"
)

// RekeyOptions configure Rekey. Zero values take the documented defaults.
type RekeyOptions struct {
	// OpenTimeout is how long Rekey waits for the database's file lock (default
	// DefaultOpenTimeout): a running server holds it.
	OpenTimeout time.Duration

	// batch is the most entries one transaction of the copy writes (tests lower it).
	batch int
	// hook, when set, is called at each stage of the copy ("batch" after every
	// transaction of the copy, "copied" before the rename, "renamed" after it), so
	// a test can kill the process at any of them.
	hook func(stage string)
}

// RekeyStats counts the values Rekey sealed again under the new master key.
type RekeyStats struct {
	Upstreams    int // upstream secrets
	Responses    int // stored Stripe answers of idempotency records
	ClaimResults int // results of completed claims
}

// rekeyBatch is how many entries one write transaction of the copy carries.
const rekeyBatch = 10000

// Rekey seals every sealed value of the database at path again under newKey.
// oldKey must be the master key the database was sealed with. The database must
// not be in use: Rekey takes its file lock (ErrLocked when a server holds it).
//
// It never changes the file in place. It writes a complete copy beside it (every
// bucket and entry, with each sealed value — upstream secrets, stored responses,
// claim results and the master key check — opened with oldKey and sealed with
// newKey), syncs it, checks that newKey opens it, and renames it over path. A
// failure or a crash at any moment leaves path as it was, sealed under oldKey, or
// replaced by the complete copy, sealed under newKey; never a mix. A temporary
// file a crash left behind is removed by the next Rekey.
//
// Errors: ErrInvalid (a key not 32 bytes, or the same key twice), ErrNotFound (no
// database at path), ErrLocked, ErrSealed (oldKey does not open the database),
// ErrSchemaVersion, ErrStorage.
func Rekey(ctx context.Context, path string, oldKey, newKey []byte, opts RekeyOptions) (RekeyStats, error) {
	stats, err := rekey(ctx, path, oldKey, newKey, opts)
	if err != nil {
		return RekeyStats{}, fmt.Errorf("rekey %s: %w", path, err)
	}
	return stats, nil
}

func rekey(ctx context.Context, path string, oldKey, newKey []byte, opts RekeyOptions) (RekeyStats, error) {
	from, err := engine.NewSealer(oldKey)
	if err != nil {
		return RekeyStats{}, fmt.Errorf("old key: %w", err)
	}
	to, err := engine.NewSealer(newKey)
	if err != nil {
		return RekeyStats{}, fmt.Errorf("new key: %w", err)
	}
	if bytes.Equal(oldKey, newKey) {
		return RekeyStats{}, fmt.Errorf("the new master key is the old one: %w", vault.ErrInvalid)
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return RekeyStats{}, fmt.Errorf("no database: %w", vault.ErrNotFound)
	}
	if opts.OpenTimeout <= 0 {
		opts.OpenTimeout = DefaultOpenTimeout
	}
	if opts.batch <= 0 {
		opts.batch = rekeyBatch
	}
	hook := opts.hook
	if hook == nil {
		hook = func(string) {}
	}
	var stats RekeyStats

	// The exclusive lock keeps a server (and a second rekey) out until the copy is
	// in place.
	if err := inspectFile(path, slog.Default()); err != nil {
		return RekeyStats{}, err
	}
	src, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: opts.OpenTimeout})
	if err != nil {
		return RekeyStats{}, translate(err)
	}
	defer src.Close()
	if err := checkStart(src, path); err != nil {
		return RekeyStats{}, err // a walk of a damaged page would panic
	}
	// The log a killed server left holds values sealed with the old key: it
	// goes into the tree first, and is resealed with the rest.
	if _, _, err := replayLog(src, path, slog.Default().Warn); err != nil {
		return RekeyStats{}, err
	}
	if err := translate(src.View(func(tx *bbolt.Tx) error { return checkRekeySource(tx, from) })); err != nil {
		return RekeyStats{}, err
	}
	c := &dbCopy{transform: func(bucket, k, v []byte) ([]byte, error) {
		b, ok := engine.BucketByName(string(bucket))
		if !ok {
			return v, nil // not keybrake's: copied as it is
		}
		out, kind, err := engine.Reseal(b, k, v, from, to)
		switch kind {
		case engine.ResealedUpstream:
			stats.Upstreams++
		case engine.ResealedResponse:
			stats.Responses++
		case engine.ResealedClaimResult:
			stats.ClaimResults++
		}
		return out, err
	}, batch: opts.batch, hook: hook}
	err = c.replace(ctx, src, path, rekeyTempPrefix(path), opts.OpenTimeout, func(tx *bbolt.Tx) error {
		return checkRekeySource(tx, to)
	})
	return stats, err
}

// rekeyTempPrefix is the name prefix of Rekey's copy of the database at path.
func rekeyTempPrefix(path string) string { return "." + filepath.Base(path) + ".rekey-" }

// removeLeftovers removes the copies (named prefix…) of a Rekey or a Compact
// that died before its rename, and returns their names. The caller holds the
// database's lock, so no other process is writing one.
func removeLeftovers(path, prefix string) ([]string, error) {
	leftovers, err := filepath.Glob(filepath.Join(filepath.Dir(path), prefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("%w: %s", vault.ErrStorage, err.Error())
	}
	for _, f := range leftovers {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: remove the leftover %s: %s", vault.ErrStorage, f, err.Error())
		}
	}
	return leftovers, nil
}

// syncDirectory fsyncs a directory so that a rename in it is durable.
func syncDirectory(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("%w: %s", vault.ErrStorage, err.Error())
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("%w: sync %s: %s", vault.ErrStorage, dir, err.Error())
	}
	return nil
}

// checkRekeySource checks that tx is a keybrake database this code can read
// whose master key check opens with sl.
func checkRekeySource(tx *bbolt.Tx, sl *engine.Sealer) error {
	if err := checkCopy(tx); err != nil {
		return err
	}
	return sl.CheckMaster(tx.Bucket([]byte(engine.BucketMeta.Name())).Get(engine.MetaMasterCheck))
}

// dbCopy writes a copy of a database beside it, each value passed through
// transform, and puts it in the database's place: what Rekey and Compact do.
type dbCopy struct {
	// transform returns the value to write for the entry k, v of bucket.
	transform func(bucket, k, v []byte) ([]byte, error)
	batch     int
	hook      func(string)
	dst       *bbolt.DB
}

// replace copies src into a temporary file beside path (whose name starts with
// prefix; leftovers of a copy that died are removed first), syncs it, runs
// check on it, and renames it over path. The caller holds src, the database at
// path, open: its file lock keeps every other process out meanwhile. A
// failure or a crash leaves path as it was, or replaced by the complete copy.
func (c *dbCopy) replace(ctx context.Context, src *bbolt.DB, path, prefix string, openTimeout time.Duration, check func(*bbolt.Tx) error) error {
	if _, err := removeLeftovers(path, prefix); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), prefix+"*")
	if err != nil {
		return fmt.Errorf("%w: create the copy: %s", vault.ErrStorage, err.Error())
	}
	tmpPath := tmp.Name()
	_ = tmp.Close()
	renamed := false
	defer func() {
		if !renamed {
			_ = os.Remove(tmpPath)
		}
	}()
	// The copy is synced once, at the end: it becomes the database only after.
	c.dst, err = bbolt.Open(tmpPath, 0o600, &bbolt.Options{Timeout: openTimeout, NoSync: true})
	if err != nil {
		return translate(err)
	}
	err = src.View(func(stx *bbolt.Tx) error { return c.copyAll(ctx, stx) })
	if cerr := ctx.Err(); err != nil && cerr != nil {
		err = cerr // not a storage failure
	} else {
		err = translate(err)
	}
	if err == nil {
		err = translate(c.dst.Sync())
	}
	var used int64
	if err == nil {
		err = translate(c.dst.View(func(tx *bbolt.Tx) error {
			used = tx.Size() // up to the high water mark
			return check(tx)
		}))
	}
	if cerr := c.dst.Close(); err == nil {
		err = translate(cerr)
	}
	if err == nil {
		err = trimFile(tmpPath, used)
	}
	if err != nil {
		return err
	}
	c.hook("copied")
	if err := os.Rename(tmpPath, path); err != nil {
		return fmt.Errorf("%w: rename the copy into place: %s", vault.ErrStorage, err.Error())
	}
	renamed = true
	c.hook("renamed")
	return syncDirectory(filepath.Dir(path))
}

// trimFile cuts the copy at path to size, its high water mark, and syncs it.
// bbolt grows a file ahead of its last page (to its memory map's size, which
// doubles), so an untrimmed copy could be larger than the file it replaces
// although it holds fewer pages. bbolt grows it again, by its allocation
// step, when it needs to.
func trimFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("%w: trim the copy: %s", vault.ErrStorage, err.Error())
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() <= size {
		return nil
	}
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("%w: trim the copy: %s", vault.ErrStorage, err.Error())
	}
	if err := f.Sync(); err != nil {
		return translate(fmt.Errorf("sync the trimmed copy: %w", err))
	}
	return nil
}

// copyAll copies every top-level bucket of stx, in transactions of at most c.batch
// entries, with their sequences.
func (c *dbCopy) copyAll(ctx context.Context, stx *bbolt.Tx) error {
	return stx.ForEach(func(name []byte, sb *bbolt.Bucket) error {
		tx, err := c.dst.Begin(true)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // after a Commit, a no-op
		db, err := tx.CreateBucket(name)
		if err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
		fill := copyFill(name)
		db.FillPercent = fill
		n := 0
		cur := sb.Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			if v == nil { // a nested bucket: keybrake has none; copied as it is
				if err := copyBucket(sb.Bucket(k), db, k); err != nil {
					return err
				}
				continue
			}
			out, err := c.transform(name, k, v)
			if err != nil {
				return err
			}
			if err := db.Put(k, out); err != nil {
				return fmt.Errorf("put %s/%q: %w", name, k, err)
			}
			if n++; n%c.batch == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
				if err := tx.Commit(); err != nil {
					return err
				}
				c.hook("batch")
				if tx, err = c.dst.Begin(true); err != nil {
					return err
				}
				db = tx.Bucket(name)
				db.FillPercent = fill // per transaction, like every Bucket field
			}
		}
		if err := db.SetSequence(sb.Sequence()); err != nil {
			return fmt.Errorf("sequence of %s: %w", name, err)
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		c.hook("batch")
		return nil
	})
}

// copyFill is the fill percent the copy writes bucket name with. bbolt's
// default splits pages half full, and the copy inserts every key in order, so
// with the default every page of the copy stays half full: a compacted file
// was larger than the live one, whose append-ordered buckets split at
// appendFill. The copy fills the pages of those buckets as full as bbolt
// allows (nothing is ever inserted before their last key); the others as the
// live server's random inserts leave a B+tree on average, so that the first
// writes after a compaction do not split every page at once.
func copyFill(name []byte) float64 {
	b, ok := engine.BucketByName(string(name))
	if !ok {
		return bbolt.DefaultFillPercent
	}
	switch b {
	case engine.BucketEvents, engine.BucketAudit, engine.BucketHoldIndex, engine.BucketRecords, engine.BucketCompletions:
		return 1.0
	}
	return randomFill
}

// randomFill is the fill percent the copy writes the buckets with random
// inserts at: about where random inserts into half-full splits leave a B+tree.
const randomFill = 0.7

// copyBucket copies the nested bucket sb, entries, sub-buckets and sequence, as
// the bucket name under parent.
func copyBucket(sb, parent *bbolt.Bucket, name []byte) error {
	db, err := parent.CreateBucket(name)
	if err != nil {
		return fmt.Errorf("create nested bucket %q: %w", name, err)
	}
	if err := db.SetSequence(sb.Sequence()); err != nil {
		return err
	}
	return sb.ForEach(func(k, v []byte) error {
		if v == nil {
			return copyBucket(sb.Bucket(k), db, k)
		}
		return db.Put(k, v)
	})
}
