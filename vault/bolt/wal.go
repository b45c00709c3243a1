package bolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	bbolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/vault/internal/engine"
)

// The log: what makes a hot-path write durable with one fdatasync. Every
// batch of the group committer is one record appended to the current log
// segment, a file beside the database named after it (keybrake.db.log.
// followed by the segment's number in 16 hex digits):
//
//	length  uint32 BE   of the payload
//	crc     uint32 BE   CRC-32C of length, segment, lsn and payload
//	segment uint64 BE   the number of the segment it was written in
//	lsn     uint64 BE   the record's log sequence number, one more than the last
//	payload             the batch's writes, each: op (1 put, 2 delete, 3 a
//	                    bucket's sequence), bucket, then for a put uvarint
//	                    key length, key, uvarint value length, value; for a
//	                    delete uvarint key length, key; for a sequence uvarint
//
// A record holds each key's final value and each bucket's final sequence, not
// deltas: applying it twice leaves what applying it once does.
//
// A segment is written over bytes laid down before: zeros (a new segment is
// filled with zeros up to the size the last one needed, so that an append
// changes no file size and its fdatasync writes no metadata) or the records of
// an earlier use of the file (a folded segment is renamed to the next number
// and written over, instead of zeroing a new one). Every append writes a
// header's worth of zeros after its record, which the next record writes
// over: where a segment's records end, a zero header follows, the end.
//
// The folder
// writes a segment's records into the B+tree in one bbolt transaction that
// also records the LSN of the last one (logBucket/logFolded), then removes the
// segment. Open reads the segments left, applies the records after that LSN
// and removes them; a record cut short or damaged at the very end of the log
// — a write the crash tore, never acknowledged — is discarded, and one
// anywhere else (acknowledged records after it) refuses the file (ErrDamaged).

// logBucket is the bbolt bucket (not one of the engine's) where the fold
// records the LSN of the last record in the B+tree, under logFolded.
var (
	logBucket = []byte("log")
	logFolded = []byte("folded")
)

const (
	recHeader = 24
	opPut     = 1
	opDelete  = 2
	opSeq     = 3
	// maxRecord bounds a record's payload when reading: a length beyond it
	// is damage, not a record.
	maxRecord = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// segmentName is the file of log segment n of the database at path.
func segmentName(path string, n uint64) string { return fmt.Sprintf("%s.log.%016x", path, n) }

// listSegments returns the numbers of the log segments beside path, in order.
func listSegments(path string) ([]uint64, error) {
	names, err := filepath.Glob(path + ".log.*")
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, name := range names {
		hex := strings.TrimPrefix(name, path+".log.")
		if len(hex) != 16 {
			continue
		}
		n, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			continue
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// encodeRecord appends the record of w at lsn, in segment seg, to dst.
func encodeRecord(dst []byte, seg, lsn uint64, w *writeSet) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, recHeader)...)
	for b := range w.ents {
		for _, e := range w.ents[b] {
			if e.del {
				dst = append(dst, opDelete, byte(b))
				dst = binary.AppendUvarint(dst, uint64(len(e.key)))
				dst = append(dst, e.key...)
				continue
			}
			dst = append(dst, opPut, byte(b))
			dst = binary.AppendUvarint(dst, uint64(len(e.key)))
			dst = append(dst, e.key...)
			dst = binary.AppendUvarint(dst, uint64(len(e.val)))
			dst = append(dst, e.val...)
		}
	}
	for b, ok := range w.seqSet {
		if ok {
			dst = append(dst, opSeq, byte(b))
			dst = binary.AppendUvarint(dst, w.seqs[b])
		}
	}
	rec := dst[start:]
	binary.BigEndian.PutUint32(rec[0:4], uint32(len(rec)-recHeader))
	binary.BigEndian.PutUint64(rec[8:16], seg)
	binary.BigEndian.PutUint64(rec[16:24], lsn)
	binary.BigEndian.PutUint32(rec[4:8], recordCRC(rec))
	return dst
}

// recordCRC is the checksum of a record: all of it but the checksum.
func recordCRC(rec []byte) uint32 {
	c := crc32.Update(0, castagnoli, rec[0:4])
	return crc32.Update(c, castagnoli, rec[8:])
}

