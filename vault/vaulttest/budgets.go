package vaulttest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// MustBudget creates a usd budget starting on 1 September 2026 with the given
// daily and period caps ("" for none) under parent ("" for a root).
func MustBudget(tb testing.TB, s vault.Store, name, parent, daily, period string, velocity ...policy.Velocity) vault.Budget {
	tb.Helper()
	spec := vault.BudgetSpec{Name: name, Parent: parent, Currency: "usd", Timezone: "UTC",
		PeriodStart: time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC), Velocity: velocity}
	if daily != "" {
		spec.DailyCap = MustDec(tb, daily)
	}
	if period != "" {
		spec.PeriodCap = MustDec(tb, period)
	}
	b, err := s.CreateBudget(context.Background(), "tester", spec)
	require.NoError(tb, err)
	return b
}

// underBudget is Policy with a budget and no cap of the key's own but a
// per-request one (a key needs a cap).
func underBudget(tb testing.TB, budget string) policy.Policy {
	p := Policy(tb, "", "", "1000.00")
	p.Budget = budget
	return p
}

// budgetUsage is the daily and period counters of a budget at the store clock.
func budgetUsage(tb testing.TB, s vault.Store, id string) (daily, period policy.Counter) {
	tb.Helper()
	chain, err := s.BudgetChain(context.Background(), id)
	require.NoError(tb, err)
	for _, w := range chain[0].Windows {
		switch w.Kind {
		case policy.WindowDaily:
			daily = chain[0].Usage[w.ID]
		case policy.WindowPeriod:
			period = chain[0].Usage[w.ID]
		}
	}
	return daily, period
}

// reserveAll runs reqs at once and returns their results in order.
func reserveAll(t *testing.T, s vault.Store, reqs []vault.ReserveRequest) []vault.ReserveResult {
	t.Helper()
	out := make([]vault.ReserveResult, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i], errs[i] = s.Reserve(context.Background(), reqs[i])
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "reserve %d", i)
	}
	return out
}

// testBudgetSharedByKeys: 100 concurrent 1.00 charges through four keys
// under one 20.00 budget place exactly 20 holds; every refusal names the
// budget; commits and releases move the budget's counters with the keys'.
func testBudgetSharedByKeys(t *testing.T) {
	s := mustOpen(t, NewClock(T0))
	MustUpstream(t, s, "sk_test_abcdef1234")
	b := MustBudget(t, s, "fleet", "", "20.00", "")
	var keys []vault.Key
	for i := range 4 {
		k, _ := MustMint(t, s, fmt.Sprintf("agent-%d", i), underBudget(t, b.ID), nil)
		keys = append(keys, k)
	}
	got, err := s.GetBudget(context.Background(), b.ID)
	require.NoError(t, err)
	assert.Equal(t, 4, got.Keys)

	var reqs []vault.ReserveRequest
	for i := range 100 {
		reqs = append(reqs, Charge(keys[i%4].ID, Idem(i), 100))
	}
	claimed := 0
	var won []vault.ReserveRequest
	for i, res := range reserveAll(t, s, reqs) {
		switch res.Outcome {
		case vault.ReserveClaimed:
			claimed++
			won = append(won, reqs[i])
			assert.Contains(t, res.Hold.WindowIDs, policy.WindowID(b.ID+"/day:2026-09-14"))
		case vault.ReserveRefused:
			assert.Equal(t, policy.ReasonCapExceeded, res.Decision.Reason)
			assert.Equal(t, policy.Scope{Kind: policy.ScopeBudget, ID: b.ID, Name: "fleet"}, res.Decision.Scope)
		default:
			t.Errorf("outcome %v", res.Outcome)
		}
	}
	assert.Equal(t, 20, claimed)
	daily, _ := budgetUsage(t, s, b.ID)
	assert.Equal(t, policy.Counter{Held: 2000}, daily)

	// Settle: the first charge commits, the second is released; the budget
	// follows its keys.
	require.Len(t, won, 20)
	MustSettle(t, s, vault.SettleRequest{KeyID: won[0].KeyID, IdempotencyKey: won[0].IdempotencyKey, Outcome: vault.SettleCommit, Amount: 100})
	MustSettle(t, s, vault.SettleRequest{KeyID: won[1].KeyID, IdempotencyKey: won[1].IdempotencyKey, Outcome: vault.SettleRelease})
	daily, _ = budgetUsage(t, s, b.ID)
	assert.Equal(t, policy.Counter{Committed: 100, Held: 1800}, daily)
	require.NoError(t, s.CheckInvariant(context.Background()))
}

