package vaulttest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// Stripe's events: each id applied once, in the transaction of its effect;
// an object's event applied as a read of it is; an unknown hold settled by
// the event that names its upstream key.

// stripeEvent is an event about objectID signed at the store's clock, whose
// object moved moved (terminal: it can move no more) in usd.
func stripeEvent(f *meteringFixture, id, objectID string, moved int64, terminal bool) vault.StripeEvent {
	return vault.StripeEvent{
		ID: id, Type: "payment_intent.succeeded", Upstream: "default", SignedAt: f.clock.Now(), ObjectID: objectID,
		Read: func(currency string) (vault.Observation, bool) {
			return vault.Observation{Moved: moved, MovedKnown: true, Terminal: terminal}, currency == "usd"
		},
	}
}

func mustApply(tb testing.TB, s vault.Store, ev vault.StripeEvent) vault.StripeEventResult {
	tb.Helper()
	res, err := s.ApplyStripeEvent(context.Background(), ev)
	require.NoError(tb, err)
	return res
}

func testStripeEventAppliedOnce(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 6000, 0, "pi_1", vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true})
	older := stripeEvent(f, "evt_0", "pi_1", 0, false) // made before the payment, delivered after it

	res := mustApply(t, f.s, stripeEvent(f, "evt_1", "pi_1", 6000, true))
	assert.Equal(t, vault.StripeEventApplied, res.Outcome)
	assert.Equal(t, []string{id}, res.Keys)
	day, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 6000}, day)

	assert.Equal(t, vault.StripeEventDuplicate, mustApply(t, f.s, stripeEvent(f, "evt_1", "pi_1", 6000, true)).Outcome)
	assert.Equal(t, vault.StripeEventUnchanged, mustApply(t, f.s, older).Outcome, "an older event undoes nothing")
	day, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 6000}, day, "committed once")

	events, _, err := f.s.ListEvents(ctx, id, 10, "")
	require.NoError(t, err)
	require.NotEmpty(t, events)
	assert.Equal(t, vault.OperationStripeEvent, events[0].Operation)
	assert.Equal(t, "evt_1", events[0].StripeRequestID)
	assert.Equal(t, "pi_1", events[0].ObjectID)
	assert.EqualValues(t, 6000, events[0].CommittedDelta)

	// Nobody's object, another upstream's event, a replay outside the
	// tolerance, an object in another currency.
	assert.Equal(t, vault.StripeEventDropped, mustApply(t, f.s, stripeEvent(f, "evt_2", "pi_nobody", 100, true)).Outcome)
	settleOn(t, f.s, id, "create-2", 3000, 0, "pi_2", vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true})
	other := stripeEvent(f, "evt_3", "pi_2", 3000, true)
	other.Upstream = "eu"
	assert.Equal(t, vault.StripeEventDropped, mustApply(t, f.s, other).Outcome, "the key is not eu's")
	old := stripeEvent(f, "evt_4", "pi_2", 3000, true)
	old.SignedAt = f.clock.Now().Add(-vault.StripeEventTolerance - time.Second)
	assert.Equal(t, vault.StripeEventTooOld, mustApply(t, f.s, old).Outcome)
	old.SignedAt = f.clock.Now().Add(vault.StripeEventTolerance + time.Second)
	assert.Equal(t, vault.StripeEventTooOld, mustApply(t, f.s, old).Outcome)
	eur := stripeEvent(f, "evt_5", "pi_2", 3000, true)
	eur.Read = func(string) (vault.Observation, bool) { return vault.Observation{}, false }
	assert.Equal(t, vault.StripeEventUnchanged, mustApply(t, f.s, eur).Outcome)
	day, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 6000, Held: 3000}, day, "none of them changed anything")

	// The replay turned down was not recorded: signed in time, it applies.
	old.SignedAt = f.clock.Now()
	assert.Equal(t, vault.StripeEventApplied, mustApply(t, f.s, old).Outcome)
	day, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 9000}, day)
	require.NoError(t, f.s.CheckInvariant(ctx))

	_, err = f.s.ApplyStripeEvent(ctx, vault.StripeEvent{Upstream: "default", SignedAt: f.clock.Now(), Read: older.Read})
	assert.ErrorIs(t, err, vault.ErrInvalid, "no id")
}