// parseRecord reads the record at the start of data: its segment, LSN,
// payload and length in the file, or ok false when it is cut short or fails
// its checksum.
func parseRecord(data []byte) (seg, lsn uint64, payload []byte, n int, ok bool) {
	if len(data) < recHeader {
		return 0, 0, nil, 0, false
	}
	size := binary.BigEndian.Uint32(data[0:4])
	if size > maxRecord || int(size) > len(data)-recHeader {
		return 0, 0, nil, 0, false
	}
	rec := data[:recHeader+int(size)]
	if binary.BigEndian.Uint32(rec[4:8]) != recordCRC(rec) {
		return 0, 0, nil, 0, false
	}
	return binary.BigEndian.Uint64(rec[8:16]), binary.BigEndian.Uint64(rec[16:24]), rec[recHeader:], len(rec), true
}

// allZero reports whether b holds zeros only.
func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// hasRecord reports whether data starts with a record of segment seg.
func hasRecord(data []byte, seg uint64) bool {
	got, _, _, _, ok := parseRecord(data)
	return ok && got == seg
}

// decodePayload reads a record's writes into a write set.
func decodePayload(p []byte) (*writeSet, error) {
	w := &writeSet{}
	bad := errors.New("malformed log record")
	field := func() ([]byte, bool) {
		n, used := binary.Uvarint(p)
		if used <= 0 || n > uint64(len(p)-used) {
			return nil, false
		}
		f := p[used : used+int(n)]
		p = p[used+int(n):]
		return f, true
	}
	for len(p) > 0 {
		if len(p) < 2 || p[1] >= byte(engine.NumBuckets) {
			return nil, bad
		}
		op, b := p[0], engine.Bucket(p[1])
		p = p[2:]
		switch op {
		case opPut, opDelete:
			k, ok := field()
			if !ok || len(k) == 0 {
				return nil, bad
			}
			if op == opDelete {
				w.put(b, k, nil, true)
				continue
			}
			v, ok := field()
			if !ok {
				return nil, bad
			}
			w.put(b, k, v, false)
		case opSeq:
			seq, used := binary.Uvarint(p)
			if used <= 0 {
				return nil, bad
			}
			p = p[used:]
			w.seqs[b], w.seqSet[b] = seq, true
		default:
			return nil, bad
		}
	}
	return w, nil
}

// logRecord is one record read back from the log.
type logRecord struct {
	lsn  uint64
	w    *writeSet
	size int64
}

// logState is what readLog found beside a database.
type logState struct {
	// records are those after the folded LSN, in order.
	records []logRecord
	// segments are the numbers of the segment files.
	segments []uint64
	// last is the highest LSN the log or the tree knows.
	last uint64
	// torn says where a torn record at the end was discarded, if one was.
	torn string
}

// readLog reads the log segments of the database at path: the records after
// folded (the tree's folded LSN), checked end to end. Errors: ErrDamaged (a
// bad record before the end, a gap in the LSNs).
func readLog(path string, folded uint64) (logState, error) {
	st := logState{last: folded}
	segs, err := listSegments(path)
	if err != nil {
		return st, err
	}
	st.segments = segs
	datas := make([][]byte, len(segs))
	for i, n := range segs {
		if datas[i], err = os.ReadFile(segmentName(path, n)); err != nil {
			return st, translate(fmt.Errorf("read log segment: %w", err))
		}
	}
	var expect uint64 // the LSN the next record must have; 0 before the first
	for i, data := range datas {
		name := filepath.Base(segmentName(path, segs[i]))
		for off := 0; off < len(data); {
			seg, lsn, payload, n, ok := parseRecord(data[off:])
			if ok && seg != segs[i] {
				break // a record of the file's earlier use: the end
			}
			if !ok {
				if allZero(data[off:min(len(data), off+recHeader)]) {
					break // zeros where a header would be: the end
				}
				laterRecords := false
				for j, d := range datas[i+1:] {
					laterRecords = laterRecords || hasRecord(d, segs[i+1+j])
				}
				if laterRecords || validAfter(data[off:], segs[i], expect) {
					return st, damaged(path, "log segment %s has a damaged record at byte %d with acknowledged records after it", name, off)
				}
				st.torn = fmt.Sprintf("%s at byte %d", name, off)
				break
			}
			if expect != 0 && lsn != expect {
				return st, damaged(path, "log segment %s: record %d follows record %d", name, lsn, expect-1)
			}
			expect = lsn + 1
			off += n
			if lsn <= folded {
				continue
			}
			if len(st.records) == 0 && lsn != folded+1 {
				return st, damaged(path, "log segment %s starts at record %d, but the database holds records up to %d only", name, lsn, folded)
			}
			w, err := decodePayload(payload)
			if err != nil {
				return st, damaged(path, "log segment %s, record %d: %v", name, lsn, err)
			}
			st.records = append(st.records, logRecord{lsn: lsn, w: w, size: int64(n)})
			st.last = lsn
		}
	}
	return st, nil
}

