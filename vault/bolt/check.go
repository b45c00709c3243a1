package bolt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// Damaged files. bbolt maps the file into memory and trusts it: a file
// shorter than its meta page says faults (SIGBUS) when a read reaches the
// missing end, a zeroed page panics when a walk reaches it, and a meta page
// that does not check is passed over for the other one without a word. So
// before bbolt opens a file, inspectFile reads its two meta pages itself and
// refuses a file that cannot be whole; a server also runs bbolt's page check
// at start (Options.CheckPages), and `keybrake check` runs it with the
// invariant check on a data directory or a backup.

// The layout of a bbolt meta page (go.etcd.io/bbolt/internal/common): a page
// header (id, flags, count, overflow) and the meta fields, little-endian on
// every platform keybrake builds for.
const (
	pageHeaderSize = 16
	metaMagic      = 0xED0CDAED
	metaVersion    = 2
	metaSumLen     = 56 // the meta's bytes before its checksum
	metaPageFlag   = 0x04
	// maxMetaRead is what inspectFile reads of each meta page: the header
	// and the meta, whatever the page size.
	maxMetaRead = pageHeaderSize + metaSumLen + 8
)

// fileMeta is what a meta page says about its file.
type fileMeta struct {
	pageSize uint32
	pgid     uint64 // the high water mark: pages the file must hold
	txid     uint64
}

// readMeta decodes the meta page in b (the page's first maxMetaRead bytes),
// or says why it does not check.
func readMeta(b []byte) (fileMeta, error) {
	if len(b) < maxMetaRead {
		return fileMeta{}, errors.New("cut short")
	}
	le := binary.LittleEndian
	if flags := le.Uint16(b[8:]); flags&metaPageFlag == 0 {
		return fileMeta{}, fmt.Errorf("not a meta page (flags %#x)", flags)
	}
	m := b[pageHeaderSize:]
	if le.Uint32(m[0:]) != metaMagic {
		return fileMeta{}, errors.New("no bbolt magic number")
	}
	if v := le.Uint32(m[4:]); v != metaVersion {
		return fileMeta{}, fmt.Errorf("bbolt version %d", v)
	}
	h := fnv.New64a()
	_, _ = h.Write(m[:metaSumLen])
	if h.Sum64() != le.Uint64(m[metaSumLen:]) {
		return fileMeta{}, errors.New("its checksum does not match")
	}
	return fileMeta{pageSize: le.Uint32(m[8:]), pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}, nil
}

// damaged is the refusal of a damaged file: it names the file and says what
// to do.
func damaged(path, format string, args ...any) error {
	return fmt.Errorf("%s is damaged: %s; restore it from a backup (keybrake check --file BACKUP tells whether a backup is whole): %w",
		path, fmt.Sprintf(format, args...), vault.ErrDamaged)
}

// inspectFile reads the meta pages of the existing database file at path
// before bbolt maps it. It refuses (ErrDamaged) a file that no meta page
// describes, and one shorter than the valid meta page with the highest
// transaction says — bbolt would fault reading its missing end. When one of
// the two meta pages does not check, it logs that bbolt falls back to the
// other, and what that may have lost. A missing or empty file is left to
// the caller.
func inspectFile(path string, log *slog.Logger) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %s", vault.ErrStorage, err.Error())
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%w: %s", vault.ErrStorage, err.Error())
	}
	size := fi.Size()
	if size == 0 {
		return nil
	}
	first := make([]byte, maxMetaRead)
	n, _ := f.ReadAt(first, 0)
	m0, err0 := readMeta(first[:n])
	pageSize := int64(m0.pageSize)
	if err0 != nil {
		pageSize = 0
	}
	// Without the first meta page, the second is found at each page size
	// bbolt may have used.
	var m1 fileMeta
	err1 := errors.New("not found")
	for _, ps := range candidatePageSizes(pageSize) {
		buf := make([]byte, maxMetaRead)
		n, rerr := f.ReadAt(buf, ps)
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			continue
		}
		if m, err := readMeta(buf[:n]); err == nil && int64(m.pageSize) == ps {
			m1, err1 = m, nil
			break
		} else if pageSize != 0 {
			err1 = err
		}
	}
	var use fileMeta
	switch {
	case err0 != nil && err1 != nil:
		return damaged(path, "neither meta page checks (the first: %v; the second: %v)", err0, err1)
	case err0 != nil:
		use = m1
		log.Warn("the first meta page of the database does not check; bbolt uses the second, and the last commit before the damage may be missing",
			"file", path, "problem", err0.Error(), "txid", m1.txid)
	case err1 != nil:
		use = m0
		log.Warn("the second meta page of the database does not check; bbolt uses the first, and the last commit before the damage may be missing",
			"file", path, "problem", err1.Error(), "txid", m0.txid)
	default:
		use = m0
		if m1.txid > m0.txid {
			use = m1
		}
	}
	if want := int64(use.pgid) * int64(use.pageSize); size < want {
		return damaged(path, "it is %d bytes, but its meta page says it holds %d pages of %d bytes (%d bytes): it was cut short",
			size, use.pgid, use.pageSize, want)
	}
	return nil
}

