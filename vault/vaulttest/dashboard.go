package vaulttest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// commitCharge reserves and commits a usd charge of amount cents on keyID.
func commitCharge(tb testing.TB, s *Store, keyID, idemKey string, amount int64) {
	tb.Helper()
	res := MustReserve(tb, s, Charge(keyID, idemKey, amount))
	require.Equal(tb, vault.ReserveClaimed, res.Outcome, "decision: %+v", res.Decision)
	MustSettle(tb, s, vault.SettleRequest{KeyID: keyID, IdempotencyKey: idemKey, Outcome: vault.SettleCommit, Amount: amount})
}

func testKeysUsageReadsEachKeyInOrder(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	other, _ := MustMint(t, f.s, "other", Policy(t, "10.00", "", ""), nil)
	commitCharge(t, f.s, f.key.ID, "a", 2500)
	MustReserve(t, f.s, Charge(other.ID, "b", 300)) // still held

	got, err := f.s.KeysUsage(ctx, []string{other.ID, f.key.ID})
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, other.ID, got[0].Key.ID)
	assert.Equal(t, f.key.ID, got[1].Key.ID)
	for i, want := range []policy.Counter{{Held: 300}, {Committed: 2500}} {
		require.Len(t, got[i].Windows, 2)
		for _, w := range got[i].Windows {
			assert.Equal(t, want, got[i].Usage[w.ID], "key %d window %s", i, w.ID)
		}
	}
	assert.Equal(t, int64(1000), got[0].Windows[0].Cap)
	assert.False(t, got[0].Windows[1].HasCap, "no period cap")

	_, err = f.s.KeysUsage(ctx, []string{f.key.ID, "key_nope"})
	assert.ErrorIs(t, err, vault.ErrNotFound)
	assert.ErrorContains(t, err, "key_nope")
	_, err = f.s.KeysUsage(ctx, nil)
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = f.s.KeysUsage(ctx, make([]string, vault.MaxKeysUsage+1))
	assert.ErrorIs(t, err, vault.ErrInvalid)
}

