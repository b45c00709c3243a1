package vault

import (
	"context"
	"math"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
)

func TestCountHolds(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	want := map[HoldState]int{}
	for i := range 23 {
		f.clock.Advance(time.Second)
		MustReserve(t, f.s, charge(id, idem(i), 100))
		switch i % 3 {
		case 0:
			MustSettle(t, f.s, SettleRequest{KeyID: id, IdempotencyKey: idem(i), Outcome: SettleUnknown})
			want[HoldUnknown]++
		case 1:
			MustSettle(t, f.s, SettleRequest{KeyID: id, IdempotencyKey: idem(i), Outcome: SettleCommit, Amount: 100})
			want[HoldCommitted]++
		default:
			want[HoldHeld]++ // in flight
		}
	}
	// Chunk sizes that split the 23 entries unevenly, exactly, and not at all.
	for _, chunk := range []int{1, 4, 23, holdCountChunk} {
		f.s.countChunk = chunk
		for _, st := range []HoldState{HoldHeld, HoldCommitted, HoldReleased, HoldUnknown} {
			n, err := f.s.CountHolds(ctx, st)
			require.NoError(t, err)
			assert.Equal(t, want[st], n, "state %s, chunk %d", st, chunk)
		}
	}

	holds, _, err := f.s.ListHolds(ctx, HoldUnknown, 500, "")
	require.NoError(t, err)
	assert.Len(t, holds, want[HoldUnknown], "CountHolds agrees with ListHolds")

	_, err = f.s.CountHolds(ctx, "")
	assert.ErrorIs(t, err, ErrInvalid, "the empty state is not a state")
	_, err = f.s.CountHolds(ctx, "bogus")
	assert.ErrorIs(t, err, ErrInvalid)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = f.s.CountHolds(cancelled, HoldUnknown)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestCommitObserverSeesEveryGroupCommit(t *testing.T) {
	clock := newClock(t0)
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
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := MustMint(t, s, "k", testPolicy(t, "100.00", "150.00", ""), nil)
	const n = 5
	for i := range n {
		MustReserve(t, s, charge(k.ID, idem(i), 100))
		MustSettle(t, s, SettleRequest{KeyID: k.ID, IdempotencyKey: idem(i), Outcome: SettleCommit, Amount: 100})
	}
	require.NoError(t, s.Ping(context.Background()))
	mu.Lock()
	defer mu.Unlock()
	// One caller at a time: every operation is a batch of its own. Upstream and
	// mint are plain transactions, not the committer's.
	assert.Equal(t, 2*n+1, ops, "a Reserve and a Settle per request, and the ping")
	assert.Equal(t, 2*n+1, commits)
}

func TestPingAndSize(t *testing.T) {
	ctx := context.Background()
	s, path := MustOpen(t, newClock(t0))
	require.NoError(t, s.Ping(ctx))
	n, err := s.Size(ctx)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, fi.Size(), n, "the file's size")

	require.NoError(t, s.Close())
	assert.ErrorIs(t, s.Ping(ctx), ErrClosed)
	_, err = s.Size(ctx)
	assert.ErrorIs(t, err, ErrClosed)
}

func TestSummarizeUsage(t *testing.T) {
	ctx := context.Background()
	clock := newClock(t0)
	s, _ := MustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	// usd: a at 95 % of its daily cap (90 of 100 committed, 5 held), b far from
	// both; jpy: c at exactly 90 % of its period cap; revoked and expired keys do
	// not count.
	a, _ := MustMint(t, s, "a", testPolicy(t, "100.00", "1000.00", ""), nil)
	b, _ := MustMint(t, s, "b", testPolicy(t, "", "1000.00", ""), nil)
	jpy := testPolicy(t, "", "1000", "")
	jpy.Currency = "jpy"
	c, _ := MustMint(t, s, "c", jpy, nil)
	revoked, _ := MustMint(t, s, "revoked", testPolicy(t, "10.00", "", ""), nil)
	expiring := testPolicy(t, "10.00", "", "")
	expiring.ExpiresAt = t0.Add(time.Hour)
	expired, _ := MustMint(t, s, "expired", expiring, nil)

	commit := func(keyID, id, cur string, amount int64) {
		req := charge(keyID, id, amount)
		req.Request.Currency = cur
		res := MustReserve(t, s, req)
		require.Equal(t, ReserveClaimed, res.Outcome, "%s %s: %+v", keyID, id, res.Decision)
		MustSettle(t, s, SettleRequest{KeyID: keyID, IdempotencyKey: id, Outcome: SettleCommit, Amount: amount})
	}
	commit(a.ID, "a1", "usd", 9000)
	MustReserve(t, s, charge(a.ID, "a2", 500)) // held
	commit(b.ID, "b1", "usd", 1234)
	commit(c.ID, "c1", "jpy", 900)
	commit(revoked.ID, "r1", "usd", 1000)
	_, err := s.RevokeKey(ctx, "tester", revoked.ID)
	require.NoError(t, err)
	commit(expired.ID, "e1", "usd", 1000)
	clock.Advance(2 * time.Hour) // expired now; still the same day

	for _, chunk := range []int{1, 2, holdCountChunk} {
		s.countChunk = chunk
		sum, err := s.SummarizeUsage(ctx, 90)
		require.NoError(t, err)
		assert.Equal(t, 3, sum.ActiveKeys, "chunk %d", chunk)
		assert.Equal(t, map[CurrencyWindow]policy.Counter{
			{"usd", policy.WindowDaily}:  {Committed: 9000 + 1234, Held: 500},
			{"usd", policy.WindowPeriod}: {Committed: 9000 + 1234, Held: 500},
			{"jpy", policy.WindowDaily}:  {Committed: 900},
			{"jpy", policy.WindowPeriod}: {Committed: 900},
		}, sum.Totals, "chunk %d", chunk)
		assert.Equal(t, map[policy.WindowKind]int{policy.WindowDaily: 1, policy.WindowPeriod: 1}, sum.NearCap,
			"a's daily window, c's period window; chunk %d", chunk)
	}
	sum, err := s.SummarizeUsage(ctx, 100)
	require.NoError(t, err)
	assert.Empty(t, sum.NearCap, "nobody is at a cap")

	clock.Advance(24 * time.Hour) // a new day: the daily windows start at zero
	sum, err = s.SummarizeUsage(ctx, 90)
	require.NoError(t, err)
	assert.Equal(t, policy.Counter{}, sum.Totals[CurrencyWindow{"usd", policy.WindowDaily}])
	assert.Equal(t, policy.Counter{Committed: 9000 + 1234, Held: 500}, sum.Totals[CurrencyWindow{"usd", policy.WindowPeriod}])

	for _, bad := range []int{0, 101} {
		_, err := s.SummarizeUsage(ctx, bad)
		assert.ErrorIs(t, err, ErrInvalid)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.SummarizeUsage(cancelled, 90)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestReachedPercent(t *testing.T) {
	tests := []struct {
		used, limit int64
		pct         int
		want        bool
	}{
		{90, 100, 90, true},
		{89, 100, 90, false},
		{9, 10, 90, true},
		{8, 9, 90, false}, // 90 % of 9 is 8.1
		{9, 9, 90, true},
		{0, 0, 90, true},
		{1, 1, 100, true},
		{0, 1, 100, false},
		{math.MaxInt64 / 10 * 9, math.MaxInt64, 90, false},
		{math.MaxInt64/100*90 + 7, math.MaxInt64, 90, true}, // no overflow near the top
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, reachedPercent(tc.used, tc.limit, tc.pct), "%d of %d at %d %%", tc.used, tc.limit, tc.pct)
	}
}
