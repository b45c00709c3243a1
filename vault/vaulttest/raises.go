package vaulttest

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

func keyScope(id string) vault.RaiseScope { return vault.RaiseScope{Kind: policy.ScopeKey, ID: id} }

// windowCap is the cap of a key's window of kind at the store clock, as usage
// reports it.
func windowCap(tb testing.TB, s vault.Store, keyID string, kind policy.WindowKind) (int64, policy.Counter) {
	tb.Helper()
	_, windows, usage, err := s.KeyUsage(context.Background(), keyID)
	require.NoError(tb, err)
	for _, w := range windows {
		if w.Kind == kind {
			return w.Cap, usage[w.ID]
		}
	}
	tb.Fatalf("no %s window", kind)
	return 0, policy.Counter{}
}

// testARaiseThatEnds: a raise adds to the cap at once; at its until the cap is
// back by itself (the store clock decides, nothing runs); the money committed
// and held under it stays counted, remaining is never negative, and the
// invariant holds throughout.
func testARaiseThatEnds(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t) // daily 100.00, period 150.00
	id := f.key.ID
	MustCommit(t, f.s, id, "fill", 10000)
	require.Equal(t, vault.ReserveRefused, MustReserve(t, f.s, Charge(id, "over", 100)).Outcome, "the daily cap is full")

	until := T0.Add(time.Hour)
	r, err := f.s.AddRaise(ctx, "ops@example.com", keyScope(id), vault.NewRaise{Window: policy.WindowDaily, Amount: 5000, Until: until, Reason: "end of quarter"})
	require.NoError(t, err)
	assert.Equal(t, vault.Raise{ID: r.ID, Scope: keyScope(id), Window: policy.WindowDaily, Amount: 5000, Currency: "usd",
		Until: until, Reason: "end of quarter", CreatedBy: "ops@example.com", CreatedAt: T0}, r)
	capNow, _ := windowCap(t, f.s, id, policy.WindowDaily)
	assert.Equal(t, int64(15000), capNow, "the effective cap is base plus the raise")

	// Spend under the raise: 30.00 committed, 20.00 still held.
	MustCommit(t, f.s, id, "under-1", 3000)
	require.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, Charge(id, "under-2", 2000)).Outcome)
	res := MustReserve(t, f.s, Charge(id, "under-3", 1))
	require.Equal(t, vault.ReserveRefused, res.Outcome, "the raised cap is a cap too")
	assert.Equal(t, int64(15000), res.Decision.Limit)
	assert.Zero(t, res.Decision.Remaining)

	// One nanosecond before the end the raise still counts; at the end it does not.
	f.clock.Set(until.Add(-time.Nanosecond))
	capNow, _ = windowCap(t, f.s, id, policy.WindowDaily)
	assert.Equal(t, int64(15000), capNow)
	f.clock.Set(until)
	capNow, used := windowCap(t, f.s, id, policy.WindowDaily)
	assert.Equal(t, int64(10000), capNow, "the cap is back by itself at until")
	assert.Equal(t, policy.Counter{Committed: 13000, Held: 2000}, used, "money spent and held under the raise stays counted")
	assert.Zero(t, policy.Remaining(policy.Window{HasCap: true, Cap: capNow}, used))
	res = MustReserve(t, f.s, Charge(id, "after", 1))
	require.Equal(t, vault.ReserveRefused, res.Outcome)
	assert.Equal(t, int64(10000), res.Decision.Limit)
	assert.Zero(t, res.Decision.Remaining, "remaining is never negative")
	require.NoError(t, f.s.CheckInvariant(ctx), "usage above the base cap was within the raised cap when it was held")

	// The hold placed under the raise settles after it ended, in full.
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "under-2", Outcome: vault.SettleCommit, Amount: 2000})
	_, used = windowCap(t, f.s, id, policy.WindowDaily)
	assert.Equal(t, policy.Counter{Committed: 15000}, used)
	require.NoError(t, f.s.CheckInvariant(ctx))

	raises, err := f.s.ListRaises(ctx, keyScope(id))
	require.NoError(t, err)
	require.Len(t, raises, 1, "an ended raise is still listed")
	assert.False(t, raises[0].Active(f.s.Now()))
	key, err := f.s.GetKey(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, raises, key.Raises)
}