func testDailySpendSumsTheLedgerPerDay(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t) // period 2026-09-01 .. 2026-10-01 UTC, daily cap 100.00
	id := f.key.ID
	at := func(day, hour, minute int) time.Time { return time.Date(2026, 9, day, hour, minute, 0, 0, time.UTC) }

	f.clock.Set(at(2, 9, 0))
	commitCharge(t, f.s, id, "d2", 1000)
	f.clock.Set(at(12, 10, 0))
	commitCharge(t, f.s, id, "d12-a", 2000)
	commitCharge(t, f.s, id, "d12-b", 500)
	res := MustReserve(t, f.s, Charge(id, "d12-refused", 99000))
	require.Equal(t, vault.ReserveRefused, res.Outcome, "a refusal moves nothing")
	// Placed before midnight, settled after: it counts on the day it was placed.
	f.clock.Set(at(13, 23, 59))
	MustReserve(t, f.s, Charge(id, "late", 700))
	f.clock.Set(at(14, 0, 1))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "late", Outcome: vault.SettleCommit, Amount: 700})
	f.clock.Set(at(14, 12, 0))
	MustReserve(t, f.s, Charge(id, "in-flight", 300))
	MustReserve(t, f.s, Charge(id, "released", 400))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "released", Outcome: vault.SettleRelease})

	rep, err := f.s.DailySpend(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, id, rep.Key.ID)
	assert.False(t, rep.Truncated)
	require.Len(t, rep.Days, 14, "2026-09-01 to today, 2026-09-14")
	byDate := map[string]vault.DaySpend{}
	for i, d := range rep.Days {
		assert.Equal(t, fmt.Sprintf("2026-09-%02d", i+1), d.Date)
		assert.Equal(t, at(i+1, 0, 0), d.Start.UTC())
		assert.Equal(t, at(i+2, 0, 0), d.End.UTC())
		byDate[d.Date] = d
	}
	assert.Equal(t, vault.DaySpend{Date: "2026-09-02", Start: at(2, 0, 0), End: at(3, 0, 0), Committed: 1000}, utcDay(byDate["2026-09-02"]))
	assert.Equal(t, int64(2500), byDate["2026-09-12"].Committed)
	assert.Equal(t, int64(700), byDate["2026-09-13"].Committed)
	assert.Equal(t, int64(0), byDate["2026-09-14"].Committed)
	assert.Equal(t, int64(300), byDate["2026-09-14"].Held)
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 0, Held: 300}, daily, "today's sums equal today's counter")

	// The reaper drops old daily counters; the ledger keeps the history.
	f.clock.Set(at(20, 12, 0))
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	rep, err = f.s.DailySpend(ctx, id)
	require.NoError(t, err)
	require.Len(t, rep.Days, 20)
	assert.Equal(t, int64(2500), rep.Days[11].Committed, "2026-09-12 after its counter was reaped")

	// After expiry the days stop at the period's last day.
	f.clock.Set(time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC))
	rep, err = f.s.DailySpend(ctx, id)
	require.NoError(t, err)
	require.Len(t, rep.Days, 30)
	assert.Equal(t, "2026-09-30", rep.Days[29].Date)

	// A walk cut short says so; one that read every event does not.
	f.clock.Set(at(14, 12, 0))
	all, _, err := f.s.ListEvents(ctx, id, 500, "")
	require.NoError(t, err)
	defer func(n int) { engine.SpendScanLimit = n }(engine.SpendScanLimit)
	engine.SpendScanLimit = len(all)
	rep, err = f.s.DailySpend(ctx, id)
	require.NoError(t, err)
	assert.False(t, rep.Truncated)
	assert.Equal(t, int64(2500), rep.Days[11].Committed)
	engine.SpendScanLimit = len(all) - 1
	rep, err = f.s.DailySpend(ctx, id)
	require.NoError(t, err)
	assert.True(t, rep.Truncated)

	_, err = f.s.DailySpend(ctx, "key_nope")
	assert.ErrorIs(t, err, vault.ErrNotFound)
}

func utcDay(d vault.DaySpend) vault.DaySpend {
	d.Start, d.End = d.Start.UTC(), d.End.UTC()
	return d
}

func testDailySpendDaysFollowTheKeysTimeZone(t *testing.T) {
	ctx := context.Background()
	clock := NewClock(time.Date(2026, 11, 2, 15, 0, 0, 0, time.UTC))
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	p := Policy(t, "100.00", "", "")
	p.Timezone = "America/New_York"
	p.PeriodStart = time.Date(2026, 10, 31, 12, 0, 0, 0, time.UTC) // 08:00 in New York
	p.ExpiresAt = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	k, _ := MustMint(t, s, "ny", p, nil)

	// 2026-11-02 03:00 UTC is still 2026-11-01 in New York (22:00 EST).
	clock.Set(time.Date(2026, 11, 2, 3, 0, 0, 0, time.UTC))
	commitCharge(t, s, k.ID, "late-evening", 1200)
	clock.Set(time.Date(2026, 11, 2, 15, 0, 0, 0, time.UTC))

	rep, err := s.DailySpend(ctx, k.ID)
	require.NoError(t, err)
	require.Len(t, rep.Days, 3)
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	assert.Equal(t, []string{"2026-10-31", "2026-11-01", "2026-11-02"},
		[]string{rep.Days[0].Date, rep.Days[1].Date, rep.Days[2].Date})
	assert.Equal(t, time.Date(2026, 10, 31, 0, 0, 0, 0, ny), rep.Days[0].Start, "the first day is the whole day period_start falls on")
	assert.Equal(t, 25*time.Hour, rep.Days[1].End.Sub(rep.Days[1].Start), "2026-11-01 ends daylight saving time in New York")
	assert.Equal(t, int64(1200), rep.Days[1].Committed)
	assert.Zero(t, rep.Days[2].Committed)

	// Before the period starts there is no day to show.
	clock.Set(time.Date(2026, 10, 30, 0, 0, 0, 0, time.UTC))
	rep, err = s.DailySpend(ctx, k.ID)
	require.NoError(t, err)
	assert.Empty(t, rep.Days)
}

