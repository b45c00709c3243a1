package vault

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/policy"
)

// TestGroupCommitIsolatesFailures queues reserves together with an op that fails
// and one that panics, all in one batch: the batch is rolled back and re-run op by
// op, so the reserves succeed exactly once and only the bad ops see errors.
func TestGroupCommitIsolatesFailures(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)

	// Park the committer inside a transaction so that everything below queues up
	// and forms a single batch.
	parked, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		assert.NoError(t, f.s.submit(ctx, func(tx *bolt.Tx, now time.Time) error {
			close(parked)
			<-release
			return nil
		}))
	}()
	<-parked

	const n = 10
	results := make([]ReserveResult, n)
	errs := make([]error, n)
	boom := errors.New("boom")
	var badErr, panicErr error
	var queued sync.WaitGroup
	for i := range n {
		wg.Add(1)
		queued.Add(1)
		go func() {
			defer wg.Done()
			queued.Done()
			results[i], errs[i] = f.s.Reserve(ctx, charge(f.key.ID, idem(i), 100))
		}()
	}
	wg.Add(2)
	queued.Add(2)
	go func() {
		defer wg.Done()
		queued.Done()
		badErr = f.s.submit(ctx, func(tx *bolt.Tx, now time.Time) error {
			// Writes something, then fails: the write must not survive.
			if err := tx.Bucket(bucketMeta).Put([]byte("junk"), []byte("x")); err != nil {
				return err
			}
			return boom
		})
	}()
	go func() {
		defer wg.Done()
		queued.Done()
		panicErr = f.s.submit(ctx, func(tx *bolt.Tx, now time.Time) error { panic("bug") })
	}()
	queued.Wait()
	require.Eventually(t, func() bool { return len(f.s.ops) == n+2 }, 10*time.Second, time.Millisecond, "all ops queued")
	commitsBefore := f.s.commits.Load()
	close(release)
	wg.Wait()

	for i := range n {
		require.NoError(t, errs[i])
		assert.Equal(t, ReserveClaimed, results[i].Outcome, "op %d", i)
	}
	assert.ErrorIs(t, badErr, ErrStorage, "an unknown error is a storage failure to the caller")
	assert.Contains(t, badErr.Error(), "boom")
	assert.ErrorContains(t, panicErr, "panic in store operation")
	assert.Equal(t, int64(1+1+n+2), f.s.commits.Load()-commitsBefore, "parked tx, the failed batch, then one per op")
	require.NoError(t, f.s.db.View(func(tx *bolt.Tx) error {
		assert.Nil(t, tx.Bucket(bucketMeta).Get([]byte("junk")), "the failed op's write was rolled back")
		return nil
	}))
	daily, _ := usageOf(t, f.s, f.key.ID)
	assert.Equal(t, policy.Counter{Held: n * 100}, daily, "each reserve counted once despite the re-run")
	assert.Len(t, allHolds(t, f.s), n)
}

func TestTamperedStoredResponseIsNotReplayed(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	MustReserve(t, f.s, charge(f.key.ID, "a", 100))
	MustSettle(t, f.s, SettleRequest{KeyID: f.key.ID, IdempotencyKey: "a", Outcome: SettleCommit, Amount: 100,
		Response: &StoredResponse{Status: 200, Body: []byte(`{"id":"ch_1"}`)}})
	require.NoError(t, f.s.db.Update(func(tx *bolt.Tx) error {
		r, err := getRecord(tx, f.key.ID, "a")
		if err != nil {
			return err
		}
		r.Response.SealedBody[20] ^= 1
		return putRecord(tx, r)
	}))
	_, err := f.s.Reserve(ctx, charge(f.key.ID, "a", 100))
	assert.ErrorIs(t, err, ErrSealed)
}