// testRaisePerRequestAndPeriod: raises of the per-request and period caps
// count for those windows only.
func testRaisePerRequestAndPeriod(t *testing.T) {
	ctx := context.Background()
	clock := NewClock(T0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := MustMint(t, s, "k", Policy(t, "1000.00", "100.00", "10.00"), nil)
	require.Equal(t, vault.ReserveRefused, MustReserve(t, s, Charge(k.ID, "big", 1500)).Outcome)
	_, err := s.AddRaise(ctx, "op", keyScope(k.ID), vault.NewRaise{Window: policy.WindowPerRequest, Amount: 1000, Until: T0.Add(24 * time.Hour)})
	require.NoError(t, err)
	MustCommit(t, s, k.ID, "big", 1500)
	key, err := s.GetKey(ctx, k.ID)
	require.NoError(t, err)
	c, ok := key.PerRequestCap(s.Now())
	assert.True(t, ok)
	assert.Equal(t, int64(2000), c)

	MustCommit(t, s, k.ID, "p1", 2000)
	MustCommit(t, s, k.ID, "p2", 2000)
	MustCommit(t, s, k.ID, "p3", 2000)
	MustCommit(t, s, k.ID, "p4", 2000)
	require.Equal(t, vault.ReserveRefused, MustReserve(t, s, Charge(k.ID, "p5", 600)).Outcome, "9500 of the period's 10000 used")
	_, err = s.AddRaise(ctx, "op", keyScope(k.ID), vault.NewRaise{Window: policy.WindowPeriod, Amount: 500, Until: T0.Add(48 * time.Hour)})
	require.NoError(t, err)
	MustCommit(t, s, k.ID, "p5", 600)
	capNow, _ := windowCap(t, s, k.ID, policy.WindowPeriod)
	assert.Equal(t, int64(10500), capNow)
	capNow, _ = windowCap(t, s, k.ID, policy.WindowDaily)
	assert.Equal(t, int64(100000), capNow, "the daily cap is not raised")

	clock.Set(T0.Add(48 * time.Hour))
	capNow, used := windowCap(t, s, k.ID, policy.WindowPeriod)
	assert.Equal(t, int64(10000), capNow)
	assert.Equal(t, int64(10100), used.Committed)
	require.NoError(t, s.CheckInvariant(ctx))
}

// testRaiseArguments: what a raise may not be, and raises of a revoked key or
// of a scope the store does not have.
func testRaiseArguments(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t) // no per-request cap
	scope := keyScope(f.key.ID)
	later := T0.Add(time.Hour)
	for name, nr := range map[string]vault.NewRaise{
		"unknown window":      {Window: "weekly", Amount: 1, Until: later},
		"zero amount":         {Window: policy.WindowDaily, Amount: 0, Until: later},
		"negative amount":     {Window: policy.WindowDaily, Amount: -1, Until: later},
		"until now":           {Window: policy.WindowDaily, Amount: 1, Until: T0},
		"until in the past":   {Window: policy.WindowDaily, Amount: 1, Until: T0.Add(-time.Hour)},
		"over 31 days":        {Window: policy.WindowDaily, Amount: 1, Until: T0.Add(policy.MaxRaiseSpan + time.Second)},
		"no cap to raise":     {Window: policy.WindowPerRequest, Amount: 1, Until: later},
		"reason over 500":     {Window: policy.WindowDaily, Amount: 1, Until: later, Reason: string(make([]byte, 501))},
		"request: over 31 d.": {Window: policy.WindowPeriod, Amount: 1, Until: T0.Add(40 * 24 * time.Hour)},
	} {
		_, err := f.s.AddRaise(ctx, "op", scope, nr)
		assert.ErrorIs(t, err, vault.ErrInvalid, name)
		_, err = f.s.RequestRaise(ctx, f.key.ID, nr)
		assert.ErrorIs(t, err, vault.ErrInvalid, name)
	}
	_, err := f.s.AddRaise(ctx, "op", scope, vault.NewRaise{Window: policy.WindowDaily, Amount: 1, Until: T0.Add(policy.MaxRaiseSpan)})
	assert.NoError(t, err, "exactly 31 days ahead is allowed")
	_, err = f.s.AddRaise(ctx, "op", keyScope("key_nope"), vault.NewRaise{Window: policy.WindowDaily, Amount: 1, Until: later})
	assert.ErrorIs(t, err, vault.ErrNotFound)
	_, err = f.s.ListRaises(ctx, vault.RaiseScope{Kind: "team", ID: "x"})
	assert.ErrorIs(t, err, vault.ErrNotFound)
	_, err = f.s.RevokeKey(ctx, "op", f.key.ID)
	require.NoError(t, err)
	_, err = f.s.AddRaise(ctx, "op", scope, vault.NewRaise{Window: policy.WindowDaily, Amount: 1, Until: later})
	assert.ErrorIs(t, err, vault.ErrConflict, "a revoked key gets no raise")
	_, err = f.s.RequestRaise(ctx, f.key.ID, vault.NewRaise{Window: policy.WindowDaily, Amount: 1, Until: later})
	assert.ErrorIs(t, err, vault.ErrKeyRevoked)
}

