package vault

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/policy"
)

// counterOf reads one window's counter directly.
func counterOf(tb testing.TB, s *Store, keyID, windowID string) policy.Counter {
	tb.Helper()
	var c counter
	require.NoError(tb, s.view(func(tx *boltTx, now time.Time) error {
		var err error
		c, _, err = getCounter(tx, keyID, windowID)
		return err
	}))
	return policy.Counter{Committed: c.Committed, Held: c.Held}
}

// exposureOf returns the key's exposure on an object (zero when unknown).
func exposureOf(tb testing.TB, s *Store, keyID, objectID string) Exposure {
	tb.Helper()
	exp, _, err := s.ObjectExposure(context.Background(), keyID, objectID)
	require.NoError(tb, err)
	return exp
}

// settleOn reserves amount under idem and settles it as a commit of commit
// against objectID with the given object change.
func settleOn(tb testing.TB, s *Store, keyID, idem string, amount, commit int64, objectID string, ch ObjectSettle) {
	tb.Helper()
	require.Equal(tb, ReserveClaimed, MustReserve(tb, s, charge(keyID, idem, amount)).Outcome)
	MustSettle(tb, s, SettleRequest{KeyID: keyID, IdempotencyKey: idem, Outcome: SettleCommit, Amount: commit,
		ObjectID: objectID, Object: ch, Response: &StoredResponse{Status: 200}})
}

// A PaymentIntent created through the key stays counted as held, on the day it
// was created, until its money moves or Stripe says it cannot any more.
func TestExposureFromCreationToCapture(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 6000, 0, "pi_1", ObjectSettle{Created: true, Expose: true, MovedKnown: true})
	daily, period := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Held: 6000}, daily, "a created PaymentIntent is exposure, not yet money")
	assert.Equal(t, policy.Counter{Held: 6000}, period)
	assert.Equal(t, HoldCommitted, allHolds(t, f.s)[HoldID(id, "create")].State)
	assert.Equal(t, Exposure{Held: 6000, Own: true, MovedSeen: true}, exposureOf(t, f.s, id, "pi_1"))

	// The next day, a capture of 2500 with the rest kept capturable, then the final one.
	f.clock.Advance(24 * time.Hour)
	settleOn(t, f.s, id, "capture-1", 0, 2500, "pi_1", ObjectSettle{Expose: true, Moved: 2500, MovedKnown: true})
	assert.Equal(t, policy.Counter{Committed: 2500, Held: 3500}, counterOf(t, f.s, id, "day:2026-09-14"),
		"the exposure settles on the day it was placed")
	assert.Equal(t, policy.Counter{}, counterOf(t, f.s, id, "day:2026-09-15"))
	settleOn(t, f.s, id, "capture-2", 0, 1000, "pi_1", ObjectSettle{Terminal: true, Moved: 3500, MovedKnown: true})
	assert.Equal(t, policy.Counter{Committed: 3500}, counterOf(t, f.s, id, "day:2026-09-14"),
		"the final capture releases what was not captured")
	_, period = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 3500}, period)
	assert.Equal(t, Exposure{Committed: 3500, Moved: 3500, MovedSeen: true, Own: true, Closed: true}, exposureOf(t, f.s, id, "pi_1"))

	events, _, err := f.s.ListEvents(context.Background(), id, 10, "")
	require.NoError(t, err)
	var kinds []string
	for _, e := range events {
		if e.Decision == "exposure" {
			kinds = append(kinds, fmt.Sprintf("%s %d", e.Reason, e.Amount))
			assert.Equal(t, "pi_1", e.ObjectID)
			assert.Equal(t, HoldID(id, "create"), e.HoldID, "a part remembers the hold that placed it")
		}
	}
	assert.Equal(t, []string{"release 2500", "commit 1000", "commit 2500"}, kinds, "newest first")
}