// testBudgetTree: two teams of 10.00 under a 15.00 organisation take at
// most 15.00 in all and at most 10.00 each; a refusal names the closest scope
// that would be exceeded.
func testBudgetTree(t *testing.T) {
	s := mustOpen(t, NewClock(T0))
	MustUpstream(t, s, "sk_test_abcdef1234")
	org := MustBudget(t, s, "org", "", "", "15.00")
	teams := []vault.Budget{MustBudget(t, s, "team-a", org.ID, "", "10.00"), MustBudget(t, s, "team-b", org.ID, "", "10.00")}
	var keys []vault.Key
	for i := range 4 {
		k, _ := MustMint(t, s, fmt.Sprintf("k%d", i), underBudget(t, teams[i%2].ID), nil)
		keys = append(keys, k)
	}
	var reqs []vault.ReserveRequest
	for i := range 60 {
		reqs = append(reqs, Charge(keys[i%4].ID, Idem(i), 100))
	}
	perTeam := map[string]int{}
	total := 0
	for i, res := range reserveAll(t, s, reqs) {
		if res.Outcome == vault.ReserveClaimed {
			total++
			perTeam[teams[i%2].ID]++
			continue
		}
		require.Equal(t, vault.ReserveRefused, res.Outcome)
		assert.Contains(t, []string{org.ID, teams[0].ID, teams[1].ID}, res.Decision.Scope.ID)
	}
	assert.Equal(t, 15, total)
	for _, tm := range teams {
		assert.LessOrEqual(t, perTeam[tm.ID], 10)
		_, period := budgetUsage(t, s, tm.ID)
		assert.Equal(t, int64(perTeam[tm.ID])*100, period.Held)
	}
	_, period := budgetUsage(t, s, org.ID)
	assert.Equal(t, policy.Counter{Held: 1500}, period)

	// A team that is full is named before its organisation.
	full := teams[0]
	if perTeam[teams[1].ID] == 10 {
		full = teams[1]
	}
	if perTeam[full.ID] == 10 {
		k := keys[0]
		if full.ID == teams[1].ID {
			k = keys[1]
		}
		res := MustReserve(t, s, Charge(k.ID, "more", 100))
		assert.Equal(t, full.ID, res.Decision.Scope.ID)
	}
}