// testEndRaiseEarly: ending a raise puts the cap back at once, is audited, and
// cannot be done twice.
func testEndRaiseEarly(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	scope := keyScope(f.key.ID)
	r, err := f.s.AddRaise(ctx, "alice", scope, vault.NewRaise{Window: policy.WindowDaily, Amount: 5000, Until: T0.Add(24 * time.Hour)})
	require.NoError(t, err)
	MustCommit(t, f.s, f.key.ID, "a", 12000)
	f.clock.Advance(time.Minute)
	ended, err := f.s.EndRaise(ctx, "bob", scope, r.ID)
	require.NoError(t, err)
	assert.Equal(t, T0.Add(time.Minute), ended.EndedAt)
	assert.Equal(t, "bob", ended.EndedBy)
	assert.False(t, ended.Active(f.s.Now()))
	capNow, _ := windowCap(t, f.s, f.key.ID, policy.WindowDaily)
	assert.Equal(t, int64(10000), capNow)
	assert.Equal(t, vault.ReserveRefused, MustReserve(t, f.s, Charge(f.key.ID, "b", 1)).Outcome)
	_, err = f.s.EndRaise(ctx, "bob", scope, r.ID)
	assert.ErrorIs(t, err, vault.ErrConflict)
	_, err = f.s.EndRaise(ctx, "bob", scope, "raise_nope")
	assert.ErrorIs(t, err, vault.ErrNotFound)
	require.NoError(t, f.s.CheckInvariant(ctx))

	audit, _, err := f.s.ListAudit(ctx, 0, "")
	require.NoError(t, err)
	var actions []string
	for _, a := range audit {
		actions = append(actions, a.Actor+" "+a.Action)
	}
	assert.Subset(t, actions, []string{"alice key.raise", "bob key.raise_end"})
}

