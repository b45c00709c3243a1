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

// hasCounter reports whether the key's counter for window exists.
func hasCounter(t *testing.T, s *Store, keyID string, window policy.WindowID) bool {
	t.Helper()
	var ok bool
	require.NoError(t, s.view(func(tx engine.Tx, _ time.Time) error {
		var err error
		_, ok, err = engine.GetCounter(tx, keyID, window)
		return err
	}))
	return ok
}

// The clock jumps five days ahead (and traffic runs meanwhile), the reaper runs,
// the clock comes back: today's counter, with the day's spend, is still there,
// so the daily cap does not open again. Only when the key has spent a week later
// by its own counters is the old day reaped.
func testReaperSurvivesAClockJump(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t) // daily cap 100.00, period 150.00
	id := f.key.ID
	MustCommit(t, f.s, id, "today", 10000)

	f.clock.Advance(5 * 24 * time.Hour)
	_, err := f.s.Reap(ctx)
	require.NoError(t, err)
	assert.True(t, hasCounter(t, f.s, id, "day:2026-09-14"), "the clock alone does not reap a day with spend")
	MustCommit(t, f.s, id, "jumped", 1000) // day:2026-09-19
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	assert.True(t, hasCounter(t, f.s, id, "day:2026-09-14"), "nor does spend five days later")

	f.clock.Set(T0) // the clock is corrected
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 10000}, daily)
	assert.Equal(t, vault.ReserveRefused, MustReserve(t, f.s, Charge(id, "again", 100)).Outcome, "today's cap is still spent")

	// A week of the key's own later use: the old day goes, the recent ones stay.
	f.clock.Set(T0.Add(8 * 24 * time.Hour))
	MustCommit(t, f.s, id, "week-later", 100) // day:2026-09-22
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	assert.False(t, hasCounter(t, f.s, id, "day:2026-09-14"))
	assert.True(t, hasCounter(t, f.s, id, "day:2026-09-19"), "three days older than the latest: kept")
	assert.True(t, hasCounter(t, f.s, id, "day:2026-09-22"))
	assert.True(t, hasCounter(t, f.s, id, "period"))
}

// A hold an operator resolved replays "resolved" to a retry of its key for good,
// not only for the idempotency TTL: the record had been kept while unknown, and a
// caller still retrying days later must not move the money again.
func testResolvedRecordIsKept(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	MustReserve(t, f.s, Charge(id, "lost", 2500))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "lost", Outcome: vault.SettleUnknown})
	f.clock.Advance(3 * 24 * time.Hour)
	_, err := f.s.ResolveHold(ctx, "alice", vault.HoldID(id, "lost"), vault.HoldCommitted)
	require.NoError(t, err)
	MustCommit(t, f.s, id, "normal", 100)

	f.clock.Advance(10 * 24 * time.Hour) // still within the key's period
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	res := MustReserve(t, f.s, Charge(id, "lost", 2500))
	require.Equal(t, vault.ReserveReplay, res.Outcome, "still resolved")
	assert.True(t, res.Record.Resolved)
	require.NotNil(t, res.Hold)
	assert.Equal(t, vault.HoldCommitted, res.Hold.State)
	assert.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, Charge(id, "normal", 100)).Outcome,
		"an ordinary completed record is reaped after the idempotency TTL")
}

// testLedgerRetentionKeepsTheSums: the reaper removes ledger events older than
// the retention, and the sums they carried survive in roll-ups: the counters
// still equal the ledger (CheckInvariant), and the spend per day still shows
// the days whose events are gone. A day's roll-up goes only once its counter
// is gone and no spend chart reaches back to it.
func testLedgerRetentionKeepsTheSums(t *testing.T) {
	ctx := context.Background()
	clock := NewClock(T0) // 2026-09-14 12:00 UTC
	s := mustOpen(t, clock, func(o *Options) { o.LedgerRetention = 10 * 24 * time.Hour })
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := MustMint(t, s, "k", Policy(t, "100.00", "1000.00", ""), nil)
	id := k.ID
	MustCommit(t, s, id, "a", 1000)
	MustReserve(t, s, Charge(id, "r", 500))
	MustSettle(t, s, vault.SettleRequest{KeyID: id, IdempotencyKey: "r", Outcome: vault.SettleRelease})
	require.Equal(t, vault.ReserveRefused, MustReserve(t, s, Charge(id, "over", 20000)).Outcome)
	clock.Advance(24 * time.Hour)
	MustCommit(t, s, id, "b", 2000) // day:2026-09-15

	clock.Set(time.Date(2026, 9, 24, 18, 0, 0, 0, time.UTC)) // 2026-09-14 is 10 days and 6 hours ago
	MustCommit(t, s, id, "c", 300)
	_, err := s.Reap(ctx)
	require.NoError(t, err)
	events, _, err := s.ListEvents(ctx, id, 0, "")
	require.NoError(t, err)
	var ops []string
	for _, e := range events {
		assert.False(t, e.Time.Before(T0.Add(24*time.Hour)), "event %s of %s is past the retention", e.ID, e.Time)
		ops = append(ops, string(e.Decision))
	}
	assert.Equal(t, []string{"settled", "allowed", "settled", "allowed"}, ops, "the events of b and c are kept")
	require.NoError(t, s.CheckInvariant(ctx), "the counters equal the events plus the roll-ups")

	rep, err := s.DailySpend(ctx, id)
	require.NoError(t, err)
	spent := map[string]int64{}
	for _, d := range rep.Days {
		spent[d.Date] = d.Committed
	}
	assert.Equal(t, int64(1000), spent["2026-09-14"], "a day whose events are gone still shows")
	assert.Equal(t, int64(2000), spent["2026-09-15"])
	assert.Equal(t, int64(300), spent["2026-09-24"])

	// A year later: the key's old days' counters are long gone, and so is the
	// roll-up of a day no chart shows; the period's stays with its counter.
	clock.Set(time.Date(2027, 9, 30, 0, 0, 0, 0, time.UTC))
	_, err = s.Reap(ctx)
	require.NoError(t, err)
	events, _, err = s.ListEvents(ctx, id, 0, "")
	require.NoError(t, err)
	assert.Empty(t, events)
	assert.False(t, hasCounter(t, s, id, "day:2026-09-14"))
	var day, period bool
	require.NoError(t, s.view(func(tx engine.Tx, _ time.Time) error {
		for _, w := range []struct {
			window string
			found  *bool
		}{{"day:2026-09-14", &day}, {"period", &period}} {
			v, err := tx.Get(engine.BucketRollups, []byte(id+"/"+w.window))
			*w.found = v != nil
			if err != nil {
				return err
			}
		}
		return nil
	}))
	assert.False(t, day, "a day no spend chart shows loses its roll-up")
	assert.True(t, period, "the period's roll-up stays with its counter")
	_, _, usage, err := s.KeyUsage(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, int64(3300), usage["period"].Committed)
	require.NoError(t, s.CheckInvariant(ctx))
}
