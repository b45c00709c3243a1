package postgres

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/postgres/pgtest"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// replicas opens n stores on one new database, as n keybrake replicas would,
// all on clock.
func replicas(t *testing.T, n int, clock *vaulttest.Clock) []*Store {
	t.Helper()
	url := migrated.URL(t)
	out := make([]*Store, n)
	for i := range out {
		out[i] = mustOpenURL(t, url, vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: clock.Now})
	}
	t.Cleanup(func() {
		if err := out[0].CheckInvariant(context.Background()); err != nil {
			t.Errorf("invariant at cleanup: %v", err)
		}
	})
	return out
}

// TestReplicasShareCaps: three stores on one database meter one key as one
// store would. 100 concurrent $1 charges spread over them against a $20 cap
// claim exactly 20; one idempotency key sent to all three at once is claimed
// once; a key revoked through one is refused by the others at once.
func TestReplicasShareCaps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := vaulttest.NewClock(vaulttest.T0)
	rs := replicas(t, 3, clock)
	vaulttest.MustUpstream(t, rs[0], "sk_test_abcdef1234")
	k, _ := vaulttest.MustMint(t, rs[1], "shared", vaulttest.Policy(t, "20.00", "", ""), nil)

	const n = 100
	outcomes := make([]vault.ReserveOutcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			s := rs[i%len(rs)]
			idem := fmt.Sprintf("charge-%d", i)
			res, err := s.Reserve(ctx, vaulttest.Charge(k.ID, idem, 100))
			if !assert.NoError(t, err) {
				return
			}
			outcomes[i] = res.Outcome
			if res.Outcome == vault.ReserveClaimed {
				assert.NoError(t, s.Settle(ctx, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: idem, Outcome: vault.SettleCommit, Amount: 100}))
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
		_, windows, usage, err := s.KeyUsage(ctx, k.ID)
		require.NoError(t, err)
		assert.Equal(t, int64(2000), usage[windows[0].ID].Committed, "every replica sees the same counters")
	}

	// One idempotency key, sent to all three at once.
	const same = 30
	results := make([]vault.ReserveOutcome, same)
	k2, _ := vaulttest.MustMint(t, rs[2], "same", vaulttest.Policy(t, "100.00", "", ""), nil)
	start := make(chan struct{})
	for i := range same {
		wg.Go(func() {
			<-start
			res, err := rs[i%len(rs)].Reserve(ctx, vaulttest.Charge(k2.ID, "once", 2500))
			if assert.NoError(t, err) {
				results[i] = res.Outcome
			}
		})
	}
	close(start)
	wg.Wait()
	count = map[vault.ReserveOutcome]int{}
	for _, o := range results {
		count[o]++
	}
	assert.Equal(t, 1, count[vault.ReserveClaimed], "%v", count)
	assert.Equal(t, same-1, count[vault.ReserveInFlight], "%v", count)
	_, windows, usage, err := rs[0].KeyUsage(ctx, k2.ID)
	require.NoError(t, err)
	assert.Equal(t, int64(2500), usage[windows[0].ID].Held, "one hold")
	require.NoError(t, rs[1].Settle(ctx, vault.SettleRequest{KeyID: k2.ID, IdempotencyKey: "once", Outcome: vault.SettleCommit, Amount: 2500}))

	// Revoked on one replica, refused by the next request on another.
	_, err = rs[0].RevokeKey(ctx, "op", k2.ID)
	require.NoError(t, err)
	_, err = rs[2].Reserve(ctx, vaulttest.Charge(k2.ID, "after", 100))
	assert.ErrorIs(t, err, vault.ErrKeyRevoked)
}

// TestOpenLeavesLiveLeasesAlone: a replica that starts while another serves
// a request must not take that request for a dead one; a lapsed lease is.
func TestOpenLeavesLiveLeasesAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := vaulttest.NewClock(vaulttest.T0)
	url := migrated.URL(t)
	opts := vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: clock.Now, Lease: 2 * time.Minute}
	a := mustOpenURL(t, url, opts)
	vaulttest.MustUpstream(t, a, "sk_test_abcdef1234")
	k, _ := vaulttest.MustMint(t, a, "k", vaulttest.Policy(t, "100.00", "", ""), nil)
	res := vaulttest.MustReserve(t, a, vaulttest.Charge(k.ID, "in-flight", 1000))
	require.Equal(t, vault.ReserveClaimed, res.Outcome)

	clock.Advance(time.Minute)
	b := mustOpenURL(t, url, opts)
	states := func() map[vault.HoldState]int {
		out := map[vault.HoldState]int{}
		holds, _, err := b.ListHolds(ctx, "", 10, "")
		require.NoError(t, err)
		for _, h := range holds {
			out[h.State]++
		}
		return out
	}
	assert.Equal(t, map[vault.HoldState]int{vault.HoldHeld: 1}, states(), "a live lease is another replica's request")
	require.NoError(t, a.Settle(ctx, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: "in-flight", Outcome: vault.SettleCommit, Amount: 1000}),
		"the replica that serves it settles it")

	vaulttest.MustReserve(t, a, vaulttest.Charge(k.ID, "dies", 500))
	require.NoError(t, a.Close()) // the replica dies with its request in flight
	clock.Advance(2*time.Minute + time.Second)
	c := mustOpenURL(t, url, opts)
	require.NoError(t, c.CheckInvariant(ctx))
	assert.Equal(t, map[vault.HoldState]int{vault.HoldCommitted: 1, vault.HoldUnknown: 1}, states(), "a lapsed lease is a dead replica's")
}

