package bolt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// stopFolds keeps the folder from writing the log into the tree until the
// returned function is called, so that what the hot path writes stays in the
// log alone: what a crash before the next fold leaves.
func stopFolds(s *Store) func() {
	s.foldMu.Lock()
	return s.foldMu.Unlock
}

// copyStore copies the database at src and its log segments to dst: what is
// on disk, as a crash at this moment would leave it.
func copyStore(t *testing.T, src, dst string) {
	t.Helper()
	copyFile(t, src, dst)
	segs, err := listSegments(src)
	require.NoError(t, err)
	for _, n := range segs {
		copyFile(t, segmentName(src, n), segmentName(dst, n))
	}
}

// recordOffsets returns where each record of a segment starts, and where
// the last one ends (the zeros after it).
func recordOffsets(t *testing.T, data []byte) []int {
	t.Helper()
	var offs []int
	off := 0
	for off < len(data) && !allZero(data[off:]) {
		_, _, _, n, ok := parseRecord(data[off:])
		require.True(t, ok, "record at byte %d", off)
		offs = append(offs, off)
		off += n
	}
	return append(offs, off)
}

// reserveAll reserves one charge per idempotency key, each in its own commit.
func reserveAll(t *testing.T, s *Store, keyID string, idems []string) map[string]string {
	t.Helper()
	holds := map[string]string{}
	for _, idem := range idems {
		res, err := s.Reserve(context.Background(), vaulttest.Charge(keyID, idem, 100))
		require.NoError(t, err)
		require.Equal(t, vault.ReserveClaimed, res.Outcome)
		holds[idem] = res.Hold.ID
	}
	return holds
}

// newKeyStore opens a fresh store with an upstream and one key.
func newKeyStore(t *testing.T) (*Store, string, *vaulttest.Clock, vault.Key) {
	t.Helper()
	clock := vaulttest.NewClock(vaulttest.T0)
	s, path := MustOpen(t, clock)
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	key, _ := vaulttest.MustMint(t, s, "k", vaulttest.Policy(t, "5000.00", "20000.00", ""), nil)
	return s, path, clock, key
}

// crashImage reserves one charge per idempotency key with the folds stopped
// and copies the store at path as a crash would leave it (the holds in the
// log only): the holds, the copy's path and the number of its segment.
func crashImage(t *testing.T, s *Store, path, keyID string, idems ...string) (map[string]string, string, uint64) {
	t.Helper()
	resume := stopFolds(s)
	defer resume()
	holds := reserveAll(t, s, keyID, idems)
	image := filepath.Join(t.TempDir(), "keybrake.db")
	copyStore(t, path, image)
	return holds, image, s.logw.seg
}

// TestLogTornTail: a crash (a power cut) in the middle of appending a record
// leaves any prefix of it, or the prefix and garbage, at the end of the log.
// For cuts at every byte of the last record's header and across its
// payload, and for garbage after each,
// Open discards that record only: every hold acknowledged before it is there,
// the last one is not (its caller never heard of it), and the invariant holds.
func TestLogTornTail(t *testing.T) {
	t.Parallel()
	s, path, clock, key := newKeyStore(t)
	holds, image, segNum := crashImage(t, s, path, key.ID, "a", "b", "c")
	seg := segmentName(image, segNum)
	data, err := os.ReadFile(seg)
	require.NoError(t, err)
	offs := recordOffsets(t, data)
	require.Len(t, offs, 4, "three records, one per reserve")
	last, end := offs[2], offs[3]

	// Every cut inside the header, then a spread over the payload (every
	// byte with KEYBRAKE_LONG), and the last byte.
	var cuts []int
	stride := max(1, (end-last)/12)
	if vaulttest.Long() {
		stride = 1
	}
	for cut := last; cut < end; cut++ {
		if cut < last+recHeader+1 || (cut-last)%stride == 0 || cut == end-1 {
			cuts = append(cuts, cut)
		}
	}
	for _, cut := range cuts {
		for _, garbage := range []bool{false, true} {
			dir := t.TempDir()
			db := filepath.Join(dir, "keybrake.db")
			copyStore(t, image, db)
			torn := append([]byte(nil), data[:cut]...)
			if garbage {
				for i := range 7 {
					torn = append(torn, byte(0xa5+31*i+cut))
				}
			}
			require.NoError(t, os.WriteFile(segmentName(db, segNum), torn, 0o600))
			after := MustOpenPath(t, db, clock)
			got := allHolds(t, after)
			for _, idem := range []string{"a", "b"} {
				assert.Contains(t, got, holds[idem], "cut at %d (garbage %v): the acknowledged hold of %s", cut, garbage, idem)
			}
			assert.NotContains(t, got, holds["c"], "cut at %d (garbage %v): the torn record is discarded", cut, garbage)
			daily, _ := usageOf(t, after, key.ID)
			assert.Equal(t, int64(200), daily.Held, "cut at %d (garbage %v)", cut, garbage)
			require.NoError(t, after.Close())
			if t.Failed() {
				return
			}
		}
	}
}