// validAfter reports whether a valid record with the expected LSN follows the
// bad one at the start of data, as its length field says: then the bad record
// is damage in the middle of the log, not a torn end.
func validAfter(data []byte, seg, expect uint64) bool {
	if len(data) < recHeader {
		return false
	}
	size := binary.BigEndian.Uint32(data[0:4])
	if size > maxRecord || int(size) > len(data)-recHeader {
		return false
	}
	got, lsn, _, _, ok := parseRecord(data[recHeader+int(size):])
	return ok && got == seg && (expect == 0 || lsn == expect+1)
}

// readFolded returns the LSN of the last log record in the tree.
func readFolded(btx *bbolt.Tx) uint64 {
	if b := btx.Bucket(logBucket); b != nil {
		if v := b.Get(logFolded); len(v) == 8 {
			return binary.BigEndian.Uint64(v)
		}
	}
	return 0
}

// writeFolded records lsn as the last log record in the tree.
func writeFolded(btx *bbolt.Tx, lsn uint64) error {
	b, err := btx.CreateBucketIfNotExists(logBucket)
	if err != nil {
		return err
	}
	return b.Put(logFolded, binary.BigEndian.AppendUint64(nil, lsn))
}

// treeWriter writes into bbolt's buckets, each looked up once.
type treeWriter struct {
	btx     *bbolt.Tx
	buckets [engine.NumBuckets]*bbolt.Bucket
}

func (t *treeWriter) bucket(b engine.Bucket) (*bbolt.Bucket, error) {
	if bk := t.buckets[b]; bk != nil {
		return bk, nil
	}
	bk, err := t.btx.CreateBucketIfNotExists([]byte(b.Name()))
	if err != nil {
		return nil, err
	}
	switch b {
	case engine.BucketEvents, engine.BucketAudit, engine.BucketHoldIndex, engine.BucketRecords, engine.BucketCompletions:
		bk.FillPercent = appendFill
	}
	t.buckets[b] = bk
	return bk, nil
}

func (t *treeWriter) write(b engine.Bucket, k []byte, val []byte, del bool) error {
	bk, err := t.bucket(b)
	if err != nil {
		return err
	}
	if del {
		return bk.Delete(k)
	}
	return bk.Put(k, val)
}

func (t *treeWriter) setSequence(b engine.Bucket, seq uint64) error {
	bk, err := t.bucket(b)
	if err != nil {
		return err
	}
	return bk.SetSequence(seq)
}

// applyWrites writes one record's writes into the tree.
func (t *treeWriter) applyWrites(w *writeSet) error {
	for b := range w.ents {
		for _, e := range w.ents[b] {
			if err := t.write(engine.Bucket(b), []byte(e.key), e.val, e.del); err != nil {
				return err
			}
		}
	}
	for b, ok := range w.seqSet {
		if ok {
			if err := t.setSequence(engine.Bucket(b), w.seqs[b]); err != nil {
				return err
			}
		}
	}
	return nil
}

// applyLayer writes a layer's newest versions into the tree, each bucket's
// keys in order (bbolt inserts in order touch each page once).
func (t *treeWriter) applyLayer(l *layer) error {
	for b := range l.keys {
		keys := make([]string, 0, len(l.keys[b]))
		for k := range l.keys[b] {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			v := l.keys[b][k]
			if err := t.write(engine.Bucket(b), []byte(k), v.val, v.del); err != nil {
				return err
			}
		}
	}
	for b, v := range l.seqs {
		if v != nil {
			if err := t.setSequence(engine.Bucket(b), v.seq); err != nil {
				return err
			}
		}
	}
	return nil
}

