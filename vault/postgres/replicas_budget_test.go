package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"

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
