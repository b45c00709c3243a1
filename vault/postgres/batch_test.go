package postgres

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// parkCommitter holds s's committer inside a transaction of its own, so
// that what is submitted meanwhile queues; it returns once the committer is
// parked. release frees it, and it then takes everything queued in one
// batch. The parked body locks nothing, so its transaction takes nothing in.
func parkCommitter(t *testing.T, s *Store) (release func()) {
	t.Helper()
	parked, gate, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		var once sync.Once
		assert.NoError(t, (*backend)(s).SubmitPrefetch(context.Background(), &engine.Prefetch{}, func(engine.Tx, time.Time) error {
			once.Do(func() { close(parked) })
			<-gate
			return nil
		}))
	}()
	<-parked
	return func() {
		close(gate)
		<-done
	}
}

// TestGroupCommitSharesTransactions: concurrent Reserves and Settles of one
// key on one replica share transactions — one commit, and one lock of the
// key's row, for many — and each counts once.
func TestGroupCommitSharesTransactions(t *testing.T) {
	t.Parallel()
	clock := vaulttest.NewClock(vaulttest.T0)
	s := mustOpenURL(t, migrated.URL(t), vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: clock.Now})
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := vaulttest.MustMint(t, s, "hot", vaulttest.Policy(t, "", "1000000", ""), nil)
	var commits, ops atomic.Int64
	s.observe = func(n int, _ time.Duration) { commits.Add(1); ops.Add(int64(n)) }
	const workers, each = 32, 4
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				idem := vaulttest.Idem(w*each + i)
				res := vaulttest.MustReserve(t, s, vaulttest.Charge(k.ID, idem, 1))
				assert.Equal(t, vault.ReserveClaimed, res.Outcome)
				vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: idem, Outcome: vault.SettleCommit, Amount: 1})
			}
		})
	}
	wg.Wait()
	t.Logf("%d operations in %d transactions", ops.Load(), commits.Load())
	assert.Equal(t, int64(2*workers*each), ops.Load(), "every operation committed once")
	assert.Less(t, commits.Load(), ops.Load(), "concurrent operations share transactions")
	_, windows, usage, err := s.KeyUsage(context.Background(), k.ID)
	require.NoError(t, err)
	assert.Equal(t, int64(workers*each), usage[windows[0].ID].Committed)
	assert.Zero(t, usage[windows[0].ID].Held)
	require.NoError(t, s.CheckInvariant(context.Background()))
}