// candidatePageSizes is where the second meta page may start: at known, or
// else at each page size bbolt supports from 1 KiB to 64 KiB.
func candidatePageSizes(known int64) []int64 {
	if known > 0 {
		return []int64{known}
	}
	var out []int64
	for ps := int64(1024); ps <= 64<<10; ps *= 2 {
		out = append(out, ps)
	}
	return out
}

// maxPageProblems bounds the findings of one page check: a damaged file can
// have millions.
const maxPageProblems = 100

// checkPages runs bbolt's page check in btx: every page below the high water
// mark reachable exactly once or free, every page of a valid type. It
// returns how many pages the file holds and the findings.
func checkPages(btx *bbolt.Tx) (int, []string) {
	var problems []string
	for err := range btx.Check() {
		if len(problems) < maxPageProblems {
			problems = append(problems, err.Error())
		} else if len(problems) == maxPageProblems {
			problems = append(problems, "… and more")
		}
	}
	return int(btx.Size() / int64(btx.DB().Info().PageSize)), problems
}

// pageCheck is checkPages as the engine's PageCheck. bbolt's page check is
// exact only where no writer runs meanwhile: a page that a later write (a
// fold of the log, an admin write) took from the freelist is neither free nor
// reachable from an older read transaction's root, and would be reported
// "unreachable unfreed". So it runs in a write transaction of its own, which
// waits for the writer and is rolled back; it writes nothing, so it never
// grows the file under the open read transaction.
// A file opened read-only has no writer (its lock is shared): the read
// transaction serves.
func pageCheck(t engine.Tx) (int, []string, error) {
	btx := t.(*otx).base.btx
	if btx.DB().IsReadOnly() {
		n, problems := checkPages(btx)
		return n, problems, nil
	}
	wtx, err := btx.DB().Begin(true)
	if err != nil {
		return 0, nil, fmt.Errorf("page check: %w", err)
	}
	defer func() { _ = wtx.Rollback() }()
	n, problems := checkPages(wtx)
	return n, problems, nil
}

// Check runs bbolt's page check and the invariant check in one read
// transaction, after every queued settle (vault.Store.Check). It is a long
// read, like a hot backup: a Compact asked for meanwhile waits for it without
// stopping the hot path (copyMu).
func (s *Store) Check(ctx context.Context) (vault.CheckReport, error) {
	s.copyMu.RLock()
	defer s.copyMu.RUnlock()
	return s.CheckWith(ctx, pageCheck)
}

// CheckFile checks the database file at path — a data directory's
// keybrake.db while no server runs, or a backup — without opening it for
// writing and without a master key (nothing sealed is opened): its meta
// pages and size (ErrDamaged), bbolt's page check and, on pages that checked
// clean, the invariant check, at now. Errors: ErrNotFound (no file),
// ErrLocked (a server holds it, within openTimeout), ErrDamaged (the report
// then names nothing), ErrSchemaVersion, ErrStorage.
func CheckFile(ctx context.Context, path string, openTimeout time.Duration, log *slog.Logger) (vault.CheckReport, error) {
	rep, err := checkFile(ctx, path, openTimeout, log)
	if err != nil {
		return vault.CheckReport{}, fmt.Errorf("check %s: %w", path, err)
	}
	return rep, nil
}

func checkFile(ctx context.Context, path string, openTimeout time.Duration, log *slog.Logger) (vault.CheckReport, error) {
	if log == nil {
		log = slog.Default()
	}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return vault.CheckReport{}, fmt.Errorf("no database: %w", vault.ErrNotFound)
	}
	if err != nil {
		return vault.CheckReport{}, fmt.Errorf("%w: %s", vault.ErrStorage, err.Error())
	}
	if fi.Size() == 0 {
		return vault.CheckReport{}, damaged(path, "it is empty (0 bytes)")
	}
	if err := inspectFile(path, log); err != nil {
		return vault.CheckReport{}, err
	}
	if openTimeout <= 0 {
		openTimeout = DefaultOpenTimeout
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: openTimeout, ReadOnly: true})
	if err != nil {
		return vault.CheckReport{}, translate(err)
	}
	defer db.Close()
	var rep vault.CheckReport
	err = db.View(func(btx *bbolt.Tx) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := checkCopy(btx); err != nil {
			return err
		}
		// A server killed before its folder wrote the log into the tree
		// left records beside the file: the check reads them over the tree,
		// as the next start would apply them.
		st, err := readLog(path, readFolded(btx))
		if err != nil {
			return err
		}
		l := newLayer(0)
		for _, r := range st.records {
			l.apply(r.lsn, r.w, r.size)
		}
		rep, err = engine.CheckTx(&otx{base: tx{btx: btx}, layers: []*layer{l}, lsn: math.MaxUint64}, time.Now(), pageCheck)
		return err
	})
	return rep, translate(err)
}

// checkStart is the fast part of the check, run before a server serves:
// bbolt's page check, which reads every page once (seconds per gigabyte) but
// decodes no record. It refuses (ErrDamaged) a file with findings.
func checkStart(db *bbolt.DB, path string) error {
	var problems []string
	err := db.View(func(btx *bbolt.Tx) error {
		_, problems = checkPages(btx)
		return nil
	})
	if err != nil {
		return translate(err)
	}
	if len(problems) > 0 {
		return damaged(path, "bbolt's page check found %d problems, the first: %s", len(problems), problems[0])
	}
	return nil
}
