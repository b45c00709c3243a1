package bolt

import (
	"context"
	"errors"
	"fmt"
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
)

func TestClaimsAreGroupCommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newMeteringFixture(t)
	const n = 64
	before := f.s.commits.Load()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := f.s.Claim(ctx, f.key.ID, fmt.Sprintf("job-%d", i), "fp", time.Minute)
			if assert.NoError(t, err) && assert.Equal(t, vault.ClaimOutcomeClaimed, res.Outcome) {
				assert.NoError(t, f.s.CompleteClaim(ctx, f.key.ID, fmt.Sprintf("job-%d", i), res.Claim.FencingToken, []byte(`1`)))
			}
		}()
	}
	wg.Wait()
	commits := f.s.commits.Load() - before
	t.Logf("%d claims and completes in %d write transactions", 2*n, commits)
	assert.Positive(t, commits, "claims go through the committer")
	assert.Less(t, commits, int64(2*n), "concurrent claims share transactions")
}

// TestGroupCommitIsolatesFailures queues reserves together with an op that fails
// and one that panics, all in one batch: the batch is rolled back and re-run op by
// op, so the reserves succeed exactly once and only the bad ops see errors.
func TestGroupCommitIsolatesFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newMeteringFixture(t)

	// Park the committer inside a transaction so that everything below queues up
	// and forms a single batch.
	parked, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		assert.NoError(t, (*backend)(f.s).Submit(ctx, func(engine.Tx, time.Time) error {
			close(parked)
			<-release
			return nil
		}))
	}()
	<-parked

	const n = 10
	results := make([]vault.ReserveResult, n)
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
			results[i], errs[i] = f.s.Reserve(ctx, vaulttest.Charge(f.key.ID, vaulttest.Idem(i), 100))
		}()
	}
	wg.Add(2)
	queued.Add(2)
	go func() {
		defer wg.Done()
		queued.Done()
		badErr = (*backend)(f.s).Submit(ctx, func(tx engine.Tx, _ time.Time) error {
			// Writes something, then fails: the write must not survive.
			if err := tx.Put(engine.BucketMeta, []byte("junk"), []byte("x")); err != nil {
				return err
			}
			return boom
		})
	}()
	go func() {
		defer wg.Done()
		queued.Done()
		panicErr = (*backend)(f.s).Submit(ctx, func(engine.Tx, time.Time) error { panic("bug") })
	}()
	queued.Wait()
	require.Eventually(t, func() bool { return len(f.s.ops) == n+2 }, 10*time.Second, time.Millisecond, "all ops queued")
	commitsBefore := f.s.commits.Load()
	close(release)
	wg.Wait()

	for i := range n {
		require.NoError(t, errs[i])
		assert.Equal(t, vault.ReserveClaimed, results[i].Outcome, "op %d", i)
	}
	assert.ErrorIs(t, badErr, vault.ErrStorage, "an unknown error is a storage failure to the caller")
	assert.Contains(t, badErr.Error(), "boom")
	assert.ErrorContains(t, panicErr, "panic in store operation")
	assert.Equal(t, int64(1+1+n+2), f.s.commits.Load()-commitsBefore, "parked tx, the failed batch, then one per op")
	require.NoError(t, f.s.db.View(func(tx *bbolt.Tx) error {
		assert.Nil(t, tx.Bucket([]byte("meta")).Get([]byte("junk")), "the failed op's write was rolled back")
		return nil
	}))
	daily, _ := usageOf(t, f.s, f.key.ID)
	assert.Equal(t, policy.Counter{Held: n * 100}, daily, "each reserve counted once despite the re-run")
	assert.Len(t, allHolds(t, f.s), n)
}

func TestCommitObserverSeesEveryGroupCommit(t *testing.T) {
	t.Parallel()
	clock := vaulttest.NewClock(vaulttest.T0)
	var (
		mu      sync.Mutex
		commits int
		ops     int
	)
	s, _ := MustOpen(t, clock, func(o *Options) {
		o.CommitObserver = func(n int, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			commits++
			ops += n
			assert.Positive(t, n)
			assert.GreaterOrEqual(t, d, time.Duration(0))
		}
	})
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := vaulttest.MustMint(t, s, "k", vaulttest.Policy(t, "100.00", "150.00", ""), nil)
	const n = 5
	for i := range n {
		vaulttest.MustReserve(t, s, vaulttest.Charge(k.ID, vaulttest.Idem(i), 100))
		vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: vaulttest.Idem(i), Outcome: vault.SettleCommit, Amount: 100})
	}
	require.NoError(t, s.Ping(context.Background()))
	mu.Lock()
	defer mu.Unlock()
	// One caller at a time: every operation is a batch of its own. Upstream and
	// mint are plain transactions, not the committer's.
	assert.Equal(t, 2*n+1, ops, "a Reserve and a Settle per request, and the ping")
	assert.Equal(t, 2*n+1, commits)
}