// TestGroupCommitIsolatesFailures: Reserves batched with a body that writes
// and then fails, and with one that panics: the batch rolls back and runs
// again op by op, so each Reserve counts once and only the bad ones fail.
func TestGroupCommitIsolatesFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := vaulttest.NewClock(vaulttest.T0)
	s := mustOpenURL(t, migrated.URL(t), vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: clock.Now})
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := vaulttest.MustMint(t, s, "k", vaulttest.Policy(t, "1000.00", "", ""), nil)

	release := parkCommitter(t, s)
	const n = 10
	results := make([]vault.ReserveResult, n)
	errs := make([]error, n)
	var badErr, panicErr error
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i], errs[i] = s.Reserve(ctx, vaulttest.Charge(k.ID, vaulttest.Idem(i), 100)) })
	}
	bad := &engine.Prefetch{Keys: []string{k.ID}}
	wg.Go(func() {
		badErr = (*backend)(s).SubmitPrefetch(ctx, bad, func(tx engine.Tx, _ time.Time) error {
			// Writes something, then fails: the write must not survive.
			if err := tx.Put(engine.BucketMeta, []byte("junk"), []byte("x")); err != nil {
				return err
			}
			return errors.New("boom")
		})
	})
	wg.Go(func() {
		panicErr = (*backend)(s).SubmitPrefetch(ctx, bad, func(engine.Tx, time.Time) error { panic("bug") })
	})
	require.Eventually(t, func() bool { return len(s.ops) == n+2 }, 10*time.Second, time.Millisecond, "all queued")
	release()
	wg.Wait()

	for i := range n {
		require.NoError(t, errs[i])
		assert.Equal(t, vault.ReserveClaimed, results[i].Outcome, "op %d", i)
	}
	assert.ErrorIs(t, badErr, vault.ErrStorage, "an unknown error is a storage failure to the caller")
	assert.ErrorContains(t, badErr, "boom")
	assert.ErrorContains(t, panicErr, "panic in store operation")
	var junk int
	require.NoError(t, s.pool.QueryRow(ctx, "SELECT count(*) FROM keybrake_meta WHERE k = 'junk'").Scan(&junk))
	assert.Zero(t, junk, "the failed body's write was rolled back")
	_, windows, usage, err := s.KeyUsage(ctx, k.ID)
	require.NoError(t, err)
	assert.Equal(t, int64(n*100), usage[windows[0].ID].Held, "each Reserve counted once despite the re-run")
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestBatchLeavesALockedKeyToWaitAlone: a batch that meets a key another
// session holds (a frozen replica) does not make the batch's other keys wait:
// they commit, while the held key's Reserve waits for the lock on its own —
// and succeeds once the holder lets go, within lock_timeout.
func TestBatchLeavesALockedKeyToWaitAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := migrated.URL(t)
	clock := vaulttest.NewClock(vaulttest.T0)
	s := mustOpenURL(t, url, vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: clock.Now}) // lock_timeout 10s
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	held, _ := vaulttest.MustMint(t, s, "held", vaulttest.Policy(t, "50.00", "", ""), nil)
	free, _ := vaulttest.MustMint(t, s, "free", vaulttest.Policy(t, "50.00", "", ""), nil)

	holder := holdKeyRow(t, url, held.ID)

	release := parkCommitter(t, s)
	heldDone, freeDone := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := s.Reserve(ctx, vaulttest.Charge(held.ID, "while-held", 100))
		heldDone <- err
	}()
	require.Eventually(t, func() bool { return len(s.ops) == 1 }, 10*time.Second, time.Millisecond)
	go func() {
		_, err := s.Reserve(ctx, vaulttest.Charge(free.ID, "other-key", 100))
		freeDone <- err
	}()
	require.Eventually(t, func() bool { return len(s.ops) == 2 }, 10*time.Second, time.Millisecond, "one batch for both")
	release()

	select {
	case err := <-freeDone:
		require.NoError(t, err, "the other key commits")
	case err := <-heldDone:
		t.Fatalf("the held key's Reserve ended (%v) before the other key's", err)
	}
	select {
	case err := <-heldDone:
		t.Fatalf("the held key's Reserve ended (%v) while its key was held", err)
	default:
	}
	require.NoError(t, holder.Close(ctx)) // the frozen session ends
	require.NoError(t, <-heldDone, "the held key's Reserve got its lock")
	_, windows, usage, err := s.KeyUsage(ctx, held.ID)
	require.NoError(t, err)
	assert.Equal(t, int64(100), usage[windows[0].ID].Held)
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestReplicasBatchManyKeys: three replicas whose batches lock overlapping
// sets of keys take the locks in one order — no deadlock — and meter every
// charge once.
func TestReplicasBatchManyKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := replicas(t, 3, vaulttest.NewClock(vaulttest.T0))
	vaulttest.MustUpstream(t, rs[0], "sk_test_abcdef1234")
	const nKeys, workers, each = 8, 24, 8
	keys := make([]vault.Key, nKeys)
	for i := range keys {
		keys[i], _ = vaulttest.MustMint(t, rs[0], vaulttest.Idem(i), vaulttest.Policy(t, "1000.00", "", ""), nil)
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			s := rs[w%len(rs)]
			for i := range each {
				k := keys[(w*7+i*3)%nKeys]
				idem := vaulttest.Idem(w*each + i)
				res := vaulttest.MustReserve(t, s, vaulttest.Charge(k.ID, idem, 1))
				assert.Equal(t, vault.ReserveClaimed, res.Outcome)
				vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: idem, Outcome: vault.SettleCommit, Amount: 1})
			}
		})
	}
	wg.Wait()
	var total int64
	for _, k := range keys {
		_, windows, usage, err := rs[1].KeyUsage(ctx, k.ID)
		require.NoError(t, err)
		total += usage[windows[0].ID].Committed
		assert.Zero(t, usage[windows[0].ID].Held)
	}
	assert.Equal(t, int64(workers*each), total)
}

