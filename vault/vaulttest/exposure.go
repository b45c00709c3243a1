package vaulttest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// counterOf reads one window's counter directly.
func counterOf(tb testing.TB, s *Store, keyID string, windowID policy.WindowID) policy.Counter {
	tb.Helper()
	var c engine.Counter
	require.NoError(tb, s.view(func(tx engine.Tx, now time.Time) error {
		var err error
		c, _, err = engine.GetCounter(tx, keyID, windowID)
		return err
	}))
	return policy.Counter{Committed: c.Committed, Held: c.Held}
}

// exposureOf returns the key's exposure on an object (zero when unknown).
func exposureOf(tb testing.TB, s *Store, keyID, objectID string) vault.Exposure {
	tb.Helper()
	exp, _, err := s.ObjectExposure(context.Background(), keyID, objectID)
	require.NoError(tb, err)
	return exp
}

// settleOn reserves amount under idem and settles it as a commit of commit
// against objectID with the given object change.
func settleOn(tb testing.TB, s *Store, keyID, idem string, amount, commit int64, objectID string, ch vault.ObjectSettle) {
	tb.Helper()
	require.Equal(tb, vault.ReserveClaimed, MustReserve(tb, s, Charge(keyID, idem, amount)).Outcome)
	MustSettle(tb, s, vault.SettleRequest{KeyID: keyID, IdempotencyKey: idem, Outcome: vault.SettleCommit, Amount: commit,
		ObjectID: objectID, Object: ch, Response: &vault.StoredResponse{Status: 200}})
}

// A PaymentIntent created through the key stays counted as held, on the day it
// was created, until its money moves or Stripe says it cannot any more.
func testExposureFromCreationToCapture(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 6000, 0, "pi_1", vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true})
	daily, period := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Held: 6000}, daily, "a created PaymentIntent is exposure, not yet money")
	assert.Equal(t, policy.Counter{Held: 6000}, period)
	assert.Equal(t, vault.HoldCommitted, allHolds(t, f.s)[vault.HoldID(id, "create")].State)
	assert.Equal(t, vault.Exposure{Held: 6000, Own: true, MovedSeen: true}, exposureOf(t, f.s, id, "pi_1"))

	// The next day, a capture of 2500 with the rest kept capturable, then the final one.
	f.clock.Advance(24 * time.Hour)
	settleOn(t, f.s, id, "capture-1", 0, 2500, "pi_1", vault.ObjectSettle{Expose: true, Moved: 2500, MovedKnown: true})
	assert.Equal(t, policy.Counter{Committed: 2500, Held: 3500}, counterOf(t, f.s, id, "day:2026-09-14"),
		"the exposure settles on the day it was placed")
	assert.Equal(t, policy.Counter{}, counterOf(t, f.s, id, "day:2026-09-15"))
	settleOn(t, f.s, id, "capture-2", 0, 1000, "pi_1", vault.ObjectSettle{Terminal: true, Moved: 3500, MovedKnown: true})
	assert.Equal(t, policy.Counter{Committed: 3500}, counterOf(t, f.s, id, "day:2026-09-14"),
		"the final capture releases what was not captured")
	_, period = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 3500}, period)
	assert.Equal(t, vault.Exposure{Committed: 3500, Moved: 3500, MovedSeen: true, Own: true, Closed: true}, exposureOf(t, f.s, id, "pi_1"))

	events, _, err := f.s.ListEvents(context.Background(), id, 10, "")
	require.NoError(t, err)
	var kinds []string
	for _, e := range events {
		if e.Decision == "exposure" {
			kinds = append(kinds, fmt.Sprintf("%s %d", e.Reason, e.Amount))
			assert.Equal(t, "pi_1", e.ObjectID)
			assert.Equal(t, vault.HoldID(id, "create"), e.HoldID, "a part remembers the hold that placed it")
		}
	}
	assert.Equal(t, []string{"release 2500", "commit 1000", "commit 2500"}, kinds, "newest first")
}

// Each capture of an authorisation the key did not create moves its own money:
// with no exposure to draw on, every capture holds and commits in full.
func testCapturesOfAForeignAuthorisationEachCount(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	for i := range 3 {
		settleOn(t, f.s, id, fmt.Sprintf("cap-%d", i), 2000, 2000, "pi_foreign", vault.ObjectSettle{Expose: true})
	}
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 6000}, daily)
	res := MustReserve(t, f.s, Charge(id, "cap-3", 5000))
	assert.Equal(t, vault.ReserveRefused, res.Outcome, "the cap bites on the fourth: 6000 + 5000 > 10000")
}

