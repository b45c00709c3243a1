package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"

	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// The hot path's writes reach the B+tree in two steps (see wal.go): a batch's
// writes are appended to the log as one record and made durable with one
// fdatasync, then kept in memory, in a layer, until the folder writes the
// whole layer into the B+tree in one bbolt transaction. Meanwhile every read
// looks in the layers first, newest first, and in the B+tree after: the store
// is the tree with the layers over it.

// version is one write of a key in a layer: its value (del for a delete), the
// log sequence number (LSN) of the record that wrote it, and the key's write
// before it in the same layer. A read transaction sees the newest version at
// or before the LSN it started at.
type version struct {
	lsn  uint64
	val  []byte
	del  bool
	prev *version
}

// seqVersion is a bucket's sequence as a record left it.
type seqVersion struct {
	lsn, seq uint64
	prev     *seqVersion
}

// layer holds the writes of the log records of one log segment, not yet in the
// B+tree. Only the committer adds to it (under mu); readers look under mu
// shared.
type layer struct {
	mu   sync.RWMutex
	keys [engine.NumBuckets]map[string]*version
	seqs [engine.NumBuckets]*seqVersion
	// last is the LSN of the newest record in it; bytes what its records
	// took in the log.
	last  uint64
	bytes int64
	// seg is the number of the log segment its records are in.
	seg uint64
}

func newLayer(seg uint64) *layer { return &layer{seg: seg} }

// empty reports whether no record is in l.
func (l *layer) empty() bool { return l.last == 0 }

// get returns the newest version of b/k at or before lsn, if l has one.
func (l *layer) get(b engine.Bucket, k []byte, lsn uint64) (*version, bool) {
	m := l.keys[b]
	if m == nil {
		return nil, false
	}
	for v := m[string(k)]; v != nil; v = v.prev {
		if v.lsn <= lsn {
			return v, true
		}
	}
	return nil, false
}

// seq returns b's sequence at or before lsn, if l set it.
func (l *layer) seq(b engine.Bucket, lsn uint64) (uint64, bool) {
	for v := l.seqs[b]; v != nil; v = v.prev {
		if v.lsn <= lsn {
			return v.seq, true
		}
	}
	return 0, false
}

// apply adds the writes of the record lsn to l. Its versions are made in one
// slice (a batch writes dozens of keys), and they keep the write set's key
// strings: nothing is copied again. The caller holds l.mu.
func (l *layer) apply(lsn uint64, w *writeSet, size int64) {
	vs := make([]version, w.count())
	for b := range w.ents {
		if len(w.ents[b]) == 0 {
			continue
		}
		if l.keys[b] == nil {
			l.keys[b] = make(map[string]*version, len(w.ents[b]))
		}
		for _, e := range w.ents[b] {
			v := &vs[0]
			vs = vs[1:]
			*v = version{lsn: lsn, val: e.val, del: e.del, prev: l.keys[b][e.key]}
			l.keys[b][e.key] = v
		}
	}
	for b, ok := range w.seqSet {
		if ok {
			l.seqs[b] = &seqVersion{lsn: lsn, seq: w.seqs[b], prev: l.seqs[b]}
		}
	}
	l.last = lsn
	l.bytes += size
}

// entry is one key of an overlay as a merged cursor walks it.
type entry struct {
	k, v []byte
	del  bool
}

// wentry is a batch's last write of one key.
type wentry struct {
	key string
	val []byte
	del bool
}

// writeSet is what one batch of the committer wrote: the last write of each
// key and each bucket's sequence, which is all its log record holds. Each
// bucket's entries are kept in the order their keys were first written, and
// idx finds a key's entry: a key written again (a window's counter, by
// every hold and settle of a batch) keeps its entry and its string.
type writeSet struct {
	idx    [engine.NumBuckets]map[string]int
	ents   [engine.NumBuckets][]wentry
	seqs   [engine.NumBuckets]uint64
	seqSet [engine.NumBuckets]bool
	// arena holds the copies of the values the batch put (see keep).
	arena []byte
}

// reset empties w for the next batch. Its maps and slices keep their room
// (the next batch writes as many keys); the keys and values they held belong
// to the layer they were applied to, and the arena keeps only its unused
// tail, which no value reaches into.
func (w *writeSet) reset() {
	for b := range w.ents {
		clear(w.idx[b])
		clear(w.ents[b])
		w.ents[b] = w.ents[b][:0]
	}
	w.seqs, w.seqSet = [engine.NumBuckets]uint64{}, [engine.NumBuckets]bool{}
}