// Each capture of an authorisation the key did not create moves its own money:
// with no exposure to draw on, every capture holds and commits in full.
func TestCapturesOfAForeignAuthorisationEachCount(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	for i := range 3 {
		settleOn(t, f.s, id, fmt.Sprintf("cap-%d", i), 2000, 2000, "pi_foreign", ObjectSettle{Expose: true})
	}
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 6000}, daily)
	res := MustReserve(t, f.s, charge(id, "cap-3", 5000))
	assert.Equal(t, ReserveRefused, res.Outcome, "the cap bites on the fourth: 6000 + 5000 > 10000")
}

// A raise holds the difference, a lowered amount keeps the exposure until the
// object settles, and a cancel releases everything.
func TestExposureRaisedAndReleased(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 3000, 0, "pi_1", ObjectSettle{Created: true, Expose: true})
	settleOn(t, f.s, id, "raise", 2000, 0, "pi_1", ObjectSettle{Expose: true})
	assert.Equal(t, int64(5000), exposureOf(t, f.s, id, "pi_1").Held)
	settleOn(t, f.s, id, "lower", 0, 0, "pi_1", ObjectSettle{Expose: true})
	assert.Equal(t, int64(5000), exposureOf(t, f.s, id, "pi_1").Held, "only an answer that proves it releases exposure")

	changed, err := f.s.ObserveObject(context.Background(), id, "pi_1", Observation{Operation: "payment_intents.cancel", Terminal: true, MovedKnown: true})
	require.NoError(t, err)
	assert.True(t, changed)
	daily, period := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{}, daily)
	assert.Equal(t, policy.Counter{}, period)
	changed, err = f.s.ObserveObject(context.Background(), id, "pi_1", Observation{Terminal: true})
	require.NoError(t, err)
	assert.False(t, changed, "nothing left to release")
}

// An observation commits what moved since the last answer the key saw, never more
// than the exposure.
func TestObserveCommitsWhatMoved(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 4000, 0, "pi_1", ObjectSettle{Created: true, Expose: true, MovedKnown: true})

	changed, err := f.s.ObserveObject(ctx, id, "pi_1", Observation{Operation: "payment_intents.read"})
	require.NoError(t, err)
	assert.False(t, changed, "an answer that says nothing changes nothing")
	changed, err = f.s.ObserveObject(ctx, id, "pi_1", Observation{Moved: 1500, MovedKnown: true})
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, Exposure{Held: 2500, Committed: 1500, Moved: 1500, MovedSeen: true, Own: true}, exposureOf(t, f.s, id, "pi_1"))
	changed, err = f.s.ObserveObject(ctx, id, "pi_1", Observation{Moved: 1500, MovedKnown: true})
	require.NoError(t, err)
	assert.False(t, changed, "the same answer again commits nothing twice")
	_, err = f.s.ObserveObject(ctx, id, "pi_1", Observation{Moved: 9000, MovedKnown: true, Terminal: true})
	require.NoError(t, err)
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 4000}, daily, "at most the exposure: the rest moved outside this key")

	changed, err = f.s.ObserveObject(ctx, id, "pi_unknown", Observation{Terminal: true})
	require.NoError(t, err)
	assert.False(t, changed)
	_, err = f.s.ObserveObject(ctx, id, "", Observation{})
	assert.ErrorIs(t, err, ErrInvalid)
}

// A declined creation that left its PaymentIntent behind keeps its money counted:
// a commit of nothing with the hold kept as exposure.
func TestDeclinedCreationKeepsExposure(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	for i := range 2 {
		settleOn(t, f.s, id, fmt.Sprintf("declined-%d", i), 5000, 0, fmt.Sprintf("pi_%d", i), ObjectSettle{Created: true, Expose: true})
	}
	res := MustReserve(t, f.s, charge(id, "third", 5000))
	assert.Equal(t, ReserveRefused, res.Outcome, "two confirmable 50.00 PaymentIntents fill a 100.00 cap")
}