func testOverviewSummarizesKeysSpendRefusalsAndUnknownHolds(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t) // "k": usd, daily 100.00, period 150.00
	s, id := f.s, f.key.ID

	near, _ := MustMint(t, s, "near", Policy(t, "10.00", "", ""), nil)
	full, _ := MustMint(t, s, "full", Policy(t, "", "20.00", ""), nil)
	revoked, _ := MustMint(t, s, "revoked", Policy(t, "10.00", "", ""), nil)
	pe := Policy(t, "50.00", "", "")
	pe.Currency = "eur"
	eur, _ := MustMint(t, s, "eur", pe, nil)
	expired := Policy(t, "10.00", "", "")
	expired.ExpiresAt = T0.Add(10 * time.Minute)
	MustMint(t, s, "expiring", expired, nil)

	// An hour and a half ago: a refusal that falls out of the window.
	f.clock.Set(T0.Add(-90 * time.Minute))
	require.Equal(t, vault.ReserveRefused, MustReserve(t, s, Charge(near.ID, "too-early", 5000)).Outcome)
	f.clock.Set(T0)

	commitCharge(t, s, id, "k1", 4000)
	commitCharge(t, s, near.ID, "n1", 800) // 80 % of 10.00
	MustReserve(t, s, Charge(near.ID, "n2", 50))
	commitCharge(t, s, full.ID, "f1", 2000) // 100 % of the period cap
	commitCharge(t, s, revoked.ID, "r1", 900)
	_, err := s.RevokeKey(ctx, "tester", revoked.ID)
	require.NoError(t, err)
	eurCharge := Charge(eur.ID, "e1", 1234)
	eurCharge.Request.Currency = "eur"
	require.Equal(t, vault.ReserveClaimed, MustReserve(t, s, eurCharge).Outcome)
	MustSettle(t, s, vault.SettleRequest{KeyID: eur.ID, IdempotencyKey: "e1", Outcome: vault.SettleCommit, Amount: 1234})
	for i := range 3 {
		res := MustReserve(t, s, Charge(near.ID, Idem(100+i), 500))
		require.Equal(t, vault.ReserveRefused, res.Outcome)
		assert.Equal(t, policy.ReasonCapExceeded, res.Decision.Reason)
	}
	res := MustReserve(t, s, vault.ReserveRequest{KeyID: id, IdempotencyKey: "gbp", Fingerprint: "x", Metered: true,
		Request: policy.Request{Operation: "charges.create", Amount: 100, Currency: "gbp"}})
	require.Equal(t, vault.ReserveRefused, res.Outcome)
	for i := range 3 {
		f.clock.Advance(time.Second)
		MustReserve(t, s, Charge(id, Idem(i), 100))
		MustSettle(t, s, vault.SettleRequest{KeyID: id, IdempotencyKey: Idem(i), Outcome: vault.SettleUnknown})
	}
	f.clock.Set(T0.Add(30 * time.Minute))

	for _, chunk := range []int{1, 2, holdCountChunk} {
		engine.SetCountChunk(s.e, chunk)
		ov, err := s.Overview(ctx, vault.OverviewOptions{OldestUnknown: 2})
		require.NoError(t, err)
		assert.Equal(t, T0.Add(30*time.Minute), ov.Time)
		assert.Equal(t, vault.KeyCounts{Active: 4, Revoked: 1, Expired: 1}, ov.Keys)

		require.Len(t, ov.Spend, 2)
		assert.Equal(t, vault.CurrencySpend{Currency: "eur", Keys: 1, TodayCommitted: 1234, PeriodCommitted: 1234}, ov.Spend[0])
		assert.Equal(t, vault.CurrencySpend{
			Currency: "usd", Keys: 4, // k, near, full and the revoked key; the expired key's period is over
			TodayCommitted: 4000 + 800 + 2000 + 900, TodayHeld: 50 + 300,
			PeriodCommitted: 4000 + 800 + 2000 + 900, PeriodHeld: 50 + 300,
		}, ov.Spend[1])

		require.Len(t, ov.NearCap, 2, "%+v", ov.NearCap)
		assert.Equal(t, 2, ov.NearCapTotal)
		assert.Equal(t, full.ID, ov.NearCap[0].Key.ID)
		assert.Equal(t, policy.WindowPeriod, ov.NearCap[0].Window.Kind)
		assert.Equal(t, 100, ov.NearCap[0].Percent)
		assert.Equal(t, near.ID, ov.NearCap[1].Key.ID)
		assert.Equal(t, policy.WindowDaily, ov.NearCap[1].Window.Kind)
		assert.Equal(t, 85, ov.NearCap[1].Percent, "8.00 committed and 0.50 held of 10.00")
		assert.Equal(t, policy.Counter{Committed: 800, Held: 50}, ov.NearCap[1].Counter)

		assert.Equal(t, T0.Add(-30*time.Minute), ov.RefusalsSince)
		assert.Equal(t, []vault.RefusalCount{
			{Decision: "refused", Reason: string(policy.ReasonCapExceeded), Count: 3},
			{Decision: "refused", Reason: string(policy.ReasonCurrencyNotAllowed), Count: 1},
		}, ov.Refusals)
		assert.False(t, ov.RefusalsTruncated)

		assert.Equal(t, 3, ov.UnknownHolds)
		require.Len(t, ov.OldestUnknown, 2)
		assert.Equal(t, vault.HoldID(id, Idem(0)), ov.OldestUnknown[0].ID, "oldest first")
		assert.Equal(t, vault.HoldID(id, Idem(1)), ov.OldestUnknown[1].ID)
		assert.Equal(t, vault.HoldUnknown, ov.OldestUnknown[0].State)
	}

	ov, err := s.Overview(ctx, vault.OverviewOptions{NearCapLimit: 1, NearCapPercent: 100})
	require.NoError(t, err)
	require.Len(t, ov.NearCap, 1)
	assert.Equal(t, 1, ov.NearCapTotal, "only the full key is at 100 %")

	defer func(n int) { engine.RefusalScanLimit = n }(engine.RefusalScanLimit)
	engine.RefusalScanLimit = 2
	ov, err = s.Overview(ctx, vault.OverviewOptions{})
	require.NoError(t, err)
	assert.True(t, ov.RefusalsTruncated)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.Overview(cancelled, vault.OverviewOptions{})
	assert.ErrorIs(t, err, context.Canceled)
}

