package vaulttest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

func testCountHolds(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	want := map[vault.HoldState]int{}
	for i := range 23 {
		f.clock.Advance(time.Second)
		MustReserve(t, f.s, Charge(id, Idem(i), 100))
		switch i % 3 {
		case 0:
			MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: Idem(i), Outcome: vault.SettleUnknown})
			want[vault.HoldUnknown]++
		case 1:
			MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: Idem(i), Outcome: vault.SettleCommit, Amount: 100})
			want[vault.HoldCommitted]++
		default:
			want[vault.HoldHeld]++ // in flight
		}
	}
	// Chunk sizes that split the 23 entries unevenly, exactly, and not at all.
	for _, chunk := range []int{1, 4, 23, holdCountChunk} {
		engine.SetCountChunk(f.s.e, chunk)
		for _, st := range []vault.HoldState{vault.HoldHeld, vault.HoldCommitted, vault.HoldReleased, vault.HoldUnknown} {
			n, err := f.s.CountHolds(ctx, st)
			require.NoError(t, err)
			assert.Equal(t, want[st], n, "state %s, chunk %d", st, chunk)
		}
	}

	holds, _, err := f.s.ListHolds(ctx, vault.HoldUnknown, 500, "")
	require.NoError(t, err)
	assert.Len(t, holds, want[vault.HoldUnknown], "CountHolds agrees with ListHolds")

	_, err = f.s.CountHolds(ctx, "")
	assert.ErrorIs(t, err, vault.ErrInvalid, "the empty state is not a state")
	_, err = f.s.CountHolds(ctx, "bogus")
	assert.ErrorIs(t, err, vault.ErrInvalid)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = f.s.CountHolds(cancelled, vault.HoldUnknown)
	assert.ErrorIs(t, err, context.Canceled)
}

func testPingAndSize(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	require.NoError(t, s.Ping(ctx))
	n, err := s.Size(ctx)
	require.NoError(t, err)
	assert.Positive(t, n)

	require.NoError(t, s.Close())
	assert.ErrorIs(t, s.Ping(ctx), vault.ErrClosed)
	_, err = s.Size(ctx)
	assert.ErrorIs(t, err, vault.ErrClosed)
}

func testSummarizeUsage(t *testing.T) {
	ctx := context.Background()
	clock := NewClock(T0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	// usd: a at 95 % of its daily cap (90 of 100 committed, 5 held), b far from
	// both; jpy: c at exactly 90 % of its period cap; revoked and expired keys do
	// not count.
	a, _ := MustMint(t, s, "a", Policy(t, "100.00", "1000.00", ""), nil)
	b, _ := MustMint(t, s, "b", Policy(t, "", "1000.00", ""), nil)
	jpy := Policy(t, "", "1000", "")
	jpy.Currency = "jpy"
	c, _ := MustMint(t, s, "c", jpy, nil)
	revoked, _ := MustMint(t, s, "revoked", Policy(t, "10.00", "", ""), nil)
	expiring := Policy(t, "10.00", "", "")
	expiring.ExpiresAt = T0.Add(time.Hour)
	expired, _ := MustMint(t, s, "expired", expiring, nil)

	commit := func(keyID, id, cur string, amount int64) {
		req := Charge(keyID, id, amount)
		req.Request.Currency = cur
		res := MustReserve(t, s, req)
		require.Equal(t, vault.ReserveClaimed, res.Outcome, "%s %s: %+v", keyID, id, res.Decision)
		MustSettle(t, s, vault.SettleRequest{KeyID: keyID, IdempotencyKey: id, Outcome: vault.SettleCommit, Amount: amount})
	}
	commit(a.ID, "a1", "usd", 9000)
	MustReserve(t, s, Charge(a.ID, "a2", 500)) // held
	commit(b.ID, "b1", "usd", 1234)
	commit(c.ID, "c1", "jpy", 900)
	commit(revoked.ID, "r1", "usd", 1000)
	_, err := s.RevokeKey(ctx, "tester", revoked.ID)
	require.NoError(t, err)
	commit(expired.ID, "e1", "usd", 1000)
	clock.Advance(2 * time.Hour) // expired now; still the same day

	for _, chunk := range []int{1, 2, holdCountChunk} {
		engine.SetCountChunk(s.e, chunk)
		sum, err := s.SummarizeUsage(ctx, 90)
		require.NoError(t, err)
		assert.Equal(t, 3, sum.ActiveKeys, "chunk %d", chunk)
		assert.Equal(t, map[vault.CurrencyWindow]policy.Counter{
			{Currency: "usd", Window: policy.WindowDaily}:  {Committed: 9000 + 1234, Held: 500},
			{Currency: "usd", Window: policy.WindowPeriod}: {Committed: 9000 + 1234, Held: 500},
			{Currency: "jpy", Window: policy.WindowDaily}:  {Committed: 900},
			{Currency: "jpy", Window: policy.WindowPeriod}: {Committed: 900},
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
	assert.Equal(t, policy.Counter{}, sum.Totals[vault.CurrencyWindow{Currency: "usd", Window: policy.WindowDaily}])
	assert.Equal(t, policy.Counter{Committed: 9000 + 1234, Held: 500}, sum.Totals[vault.CurrencyWindow{Currency: "usd", Window: policy.WindowPeriod}])

	for _, bad := range []int{0, 101} {
		_, err := s.SummarizeUsage(ctx, bad)
		assert.ErrorIs(t, err, vault.ErrInvalid)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.SummarizeUsage(cancelled, 90)
	assert.ErrorIs(t, err, context.Canceled)
}

// testCheck: Check finds nothing in a store the contract wrote, counts its
// records, and lists what it finds once a counter disagrees with its ledger;
// a store that commits reports no commit error and no settle kept for a
// retry.
func testCheck(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	MustCommit(t, f.s, f.key.ID, "a", 700)
	MustCommit(t, f.s, f.key.ID, "b", 300)
	rep, err := f.s.Check(ctx)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%+v", rep)
	assert.Equal(t, 2, rep.Records)
	assert.NoError(t, f.s.CommitError())
	assert.Zero(t, f.s.PendingSettles())

	require.NoError(t, engine.Update(f.s.e, ctx, func(tx engine.Tx, _ time.Time) error {
		c, _, err := engine.GetCounter(tx, f.key.ID, "period")
		if err != nil {
			return err
		}
		c.Committed += 5
		return engine.PutCounter(tx, f.key.ID, "period", c)
	}))
	rep, err = f.s.Check(ctx)
	require.NoError(t, err)
	assert.False(t, rep.OK())
	assert.Empty(t, rep.PageProblems, "the pages are whole")
	require.NotEmpty(t, rep.InvariantProblems)
	assert.Contains(t, rep.InvariantProblems[0], "ledger")
	require.NoError(t, f.s.Close()) // the cleanup's invariant check would fail, as it should
}