func (w *writeSet) empty() bool {
	for b := range w.ents {
		if len(w.ents[b]) > 0 || w.seqSet[b] {
			return false
		}
	}
	return true
}

// count is how many keys w writes.
func (w *writeSet) count() int {
	n := 0
	for b := range w.ents {
		n += len(w.ents[b])
	}
	return n
}

// get returns the batch's write of b/k, if it made one.
func (w *writeSet) get(b engine.Bucket, k []byte) (wentry, bool) {
	i, ok := w.idx[b][string(k)]
	if !ok {
		return wentry{}, false
	}
	return w.ents[b][i], true
}

// put records the batch's write of b/k: val, or a delete.
func (w *writeSet) put(b engine.Bucket, k []byte, val []byte, del bool) {
	if i, ok := w.idx[b][string(k)]; ok {
		w.ents[b][i].val, w.ents[b][i].del = val, del
		return
	}
	w.putNew(b, string(k), val, del)
}

// putString is put for a key the caller made as a string.
func (w *writeSet) putString(b engine.Bucket, key string, val []byte, del bool) {
	if i, ok := w.idx[b][key]; ok {
		w.ents[b][i].val, w.ents[b][i].del = val, del
		return
	}
	w.putNew(b, key, val, del)
}

// putNew records the write of a key the batch has not written.
func (w *writeSet) putNew(b engine.Bucket, key string, val []byte, del bool) {
	if w.idx[b] == nil {
		w.idx[b] = make(map[string]int)
	}
	w.idx[b][key] = len(w.ents[b])
	w.ents[b] = append(w.ents[b], wentry{key: key, val: val, del: del})
}

// Values put are copied (the caller may reuse its buffer after Put, and the
// layer keeps them until the fold) into chunks of arenaChunk bytes shared by
// the batch, instead of one allocation each: a batch puts a dozen values per
// operation, most of them tens of bytes. Nothing writes to a value once
// kept, as nothing writes to one bbolt returns, and a value's capacity ends
// where it does, so an append to it cannot reach its neighbour. A value of
// more than arenaChunk/8 bytes (a stored answer) is copied alone, so that a
// chunk's unused tail stays small.
const arenaChunk = 16 << 10

// keep returns a copy of v that stays unchanged for as long as it is used:
// bytes.Clone, in the arena.
func (w *writeSet) keep(v []byte) []byte {
	switch {
	case v == nil:
		return nil
	case len(v) == 0:
		return []byte{}
	case len(v) > arenaChunk/8:
		return bytes.Clone(v)
	}
	if len(v) > cap(w.arena)-len(w.arena) {
		w.arena = make([]byte, 0, arenaChunk)
	}
	n := len(w.arena)
	w.arena = append(w.arena, v...)
	return w.arena[n:len(w.arena):len(w.arena)]
}

// otx is a transaction over the B+tree (base, a bbolt transaction) with the
// layers over it, newest first, seen as of lsn. A write transaction (the
// committer's) collects its writes in w; a read one has none.
//
// A transaction is made with each request's replay check and each batch:
// the tree's transaction and the layers' list live in it, not beside it.
type otx struct {
	base     tx
	layers   []*layer
	layerBuf [2]*layer
	lsn      uint64
	w        *writeSet
}

// rollback ends the tree's read transaction under t.
func (t *otx) rollback() { _ = t.base.btx.Rollback() }

var _ engine.Tx = (*otx)(nil)

// lookup finds b/k: in the batch's writes, the layers, the tree.
func (t *otx) lookup(b engine.Bucket, k []byte) []byte {
	if t.w != nil {
		if v, ok := t.w.get(b, k); ok {
			if v.del {
				return nil
			}
			return v.val
		}
	}
	for _, l := range t.layers {
		l.mu.RLock()
		v, ok := l.get(b, k, t.lsn)
		l.mu.RUnlock()
		if ok {
			if v.del {
				return nil
			}
			return v.val
		}
	}
	return t.base.get(b, k)
}

func (t *otx) Get(b engine.Bucket, k []byte) ([]byte, error) { return t.lookup(b, k), nil }