// TestLogDamageBeforeTheEnd: a record that fails its checksum with
// acknowledged records after it is not a torn end: Open refuses the file
// (ErrDamaged) rather than drop what was acknowledged, and names the segment.
func TestLogDamageBeforeTheEnd(t *testing.T) {
	t.Parallel()
	s, path, clock, key := newKeyStore(t)
	_, image, segNum := crashImage(t, s, path, key.ID, "a", "b", "c")
	seg := segmentName(image, segNum)
	data, err := os.ReadFile(seg)
	require.NoError(t, err)
	offs := recordOffsets(t, data)
	for i, at := range []int{offs[0] + recHeader + 3, offs[1] + 5} {
		bad := append([]byte(nil), data...)
		bad[at] ^= 0x40
		db := filepath.Join(t.TempDir(), fmt.Sprintf("keybrake-%d.db", i))
		copyStore(t, image, db)
		require.NoError(t, os.WriteFile(segmentName(db, segNum), bad, 0o600))
		_, err := Open(db, Options{MasterKey: vaulttest.MasterKey, Now: clock.Now, Logger: vaulttest.QuietLogger()})
		require.ErrorIs(t, err, vault.ErrDamaged, "byte %d flipped", at)
		assert.Contains(t, err.Error(), filepath.Base(segmentName(db, segNum)))
	}
}

// TestLogFoldedSegmentSkipped: a crash after a fold's commit and before its
// segment is removed leaves records the tree already holds. A write straight
// into the tree after the fold (an operator resolving the hold) must not be
// undone when Open finds the stale segment: it applies only the records after
// the LSN the fold recorded.
func TestLogFoldedSegmentSkipped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, path, clock, key := newKeyStore(t)
	resume := stopFolds(s)
	holds := reserveAll(t, s, key.ID, []string{"a"})
	require.NoError(t, s.Settle(ctx, vault.SettleRequest{KeyID: key.ID, IdempotencyKey: "a", Outcome: vault.SettleUnknown}))
	stale := filepath.Join(t.TempDir(), "stale")
	seg := segmentName(path, s.logw.seg)
	copyFile(t, seg, stale)
	resume()
	// The operator's resolution is written straight into the tree, after
	// the log is folded.
	_, err := s.ResolveHold(ctx, "ops", holds["a"], vault.HoldReleased)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	copyFile(t, stale, seg)

	after := MustOpenPath(t, path, clock)
	assert.Equal(t, vault.HoldReleased, allHolds(t, after)[holds["a"]].State, "the stale record did not undo the resolution")
	daily, _ := usageOf(t, after, key.ID)
	assert.Zero(t, daily.Held)
	require.NoError(t, after.CheckInvariant(ctx))
	segs, err := listSegments(path)
	require.NoError(t, err)
	assert.Len(t, segs, 1, "only the new segment: the stale one is removed")
}

// TestCheckFileReadsTheLog: keybrake check on the file a killed server left
// checks it with the log's records over it — the state the next start opens
// — without applying them; without its log the same file lacks them, and a
// damaged log is a damaged file.
func TestCheckFileReadsTheLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, path, _, key := newKeyStore(t)
	_, image, segNum := crashImage(t, s, path, key.ID, "a", "b", "c")

	rep, err := CheckFile(ctx, image, 0, vaulttest.QuietLogger())
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%+v", rep)
	assert.Equal(t, 3, rep.Records, "the three records only the log holds")
	segs, err := listSegments(image)
	require.NoError(t, err)
	assert.NotEmpty(t, segs, "check applies nothing: the log is still there")

	bare := filepath.Join(t.TempDir(), "keybrake.db")
	copyFile(t, image, bare)
	rep, err = CheckFile(ctx, bare, 0, vaulttest.QuietLogger())
	require.NoError(t, err)
	assert.Zero(t, rep.Records, "without its log the file holds none of them")

	data, err := os.ReadFile(segmentName(image, segNum))
	require.NoError(t, err)
	data[recHeader+2] ^= 0x10
	require.NoError(t, os.WriteFile(segmentName(image, segNum), data, 0o600))
	_, err = CheckFile(ctx, image, 0, vaulttest.QuietLogger())
	require.ErrorIs(t, err, vault.ErrDamaged)
}

// TestBackupHoldsWhatTheLogHeld: a hot backup taken while the last holds are
// in the log alone (the fold not yet run) holds them: it folds first, and the
// copy, opened without any log beside it, has every hold acknowledged before.
func TestBackupHoldsWhatTheLogHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := vaulttest.NewClock(vaulttest.T0)
	s, _ := MustOpen(t, clock)
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	key, _ := vaulttest.MustMint(t, s, "k", vaulttest.Policy(t, "5000.00", "20000.00", ""), nil)
	resume := stopFolds(s)
	holds := reserveAll(t, s, key.ID, []string{"a", "b"})
	resume() // the folder now waits for its delay; the backup folds at once
	copyPath := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(copyPath)
	require.NoError(t, err)
	_, err = s.Backup(ctx, f)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	restored := MustOpenPath(t, copyPath, clock)
	got := allHolds(t, restored)
	for _, id := range holds {
		assert.Contains(t, got, id)
	}
	daily, _ := usageOf(t, restored, key.ID)
	assert.Equal(t, int64(200), daily.Held)
}