// testVelocityLimit: a limit of 20 holds a minute lets exactly 20 of 60
// concurrent money requests through; refusals, replays and requests that
// move no money do not count; a slot frees when the oldest hold leaves the
// interval.
func testVelocityLimit(t *testing.T) {
	clock := NewClock(T0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	p := Policy(t, "1000.00", "", "")
	p.Velocity = []policy.Velocity{{Count: 20, Per: "1m"}}
	k, _ := MustMint(t, s, "k", p, nil)

	var reqs []vault.ReserveRequest
	for i := range 60 {
		reqs = append(reqs, Charge(k.ID, Idem(i), 100))
	}
	claimed := 0
	var first vault.ReserveRequest
	for i, res := range reserveAll(t, s, reqs) {
		if res.Outcome == vault.ReserveClaimed {
			if claimed == 0 {
				first = reqs[i]
			}
			claimed++
			continue
		}
		require.Equal(t, vault.ReserveRefused, res.Outcome)
		assert.Equal(t, policy.ReasonVelocityExceeded, res.Decision.Reason)
		assert.Equal(t, policy.Scope{Kind: policy.ScopeKey, ID: k.ID, Name: "k"}, res.Decision.Scope)
		assert.Equal(t, T0.Add(time.Minute), res.Decision.RetryAt)
	}
	assert.Equal(t, 20, claimed)

	// A replay of a claimed request and a request without money still pass.
	assert.Equal(t, vault.ReserveInFlight, MustReserve(t, s, first).Outcome)
	read := vault.ReserveRequest{KeyID: k.ID, IdempotencyKey: "read", Fingerprint: "fp", Request: policy.Request{Operation: "charges.read"}}
	assert.Equal(t, vault.ReserveClaimed, MustReserve(t, s, read).Outcome)

	// Just before the minute ends, still full; at its end, slots are free.
	clock.Advance(time.Minute - time.Nanosecond)
	assert.Equal(t, vault.ReserveRefused, MustReserve(t, s, Charge(k.ID, "late-1", 100)).Outcome)
	clock.Advance(time.Nanosecond)
	assert.Equal(t, vault.ReserveClaimed, MustReserve(t, s, Charge(k.ID, "late-2", 100)).Outcome)
}

// testBudgetVelocityPerOperation: a budget's limit on one operation counts
// only that operation, across the keys under it.
func testBudgetVelocityPerOperation(t *testing.T) {
	s := mustOpen(t, NewClock(T0))
	MustUpstream(t, s, "sk_test_abcdef1234")
	b := MustBudget(t, s, "refunds", "", "1000.00", "", policy.Velocity{Count: 3, Per: "1m", Operations: []string{"refunds.create"}})
	p := underBudget(t, b.ID)
	p.Operations = []string{"charges.create", "refunds.create"}
	k1, _ := MustMint(t, s, "k1", p, nil)
	k2, _ := MustMint(t, s, "k2", p, nil)
	refund := func(k vault.Key, idem string) vault.ReserveResult {
		req := Charge(k.ID, idem, 100)
		req.Request.Operation = "refunds.create"
		return MustReserve(t, s, req)
	}
	for i, k := range []vault.Key{k1, k2, k1} {
		require.Equal(t, vault.ReserveClaimed, refund(k, Idem(i)).Outcome)
	}
	res := refund(k2, "fourth")
	require.Equal(t, vault.ReserveRefused, res.Outcome)
	assert.Equal(t, b.ID, res.Decision.Scope.ID)
	assert.Equal(t, 3, res.Decision.Velocity.Count)
	// Charges are not limited.
	assert.Equal(t, vault.ReserveClaimed, MustReserve(t, s, Charge(k2.ID, "charge", 100)).Outcome)
}

// testBudgetAdmin: the tree's rules (currency, depth, parent), the counts, a
// patch under the lock with its version, and delete refused while named.
func testBudgetAdmin(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	MustUpstream(t, s, "sk_test_abcdef1234")
	root := MustBudget(t, s, "root", "", "", "100.00")
	mid := MustBudget(t, s, "mid", root.ID, "", "50.00")
	leaf := MustBudget(t, s, "leaf", mid.ID, "", "20.00")

	// A fourth budget would make a key's chain five deep.
	_, err := s.CreateBudget(ctx, "tester", vault.BudgetSpec{Name: "deep", Parent: leaf.ID, Currency: "usd", PeriodCap: MustDec(t, "1.00")})
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = s.CreateBudget(ctx, "tester", vault.BudgetSpec{Name: "eur", Parent: root.ID, Currency: "eur", PeriodCap: MustDec(t, "1.00")})
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = s.CreateBudget(ctx, "tester", vault.BudgetSpec{Name: "orphan", Parent: "bud_nope", Currency: "usd", PeriodCap: MustDec(t, "1.00")})
	assert.ErrorIs(t, err, vault.ErrNotFound)
	_, err = s.CreateBudget(ctx, "tester", vault.BudgetSpec{Name: "nocap", Currency: "usd"})
	assert.ErrorIs(t, err, vault.ErrInvalid)

	// A key in another currency, or under a missing budget, is refused.
	p := underBudget(t, leaf.ID)
	p.Currency = "eur"
	_, _, err = s.MintKey(ctx, "tester", vault.MintRequest{Name: "eur", Upstream: "default", Policy: p})
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, _, err = s.MintKey(ctx, "tester", vault.MintRequest{Name: "gone", Upstream: "default", Policy: underBudget(t, "bud_nope")})
	assert.ErrorIs(t, err, vault.ErrInvalid)

	k, _ := MustMint(t, s, "k", underBudget(t, leaf.ID), nil)
	assert.ErrorIs(t, s.DeleteBudget(ctx, "tester", leaf.ID), vault.ErrConflict)
	assert.ErrorIs(t, s.DeleteBudget(ctx, "tester", mid.ID), vault.ErrConflict)

	// The key's holds reach every level.
	MustCommit(t, s, k.ID, "a", 700)
	for _, id := range []string{leaf.ID, mid.ID, root.ID} {
		_, period := budgetUsage(t, s, id)
		assert.Equal(t, policy.Counter{Committed: 700}, period, id)
	}

	// Patch at the right version; a stale version is refused; currency stays.
	patched, err := s.PatchBudget(ctx, "tester", leaf.ID, vault.BudgetChange{IfVersion: 1, Apply: func(b vault.Budget, _ time.Time) (vault.BudgetSpec, error) {
		sp := b.Spec()
		sp.PeriodCap = MustDec(t, "5.00")
		return sp, nil
	}})
	require.NoError(t, err)
	assert.Equal(t, uint64(2), patched.Version)
	_, err = s.PatchBudget(ctx, "tester", leaf.ID, vault.BudgetChange{IfVersion: 1, Apply: func(b vault.Budget, _ time.Time) (vault.BudgetSpec, error) {
		return b.Spec(), nil
	}})
	assert.ErrorIs(t, err, vault.ErrPrecondition)
	_, err = s.PatchBudget(ctx, "tester", leaf.ID, vault.BudgetChange{Apply: func(b vault.Budget, _ time.Time) (vault.BudgetSpec, error) {
		sp := b.Spec()
		sp.Currency = "eur"
		return sp, nil
	}})
	assert.ErrorIs(t, err, vault.ErrInvalid)
	refusal := errors.New("no")
	_, err = s.PatchBudget(ctx, "tester", leaf.ID, vault.BudgetChange{Apply: func(vault.Budget, time.Time) (vault.BudgetSpec, error) {
		return vault.BudgetSpec{}, refusal
	}})
	assert.Equal(t, refusal, err)

	// The lowered cap refuses at once, naming the leaf; usage was kept.
	res := MustReserve(t, s, Charge(k.ID, "b", 100))
	assert.Equal(t, vault.ReserveRefused, res.Outcome)
	assert.Equal(t, leaf.ID, res.Decision.Scope.ID)

	// Listing by parent; moving the key frees the leaf, which can go.
	list, next, err := s.ListBudgets(ctx, vault.BudgetFilter{Parent: mid.ID})
	require.NoError(t, err)
	assert.Empty(t, next)
	require.Len(t, list, 1)
	assert.Equal(t, leaf.ID, list[0].ID)
	roots, _, err := s.ListBudgets(ctx, vault.BudgetFilter{Parent: vault.RootParent})
	require.NoError(t, err)
	require.Len(t, roots, 1)

	_, err = s.PatchKey(ctx, "tester", k.ID, vault.KeyChange{Apply: func(key vault.Key, _ time.Time) (policy.Policy, map[string]string, error) {
		p := key.Policy
		p.Budget = mid.ID
		return p, key.Labels, nil
	}})
	require.NoError(t, err)
	require.NoError(t, s.DeleteBudget(ctx, "tester", leaf.ID))
	m, err := s.GetBudget(ctx, mid.ID)
	require.NoError(t, err)
	assert.Equal(t, 1, m.Keys)
	assert.Equal(t, 0, m.Children)
	_, err = s.GetBudget(ctx, leaf.ID)
	assert.ErrorIs(t, err, vault.ErrNotFound)
}

// testBudgetUnknownHoldResolved: a hold whose outcome is unknown stays on
// the budget until an operator resolves it, then moves there as on the key.
func testBudgetUnknownHoldResolved(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	MustUpstream(t, s, "sk_test_abcdef1234")
	b := MustBudget(t, s, "b", "", "10.00", "")
	k, _ := MustMint(t, s, "k", underBudget(t, b.ID), nil)
	res := MustReserve(t, s, Charge(k.ID, "u", 400))
	require.Equal(t, vault.ReserveClaimed, res.Outcome)
	MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: "u", Outcome: vault.SettleUnknown})
	daily, _ := budgetUsage(t, s, b.ID)
	assert.Equal(t, policy.Counter{Held: 400}, daily)
	_, err := s.ResolveHold(ctx, "op", res.Hold.ID, vault.HoldCommitted)
	require.NoError(t, err)
	daily, _ = budgetUsage(t, s, b.ID)
	assert.Equal(t, policy.Counter{Committed: 400}, daily)
}