func (t *otx) GetMany(b engine.Bucket, keys [][]byte) ([][]byte, error) {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = t.lookup(b, k)
	}
	return out, nil
}

func (t *otx) writable() error {
	if t.w == nil {
		return bolterrors.ErrTxNotWritable
	}
	return nil
}

func (t *otx) Put(b engine.Bucket, k, v []byte) error {
	if err := t.writable(); err != nil {
		return err
	}
	if err := checkKV(len(k), len(v)); err != nil {
		return err
	}
	t.w.put(b, k, t.w.keep(v), false)
	return nil
}

// checkKV refuses what bbolt would refuse when the layer is folded: refused
// here, the write fails in its own batch rather than in the fold.
func checkKV(klen, vlen int) error {
	switch {
	case klen == 0:
		return bolterrors.ErrKeyRequired
	case klen > bbolt.MaxKeySize:
		return bolterrors.ErrKeyTooLarge
	case vlen > bbolt.MaxValueSize:
		return bolterrors.ErrValueTooLarge
	}
	return nil
}

func (t *otx) Insert(b engine.Bucket, k, v []byte) error {
	if t.lookup(b, k) != nil {
		return fmt.Errorf("insert into %s: the key is taken: %w", b.Name(), vault.ErrConflict)
	}
	return t.Put(b, k, v)
}

func (t *otx) Delete(b engine.Bucket, k []byte) error {
	if err := t.writable(); err != nil {
		return err
	}
	if len(k) == 0 {
		return bolterrors.ErrKeyRequired
	}
	t.w.put(b, k, nil, true)
	return nil
}

func (t *otx) Append(b engine.Bucket, prefix, v []byte) error {
	seq, err := t.NextSequence(b)
	if err != nil {
		return err
	}
	// The key is made as the string the write set keeps, in one allocation
	// (a copy of prefix grown by the sequence, then its string, took three).
	var key strings.Builder
	key.Grow(len(prefix) + 8)
	key.Write(prefix)
	var be [8]byte
	binary.BigEndian.PutUint64(be[:], seq)
	key.Write(be[:])
	if err := checkKV(key.Len(), len(v)); err != nil {
		return err
	}
	t.w.putString(b, key.String(), t.w.keep(v), false)
	return nil
}

func (t *otx) NextSequence(b engine.Bucket) (uint64, error) {
	if err := t.writable(); err != nil {
		return 0, err
	}
	cur, _ := t.Sequence(b)
	t.w.seqs[b], t.w.seqSet[b] = cur+1, true
	return cur + 1, nil
}

func (t *otx) Sequence(b engine.Bucket) (uint64, error) {
	if t.w != nil && t.w.seqSet[b] {
		return t.w.seqs[b], nil
	}
	for _, l := range t.layers {
		l.mu.RLock()
		seq, ok := l.seq(b, t.lsn)
		l.mu.RUnlock()
		if ok {
			return seq, nil
		}
	}
	return t.base.Sequence(b)
}

// Cursor walks b in the tree merged with what the layers and the batch wrote
// to it. Where nothing over the tree touched b, it is the tree's own cursor.
func (t *otx) Cursor(b engine.Bucket) engine.Cursor {
	seen := map[string]bool{}
	var ov []entry
	add := func(k string, val []byte, del bool) {
		if !seen[k] {
			seen[k] = true
			ov = append(ov, entry{k: []byte(k), v: val, del: del})
		}
	}
	if t.w != nil {
		for _, e := range t.w.ents[b] {
			add(e.key, e.val, e.del)
		}
	}
	for _, l := range t.layers {
		l.mu.RLock()
		for k := range l.keys[b] {
			if v, ok := l.get(b, []byte(k), t.lsn); ok {
				add(k, v.val, v.del)
			}
		}
		l.mu.RUnlock()
	}
	base := t.base.bucket(b).Cursor()
	if len(ov) == 0 {
		return base
	}
	slices.SortFunc(ov, func(a, b entry) int { return bytes.Compare(a.k, b.k) })
	return &mergeCursor{base: base, ov: ov}
}

func (t *otx) LockKey(string) error { return nil }

