package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
	"github.com/keybrake/keybrake/vault/vaulttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

func TestRecoveryAtOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	vaulttest.MustReserve(t, f.s, vaulttest.Charge(id, "inflight", 2500))
	vaulttest.MustReserve(t, f.s, vaulttest.Charge(id, "done", 500))
	vaulttest.MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "done", Outcome: vault.SettleCommit, Amount: 500})
	require.NoError(t, f.s.Close())

	s := MustOpenPath(t, f.path, f.clock)
	assert.Equal(t, map[vault.RecordState]int{vault.RecordUnknown: 1, vault.RecordCompleted: 1}, recordStates(t, s))
	holds, _, err := s.ListHolds(ctx, vault.HoldUnknown, 0, "")
	require.NoError(t, err)
	require.Len(t, holds, 1)
	assert.Equal(t, vault.HoldID(id, "inflight"), holds[0].ID)
	daily, _ := usageOf(t, s, id)
	assert.Equal(t, policy.Counter{Committed: 500, Held: 2500}, daily, "the hold stays counted")

	res := vaulttest.MustReserve(t, s, vaulttest.Charge(id, "inflight", 2500))
	require.Equal(t, vault.ReserveResume, res.Outcome)
	vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: id, IdempotencyKey: "inflight", Outcome: vault.SettleAbandon})
	assert.Equal(t, map[vault.RecordState]int{vault.RecordUnknown: 1, vault.RecordCompleted: 1}, recordStates(t, s), "abandoning a resume keeps it unknown")
}

func TestBackup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newMeteringFixture(t)
	vaulttest.MustReserve(t, f.s, vaulttest.Charge(f.key.ID, "a", 100))
	var buf bytes.Buffer
	n, err := f.s.Backup(ctx, &buf)
	require.NoError(t, err)
	assert.Equal(t, int64(buf.Len()), n)

	path := filepath.Join(t.TempDir(), "copy.db")
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o600))
	c := MustOpenPath(t, path, f.clock)
	k, err := c.GetKey(ctx, f.key.ID)
	require.NoError(t, err)
	assert.Equal(t, "k", k.Name)
	assert.Equal(t, map[vault.RecordState]int{vault.RecordUnknown: 1}, recordStates(t, c), "the copy recovers like any restart")
}

func TestGroupCommitSharesTransactions(t *testing.T) {
	t.Parallel()
	f := newMeteringFixture(t)
	p := vaulttest.Policy(t, "", "1000000", "")
	k, _ := vaulttest.MustMint(t, f.s, "big", p, nil)
	const workers, each = 64, 4
	before := f.s.commits.Load()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				res := vaulttest.MustReserve(t, f.s, vaulttest.Charge(k.ID, vaulttest.Idem(w*each+i), 1))
				assert.Equal(t, vault.ReserveClaimed, res.Outcome)
			}
		}()
	}
	wg.Wait()
	commits := f.s.commits.Load() - before
	t.Logf("%d reserves in %d write transactions", workers*each, commits)
	assert.Less(t, commits, int64(workers*each), "concurrent reserves share transactions")
	_, period := usageOf(t, f.s, k.ID)
	assert.Equal(t, int64(workers*each), period.Held)
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := vaulttest.NewClock(vaulttest.T0)

	t.Run("short master key", func(t *testing.T) {
		_, err := Open(filepath.Join(t.TempDir(), "x.db"), Options{MasterKey: []byte("short")})
		assert.ErrorIs(t, err, vault.ErrInvalid)
	})

	t.Run("wrong master key", func(t *testing.T) {
		s, path := MustOpen(t, clock)
		require.NoError(t, s.Close())
		other := bytes.Repeat([]byte{7}, 32)
		_, err := Open(path, Options{MasterKey: other})
		assert.ErrorIs(t, err, vault.ErrSealed)
	})

	t.Run("newer schema", func(t *testing.T) {
		s, path := MustOpen(t, clock)
		require.NoError(t, s.db.Update(func(tx *bbolt.Tx) error {
			return tx.Bucket([]byte("meta")).Put(engine.MetaSchemaVersion, binary.BigEndian.AppendUint64(nil, engine.SchemaVersion+1))
		}))
		require.NoError(t, s.Close())
		_, err := Open(path, Options{MasterKey: vaulttest.MasterKey})
		assert.ErrorIs(t, err, vault.ErrSchemaVersion)
	})

	t.Run("locked", func(t *testing.T) {
		_, path := MustOpen(t, clock)
		_, err := Open(path, Options{MasterKey: vaulttest.MasterKey, OpenTimeout: 50 * time.Millisecond})
		assert.ErrorIs(t, err, vault.ErrLocked)
	})

	t.Run("closed", func(t *testing.T) {
		s, _ := MustOpen(t, clock)
		require.NoError(t, s.Close())
		require.NoError(t, s.Close(), "closing twice is fine")
		_, err := s.GetKey(ctx, "key_x")
		assert.ErrorIs(t, err, vault.ErrClosed)
		_, err = s.Reserve(ctx, vaulttest.Charge("key_x", "a", 1))
		assert.ErrorIs(t, err, vault.ErrClosed)
	})

	t.Run("every bucket and the schema version", func(t *testing.T) {
		s, _ := MustOpen(t, clock)
		require.NoError(t, s.db.View(func(tx *bbolt.Tx) error {
			for _, b := range engine.Buckets() {
				assert.NotNil(t, tx.Bucket([]byte(b.Name())), b.Name())
			}
			assert.Equal(t, binary.BigEndian.AppendUint64(nil, engine.SchemaVersion), tx.Bucket([]byte("meta")).Get(engine.MetaSchemaVersion))
			return nil
		}))
	})
}