// testBudgetNamesUniqueAmongSiblings: a budget's name is unique among the
// budgets of its parent (the roots among the roots), on create, on a rename
// and under concurrency; another parent may reuse it, and a deleted or
// renamed budget frees its name.
func testBudgetNamesUniqueAmongSiblings(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	spec := func(name, parent string) vault.BudgetSpec {
		return vault.BudgetSpec{Name: name, Parent: parent, Currency: "usd", Timezone: "UTC", PeriodStart: T0, DailyCap: MustDec(t, "10.00")}
	}
	org := MustBudget(t, s, "org", "", "10.00", "")
	other := MustBudget(t, s, "other", "", "10.00", "")
	teamA := MustBudget(t, s, "team-a", org.ID, "10.00", "")
	_, err := s.CreateBudget(ctx, "tester", spec("team-a", org.ID))
	assert.ErrorIs(t, err, vault.ErrConflict, "a sibling has the name")
	_, err = s.CreateBudget(ctx, "tester", spec("org", ""))
	assert.ErrorIs(t, err, vault.ErrConflict, "a root has the name")
	MustBudget(t, s, "team-a", other.ID, "10.00", "") // another parent's
	MustBudget(t, s, "Team-A", org.ID, "10.00", "")   // names compare exactly

	rename := func(id, name string) error {
		_, err := s.PatchBudget(ctx, "tester", id, vault.BudgetChange{Apply: func(b vault.Budget, _ time.Time) (vault.BudgetSpec, error) {
			sp := b.Spec()
			sp.Name = name
			return sp, nil
		}})
		return err
	}
	teamB := MustBudget(t, s, "team-b", org.ID, "10.00", "")
	assert.ErrorIs(t, rename(teamB.ID, "team-a"), vault.ErrConflict)
	require.NoError(t, rename(teamB.ID, "team-b"), "its own name")
	require.NoError(t, rename(teamA.ID, "team-c"))
	MustBudget(t, s, "team-a", org.ID, "10.00", "") // freed by the rename
	got, err := s.GetBudget(ctx, teamA.ID)
	require.NoError(t, err)
	assert.Equal(t, "team-c", got.Name)
	require.NoError(t, s.DeleteBudget(ctx, "tester", teamB.ID))
	MustBudget(t, s, "team-b", org.ID, "10.00", "") // freed by the delete

	// Eight at once for one root name: exactly one.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	start := make(chan struct{})
	for i := range errs {
		wg.Go(func() {
			<-start
			_, errs[i] = s.CreateBudget(ctx, "tester", spec("race", ""))
		})
	}
	close(start)
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else {
			assert.ErrorIs(t, err, vault.ErrConflict)
		}
	}
	assert.Equal(t, 1, won)
	roots, _, err := s.ListBudgets(ctx, vault.BudgetFilter{Parent: vault.RootParent, NamePrefix: "race"})
	require.NoError(t, err)
	assert.Len(t, roots, 1)
}