// TestParseSetting reads lock_timeout as PostgreSQL writes it.
func TestParseSetting(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"10s": 10 * time.Second, "250ms": 250 * time.Millisecond, "1min": time.Minute, "500": 500 * time.Millisecond, "0": 0,
	} {
		got, ok := parseSetting(in)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "fast", "-1s", "10 parsecs"} {
		_, ok := parseSetting(in)
		assert.False(t, ok, in)
	}
}

// gathered is how many operations wait in the replica's queue, for its
// committer, while a batch is under way.
func gathered(s *Store) int { return len(s.ops) }

// TestBatchWaitsForItsReplicasBatchOnTheSameKey: while a batch of the
// replica holds a key, what comes for that key is not sent to wait for the
// row lock on the server in a batch of its own: it waits in the replica's
// queue, and the batch holding the key takes it in before it commits, so
// everything that came meanwhile shares that commit.
func TestBatchWaitsForItsReplicasBatchOnTheSameKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpenURL(t, migrated.URL(t), vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: vaulttest.NewClock(vaulttest.T0).Now})
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := vaulttest.MustMint(t, s, "hot", vaulttest.Policy(t, "1000.00", "", ""), nil)
	var mu sync.Mutex
	var sizes []int
	s.observe = func(n int, _ time.Duration) { mu.Lock(); sizes = append(sizes, n); mu.Unlock() }
	b := (*backend)(s)
	pf := &engine.Prefetch{Keys: []string{k.ID}}
	gate, inBody := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		assert.NoError(t, b.SubmitPrefetch(ctx, pf, holdingBody(inBody, gate)))
	})
	<-inBody // the first batch holds the key's row
	for range 2 {
		wg.Go(func() {
			assert.NoError(t, b.SubmitPrefetch(ctx, pf, func(engine.Tx, time.Time) error { return nil }))
		})
	}
	require.Eventually(t, func() bool { return gathered(s) == 2 }, 10*time.Second, time.Millisecond,
		"both queued, though neither can lock the key yet")
	close(gate)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int{3}, sizes, "the two that came meanwhile share the commit of the batch holding the key")
}

// TestBatchTakesInOnlyWhatItsLocksCover: the batch holding a key takes in,
// of what was queued on its replica meanwhile, the operations of that key,
// and leaves the rest — one that also locks another key, and one of
// the held key queued behind it, which must not pass it. What it takes in
// is its own from then on: a body among them that fails rolls the whole
// transaction back, and each operation runs again alone, so that only the
// failing one fails.
func TestBatchTakesInOnlyWhatItsLocksCover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, ids := withKeys(t, migrated.URL(t), "hot", "other")
	r := newRecorder(t, s)
	onHot := &engine.Prefetch{Keys: []string{ids[0]}}

	gate := make(chan struct{})
	first := r.holding(onHot, gate)
	ops := []*batchOp{
		r.op("hot", onHot),
		r.op("both", &engine.Prefetch{Keys: []string{ids[0], ids[1]}}),
		r.op("behind", onHot),
	}
	require.Eventually(t, func() bool { return gathered(s) == len(ops) }, 10*time.Second, time.Millisecond, "all gathered")
	close(gate)
	require.NoError(t, <-first)
	for _, o := range ops {
		require.NoError(t, <-o.done)
	}
	ran, sizes := r.results()
	assert.Equal(t, []string{"hot", "both", "behind"}, ran, "in the order queued")
	assert.Equal(t, []int{2, 2}, sizes, "hot's operation joined the batch holding hot; the other two waited for its end")
	r.reset()

	gate = make(chan struct{})
	first = r.holding(onHot, gate)
	good, bad := r.op("good", onHot), r.failing("bad", onHot)
	require.Eventually(t, func() bool { return gathered(s) == 2 }, 10*time.Second, time.Millisecond, "both gathered")
	close(gate)
	require.NoError(t, <-first)
	require.NoError(t, <-good.done)
	assert.ErrorContains(t, <-bad.done, "boom")
	ran, sizes = r.results()
	assert.Equal(t, []string{"good", "bad", "good", "bad"}, ran, "taken in, then run again alone")
	assert.Equal(t, []int{1, 1}, sizes, "after the failure each ran alone; the failing one committed nothing")
	assert.Equal(t, []string{"test-behind", "test-both", "test-good", "test-hot"}, metaNames(t, s), "the failed body's write was rolled back")
	require.NoError(t, s.CheckInvariant(ctx))
}

