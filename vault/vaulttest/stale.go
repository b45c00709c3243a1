package vaulttest

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
)

// The background refresher's view of money objects: the exposures nobody
// touched for a while, oldest first, and a claim that lets one lookup at
// Stripe go ahead per object however many replicas ask.

// staleIDs is the (key, object) pairs of a stale listing.
func staleIDs(list []vault.StaleExposure) []string {
	out := make([]string, 0, len(list))
	for _, e := range list {
		out = append(out, e.KeyID+"/"+e.ObjectID)
	}
	return out
}

func testStaleExposures(t *testing.T) {
	ctx := context.Background()
	f := newExposureFixture(t) // now T0+24h: pi_a and pi_other last changed at T0, pi_b now
	id, other := f.key.ID, f.other.ID

	stale, err := f.s.StaleExposures(ctx, time.Hour, 0)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{id + "/pi_a", other + "/pi_other"}, staleIDs(stale),
		"untouched for an hour, with live exposure: not pi_b (changed now), not ch_done (settled)")
	for _, e := range stale {
		assert.Equal(t, T0, e.Touched)
	}
	one, err := f.s.StaleExposures(ctx, time.Hour, 1)
	require.NoError(t, err)
	assert.Len(t, one, 1, "the limit holds")

	// A claim touches the object: listed no more, and a second claim (another
	// replica's) gets nothing.
	f.clock.Advance(30 * time.Minute)
	exp, claimed, err := f.s.ClaimStaleExposure(ctx, id, "pi_a", time.Hour)
	require.NoError(t, err)
	require.True(t, claimed)
	assert.Equal(t, int64(6000), exp.Held)
	assert.Equal(t, "acct_1", exp.StripeAccount, "what the lookup needs")
	assert.Equal(t, T0, exp.CreatedAt)
	_, claimed, err = f.s.ClaimStaleExposure(ctx, id, "pi_a", time.Hour)
	require.NoError(t, err)
	assert.False(t, claimed, "claimed once")
	stale, err = f.s.StaleExposures(ctx, time.Hour, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{other + "/pi_other"}, staleIDs(stale))

	for _, obj := range []string{"pi_b", "ch_done", "pi_nope"} {
		_, claimed, err = f.s.ClaimStaleExposure(ctx, id, obj, time.Hour)
		require.NoError(t, err, obj)
		assert.False(t, claimed, "%s: touched 30m ago, settled, or unknown", obj)
	}

	// An hour after the claim it is stale again; strictly after, not at it.
	f.clock.Advance(time.Hour)
	stale, err = f.s.StaleExposures(ctx, time.Hour, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{other + "/pi_other", id + "/pi_b"}, staleIDs(stale), "oldest first; pi_a was claimed exactly an hour ago")
	f.clock.Advance(time.Nanosecond)
	stale, err = f.s.StaleExposures(ctx, time.Hour, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{other + "/pi_other", id + "/pi_b", id + "/pi_a"}, staleIDs(stale))

	// Settled by Stripe's word: off the list. Raised again: listed under now.
	_, err = f.s.ObserveObject(ctx, other, "pi_other", vault.Observation{Operation: "payment_intents.read", Terminal: true})
	require.NoError(t, err)
	settleOn(t, f.s, id, "raise-a", 500, 0, "pi_a", vault.ObjectSettle{Expose: true})
	stale, err = f.s.StaleExposures(ctx, time.Hour, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{id + "/pi_b"}, staleIDs(stale))

	_, err = f.s.StaleExposures(ctx, 0, 0)
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, _, err = f.s.ClaimStaleExposure(ctx, "", "pi_a", time.Hour)
	assert.ErrorIs(t, err, vault.ErrInvalid)
}

// testStaleExposureClaimedOnce: replicas claiming the same stale objects at
// once get each object once between them.
func testStaleExposureClaimedOnce(t *testing.T) {
	ctx := context.Background()
	f := newExposureFixture(t)
	f.clock.Advance(2 * time.Hour)
	objects := []struct{ key, obj string }{{f.key.ID, "pi_a"}, {f.key.ID, "pi_b"}, {f.other.ID, "pi_other"}}
	const replicas = 4
	var (
		mu   sync.Mutex
		wins = map[string]int{}
		wg   sync.WaitGroup
	)
	for range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, o := range objects {
				_, claimed, err := f.s.ClaimStaleExposure(ctx, o.key, o.obj, time.Hour)
				assert.NoError(t, err)
				if claimed {
					mu.Lock()
					wins[o.obj]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, map[string]int{"pi_a": 1, "pi_b": 1, "pi_other": 1}, wins)
}

// testUnknownRequestIsKept: the request of an unknown outcome is kept, sealed,
// for as long as the record is unknown, and is given back whole; a hold in any
// other state, or one whose request was not kept, has none to give.
func testUnknownRequestIsKept(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	sent := &vault.StoredRequest{Method: "POST", Target: "/v1/charges?expand%5B%5D=customer",
		Header: http.Header{"Stripe-Account": {"acct_1"}, "Content-Type": {"application/x-www-form-urlencoded"}},
		Body:   []byte("amount=1000&currency=usd&source=tok_visa")}
	for _, k := range []string{"kept", "bare", "live"} {
		MustReserve(t, f.s, Charge(id, k, 1000))
	}
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "kept", Outcome: vault.SettleUnknown, Request: sent})
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "bare", Outcome: vault.SettleUnknown})

	rec, got, err := f.s.UnknownRequest(ctx, vault.HoldID(id, "kept"))
	require.NoError(t, err)
	assert.Equal(t, *sent, got)
	assert.Equal(t, "kept", rec.IdempotencyKey)
	assert.NotEmpty(t, rec.UpstreamKey, "what the request is sent again under")

	_, _, err = f.s.UnknownRequest(ctx, vault.HoldID(id, "bare"))
	assert.ErrorIs(t, err, vault.ErrConflict, "not kept")
	_, _, err = f.s.UnknownRequest(ctx, vault.HoldID(id, "live"))
	assert.ErrorIs(t, err, vault.ErrConflict, "in flight, not unknown")
	_, _, err = f.s.UnknownRequest(ctx, "hold_nope")
	assert.ErrorIs(t, err, vault.ErrNotFound)

	// A retry resumes it and settles it: the request is dropped with the
	// unknown state.
	res := MustReserve(t, f.s, Charge(id, "kept", 1000))
	require.Equal(t, vault.ReserveResume, res.Outcome)
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "kept", Outcome: vault.SettleCommit, Amount: 1000,
		Response: &vault.StoredResponse{Status: 200}})
	_, _, err = f.s.UnknownRequest(ctx, vault.HoldID(id, "kept"))
	assert.ErrorIs(t, err, vault.ErrConflict, "committed")
}