// testRaiseRequests: a key asks, at most MaxPendingRaiseRequests at once; an
// admin approves (the raise is created, the request names it) or declines;
// a decided request cannot be decided again; every step is audited.
func testRaiseRequests(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	ask := vault.NewRaise{Window: policy.WindowDaily, Amount: 2500, Until: T0.Add(2 * time.Hour), Reason: "batch run"}
	var reqs []vault.RaiseRequest
	for range vault.MaxPendingRaiseRequests {
		rr, err := f.s.RequestRaise(ctx, id, ask)
		require.NoError(t, err)
		assert.Equal(t, vault.RaiseRequestPending, rr.State)
		assert.Regexp(t, `^rr_[0-9a-v]{26}$`, rr.ID)
		reqs = append(reqs, rr)
	}
	_, err := f.s.RequestRaise(ctx, id, ask)
	assert.ErrorIs(t, err, vault.ErrConflict, "at most five pending")

	approved, err := f.s.DecideRaiseRequest(ctx, "alice", reqs[0].ID, true, "ok for today")
	require.NoError(t, err)
	assert.Equal(t, vault.RaiseRequestApproved, approved.State)
	assert.Equal(t, "alice", approved.DecidedBy)
	assert.Equal(t, "ok for today", approved.Note)
	require.NotEmpty(t, approved.RaiseID)
	capNow, _ := windowCap(t, f.s, id, policy.WindowDaily)
	assert.Equal(t, int64(12500), capNow, "approval creates the raise")
	raises, err := f.s.ListRaises(ctx, keyScope(id))
	require.NoError(t, err)
	require.Len(t, raises, 1)
	assert.Equal(t, approved.RaiseID, raises[0].ID)
	assert.Equal(t, reqs[0].ID, raises[0].RequestID)
	assert.Equal(t, "alice", raises[0].CreatedBy)
	assert.Equal(t, "batch run", raises[0].Reason)

	declined, err := f.s.DecideRaiseRequest(ctx, "bob", reqs[1].ID, false, "")
	require.NoError(t, err)
	assert.Equal(t, vault.RaiseRequestDeclined, declined.State)
	_, err = f.s.DecideRaiseRequest(ctx, "bob", reqs[0].ID, false, "")
	assert.ErrorIs(t, err, vault.ErrConflict, "decided already")
	_, err = f.s.DecideRaiseRequest(ctx, "bob", "rr_nope", true, "")
	assert.ErrorIs(t, err, vault.ErrNotFound)

	// Two decided: two more may be asked for.
	for range 2 {
		_, err = f.s.RequestRaise(ctx, id, ask)
		require.NoError(t, err)
	}
	_, err = f.s.RequestRaise(ctx, id, ask)
	assert.ErrorIs(t, err, vault.ErrConflict)

	pending, next, err := f.s.ListRaiseRequests(ctx, vault.RaiseRequestPending, 2, "")
	require.NoError(t, err)
	require.Len(t, pending, 2)
	assert.NotEmpty(t, next)
	rest, next, err := f.s.ListRaiseRequests(ctx, vault.RaiseRequestPending, 10, next)
	require.NoError(t, err)
	assert.Len(t, rest, 3)
	assert.Empty(t, next)
	assert.Greater(t, pending[0].ID, pending[1].ID, "newest first")
	all, _, err := f.s.ListRaiseRequests(ctx, "", 0, "")
	require.NoError(t, err)
	assert.Len(t, all, 7)
	_, _, err = f.s.ListRaiseRequests(ctx, "sideways", 0, "")
	assert.ErrorIs(t, err, vault.ErrInvalid)
	got, err := f.s.GetRaiseRequest(ctx, reqs[1].ID)
	require.NoError(t, err)
	assert.Equal(t, declined, got)

	// A request whose until has passed cannot be approved; it can be declined.
	f.clock.Set(T0.Add(3 * time.Hour))
	_, err = f.s.DecideRaiseRequest(ctx, "alice", reqs[2].ID, true, "")
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = f.s.DecideRaiseRequest(ctx, "alice", reqs[2].ID, false, "too late")
	assert.NoError(t, err)

	audit, _, err := f.s.ListAudit(ctx, 0, "")
	require.NoError(t, err)
	count := map[string]int{}
	for _, a := range audit {
		count[a.Action]++
	}
	assert.Equal(t, 7, count["raise_request.create"])
	assert.Equal(t, 1, count["raise_request.approve"])
	assert.Equal(t, 2, count["raise_request.decline"])
}