// withKeys opens a store on url with an upstream and a vault key of each
// name (caps that never refuse), and returns it with the keys' ids in order.
func withKeys(t *testing.T, url string, names ...string) (*Store, []string) {
	t.Helper()
	s := mustOpenURL(t, url, vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: vaulttest.NewClock(vaulttest.T0).Now})
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	ids := make([]string, len(names))
	for i, name := range names {
		k, _ := vaulttest.MustMint(t, s, name, vaulttest.Policy(t, "1000.00", "", ""), nil)
		ids[i] = k.ID
	}
	return s, ids
}

// recorder queues operations on a Store at once, in the test's order; each
// body records that it ran and writes "test-" and its name into the meta
// bucket. sizes are the sizes of the batches that committed.
type recorder struct {
	t     *testing.T
	b     *backend
	mu    sync.Mutex
	ran   []string
	sizes []int
}

func newRecorder(t *testing.T, s *Store) *recorder {
	r := &recorder{t: t, b: (*backend)(s)}
	s.observe = func(n int, _ time.Duration) { r.mu.Lock(); r.sizes = append(r.sizes, n); r.mu.Unlock() }
	return r
}

func (r *recorder) op(name string, pf *engine.Prefetch) *batchOp { return r.queue(name, pf, false) }

// failing is op whose body fails ("boom") after its write.
func (r *recorder) failing(name string, pf *engine.Prefetch) *batchOp { return r.queue(name, pf, true) }

func (r *recorder) queue(name string, pf *engine.Prefetch, fail bool) *batchOp {
	o := &batchOp{pf: pf, done: make(chan error, 1), run: func(tx engine.Tx, _ time.Time) error {
		r.mu.Lock()
		r.ran = append(r.ran, name)
		r.mu.Unlock()
		if err := tx.Put(engine.BucketMeta, []byte("test-"+name), []byte("x")); err != nil {
			return err
		}
		if fail {
			return errors.New("boom")
		}
		return nil
	}}
	require.NoError(r.t, r.b.enqueue(context.Background(), o))
	return o
}

// reset forgets what ran and the batch sizes so far.
func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ran, r.sizes = nil, nil
}

// holding submits an operation on pf whose body waits for gate, and returns
// once its batch holds pf's rows.
func (r *recorder) holding(pf *engine.Prefetch, gate chan struct{}) chan error {
	inBody := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- r.b.SubmitPrefetch(context.Background(), pf, holdingBody(inBody, gate)) }()
	<-inBody
	return done
}

func (r *recorder) results() (ran []string, sizes []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ran), slices.Clone(r.sizes)
}

// metaNames is the names the recorder's operations wrote, in order.
func metaNames(t *testing.T, s *Store) []string {
	var names []string
	rows, err := s.pool.Query(context.Background(), "SELECT convert_from(k, 'UTF8') FROM keybrake_meta WHERE k >= 'test-' AND k < 'test.' ORDER BY k")
	require.NoError(t, err)
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		names = append(names, n)
	}
	require.NoError(t, rows.Err())
	return names
}

