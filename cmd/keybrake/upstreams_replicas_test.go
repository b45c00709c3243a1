package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/postgres/pgtest"
)

// twoReplicasWithKey skips in -short mode, else starts two real replicas of
// one new PostgreSQL database before a new fake Stripe, with one key named
// name of a $50 cap minted through store, the test's own view of the database.
func twoReplicasWithKey(t *testing.T, name string) (*proxytest.FakeStripe, vault.Store, vault.Key, string, *replicaSet) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs real replicas")
	}
	t.Parallel()
	dbURL := pgtest.URL(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_before_1111")
	store, masterText := MustPostgresVault(t, dbURL, fake.Secret)
	k, tok := MustMintKey(t, store, name, 50)
	return fake, store, k, tok, MustReplicas(t, 2, dbURL, fake.URL, masterText)
}

// TestUpstreamWritesAcrossReplicas: on real replicas of one PostgreSQL
// database, a secret replaced through replica 0 is the one replica 1 sends
// on its very next request, although replica 1 had just cached the old one;
// and of two replicas registering one new upstream name at once, exactly one
// answers 201.
func TestUpstreamWritesAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	fake, _, _, tok, rs := twoReplicasWithKey(t, "rotated")
	admin := replicaAdminToken(t)
	putUpstream := func(i int, name, secret string) (int, string) {
		status, body, _ := adminSend(t, http.MethodPost, rs.adminURL(i)+"/api/v1/upstreams", admin,
			fmt.Sprintf(`{"name":%q,"vendor":"stripe","secret":%q}`, name, secret), "Content-Type", "application/json")
		return status, body
	}
	lastAuthorized := func() bool {
		reqs := fake.Requests()
		require.NotEmpty(t, reqs)
		return reqs[len(reqs)-1].Authorized
	}

	// Replica 1 caches the old secret.
	status, body, err := postForm(ctx, http.DefaultClient, rs.proxyURL(1)+"/v1/charges", tok, "before", chargeForm(100, "before"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.True(t, lastAuthorized())

	// The secret is rolled at Stripe and replaced through replica 0.
	fake.SetSecret("sk_test_after_2222")
	status, got := putUpstream(0, upstreamDefault, "sk_test_after_2222")
	require.Equal(t, http.StatusOK, status, "replacing an upstream is not creating it: %s", got)

	// Replica 1's next request, well within its 5 s cache, sends the new one.
	before := fake.Count()
	status, body, err = postForm(ctx, http.DefaultClient, rs.proxyURL(1)+"/v1/charges", tok, "after", chargeForm(100, "after"))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status, "%s", body)
	require.Equal(t, before+1, fake.Count())
	assert.True(t, lastAuthorized(), "replica 1 sent the replaced secret, not the one it had cached")

	// Two replicas register one new name at once: one 201, one 200, every round.
	for i := range longRounds(10, 100) {
		name := fmt.Sprintf("eu-%d", i)
		var wg sync.WaitGroup
		statuses := make([]int, 2)
		start := make(chan struct{})
		for r := range 2 {
			wg.Go(func() {
				<-start
				statuses[r], _ = putUpstream(r, name, fmt.Sprintf("sk_test_eu_%d_%d", i, r))
			})
		}
		close(start)
		wg.Wait()
		assert.ElementsMatch(t, []int{http.StatusCreated, http.StatusOK}, statuses, "round %d", i)
	}
	rs.stopAll()
}
