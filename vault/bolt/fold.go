package bolt

import (
	"fmt"
	"math"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/vault"
)

// foldDelay is how long the folder lets the active layer grow after its first
// record before it folds it: the longer, the more of the hot path's writes to
// the same pages (a key's counters, the last page of an appended bucket) one
// fold writes once, and the fewer bbolt commits (spill, page writes, two
// fdatasyncs) compete with the requests for the CPU and the disk. The records
// are durable in the log meanwhile; the delay bounds only the memory the
// layer takes and how much Open replays. At 20 ms a fold carried hardly more
// requests than a batch on a loaded machine, and cost as much (decision 59);
// at 100 ms the folds were still a third of the store's CPU in
// BenchmarkReserveManyKeys, and 400 ms took 4–13 % off the whole benchmark's
// CPU (decision 107).
const foldDelay = 400 * time.Millisecond

// crashHook is called by the log and the folder at each step (tests: the
// crash children end the process there). tear, at "write", writes the first
// half of the record about to be appended: what a crash in the middle of the
// write leaves.
type crashHook func(step string, tear func())

// crash calls the test's crash hook at step, if one is set.
func (s *Store) crash(step string, tear func()) {
	if h := s.testCrash.Load(); h != nil {
		(*h)(step, tear)
	}
}

// snapshot opens a transaction over the tree and the layers: a read one (w
// nil) sees every record made durable before it started, and nothing after;
// a write one (the committer's) sees everything and collects its writes in
// w. The layers and the tree's read transaction are taken together under
// ovMu, so that a fold ending meanwhile is seen either in the tree or in its
// layer. The caller ends it with rollback.
func (s *Store) snapshot(db *bbolt.DB, w *writeSet) (*otx, error) {
	t := &otx{}
	t.layers = t.layerBuf[:0]
	s.ovMu.Lock()
	if s.active != nil {
		t.layers = append(t.layers, s.active)
	}
	if s.folding != nil {
		t.layers = append(t.layers, s.folding)
	}
	t.lsn = s.visible.Load()
	btx, err := db.Begin(false)
	s.ovMu.Unlock()
	if err != nil {
		return nil, translate(err)
	}
	t.base.btx = btx
	if w != nil {
		t.lsn, t.w = math.MaxUint64, w
	}
	return t, nil
}

// appendRecord writes buf — a record of n bytes and the zero header after
// it — at the end of the current segment and fdatasyncs it. A
// failed write is cut off again, so that the next record follows the last
// good one; a failed fdatasync leaves the log's state unknown, so the store
// takes no hot-path write from then on (logErr) until a restart reads the log
// back. The caller holds writeMu.
func (s *Store) appendRecord(rec []byte, n int) error {
	w := s.logw
	s.crash("write", func() { _, _ = w.f.WriteAt(rec[:n/2], w.size) })
	if _, err := w.f.WriteAt(rec, w.size); err != nil {
		if terr := w.f.Truncate(w.size); terr != nil {
			s.logErr = fmt.Errorf("%w: the log cannot be appended to until a restart: %s (cutting off a failed write: %s)", vault.ErrStorage, err.Error(), terr.Error())
			s.log.Error("the log is unusable: hot-path writes fail until a restart", "error", s.logErr)
		}
		return translate(fmt.Errorf("append to the log: %w", err))
	}
	s.crash("sync", nil)
	if err := fdatasync(w.f); err != nil {
		s.logErr = fmt.Errorf("%w: the log's fdatasync failed, hot-path writes fail until a restart: %s", vault.ErrStorage, err.Error())
		s.log.Error("the log is unusable: hot-path writes fail until a restart", "error", s.logErr)
		return s.logErr
	}
	w.size += int64(n)
	s.crash("synced", nil)
	return nil
}

// foldLoop is the folder: once a record is in the active layer, it waits
// foldDelay, makes the active layer the folding one (a new segment takes the
// next records) and writes it into the tree. It exits when foldStop closes.
func (s *Store) foldLoop() {
	defer close(s.foldDone)
	for {
		select {
		case <-s.foldKick:
		case <-s.foldStop:
			return
		}
		timer := time.NewTimer(foldDelay)
		select {
		case <-timer.C:
		case <-s.foldStop:
			timer.Stop()
			return
		}
		if err := s.ensureSpare(); err != nil {
			s.log.Warn("creating the next log segment failed; the fold waits", "error", err)
			s.kickFold()
			continue
		}
		s.writeMu.Lock()
		s.foldMu.Lock()
		var err error
		if s.folding == nil {
			err = s.swap()
		}
		l := s.folding
		s.writeMu.Unlock()
		if err == nil && l != nil {
			err = s.fold(l)
		}
		s.foldMu.Unlock()
		if err != nil {
			s.log.Warn("folding the log into the database failed; it is kept and folded again", "error", err)
		}
		if l != nil {
			// Records may have come meanwhile without a kick (one was
			// pending): look again.
			s.kickFold()
		}
	}
}