// testRaiseRequestDecidedOnce: many admins deciding one request at once (on
// PostgreSQL through separate connections): exactly one decides, every other
// gets ErrConflict, and at most one raise is created.
func testRaiseRequestDecidedOnce(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	rr, err := f.s.RequestRaise(ctx, f.key.ID, vault.NewRaise{Window: policy.WindowDaily, Amount: 100, Until: T0.Add(time.Hour)})
	require.NoError(t, err)
	const n = 8
	var (
		wg              sync.WaitGroup
		mu              sync.Mutex
		wins, conflicts int
	)
	for i := range n {
		wg.Go(func() {
			_, err := f.s.DecideRaiseRequest(ctx, "admin", rr.ID, i%2 == 0, "")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, vault.ErrConflict):
				conflicts++
			default:
				t.Errorf("decide: %v", err)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 1, wins)
	assert.Equal(t, n-1, conflicts)
	got, err := f.s.GetRaiseRequest(ctx, rr.ID)
	require.NoError(t, err)
	raises, err := f.s.ListRaises(ctx, keyScope(f.key.ID))
	require.NoError(t, err)
	if got.State == vault.RaiseRequestApproved {
		assert.Len(t, raises, 1)
	} else {
		assert.Empty(t, raises)
	}
}

// testRaisesAndHoldsConcurrently: holds placed while a raise is added and
// ended never pass the cap in force when each was placed, and the invariant
// holds after.
func testRaisesAndHoldsConcurrently(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t) // daily 100.00
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			_, err := f.s.Reserve(ctx, Charge(f.key.ID, Idem(i), 500))
			assert.NoError(t, err)
		})
	}
	wg.Go(func() {
		r, err := f.s.AddRaise(ctx, "op", keyScope(f.key.ID), vault.NewRaise{Window: policy.WindowDaily, Amount: 5000, Until: T0.Add(time.Hour)})
		if assert.NoError(t, err) {
			_, err = f.s.EndRaise(ctx, "op", keyScope(f.key.ID), r.ID)
			assert.NoError(t, err)
		}
	})
	wg.Wait()
	capNow, used := windowCap(t, f.s, f.key.ID, policy.WindowDaily)
	assert.Equal(t, int64(10000), capNow)
	assert.LessOrEqual(t, used.Held, int64(15000))
	assert.GreaterOrEqual(t, used.Held, int64(10000), "the base cap filled at least")
	require.NoError(t, f.s.CheckInvariant(ctx))
}

// testABudgetRaiseThatEnds: a raise of a budget's cap lets every key under it
// draw more until it ends; then the budget's cap is back by itself, what was
// spent under it stays counted and the refusal names the budget.
func testABudgetRaiseThatEnds(t *testing.T) {
	ctx := context.Background()
	clock := NewClock(T0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	b, err := s.CreateBudget(ctx, "op", vault.BudgetSpec{Name: "team", Currency: "usd", DailyCap: MustDec(t, "20.00"),
		PeriodStart: time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)})
	require.NoError(t, err)
	p := Policy(t, "100.00", "", "")
	p.Budget = b.ID
	k1, _ := MustMint(t, s, "k1", p, nil)
	k2, _ := MustMint(t, s, "k2", p, nil)
	MustCommit(t, s, k1.ID, "a", 2000)
	res := MustReserve(t, s, Charge(k2.ID, "b", 500))
	require.Equal(t, vault.ReserveRefused, res.Outcome)
	assert.Equal(t, policy.ScopeBudget, res.Decision.Scope.Kind)

	scope := vault.RaiseScope{Kind: policy.ScopeBudget, ID: b.ID}
	_, err = s.AddRaise(ctx, "op", scope, vault.NewRaise{Window: policy.WindowPerRequest, Amount: 100, Until: T0.Add(time.Hour)})
	assert.ErrorIs(t, err, vault.ErrInvalid, "a budget has no per-request cap")
	r, err := s.AddRaise(ctx, "op", scope, vault.NewRaise{Window: policy.WindowDaily, Amount: 1000, Until: T0.Add(time.Hour), Reason: "launch"})
	require.NoError(t, err)
	assert.Equal(t, scope, r.Scope)
	MustCommit(t, s, k2.ID, "b", 500)
	MustCommit(t, s, k1.ID, "c", 500)
	require.Equal(t, vault.ReserveRefused, MustReserve(t, s, Charge(k2.ID, "d", 1)).Outcome, "the raised budget is full")

	chain, err := s.BudgetChain(ctx, b.ID)
	require.NoError(t, err)
	require.Len(t, chain, 1)
	assert.Equal(t, int64(3000), chain[0].Windows[0].Cap)
	assert.Equal(t, []vault.Raise{r}, chain[0].Budget.Raises)

	clock.Set(T0.Add(time.Hour))
	chain, err = s.BudgetChain(ctx, b.ID)
	require.NoError(t, err)
	assert.Equal(t, int64(2000), chain[0].Windows[0].Cap, "the budget's cap is back by itself")
	assert.Equal(t, policy.Counter{Committed: 3000}, chain[0].Usage[chain[0].Windows[0].ID], "what was spent under the raise stays counted")
	res = MustReserve(t, s, Charge(k1.ID, "e", 1))
	require.Equal(t, vault.ReserveRefused, res.Outcome)
	assert.Equal(t, b.ID, res.Decision.Scope.ID)
	assert.Zero(t, res.Decision.Remaining, "remaining is never negative")
	require.NoError(t, s.CheckInvariant(ctx))

	_, err = s.EndRaise(ctx, "op", scope, r.ID)
	assert.ErrorIs(t, err, vault.ErrConflict, "it has ended already")
	_, err = s.ListRaises(ctx, vault.RaiseScope{Kind: policy.ScopeBudget, ID: "bud_nope"})
	assert.ErrorIs(t, err, vault.ErrNotFound)
}