// A part of what the object moved, then the rest and the end, in any order.
func testStripeEventMovesOnlyForward(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "auth", 6000, 0, "pi_1", vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true})
	final := stripeEvent(f, "evt_final", "pi_1", 5000, true)
	partial := stripeEvent(f, "evt_partial", "pi_1", 2000, false)

	assert.Equal(t, vault.StripeEventApplied, mustApply(t, f.s, final).Outcome)
	assert.Equal(t, vault.StripeEventUnchanged, mustApply(t, f.s, partial).Outcome)
	day, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 5000}, day, "5000 captured, the rest released; the late partial changes nothing")

	// A read through keybrake after the event counts nothing twice.
	settleOn(t, f.s, id, "auth-2", 4000, 0, "pi_2", vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true})
	assert.Equal(t, vault.StripeEventApplied, mustApply(t, f.s, stripeEvent(f, "evt_2", "pi_2", 1000, false)).Outcome)
	changed, err := f.s.ObserveObject(context.Background(), id, "pi_2", vault.Observation{Moved: 1000, MovedKnown: true})
	require.NoError(t, err)
	assert.False(t, changed)
	day, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 6000, Held: 3000}, day)

	// A request's answer settled after a newer event (the answer shows 500
	// moved, the event 1000) does not set what the object moved back: the
	// next event counts only what moved since.
	settleOn(t, f.s, id, "update-2", 0, 0, "pi_2", vault.ObjectSettle{Expose: true, MovedKnown: true, Moved: 500})
	assert.Equal(t, vault.StripeEventUnchanged, mustApply(t, f.s, stripeEvent(f, "evt_3", "pi_2", 1000, false)).Outcome)
	day, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 6000, Held: 3000}, day, "nothing counted twice")

	// A confirmation through keybrake in flight while Stripe's event of its
	// payment is applied: the confirmation's answer shows the same money the
	// event committed, and it is counted once.
	settleOn(t, f.s, id, "create-3", 1000, 0, "pi_3", vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true})
	require.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, Charge(id, "confirm-3", 0)).Outcome)
	assert.Equal(t, vault.StripeEventApplied, mustApply(t, f.s, stripeEvent(f, "evt_4", "pi_3", 1000, true)).Outcome)
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "confirm-3", Outcome: vault.SettleCommit, Amount: 1000, AllowOverrun: true,
		ObjectID: "pi_3", Object: vault.ObjectSettle{Expose: true, MovedKnown: true, Moved: 1000, Terminal: true}, Response: &vault.StoredResponse{Status: 200}})
	day, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 7000, Held: 3000}, day, "the confirmation's 10.00 counted once")
	require.NoError(t, f.s.CheckInvariant(context.Background()))
}

// The unknown hold whose upstream key the event names is settled from the
// event's object: what it moved committed, the rest kept as its exposure.
func testStripeEventSettlesUnknownHold(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	create := func(idem string) string {
		req := Charge(id, idem, 4000)
		req.Request.Operation = "payment_intents.create"
		res := MustReserve(t, f.s, req)
		require.Equal(t, vault.ReserveClaimed, res.Outcome)
		MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: idem, Outcome: vault.SettleUnknown})
		return res.Hold.ID
	}
	h1, h2 := create("create-1"), create("create-2")

	ev := stripeEvent(f, "evt_1", "pi_1", 1500, false)
	ev.IdempotencyKey = vault.UpstreamKey(id, "create-1")
	res := mustApply(t, f.s, ev)
	assert.Equal(t, vault.StripeEventApplied, res.Outcome)
	assert.Equal(t, []string{h1}, res.Resolved)
	unknown, _, err := f.s.ListHolds(ctx, vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	require.Len(t, unknown, 1)
	assert.Equal(t, h2, unknown[0].ID, "only the hold the event names")
	exp, ok, err := f.s.ObjectExposure(ctx, id, "pi_1")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, vault.Exposure{Held: 2500, Committed: 1500, Moved: 1500, MovedSeen: true, Own: true}, exp)
	day, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 1500, Held: 2500 + 4000}, day)
	events, _, err := f.s.ListEvents(ctx, id, 1, "")
	require.NoError(t, err)
	assert.Equal(t, vault.DecisionResolved, events[0].Decision)
	assert.Equal(t, "stripe_event:evt_1", events[0].Reason)
	assert.Equal(t, "create-1", events[0].IdempotencyKey)

	// Another event naming the same key finds no unknown hold: applied to the
	// object, as any event.
	again := stripeEvent(f, "evt_2", "pi_1", 4000, true)
	again.IdempotencyKey = ev.IdempotencyKey
	res = mustApply(t, f.s, again)
	assert.Empty(t, res.Resolved)
	assert.Equal(t, []string{id}, res.Keys)
	day, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 4000, Held: 4000}, day)

	// A key of no hold of this store, or of another key's hold under another
	// upstream, settles nothing.
	stray := stripeEvent(f, "evt_3", "pi_2", 4000, true)
	stray.IdempotencyKey = vault.UpstreamKey(id, "never-sent")
	assert.Equal(t, vault.StripeEventDropped, mustApply(t, f.s, stray).Outcome)
	elsewhere := stripeEvent(f, "evt_4", "pi_2", 4000, true)
	elsewhere.IdempotencyKey, elsewhere.Upstream = vault.UpstreamKey(id, "create-2"), "eu"
	assert.Equal(t, vault.StripeEventDropped, mustApply(t, f.s, elsewhere).Outcome)
	unknown, _, err = f.s.ListHolds(ctx, vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	assert.Len(t, unknown, 1)
	require.NoError(t, f.s.CheckInvariant(ctx))
}