// kickFold asks the folder for a fold.
func (s *Store) kickFold() {
	select {
	case s.foldKick <- struct{}{}:
	default:
	}
}

// ensureSpare creates the next log segment ahead of the swap that will use
// it, so that the swap does not wait for a file's creation.
func (s *Store) ensureSpare() error {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if s.spare != nil {
		return nil
	}
	w, err := createSegment(s.path, s.segCounter.Add(1), s.segmentRoom())
	if err != nil {
		return err
	}
	s.spare = w
	return nil
}

// maxSegmentRoom bounds the zeros laid down ahead in a segment.
const maxSegmentRoom = 16 << 20

// segmentRoom is how many bytes a new segment is laid down with: twice what
// the last one took, in 64 KiB steps, so that the records of a busy store's
// next fold interval overwrite zeros rather than grow the file (a growing
// file's fdatasync also writes its size), and an idle one's takes nothing.
func (s *Store) segmentRoom() int64 {
	need := 2 * s.segNeed.Load()
	return min((need+64<<10-1)&^(64<<10-1), maxSegmentRoom)
}

// recycle makes the folded segment seg the spare, renamed to the next
// number, when no spare is ready; else it removes it.
func (s *Store) recycle(seg uint64) error {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if s.spare != nil {
		return removeSegments(s.path, []uint64{seg})
	}
	w, err := recycleSegment(s.path, seg, s.segCounter.Add(1), s.segmentRoom())
	if err != nil {
		_ = removeSegments(s.path, []uint64{seg})
		return err
	}
	s.spare = w
	return nil
}

// takeSpare returns the next segment, created now if it was not ahead.
func (s *Store) takeSpare() (*logWriter, error) {
	if err := s.ensureSpare(); err != nil {
		return nil, err
	}
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	w := s.spare
	s.spare = nil
	return w, nil
}

// swap makes the active layer the folding one and starts a new layer on a new
// segment. The caller holds writeMu and foldMu, and no layer is folding.
func (s *Store) swap() error {
	if s.active.empty() {
		return nil
	}
	next, err := s.takeSpare()
	if err != nil {
		return err
	}
	old := s.logw
	s.ovMu.Lock()
	s.folding = s.active
	s.active = newLayer(next.seg)
	s.ovMu.Unlock()
	s.logw = next
	s.segNeed.Store(old.size)
	if err := old.f.Close(); err != nil {
		s.log.Warn("closing a full log segment failed", "error", err)
	}
	return nil
}

// fold writes layer l into the tree in one transaction that records its last
// LSN, then drops the layer and removes its segment. The caller holds foldMu.
func (s *Store) fold(l *layer) error {
	db, release, err := s.useDB()
	if err != nil {
		return err
	}
	s.crash("fold", nil)
	err = db.Update(func(btx *bbolt.Tx) error {
		t := &treeWriter{btx: btx}
		if err := t.applyLayer(l); err != nil {
			return err
		}
		return writeFolded(btx, l.last)
	})
	release()
	if err != nil {
		return translate(fmt.Errorf("fold the log: %w", err))
	}
	s.folds.Add(1)
	s.crash("folded", nil)
	s.ovMu.Lock()
	s.folding = nil
	s.ovMu.Unlock()
	if err := s.recycle(l.seg); err != nil {
		// Harmless: Open skips the records the tree already holds.
		s.log.Warn("recycling a folded log segment failed", "error", err)
	}
	s.crash("removed", nil)
	return nil
}

// foldAll folds every record made durable so far into the tree: before a
// write straight into the tree (Update), a backup and Close. The caller holds
// writeMu, so no record comes meanwhile.
func (s *Store) foldAll() error {
	s.foldMu.Lock()
	defer s.foldMu.Unlock()
	if s.folding != nil {
		if err := s.fold(s.folding); err != nil {
			return err
		}
	}
	if s.active == nil || s.active.empty() {
		return nil
	}
	if err := s.swap(); err != nil {
		return err
	}
	return s.fold(s.folding)
}

// closeLog removes the segments once everything is folded (a clean Close
// leaves no log), or keeps them for the next Open when it is not.
func (s *Store) closeLog(folded bool) {
	var segs []uint64
	for _, w := range []*logWriter{s.logw, s.spare} {
		if w == nil {
			continue
		}
		_ = w.f.Close()
		segs = append(segs, w.seg)
	}
	s.logw, s.spare = nil, nil
	if !folded {
		return
	}
	if err := removeSegments(s.path, segs); err != nil {
		s.log.Warn("removing the log at close failed; the next start skips what it holds", "error", err)
	}
}