// TestReplicasStartTogether: replicas starting at once on a new database
// migrate it once and agree on one master key check; a replica with another
// master key is refused.
func TestReplicasStartTogether(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() {
			s, err := Open(context.Background(), url, Options{MasterKey: vaulttest.MasterKey, Logger: vaulttest.QuietLogger()})
			errs[i] = err
			if err == nil {
				assert.NoError(t, s.Close())
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	pool := pgtest.NewPool(t, url)
	var versions int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM keybrake_schema_migrations").Scan(&versions))
	assert.Equal(t, SchemaVersion(), versions)

	_, err := Open(context.Background(), url, Options{MasterKey: bytes.Repeat([]byte{7}, 32), Logger: vaulttest.QuietLogger()})
	assert.ErrorIs(t, err, vault.ErrSealed)
}

// adminAndServing opens two replicas of one new database, one to change
// what the other serves, with an upstream and a key of a $10 daily cap.
func adminAndServing(t *testing.T) (admin, serving *Store, k vault.Key, tok string) {
	t.Helper()
	rs := replicas(t, 2, vaulttest.NewClock(vaulttest.T0))
	admin, serving = rs[0], rs[1]
	vaulttest.MustUpstream(t, admin, "sk_test_abcdef1234")
	k, tok = vaulttest.MustMint(t, admin, "k", vaulttest.Policy(t, "10.00", "", ""), nil)
	return admin, serving, k, tok
}

// TestAuthenticateReadsTheUpstreamWithTheKey: once a replica has
// authenticated a token, it reads the token, its key and the key's upstream
// in one statement, and still sees at once what another replica changed: a
// replaced secret's version, a revocation.
func TestAuthenticateReadsTheUpstreamWithTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, serving, k, tok := adminAndServing(t)
	authenticate := func() (vault.Key, int64, error) {
		before := serving.roundTrips.Load()
		got, err := serving.Authenticate(ctx, tok)
		return got, serving.roundTrips.Load() - before, err
	}
	first, _, err := authenticate()
	require.NoError(t, err)
	again, trips, err := authenticate()
	require.NoError(t, err)
	assert.Equal(t, int64(1), trips, "the token, its key and the upstream in one statement")
	assert.Equal(t, k.ID, again.ID)
	assert.Equal(t, first.UpstreamVersion, again.UpstreamVersion)

	up, _, err := admin.PutUpstream(ctx, "tester", "default", "stripe", "sk_test_replaced99")
	require.NoError(t, err)
	replaced, trips, err := authenticate()
	require.NoError(t, err)
	assert.Equal(t, int64(1), trips)
	assert.Equal(t, up.Version, replaced.UpstreamVersion, "the version another replica wrote")
	assert.NotEqual(t, first.UpstreamVersion, replaced.UpstreamVersion)

	_, err = admin.RevokeKey(ctx, "tester", k.ID)
	require.NoError(t, err)
	_, _, err = authenticate()
	assert.ErrorIs(t, err, vault.ErrKeyRevoked, "revoked through another replica: refused on the next request")
}

// TestRememberedKeysAreCheckedWithTheHold: a replica answers
// AuthenticateRemembered from the key it last authenticated, without a round
// trip, even after another replica changed it; a Reserve made with the
// remembered versions then writes nothing and answers ErrKeyChanged, for each
// change another replica can make — a new policy, a replaced secret, a
// rotated token — and ErrKeyRevoked for a revocation. The replica's own
// writes forget what it remembered.
func TestRememberedKeysAreCheckedWithTheHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, serving, k, tok := adminAndServing(t)

	remembered := func(token string) (vault.Key, bool) {
		t.Helper()
		before := serving.roundTrips.Load()
		got, rem, err := serving.AuthenticateRemembered(ctx, token)
		require.NoError(t, err)
		if rem {
			assert.Equal(t, before, serving.roundTrips.Load(), "a remembered key costs no round trip")
		}
		return got, rem
	}
	_, rem := remembered(tok)
	require.False(t, rem, "nothing remembered before the first authentication")
	n := 0
	reserveWith := func(key vault.Key) (vault.ReserveResult, error) {
		n++
		req := vaulttest.Charge(k.ID, fmt.Sprintf("charge-%d", n), 100)
		req.KeyVersion, req.UpstreamVersion = key.Version, key.UpstreamVersion
		return serving.Reserve(ctx, req)
	}
	held := func() int64 {
		t.Helper()
		_, _, usage, err := serving.KeyUsage(ctx, k.ID)
		require.NoError(t, err)
		var sum int64
		for _, c := range usage {
			sum += c.Held
		}
		return sum
	}
	key, rem := remembered(tok)
	require.True(t, rem)
	res, err := reserveWith(key)
	require.NoError(t, err)
	require.Equal(t, vault.ReserveClaimed, res.Outcome, "the remembered key is the key")
	before := serving.roundTrips.Load()
	res, err = reserveWith(key) // statements prepared, windows known
	require.NoError(t, err)
	require.Equal(t, vault.ReserveClaimed, res.Outcome)
	assert.Equal(t, int64(2), serving.roundTrips.Load()-before, "the upstream's version is read with the locks: no round trip more")
	heldBefore := held()
	require.Positive(t, heldBefore)

	for _, change := range []struct {
		name string
		make func() string // the token to use after the change
	}{
		{"a new policy", func() string {
			_, err := admin.UpdateKey(ctx, "tester", k.ID, vaulttest.Policy(t, "0.50", "", ""), nil)
			require.NoError(t, err)
			return tok
		}},
		{"a replaced secret", func() string {
			_, _, err := admin.PutUpstream(ctx, "tester", "default", "stripe", "sk_test_replaced99")
			require.NoError(t, err)
			return tok
		}},
		{"a rotated token", func() string {
			_, newTok, err := admin.RotateKey(ctx, "tester", k.ID)
			require.NoError(t, err)
			return newTok
		}},
	} {
		stale, rem := remembered(tok)
		require.True(t, rem, "%s: remembered before the change", change.name)
		newTok := change.make()
		again, rem := remembered(tok)
		require.True(t, rem, "%s: another replica's change is not seen here", change.name)
		require.Equal(t, stale.Version, again.Version)
		_, err := reserveWith(again)
		assert.ErrorIs(t, err, vault.ErrKeyChanged, "%s: the hold's transaction finds the key changed", change.name)
		assert.Equal(t, heldBefore, held(), "%s: nothing held", change.name)

		fresh, err := serving.Authenticate(ctx, newTok)
		require.NoError(t, err, change.name)
		assert.True(t, fresh.Version != stale.Version || fresh.UpstreamVersion != stale.UpstreamVersion, change.name)
		if newTok != tok {
			_, err := serving.Authenticate(ctx, tok)
			assert.ErrorIs(t, err, vault.ErrKeyInvalid, "the rotated-out token")
			_, _, err = serving.AuthenticateRemembered(ctx, tok)
			assert.ErrorIs(t, err, vault.ErrKeyInvalid, "the rotated-out token, read again, is not remembered as valid")
			tok = newTok
		}
		now, rem := remembered(tok)
		require.True(t, rem, "%s: the key read again is remembered", change.name)
		assert.Equal(t, fresh.Version, now.Version)
		res, err := reserveWith(now)
		require.NoError(t, err, change.name)
		assert.Equal(t, vault.ReserveRefused, res.Outcome, "%s: $1 over the new $0.50 cap", change.name)
		heldBefore = held()
	}

	stale, rem := remembered(tok)
	require.True(t, rem)
	_, err = admin.RevokeKey(ctx, "tester", k.ID)
	require.NoError(t, err)
	_, err = reserveWith(stale)
	assert.ErrorIs(t, err, vault.ErrKeyRevoked, "revoked through another replica: the hold is refused")
	assert.Equal(t, heldBefore, held())
	_, err = serving.Authenticate(ctx, tok)
	require.ErrorIs(t, err, vault.ErrKeyRevoked)
	_, rem, err = serving.AuthenticateRemembered(ctx, tok)
	assert.ErrorIs(t, err, vault.ErrKeyRevoked)
	assert.False(t, rem, "a key read as revoked is no longer remembered")

	// The replica's own write forgets what it remembered.
	k2, tok2 := vaulttest.MustMint(t, admin, "k2", vaulttest.Policy(t, "10.00", "", ""), nil)
	_, err = serving.Authenticate(ctx, tok2)
	require.NoError(t, err)
	_, rem = remembered(tok2)
	require.True(t, rem)
	_, err = serving.RevokeKey(ctx, "tester", k2.ID)
	require.NoError(t, err)
	_, rem, err = serving.AuthenticateRemembered(ctx, tok2)
	assert.ErrorIs(t, err, vault.ErrKeyRevoked)
	assert.False(t, rem, "read again after this replica's own revocation")
}