// mergeCursor walks a tree cursor and a sorted overlay of it together: where
// both have a key the overlay's entry wins, and an overlay's delete hides the
// tree's entry. It keeps both sources positioned on their candidates in the
// direction it last moved (fwd), and repositions them when it turns.
type mergeCursor struct {
	base   *bbolt.Cursor
	ov     []entry
	bk, bv []byte // the tree's candidate
	oi     int    // the overlay's candidate
	fwd    bool
	cur    []byte
}

func (c *mergeCursor) First() ([]byte, []byte) {
	c.bk, c.bv = c.base.First()
	c.oi, c.fwd = 0, true
	return c.pickFwd()
}

func (c *mergeCursor) Seek(seek []byte) ([]byte, []byte) {
	c.bk, c.bv = c.base.Seek(seek)
	c.oi, _ = slices.BinarySearchFunc(c.ov, seek, func(e entry, k []byte) int { return bytes.Compare(e.k, k) })
	c.fwd = true
	return c.pickFwd()
}

func (c *mergeCursor) Next() ([]byte, []byte) {
	if c.cur == nil {
		if c.fwd {
			return nil, nil
		}
		return c.First() // walked off the front: turn there
	}
	if !c.fwd {
		return c.Seek(append(bytes.Clone(c.cur), 0))
	}
	c.advanceFwd(c.cur)
	return c.pickFwd()
}

func (c *mergeCursor) Last() ([]byte, []byte) {
	c.bk, c.bv = c.base.Last()
	c.oi, c.fwd = len(c.ov)-1, false
	return c.pickBwd()
}

func (c *mergeCursor) Prev() ([]byte, []byte) {
	if c.cur == nil && !c.fwd {
		return nil, nil
	}
	if c.fwd {
		if c.cur == nil {
			return c.Last()
		}
		// Both sources to the last key before cur.
		k := c.cur
		c.bk, c.bv = c.base.Seek(k)
		if c.bk == nil {
			c.bk, c.bv = c.base.Last()
		}
		for c.bk != nil && bytes.Compare(c.bk, k) >= 0 {
			c.bk, c.bv = c.base.Prev()
		}
		i, _ := slices.BinarySearchFunc(c.ov, k, func(e entry, k []byte) int { return bytes.Compare(e.k, k) })
		c.oi, c.fwd = i-1, false
		return c.pickBwd()
	}
	c.advanceBwd(c.cur)
	return c.pickBwd()
}

// advanceFwd moves past k whichever source stands on it.
func (c *mergeCursor) advanceFwd(k []byte) {
	if c.bk != nil && bytes.Equal(c.bk, k) {
		c.bk, c.bv = c.base.Next()
	}
	if c.oi < len(c.ov) && bytes.Equal(c.ov[c.oi].k, k) {
		c.oi++
	}
}

func (c *mergeCursor) advanceBwd(k []byte) {
	if c.bk != nil && bytes.Equal(c.bk, k) {
		c.bk, c.bv = c.base.Prev()
	}
	if c.oi >= 0 && bytes.Equal(c.ov[c.oi].k, k) {
		c.oi--
	}
}

// pickFwd returns the smaller candidate, skipping the overlay's deletes.
func (c *mergeCursor) pickFwd() ([]byte, []byte) {
	for {
		var o *entry
		if c.oi < len(c.ov) {
			o = &c.ov[c.oi]
		}
		switch {
		case o == nil && c.bk == nil:
			c.cur = nil
			return nil, nil
		case o == nil || (c.bk != nil && bytes.Compare(c.bk, o.k) < 0):
			c.cur = c.bk
			return c.bk, c.bv
		case o.del:
			c.advanceFwd(o.k)
		default:
			c.cur = o.k
			return o.k, o.v
		}
	}
}

// pickBwd returns the larger candidate, skipping the overlay's deletes.
func (c *mergeCursor) pickBwd() ([]byte, []byte) {
	for {
		var o *entry
		if c.oi >= 0 && c.oi < len(c.ov) {
			o = &c.ov[c.oi]
		}
		switch {
		case o == nil && c.bk == nil:
			c.cur = nil
			return nil, nil
		case o == nil || (c.bk != nil && bytes.Compare(c.bk, o.k) > 0):
			c.cur = c.bk
			return c.bk, c.bv
		case o.del:
			c.advanceBwd(o.k)
		default:
			c.cur = o.k
			return o.k, o.v
		}
	}
}
