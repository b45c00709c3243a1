package vaulttest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// Moving a key from UTC−12 to UTC+14 puts "now" in the next local date. Daily
// counters are keyed by local date, so the change used to open a fresh daily
// budget at once. The day's usage now carries into the new zone's day, which
// resets at the new zone's next midnight.
// zoneFixture is a store whose clock reads 00:00 UTC on 2026-09-15, 12:00 on
// the 14th at UTC−12, and a key there with the given caps.
func zoneFixture(t *testing.T, daily, period string) (*Store, *Clock, vault.Key, policy.Policy) {
	t.Helper()
	clock := NewClock(time.Date(2026, 9, 15, 0, 0, 0, 0, time.UTC))
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	p := Policy(t, daily, period, "")
	p.Timezone = "Etc/GMT+12"
	k, _ := MustMint(t, s, "tz", p, nil)
	return s, clock, k, p
}

func testTimeZoneChangeCarriesTheDay(t *testing.T) {
	ctx := context.Background()
	s, clock, k, p := zoneFixture(t, "50.00", "500.00")

	MustCommit(t, s, k.ID, "a", 3000)
	MustReserve(t, s, Charge(k.ID, "b", 2000)) // still in flight: held
	assert.Equal(t, vault.ReserveRefused, MustReserve(t, s, Charge(k.ID, "c", 100)).Outcome, "the day's cap is spent")

	p.Timezone = "Pacific/Kiritimati" // 14:00 on the 15th
	_, err := s.UpdateKey(ctx, "alice", k.ID, p, nil)
	require.NoError(t, err)

	_, windows, usage, err := s.KeyUsage(ctx, k.ID)
	require.NoError(t, err)
	assert.Equal(t, policy.WindowID("day:2026-09-15"), windows[0].ID)
	assert.Equal(t, policy.Counter{Committed: 5000}, usage[windows[0].ID], "committed and held carry, as committed")
	assert.Equal(t, policy.Counter{Committed: 3000, Held: 2000}, usage["period"], "the period is not touched")
	res := MustReserve(t, s, Charge(k.ID, "c2", 100))
	assert.Equal(t, vault.ReserveRefused, res.Outcome, "no fresh daily budget")
	assert.Equal(t, policy.ReasonCapExceeded, res.Decision.Reason)
	assert.Equal(t, policy.WindowDaily, res.Decision.Cap)

	// The hold placed under the old zone settles on the old zone's window.
	MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: "b", Outcome: vault.SettleCommit, Amount: 2000})
	daily, period := usageOf(t, s, k.ID)
	assert.Equal(t, policy.Counter{Committed: 5000}, daily)
	assert.Equal(t, policy.Counter{Committed: 5000}, period)

	events, _, err := s.ListEvents(ctx, k.ID, 50, "")
	require.NoError(t, err)
	var carried []vault.Event
	for _, e := range events {
		if e.Decision == "carried" {
			carried = append(carried, e)
		}
	}
	require.Len(t, carried, 1, "the carry is in the ledger")
	assert.Equal(t, "timezone_changed", carried[0].Reason)
	assert.EqualValues(t, 5000, carried[0].CommittedDelta)
	assert.Equal(t, []policy.WindowID{"day:2026-09-15"}, carried[0].WindowIDs)
	require.NoError(t, s.CheckInvariant(ctx))

	// The new zone's midnight (10:00 UTC) is the next reset.
	clock.Set(time.Date(2026, 9, 15, 9, 59, 0, 0, time.UTC))
	assert.Equal(t, vault.ReserveRefused, MustReserve(t, s, Charge(k.ID, "d", 100)).Outcome)
	clock.Set(time.Date(2026, 9, 15, 10, 0, 0, 0, time.UTC))
	assert.Equal(t, vault.ReserveClaimed, MustReserve(t, s, Charge(k.ID, "e", 5000)).Outcome)
}

// Changing the zone back, or to a zone whose current day already has usage,
// tops the window up to the day's usage rather than adding it twice; a cap
// lowered in the same change is respected and the invariant still holds.
func testTimeZoneChangeTopsUpAndKeepsTheInvariant(t *testing.T) {
	ctx := context.Background()
	s, _, k, p := zoneFixture(t, "50.00", "")
	MustCommit(t, s, k.ID, "a", 4000)

	for _, zone := range []string{"Pacific/Kiritimati", "Etc/GMT+12", "Pacific/Kiritimati"} {
		p.Timezone = zone
		_, err := s.UpdateKey(ctx, "alice", k.ID, p, nil)
		require.NoError(t, err)
		daily, _ := usageOf(t, s, k.ID)
		assert.Equal(t, policy.Counter{Committed: 4000}, daily, "%s: the day's usage, once", zone)
	}

	// Another key: the zone and a lower cap in one change.
	p = Policy(t, "50.00", "", "")
	p.Timezone = "Etc/GMT+12"
	k2, _ := MustMint(t, s, "tz2", p, nil)
	MustCommit(t, s, k2.ID, "a", 4000)
	p.Timezone, p.DailyCap = "Pacific/Kiritimati", MustDec(t, "30.00")
	_, err := s.UpdateKey(ctx, "alice", k2.ID, p, nil)
	require.NoError(t, err)
	daily, _ := usageOf(t, s, k2.ID)
	assert.Equal(t, policy.Counter{Committed: 4000}, daily)
	assert.Equal(t, vault.ReserveRefused, MustReserve(t, s, Charge(k2.ID, "b", 1)).Outcome, "40.00 carried over a 30.00 cap")
	require.NoError(t, s.CheckInvariant(ctx), "the carry above the new cap is booked as allowance")
}