// replayLog applies the log beside the database at path to db, in one
// transaction that records the last LSN, and removes the segments: what Open,
// and the offline compact and rekey, do first. It returns the last LSN and the
// highest segment number there was.
func replayLog(db *bbolt.DB, path string, warn func(msg string, args ...any)) (last, seg uint64, err error) {
	var folded uint64
	_ = db.View(func(btx *bbolt.Tx) error { folded = readFolded(btx); return nil })
	st, err := readLog(path, folded)
	if err != nil {
		return 0, 0, err
	}
	if st.torn != "" {
		warn("discarded a torn record at the end of the log: a write cut short by a crash, never acknowledged", "where", st.torn)
	}
	if len(st.records) > 0 {
		err := db.Update(func(btx *bbolt.Tx) error {
			t := &treeWriter{btx: btx}
			for _, r := range st.records {
				if err := t.applyWrites(r.w); err != nil {
					return err
				}
			}
			return writeFolded(btx, st.last)
		})
		if err != nil {
			return 0, 0, translate(fmt.Errorf("apply the log: %w", err))
		}
		warn("applied the log records a previous process left", "records", len(st.records), "last", st.last)
	}
	if err := removeSegments(path, st.segments); err != nil {
		return 0, 0, err
	}
	if len(st.segments) > 0 {
		seg = st.segments[len(st.segments)-1]
	}
	return st.last, seg, nil
}

// removeSegments removes the given log segments of the database at path and
// syncs the directory.
func removeSegments(path string, segs []uint64) error {
	if len(segs) == 0 {
		return nil
	}
	for _, n := range segs {
		if err := os.Remove(segmentName(path, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return translate(fmt.Errorf("remove log segment: %w", err))
		}
	}
	return syncDirectory(filepath.Dir(path))
}

// logWriter appends records to one segment.
type logWriter struct {
	f    *os.File
	seg  uint64
	size int64 // where the next record goes
}

// createSegment creates log segment n of the database at path, filled with
// prealloc zeros, durably (data and directory synced), so that records
// acknowledged in it are found after a crash.
func createSegment(path string, n uint64, prealloc int64) (*logWriter, error) {
	f, err := os.OpenFile(segmentName(path, n), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, translate(fmt.Errorf("create log segment: %w", err))
	}
	if err := fillZeros(f, 0, prealloc); err != nil {
		_ = f.Close()
		return nil, err
	}
	if err := syncDirectory(filepath.Dir(path)); err != nil {
		_ = f.Close()
		return nil, err
	}
	return &logWriter{f: f, seg: n}, nil
}

// recycleSegment renames the folded segment old to n, to be written over,
// extended with zeros to prealloc if it is shorter, durably.
func recycleSegment(path string, old, n uint64, prealloc int64) (*logWriter, error) {
	if err := os.Rename(segmentName(path, old), segmentName(path, n)); err != nil {
		return nil, translate(fmt.Errorf("recycle log segment: %w", err))
	}
	f, err := os.OpenFile(segmentName(path, n), os.O_RDWR, 0o600)
	if err != nil {
		return nil, translate(fmt.Errorf("recycle log segment: %w", err))
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() < prealloc {
		err = fillZeros(f, fi.Size(), prealloc)
	}
	if err == nil {
		err = syncDirectory(filepath.Dir(path))
	}
	if err != nil {
		_ = f.Close()
		return nil, translate(err)
	}
	return &logWriter{f: f, seg: n}, nil
}

// fillZeros writes zeros from from up to size and syncs them.
func fillZeros(f *os.File, from, size int64) error {
	if size <= from {
		return nil
	}
	zeros := make([]byte, min(size-from, 1<<20))
	for off := from; off < size; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), size-off)], off); err != nil {
			return translate(fmt.Errorf("lay down a log segment: %w", err))
		}
	}
	if err := fdatasync(f); err != nil {
		return translate(fmt.Errorf("lay down a log segment: %w", err))
	}
	return nil
}