// A raise holds the difference, a lowered amount keeps the exposure until the
// object settles, and a cancel releases everything.
func testExposureRaisedAndReleased(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 3000, 0, "pi_1", vault.ObjectSettle{Created: true, Expose: true})
	settleOn(t, f.s, id, "raise", 2000, 0, "pi_1", vault.ObjectSettle{Expose: true})
	assert.Equal(t, int64(5000), exposureOf(t, f.s, id, "pi_1").Held)
	settleOn(t, f.s, id, "lower", 0, 0, "pi_1", vault.ObjectSettle{Expose: true})
	assert.Equal(t, int64(5000), exposureOf(t, f.s, id, "pi_1").Held, "only an answer that proves it releases exposure")

	changed, err := f.s.ObserveObject(context.Background(), id, "pi_1", vault.Observation{Operation: "payment_intents.cancel", Terminal: true, MovedKnown: true})
	require.NoError(t, err)
	assert.True(t, changed)
	daily, period := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{}, daily)
	assert.Equal(t, policy.Counter{}, period)
	changed, err = f.s.ObserveObject(context.Background(), id, "pi_1", vault.Observation{Terminal: true})
	require.NoError(t, err)
	assert.False(t, changed, "nothing left to release")
}

// An observation commits what moved since the last answer the key saw, never more
// than the exposure.
func testObserveCommitsWhatMoved(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 4000, 0, "pi_1", vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true})

	changed, err := f.s.ObserveObject(ctx, id, "pi_1", vault.Observation{Operation: "payment_intents.read"})
	require.NoError(t, err)
	assert.False(t, changed, "an answer that says nothing changes nothing")
	changed, err = f.s.ObserveObject(ctx, id, "pi_1", vault.Observation{Moved: 1500, MovedKnown: true})
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, vault.Exposure{Held: 2500, Committed: 1500, Moved: 1500, MovedSeen: true, Own: true}, exposureOf(t, f.s, id, "pi_1"))
	changed, err = f.s.ObserveObject(ctx, id, "pi_1", vault.Observation{Moved: 1500, MovedKnown: true})
	require.NoError(t, err)
	assert.False(t, changed, "the same answer again commits nothing twice")
	_, err = f.s.ObserveObject(ctx, id, "pi_1", vault.Observation{Moved: 9000, MovedKnown: true, Terminal: true})
	require.NoError(t, err)
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 4000}, daily, "at most the exposure: the rest moved outside this key")

	changed, err = f.s.ObserveObject(ctx, id, "pi_unknown", vault.Observation{Terminal: true})
	require.NoError(t, err)
	assert.False(t, changed)
	_, err = f.s.ObserveObject(ctx, id, "", vault.Observation{})
	assert.ErrorIs(t, err, vault.ErrInvalid)
}

// A declined creation that left its PaymentIntent behind keeps its money counted:
// a commit of nothing with the hold kept as exposure.
func testDeclinedCreationKeepsExposure(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	for i := range 2 {
		settleOn(t, f.s, id, fmt.Sprintf("declined-%d", i), 5000, 0, fmt.Sprintf("pi_%d", i), vault.ObjectSettle{Created: true, Expose: true})
	}
	res := MustReserve(t, f.s, Charge(id, "third", 5000))
	assert.Equal(t, vault.ReserveRefused, res.Outcome, "two confirmable 50.00 PaymentIntents fill a 100.00 cap")
}

// An overrun is the one commit above what was held; it is booked and excused, and
// the ledger says so.
func testOverrunIsRecorded(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 4000, 0, "in_1", vault.ObjectSettle{Created: true, Expose: true})
	require.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, Charge(id, "pay", 5000)).Outcome)
	req := vault.SettleRequest{KeyID: id, IdempotencyKey: "pay", Outcome: vault.SettleCommit, Amount: 12000, ObjectID: "in_1",
		Object: vault.ObjectSettle{Terminal: true, Moved: 12000, MovedKnown: true}}
	assert.ErrorIs(t, f.s.Settle(ctx, req), vault.ErrInvalid, "above hold + exposure without AllowOverrun")
	req.AllowOverrun = true
	MustSettle(t, f.s, req)
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 12000}, daily, "the money moved: booked past the cap")
	events, _, err := f.s.ListEvents(ctx, id, 10, "")
	require.NoError(t, err)
	var settled *vault.Event
	for i := range events {
		if events[i].Decision == "settled" && events[i].HoldID == vault.HoldID(id, "pay") {
			settled = &events[i]
		}
	}
	require.NotNil(t, settled)
	assert.Equal(t, []int64{3000, 3000}, settled.AllowanceDeltas, "12000 − (5000 held + 4000 exposure), on each window")
	require.NoError(t, f.s.CheckInvariant(ctx))
}