// An overrun is the one commit above what was held; it is booked and excused, and
// the ledger says so.
func TestOverrunIsRecorded(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 4000, 0, "in_1", ObjectSettle{Created: true, Expose: true})
	require.Equal(t, ReserveClaimed, MustReserve(t, f.s, charge(id, "pay", 5000)).Outcome)
	req := SettleRequest{KeyID: id, IdempotencyKey: "pay", Outcome: SettleCommit, Amount: 12000, ObjectID: "in_1",
		Object: ObjectSettle{Terminal: true, Moved: 12000, MovedKnown: true}}
	assert.ErrorIs(t, f.s.Settle(ctx, req), ErrInvalid, "above hold + exposure without AllowOverrun")
	req.AllowOverrun = true
	MustSettle(t, f.s, req)
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 12000}, daily, "the money moved: booked past the cap")
	events, _, err := f.s.ListEvents(ctx, id, 10, "")
	require.NoError(t, err)
	var settled *Event
	for i := range events {
		if events[i].Decision == "settled" && events[i].HoldID == HoldID(id, "pay") {
			settled = &events[i]
		}
	}
	require.NotNil(t, settled)
	assert.Equal(t, []int64{3000, 3000}, settled.AllowanceDeltas, "12000 − (5000 held + 4000 exposure), on each window")
	require.NoError(t, f.s.CheckInvariant(ctx))
}

// Live exposure is money held: the reaper keeps it, however old.
func TestReapKeepsLiveExposure(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "live", 1000, 0, "cs_live", ObjectSettle{Created: true, Expose: true})
	settleOn(t, f.s, id, "done", 1000, 1000, "ch_done", ObjectSettle{Created: true, Terminal: true})
	f.clock.Set(t0.Add(ObjectRetention + 48*time.Hour))
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
func TestConcurrentCommitsAgainstOneObject(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 8000, 0, "pi_1", ObjectSettle{Created: true, Expose: true})
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			idem := fmt.Sprintf("cap-%02d", i)
			if _, err := f.s.Reserve(ctx, charge(id, idem, 0)); err != nil {
				errs[i] = err
				return
			}
			// Each claims 1000 of the exposure; the last eight find none left.
			errs[i] = f.s.Settle(ctx, SettleRequest{KeyID: id, IdempotencyKey: idem, Outcome: SettleCommit,
				Amount: 1000, ObjectID: "pi_1", Object: ObjectSettle{Expose: true}})
		}()
	}
	wg.Wait()
	var ok, invalid int
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case assert.ErrorIs(t, err, ErrInvalid):
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
func TestCheckInvariantDetectsExposureAndAllowance(t *testing.T) {
	cases := map[string]func(tx *bolt.Tx, keyID string) error{
		"exposure part without held": func(tx *bolt.Tx, keyID string) error {
			o, _, err := getObject(tx, keyID, "pi_1")
			if err != nil {
				return err
			}
			o.addPart("hold_x", []string{"day:2026-09-14", "period"}, 500, t0)
			return putObject(tx, keyID, "pi_1", o)
		},
		"allowance without a ledger entry": func(tx *bolt.Tx, keyID string) error {
			c, _, err := getCounter(tx, keyID, "period")
			if err != nil {
				return err
			}
			c.Allowance += 7000
			c.Committed += 7000
			if err := putCounter(tx, keyID, "period", c); err != nil {
				return err
			}
			return putEvent(tx, &Event{KeyID: keyID, WindowIDs: []string{"period"}, CommittedDelta: 7000})
		},
	}
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			f := newMeteringFixture(t)
			settleOn(t, f.s, f.key.ID, "create", 3000, 0, "pi_1", ObjectSettle{Created: true, Expose: true})
			require.NoError(t, f.s.CheckInvariant(context.Background()), "consistent before")
			require.NoError(t, f.s.db.Update(func(tx *bolt.Tx) error { return corrupt(tx, f.key.ID) }))
			assert.ErrorIs(t, f.s.CheckInvariant(context.Background()), ErrInvariant)
			require.NoError(t, f.s.Close()) // the cleanup's check would fail, as it should
		})
	}
}