// A revoked key's refused requests are counted on the key, with the last one's
// address and path, and the overview lists the key while its last refusal is
// recent.
func testRecordKeyRefusalCountsARevokedKeysUse(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	quiet, _ := MustMint(t, f.s, "quiet", Policy(t, "10.00", "", ""), nil)
	_, err := f.s.RevokeKey(ctx, "alice", f.key.ID)
	require.NoError(t, err)
	audit, _, err := f.s.ListAudit(ctx, 100, "")
	require.NoError(t, err)

	f.clock.Advance(time.Minute)
	first := f.clock.Now()
	require.NoError(t, f.s.RecordKeyRefusal(ctx, f.key.ID, vault.KeyRefusal{Code: "vault_key_revoked", RemoteAddr: "10.0.4.6:5000", Path: "/v1/charges"}))
	f.clock.Advance(time.Minute)
	require.NoError(t, f.s.RecordKeyRefusal(ctx, f.key.ID, vault.KeyRefusal{Code: "vault_key_revoked", RemoteAddr: "10.0.4.7:5001", Path: "/v1/refunds"}))

	k, err := f.s.GetKey(ctx, f.key.ID)
	require.NoError(t, err)
	r := k.Refused
	assert.Equal(t, int64(2), r.Count)
	assert.Equal(t, "vault_key_revoked", r.Code)
	assert.True(t, r.First.Equal(first), "first %s", r.First)
	assert.True(t, r.Last.Equal(f.clock.Now()), "last %s", r.Last)
	assert.Equal(t, "10.0.4.7:5001", r.RemoteAddr)
	assert.Equal(t, "/v1/refunds", r.Path)
	again, _, err := f.s.ListAudit(ctx, 100, "")
	require.NoError(t, err)
	assert.Len(t, again, len(audit), "no audit entry")
	events, _, err := f.s.ListEvents(ctx, f.key.ID, 100, "")
	require.NoError(t, err)
	for _, e := range events {
		assert.NotEqual(t, vault.DecisionRefused, e.Decision, "no ledger event")
	}

	ov, err := f.s.Overview(ctx, vault.OverviewOptions{})
	require.NoError(t, err)
	require.Len(t, ov.RefusedKeys, 1)
	assert.Equal(t, f.key.ID, ov.RefusedKeys[0].ID)
	assert.Equal(t, int64(2), ov.RefusedKeys[0].Refused.Count)
	assert.Equal(t, 1, ov.RefusedKeysTotal)
	q, err := f.s.GetKey(ctx, quiet.ID)
	require.NoError(t, err)
	assert.Zero(t, q.Refused.Count)

	f.clock.Advance(25 * time.Hour)
	ov, err = f.s.Overview(ctx, vault.OverviewOptions{})
	require.NoError(t, err)
	assert.Empty(t, ov.RefusedKeys, "a day after its last refusal the key is no longer listed")

	assert.ErrorIs(t, f.s.RecordKeyRefusal(ctx, "key_nope", vault.KeyRefusal{Code: "vault_key_revoked"}), vault.ErrNotFound)
	assert.ErrorIs(t, f.s.RecordKeyRefusal(ctx, f.key.ID, vault.KeyRefusal{}), vault.ErrInvalid)
	assert.ErrorIs(t, f.s.RecordKeyRefusal(ctx, f.key.ID, vault.KeyRefusal{Code: "vault_key_revoked", Count: -1}), vault.ErrInvalid)

	// A burst the proxy aggregated is one write of its count.
	require.NoError(t, f.s.RecordKeyRefusal(ctx, f.key.ID, vault.KeyRefusal{Code: "vault_key_expired", Path: "/v1/balance", Count: 198}))
	k, err = f.s.GetKey(ctx, f.key.ID)
	require.NoError(t, err)
	assert.Equal(t, int64(200), k.Refused.Count)
	assert.Equal(t, "vault_key_expired", k.Refused.Code)
	assert.Equal(t, "/v1/balance", k.Refused.Path)
}

// Each event about a request names the caller's idempotency key, so that an
// operator can find the request in the ledger.
func testEventsCarryTheCallersIdempotencyKey(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	commitCharge(t, f.s, f.key.ID, "order-42", 2500)
	res := MustReserve(t, f.s, Charge(f.key.ID, "order-43", 99999))
	require.Equal(t, vault.ReserveRefused, res.Outcome)
	events, _, err := f.s.ListEvents(ctx, f.key.ID, 100, "")
	require.NoError(t, err)
	require.Len(t, events, 3)
	assert.Equal(t, "order-43", events[0].IdempotencyKey, "refused")
	assert.Equal(t, "order-42", events[1].IdempotencyKey, "settled")
	assert.Equal(t, "order-42", events[2].IdempotencyKey, "allowed")
}