func TestNoSecretOrTokenInFile(t *testing.T) {
	t.Parallel()
	s, path := MustOpen(t, vaulttest.NewClock(vaulttest.T0))
	vaulttest.AssertNoSecretStored(t, s, func() []byte {
		require.NoError(t, s.Close()) // every page written
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		return data
	})
}

func TestErrorsAreTranslated(t *testing.T) {
	t.Parallel()
	assert.ErrorIs(t, translate(errors.New("disk on fire")), vault.ErrStorage)
	assert.ErrorIs(t, translate(vault.ErrNotFound), vault.ErrNotFound)
	assert.ErrorIs(t, translate(bolterrors.ErrDatabaseNotOpen), vault.ErrClosed)
	assert.ErrorIs(t, translate(bolterrors.ErrTimeout), vault.ErrLocked)
	assert.NotErrorIs(t, translate(bolterrors.ErrTimeout), bolterrors.ErrTimeout, "bbolt errors do not leak")
}

// TestSizeIsTheFile: bbolt's store size is its file's, as the filesystem
// sees it.
func TestSizeIsTheFile(t *testing.T) {
	t.Parallel()
	s, path := MustOpen(t, vaulttest.NewClock(vaulttest.T0))
	n, err := s.Size(context.Background())
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, fi.Size(), n, "the file's size")
}

// TestReplayTakesNoWriteTransaction: a retry of a completed request is answered
// from a read transaction — its stored answer and the key's usage — so a
// replay neither waits for the group commit nor costs an fsync.
func TestReplayTakesNoWriteTransaction(t *testing.T) {
	t.Parallel()
	f := newMeteringFixture(t)
	vaulttest.MustCommit(t, f.s, f.key.ID, "a", 2500)
	before := f.s.commits.Load()
	for range 3 {
		res := vaulttest.MustReserve(t, f.s, vaulttest.Charge(f.key.ID, "a", 2500))
		require.Equal(t, vault.ReserveReplay, res.Outcome)
		assert.Equal(t, int64(2500), res.Usage["period"].Committed)
	}
	other := vaulttest.Charge(f.key.ID, "a", 2500)
	other.Fingerprint = "another request"
	assert.Equal(t, vault.ReserveMismatch, vaulttest.MustReserve(t, f.s, other).Outcome)
	assert.Equal(t, before, f.s.commits.Load(), "no write transaction")

	_, err := f.s.RevokeKey(context.Background(), "test", f.key.ID)
	require.NoError(t, err)
	_, err = f.s.Reserve(context.Background(), vaulttest.Charge(f.key.ID, "a", 2500))
	assert.ErrorIs(t, err, vault.ErrKeyRevoked, "a revoked key's replay is refused, by the write transaction")
}

// TestOpenReadsOnlyTheRecordsInFlight: recovery at start reads the records the
// in-flight index lists and no other, so a file of a million completed records
// opens as fast as an empty one. A completed record that cannot even be decoded
// does not stop the start (it is read only when asked for).
func TestOpenReadsOnlyTheRecordsInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	vaulttest.MustCommit(t, f.s, id, "done", 100)
	vaulttest.MustReserve(t, f.s, vaulttest.Charge(id, "flying", 200))
	k := engine.RecordKey(id, "done")
	var saved []byte
	require.NoError(t, engine.Update(f.s.Engine, ctx, func(tx engine.Tx, _ time.Time) error {
		v, err := tx.Get(engine.BucketIdem, k)
		saved = bytes.Clone(v)
		if err != nil {
			return err
		}
		return tx.Put(engine.BucketIdem, k, []byte{0xee})
	}))
	require.NoError(t, f.s.Close())

	s := MustOpenPath(t, f.path, f.clock)
	h := allHoldsOf(t, s, vault.HoldUnknown)
	require.Len(t, h, 1, "the request in flight is recovered")
	assert.Equal(t, vault.HoldID(id, "flying"), h[0].ID)
	require.NoError(t, engine.Update(s.Engine, ctx, func(tx engine.Tx, _ time.Time) error {
		return tx.Put(engine.BucketIdem, k, saved)
	}))
}

// allHoldsOf lists the holds in state.
func allHoldsOf(t *testing.T, s *Store, state vault.HoldState) []vault.Hold {
	t.Helper()
	holds, _, err := s.ListHolds(context.Background(), state, 500, "")
	require.NoError(t, err)
	return holds
}
