package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// TestReplicasShareOneBudget: three stores on one database, four keys under
// one 20.00 budget, 100 concurrent 1.00 charges spread over the replicas and
// settled as they are claimed: exactly 20 claimed, the budget's counter is
// the same from every replica, and the invariant holds (the cleanup).
func TestReplicasShareOneBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := vaulttest.NewClock(vaulttest.T0)
	rs := replicas(t, 3, clock)
	vaulttest.MustUpstream(t, rs[0], "sk_test_abcdef1234")
	b := vaulttest.MustBudget(t, rs[0], "fleet", "", "20.00", "")
	var keys []vault.Key
	for i := range 4 {
		p := vaulttest.Policy(t, "", "", "1000.00")
		p.Budget = b.ID
		k, _ := vaulttest.MustMint(t, rs[i%3], fmt.Sprintf("agent-%d", i), p, nil)
		keys = append(keys, k)
	}
	const n = 100
	outcomes := make([]vault.ReserveOutcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			s, k, idem := rs[i%len(rs)], keys[i%len(keys)], fmt.Sprintf("charge-%d", i)
			res, err := s.Reserve(ctx, vaulttest.Charge(k.ID, idem, 100))
			if !assert.NoError(t, err) {
				return
			}
			outcomes[i] = res.Outcome
			if res.Outcome == vault.ReserveClaimed {
				// Settled through another replica than the one that held.
				assert.NoError(t, rs[(i+1)%len(rs)].Settle(ctx, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: idem, Outcome: vault.SettleCommit, Amount: 100}))
			} else {
				assert.Equal(t, b.ID, res.Decision.Scope.ID)
			}
		})
	}
	wg.Wait()
	count := map[vault.ReserveOutcome]int{}
	for _, o := range outcomes {
		count[o]++
	}
	assert.Equal(t, map[vault.ReserveOutcome]int{vault.ReserveClaimed: 20, vault.ReserveRefused: 80}, count)
	for _, s := range rs {
		chain, err := s.BudgetChain(ctx, b.ID)
		require.NoError(t, err)
		assert.Equal(t, int64(2000), chain[0].Usage[chain[0].Windows[0].ID].Committed, "every replica sees the same budget counter")
	}
}

// TestReplicasLockBudgetsInOneOrder: two replicas' batches whose holds go on
// two budgets in opposite orders — one batch holds under budget A then B,
// the other under B then A — take every key's and budget's lock as they
// begin, keys then budgets by id, so neither waits for the other in a circle:
// no transaction is aborted to break a deadlock, and every hold counts once
// on its key and its budget.
func TestReplicasLockBudgetsInOneOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := replicas(t, 2, vaulttest.NewClock(vaulttest.T0))
	vaulttest.MustUpstream(t, rs[0], "sk_test_abcdef1234")
	budgets := []vault.Budget{
		vaulttest.MustBudget(t, rs[0], "a", "", "1000.00", ""),
		vaulttest.MustBudget(t, rs[0], "b", "", "1000.00", ""),
	}
	// keys[i] is under budgets[under[i]]: replica 0 batches keys 0 and 1
	// (budgets a, b), replica 1 keys 2 and 3 (budgets b, a).
	under := []int{0, 1, 1, 0}
	keys := make([]vault.Key, len(under))
	for i, b := range under {
		p := vaulttest.Policy(t, "", "", "1000.00")
		p.Budget = budgets[b].ID
		keys[i], _ = vaulttest.MustMint(t, rs[0], fmt.Sprintf("agent-%d", i), p, nil)
	}
	// Each replica has read each key's chain once, as a running one has.
	for i, k := range keys {
		vaulttest.MustCommit(t, rs[i/2], k.ID, "warm", 1)
	}
	const rounds = 4
	for round := range rounds {
		var releases []func()
		var wg sync.WaitGroup
		for r, s := range rs {
			releases = append(releases, parkCommitter(t, s))
			for j := range 2 {
				k := keys[2*r+j]
				wg.Go(func() {
					res := vaulttest.MustReserve(t, s, vaulttest.Charge(k.ID, fmt.Sprintf("charge-%d", round), 100))
					assert.Equal(t, vault.ReserveClaimed, res.Outcome)
				})
				require.Eventually(t, func() bool { return len(s.ops) == j+1 }, 10*time.Second, time.Millisecond, "queued in order")
			}
		}
		var freed sync.WaitGroup
		for _, release := range releases {
			freed.Go(release) // both replicas' batches begin together
		}
		wg.Wait()
		freed.Wait()
	}
	for _, s := range rs {
		assert.Zero(t, s.deadlocks.Load(), "no batch was aborted to break a deadlock")
	}
	for i, k := range keys {
		_, windows, usage, err := rs[1].KeyUsage(ctx, k.ID)
		require.NoError(t, err)
		assert.Equal(t, int64(rounds*100), usage[windows[0].ID].Held, "key %d", i)
	}
	for _, b := range budgets {
		chain, err := rs[1].BudgetChain(ctx, b.ID)
		require.NoError(t, err)
		u := chain[0].Usage[chain[0].Windows[0].ID]
		assert.Equal(t, int64(2*rounds*100), u.Held, "budget %s: two keys' holds", b.Name)
		assert.Equal(t, int64(2), u.Committed, "budget %s: the warm-up", b.Name)
	}
}

// TestRoundTripsUnderABudget: a Reserve and a Settle of a key under a budget
// of a budget are two round trips each, as without one: the budgets' rows
// are locked and read, and their counters read, with the key's.
func TestRoundTripsUnderABudget(t *testing.T) {
	t.Parallel()
	s := mustOpenURL(t, migrated.URL(t), vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: vaulttest.NewClock(vaulttest.T0).Now})
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	parent := vaulttest.MustBudget(t, s, "org", "", "1000.00", "")
	team := vaulttest.MustBudget(t, s, "team", parent.ID, "500.00", "")
	p := vaulttest.Policy(t, "1000.00", "", "")
	p.Budget = team.ID
	k, _ := vaulttest.MustMint(t, s, "k", p, nil)
	vaulttest.MustCommit(t, s, k.ID, "warm", 100) // the chain seen once, statements prepared
	before := s.roundTrips.Load()
	vaulttest.MustReserve(t, s, vaulttest.Charge(k.ID, "a", 100))
	reserve := s.roundTrips.Load() - before
	before = s.roundTrips.Load()
	vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 100})
	settle := s.roundTrips.Load() - before
	assert.Equal(t, int64(2), reserve, "Reserve: everything with the locks, the writes with COMMIT")
	assert.Equal(t, int64(2), settle, "Settle: the same")
	chain, err := s.BudgetChain(context.Background(), team.ID)
	require.NoError(t, err)
	require.Len(t, chain, 2)
	for _, b := range chain {
		assert.Equal(t, int64(200), b.Usage[b.Windows[0].ID].Committed, b.Budget.Name)
	}
}