// Live exposure is money held: the reaper keeps it, however old.
func testReapKeepsLiveExposure(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "live", 1000, 0, "cs_live", vault.ObjectSettle{Created: true, Expose: true})
	settleOn(t, f.s, id, "done", 1000, 1000, "ch_done", vault.ObjectSettle{Created: true, Terminal: true})
	f.clock.Set(T0.Add(vault.ObjectRetention + 48*time.Hour))
	_, err := f.s.Reap(ctx)
	require.NoError(t, err)
	_, ok, err := f.s.ObjectExposure(ctx, id, "cs_live")
	require.NoError(t, err)
	assert.True(t, ok, "an object with live exposure stays")
	_, ok, err = f.s.ObjectExposure(ctx, id, "ch_done")
	require.NoError(t, err)
	assert.False(t, ok, "a settled object goes after its retention")
	assert.Equal(t, policy.Counter{Committed: 1000, Held: 1000}, counterOf(t, f.s, id, "day:2026-09-14"), "a day with exposure held stays")
}

// Many callers settling against one object at once never commit more than its
// exposure plus their holds, and the counters stay consistent.
func testConcurrentCommitsAgainstOneObject(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 8000, 0, "pi_1", vault.ObjectSettle{Created: true, Expose: true})
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			idem := fmt.Sprintf("cap-%02d", i)
			if _, err := f.s.Reserve(ctx, Charge(id, idem, 0)); err != nil {
				errs[i] = err
				return
			}
			// Each claims 1000 of the exposure; the last eight find none left.
			errs[i] = f.s.Settle(ctx, vault.SettleRequest{KeyID: id, IdempotencyKey: idem, Outcome: vault.SettleCommit,
				Amount: 1000, ObjectID: "pi_1", Object: vault.ObjectSettle{Expose: true}})
		}()
	}
	wg.Wait()
	var ok, invalid int
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case assert.ErrorIs(t, err, vault.ErrInvalid):
			invalid++
		}
	}
	assert.Equal(t, 8, ok, "exactly the exposure is committed")
	assert.Equal(t, 8, invalid)
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 8000}, daily)
	// The eight refused settles leave their (empty) claims in flight; the cleanup
	// checks the invariant.
}

// CheckInvariant sees exposure that the counters do not carry, and allowance that
// the ledger does not explain.
func testCheckInvariantDetectsExposureAndAllowance(t *testing.T) {
	cases := map[string]func(tx engine.Tx, keyID string) error{
		"exposure part without held": func(tx engine.Tx, keyID string) error {
			o, _, err := engine.GetObject(tx, keyID, "pi_1")
			if err != nil {
				return err
			}
			engine.AddPart(o, "hold_x", []policy.WindowID{"day:2026-09-14", "period"}, 500, T0)
			return engine.PutObject(tx, keyID, "pi_1", o)
		},
		"allowance without a ledger entry": func(tx engine.Tx, keyID string) error {
			c, _, err := engine.GetCounter(tx, keyID, "period")
			if err != nil {
				return err
			}
			c.Allowance += 7000
			c.Committed += 7000
			if err := engine.PutCounter(tx, keyID, "period", c); err != nil {
				return err
			}
			return engine.PutEvent(tx, &vault.Event{KeyID: keyID, WindowIDs: []policy.WindowID{"period"}, CommittedDelta: 7000})
		},
	}
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			f := newMeteringFixture(t)
			settleOn(t, f.s, f.key.ID, "create", 3000, 0, "pi_1", vault.ObjectSettle{Created: true, Expose: true})
			require.NoError(t, f.s.CheckInvariant(context.Background()), "consistent before")
			require.NoError(t, engine.Update(f.s.e, context.Background(), func(tx engine.Tx, _ time.Time) error { return corrupt(tx, f.key.ID) }))
			assert.ErrorIs(t, f.s.CheckInvariant(context.Background()), vault.ErrInvariant)
			require.NoError(t, f.s.Close()) // the cleanup's check would fail, as it should
		})
	}
}