// An event id is kept for the retention, then pruned by the reaper.
func testStripeEventRetention(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	assert.Equal(t, vault.StripeEventDropped, mustApply(t, f.s, stripeEvent(f, "evt_1", "pi_x", 0, false)).Outcome)
	f.clock.Advance(vault.StripeEventRetention - time.Hour)
	_, err := f.s.Reap(ctx)
	require.NoError(t, err)
	assert.Equal(t, vault.StripeEventDuplicate, mustApply(t, f.s, stripeEvent(f, "evt_1", "pi_x", 0, false)).Outcome, "kept")
	f.clock.Advance(2 * time.Hour)
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	assert.Equal(t, vault.StripeEventDropped, mustApply(t, f.s, stripeEvent(f, "evt_1", "pi_x", 0, false)).Outcome, "pruned after the retention")
}

// Deliveries of one event at once, as two replicas may get them: applied once.
func testStripeEventConcurrentDeliveries(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 6000, 0, "pi_1", vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true})
	const n = 8
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		got = map[vault.StripeEventOutcome]int{}
	)
	for range n {
		wg.Go(func() {
			res, err := f.s.ApplyStripeEvent(context.Background(), stripeEvent(f, "evt_1", "pi_1", 6000, true))
			assert.NoError(t, err)
			mu.Lock()
			got[res.Outcome]++
			mu.Unlock()
		})
	}
	wg.Wait()
	assert.Equal(t, map[vault.StripeEventOutcome]int{vault.StripeEventApplied: 1, vault.StripeEventDuplicate: n - 1}, got)
	day, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 6000}, day)
}

// An upstream's webhook secrets: sealed, at most two, kept when its API
// secret is replaced.
func testUpstreamWebhookSecrets(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	secrets, err := f.s.UpstreamWebhookSecrets(ctx, "default")
	require.NoError(t, err)
	assert.Empty(t, secrets)
	up, err := f.s.SetUpstreamWebhookSecrets(ctx, "tester", "default", []string{"whsec_new1234", "whsec_old5678"})
	require.NoError(t, err)
	assert.Equal(t, []string{"1234", "5678"}, up.WebhookSecretsLast4)
	MustUpstream(t, f.s, "sk_test_replaced9999")
	secrets, err = f.s.UpstreamWebhookSecrets(ctx, "default")
	require.NoError(t, err)
	assert.Equal(t, []string{"whsec_new1234", "whsec_old5678"}, secrets)
	got, err := f.s.GetUpstream(ctx, "default")
	require.NoError(t, err)
	assert.Equal(t, []string{"1234", "5678"}, got.WebhookSecretsLast4)

	_, err = f.s.SetUpstreamWebhookSecrets(ctx, "tester", "default", []string{"whsec_a", "whsec_b", "whsec_c"})
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = f.s.SetUpstreamWebhookSecrets(ctx, "tester", "default", []string{" "})
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = f.s.SetUpstreamWebhookSecrets(ctx, "tester", "nosuch", nil)
	assert.ErrorIs(t, err, vault.ErrNotFound)
	_, err = f.s.UpstreamWebhookSecrets(ctx, "nosuch")
	assert.ErrorIs(t, err, vault.ErrNotFound)
	_, err = f.s.SetUpstreamWebhookSecrets(ctx, "tester", "default", nil)
	require.NoError(t, err)
	secrets, err = f.s.UpstreamWebhookSecrets(ctx, "default")
	require.NoError(t, err)
	assert.Empty(t, secrets)
}