// TestOneCommitterTakesInOnlyTheRowsItHolds: with one committer, what is
// queued on other keys while a batch holds a key stays queued (no second
// batch runs beside it), the batch takes in only the operations of its key
// (not one that names no row), and the others, in the order queued, form
// the next batch; all of them commit.
func TestOneCommitterTakesInOnlyTheRowsItHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, ids := withKeys(t, migrated.URL(t), "a", "b", "c")
	r := newRecorder(t, s)
	onA := &engine.Prefetch{Keys: []string{ids[0]}}

	gate := make(chan struct{})
	first := r.holding(onA, gate)
	ops := []*batchOp{
		r.op("b", &engine.Prefetch{Keys: []string{ids[1]}}),
		r.op("a1", onA),
		r.op("c", &engine.Prefetch{Keys: []string{ids[2]}}),
		r.op("a2", onA),
		r.op("none", &engine.Prefetch{}),
	}
	require.Eventually(t, func() bool { return gathered(s) == len(ops) }, 10*time.Second, time.Millisecond,
		"all queued: no other batch runs beside the one holding a")
	close(gate)
	require.NoError(t, <-first)
	for _, o := range ops {
		require.NoError(t, <-o.done)
	}
	ran, sizes := r.results()
	assert.Equal(t, []string{"a1", "a2", "b", "c", "none"}, ran, "a's taken in, the rest after, in the order queued")
	assert.Equal(t, []int{3, 3}, sizes, "the batch holding a took in a's two; b, c and the one naming nothing waited for the next")
	assert.Equal(t, []string{"test-a1", "test-a2", "test-b", "test-c", "test-none"}, metaNames(t, s), "all committed")
	require.NoError(t, s.CheckInvariant(ctx))
}

// TestCloseAnswersWhatIsPending: what a batch's transaction took from the
// queue and left (it locks a row the batch does not hold) is answered before
// Close returns, as what is still queued at Close is: ErrClosed, its body
// not run. What the batch under way took in commits with it.
func TestCloseAnswersWhatIsPending(t *testing.T) {
	t.Parallel()
	url := migrated.URL(t)
	s, ids := withKeys(t, url, "a", "b")
	r := newRecorder(t, s)
	onA := &engine.Prefetch{Keys: []string{ids[0]}}

	gate := make(chan struct{})
	first := r.holding(onA, gate)
	onB, takenIn := r.op("b", &engine.Prefetch{Keys: []string{ids[1]}}), r.op("a", onA)
	require.Eventually(t, func() bool { return gathered(s) == 2 }, 10*time.Second, time.Millisecond, "both queued")
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	require.Eventually(t, s.closed.Load, 10*time.Second, time.Millisecond, "Close has closed the queue")
	close(gate)
	require.NoError(t, <-first)
	require.NoError(t, <-takenIn.done, "taken in by the batch under way")
	assert.ErrorIs(t, <-onB.done, vault.ErrClosed, "left pending, answered at Close")
	require.NoError(t, <-closed)
	ran, sizes := r.results()
	assert.Equal(t, []string{"a"}, ran)
	assert.Equal(t, []int{2}, sizes)

	again := mustOpenURL(t, url, vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: vaulttest.NewClock(vaulttest.T0).Now})
	assert.Equal(t, []string{"test-a"}, metaNames(t, again), "what was taken in committed before Close returned")
}

// TestSplitKeepsEachKeysOrder: what a batch takes in of what is pending
// never passes an operation of the same key that stays.
func TestSplitKeepsEachKeysOrder(t *testing.T) {
	t.Parallel()
	op := func(keys ...string) *batchOp { return &batchOp{pf: &engine.Prefetch{Keys: keys}} }
	a1, ab, a2, c, a3, none := op("a"), op("a", "b"), op("a"), op("c"), op("a"), op()
	held := map[string]bool{"ka": true, "kc": true}
	taken, kept := split([]*batchOp{a1, c, ab, a2, none, a3}, held, 10)
	assert.Equal(t, []*batchOp{a1, c}, taken, "a2 and a3 stay behind ab, which needs b")
	assert.Equal(t, []*batchOp{ab, a2, none, a3}, kept)

	taken, kept = split([]*batchOp{a1, a2, c, a3}, held, 2)
	assert.Equal(t, []*batchOp{a1, a2}, taken, "at most n")
	assert.Equal(t, []*batchOp{c, a3}, kept)
}

// holdingBody is an operation's body that closes inBody the first time it
// runs (a retry runs it again) and then waits for gate: while it waits, its
// batch holds the rows it locked.
func holdingBody(inBody, gate chan struct{}) func(engine.Tx, time.Time) error {
	var once sync.Once
	return func(engine.Tx, time.Time) error {
		once.Do(func() { close(inBody) })
		<-gate
		return nil
	}
}