// testRaiseRequestEventsInTheirTransactions: asking for a raise and deciding
// on it each write their event into the outbox in the same transaction, one
// event per change, with the request's amount and the decision.
func testRaiseRequestEventsInTheirTransactions(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	MustWebhook(t, f.s, []string{vault.EventRaiseRequestCreated, vault.EventRaiseRequestDecided}, nil)
	ask := vault.NewRaise{Window: policy.WindowDaily, Amount: 2500, Until: T0.Add(2 * time.Hour), Reason: "batch run"}
	a, err := f.s.RequestRaise(ctx, f.key.ID, ask)
	require.NoError(t, err)
	b, err := f.s.RequestRaise(ctx, f.key.ID, ask)
	require.NoError(t, err)
	_, err = f.s.DecideRaiseRequest(ctx, "alice", a.ID, true, "ok for today")
	require.NoError(t, err)
	_, err = f.s.DecideRaiseRequest(ctx, "bob", b.ID, false, "no")
	require.NoError(t, err)
	_, err = f.s.DecideRaiseRequest(ctx, "bob", a.ID, false, "")
	require.ErrorIs(t, err, vault.ErrConflict, "a refused decision emits nothing")

	type ev struct{ typ, id, state, by, amount, scope string }
	var got []ev
	for _, j := range claimAll(t, f.s) {
		var body struct {
			Type string `json:"type"`
			Data struct {
				ID        string       `json:"raise_request_id"`
				Scope     policy.Scope `json:"scope"`
				Amount    string       `json:"amount"`
				State     string       `json:"state"`
				DecidedBy string       `json:"decided_by"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal(j.Body, &body))
		got = append(got, ev{body.Type, body.Data.ID, body.Data.State, body.Data.DecidedBy, body.Data.Amount, body.Data.Scope.ID})
	}
	id := f.key.ID
	assert.ElementsMatch(t, []ev{
		{vault.EventRaiseRequestCreated, a.ID, "", "", "25.00", id},
		{vault.EventRaiseRequestCreated, b.ID, "", "", "25.00", id},
		{vault.EventRaiseRequestDecided, a.ID, "approved", "alice", "25.00", id},
		{vault.EventRaiseRequestDecided, b.ID, "declined", "bob", "25.00", id},
	}, got)
}
