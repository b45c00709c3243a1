package vaulttest

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// renewalOf is a draft renewal invoice of amount on subscription sub.
func renewalOf(sub, invoice string, amount int64) vault.Renewal {
	return vault.Renewal{Upstream: "default", InvoiceID: invoice, SubscriptionID: sub, AmountDue: amount, Currency: "usd",
		Draft: true, EventID: "evt_" + invoice}
}

// renewalPolicy is a key that may start subscriptions, with caps of 100.00
// a day and 150.00 a period.
func renewalPolicy(tb testing.TB) policy.Policy {
	p := Policy(tb, "100.00", "150.00", "")
	p.Operations = append(slices.Clone(policy.DefaultOperations), "subscriptions.create")
	return p
}

// mustLink links the subscription sub to keyID.
func mustLink(tb testing.TB, s vault.Store, keyID, sub string) {
	tb.Helper()
	_, created, err := s.LinkObject(context.Background(), vault.ObjectLink{Upstream: "default", ObjectID: sub, KeyID: keyID})
	require.NoError(tb, err)
	require.True(tb, created)
}

// A renewal under the caps is held as its invoice's exposure, once however
// often Stripe tells of it; paid, it is committed from that exposure.
func testRenewalHeldThenPaid(t *testing.T) {
	ctx := context.Background()
	f := newFixtureWith(t, "k", renewalPolicy(t))
	id := f.key.ID
	mustLink(t, f.s, id, "sub_1")

	res, err := f.s.ApplyRenewal(ctx, renewalOf("sub_1", "in_r1", 4000))
	require.NoError(t, err)
	assert.True(t, res.Applied)
	assert.Equal(t, vault.RenewalHeld, res.Link.Renewal)
	assert.Equal(t, id, res.Link.KeyID)
	assert.Equal(t, "sub_1", res.Link.Via)
	assert.Equal(t, vault.Exposure{Held: 4000, MovedSeen: true, Own: true}, exposureOf(t, f.s, id, "in_r1"))

	again, err := f.s.ApplyRenewal(ctx, renewalOf("sub_1", "in_r1", 4000))
	require.NoError(t, err)
	assert.False(t, again.Applied, "a duplicate event changes nothing")
	assert.Equal(t, vault.RenewalHeld, again.Link.Renewal)
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Held: 4000}, daily)

	_, err = f.s.ObserveObject(ctx, id, "in_r1", vault.Observation{Operation: "stripe_event", Moved: 4000, MovedKnown: true, Terminal: true})
	require.NoError(t, err)
	daily, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 4000}, daily, "invoice.paid commits the renewal")
	link, err := f.s.GetLink(ctx, "default", "in_r1")
	require.NoError(t, err)
	assert.Equal(t, vault.RenewalHeld, link.Renewal, "the invoice is linked to the key")

	evs, _, err := f.s.ListEvents(ctx, id, 10, "")
	require.NoError(t, err)
	var renewals int
	for _, e := range evs {
		if e.Operation == "invoices.renewal" {
			renewals++
			assert.Equal(t, "evt_in_r1", e.StripeRequestID, "the ledger names the event")
		}
	}
	assert.Equal(t, 1, renewals)
}

// A renewal over a cap under pause_over_cap holds nothing, queues the pause
// Stripe must be told of and emits renewal.paused, once.
func testRenewalOverCapPaused(t *testing.T) {
	ctx := context.Background()
	f := newFixtureWith(t, "k", renewalPolicy(t))
	id := f.key.ID
	MustWebhook(t, f.s, []string{vault.EventRenewalPaused}, nil)
	MustCommit(t, f.s, id, "spent", 9000)
	mustLink(t, f.s, id, "sub_1")

	res, err := f.s.ApplyRenewal(ctx, renewalOf("sub_1", "in_r1", 4000))
	require.NoError(t, err)
	assert.Equal(t, vault.RenewalPaused, res.Link.Renewal)
	assert.Contains(t, res.Message, "daily cap")
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 9000}, daily, "nothing held")
	_, ok, err := f.s.ObjectExposure(ctx, id, "in_r1")
	require.NoError(t, err)
	assert.False(t, ok)

	due, err := f.s.DuePauses(ctx, 10)
	require.NoError(t, err)
	require.Len(t, due, 1)
	assert.Equal(t, vault.RenewalPause{Upstream: "default", InvoiceID: "in_r1", KeyID: id, NextAt: T0, CreatedAt: T0}, due[0])

	jobs := claimAll(t, f.s)
	require.Len(t, jobs, 1)
	var body struct {
		Type string         `json:"type"`
		Data map[string]any `json:"data"`
	}
	require.NoError(t, json.Unmarshal(jobs[0].Body, &body))
	assert.Equal(t, vault.EventRenewalPaused, body.Type)
	assert.Equal(t, "in_r1", body.Data["invoice_id"])
	assert.Equal(t, "sub_1", body.Data["subscription_id"])
	assert.Equal(t, "40.00", body.Data["amount_due"])
	assert.Equal(t, "100.00", body.Data["cap"])
	assert.Equal(t, "10.00", body.Data["remaining"])

	again, err := f.s.ApplyRenewal(ctx, renewalOf("sub_1", "in_r1", 4000))
	require.NoError(t, err)
	assert.False(t, again.Applied)
	assert.Empty(t, claimAll(t, f.s), "renewal.paused once")

	require.NoError(t, f.s.PauseFailed(ctx, "default", "in_r1", T0.Add(time.Minute), "stripe unavailable"))
	due, err = f.s.DuePauses(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, due, "not before its retry")
	f.clock.Advance(time.Minute)
	due, err = f.s.DuePauses(ctx, 10)
	require.NoError(t, err)
	require.Len(t, due, 1)
	assert.Equal(t, 1, due[0].Attempts)
	assert.Equal(t, "stripe unavailable", due[0].LastError)
	require.NoError(t, f.s.PauseSent(ctx, "default", "in_r1", ""))
	due, err = f.s.DuePauses(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, due)
}

// A pause Stripe refuses for good (the draft was finalised meanwhile) counts
// the renewal after all: the money Stripe collects is committed from it.
func testRenewalStripeWouldNotPauseIsCounted(t *testing.T) {
	ctx := context.Background()
	f := newFixtureWith(t, "k", renewalPolicy(t))
	id := f.key.ID
	MustCommit(t, f.s, id, "spent", 9000)
	mustLink(t, f.s, id, "sub_1")
	_, err := f.s.ApplyRenewal(ctx, renewalOf("sub_1", "in_r1", 4000))
	require.NoError(t, err)
	require.NoError(t, f.s.PauseSent(ctx, "default", "in_r1", "Stripe answered 400"))
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 9000, Held: 4000}, daily)
	link, err := f.s.GetLink(ctx, "default", "in_r1")
	require.NoError(t, err)
	assert.Equal(t, vault.RenewalCounted, link.Renewal)
	_, err = f.s.ObserveObject(ctx, id, "in_r1", vault.Observation{Operation: "stripe_event", Moved: 4000, MovedKnown: true, Terminal: true})
	require.NoError(t, err)
	daily, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 13000}, daily, "what Stripe collected is counted")
}

// Under renewals "count" a renewal over a cap is held anyway, the excess
// excused as an allowance (the invariant holds), and never paused; voided,
// it is released.
func testRenewalCountedOverCap(t *testing.T) {
	ctx := context.Background()
	p := renewalPolicy(t)
	p.Renewals = policy.RenewalsCount
	f := newFixtureWith(t, "k", p)
	id := f.key.ID
	MustWebhook(t, f.s, []string{vault.EventThresholdCrossed, vault.EventRenewalPaused}, []int{100})
	MustCommit(t, f.s, id, "spent", 9000)
	mustLink(t, f.s, id, "sub_1")

	res, err := f.s.ApplyRenewal(ctx, renewalOf("sub_1", "in_r1", 4000))
	require.NoError(t, err)
	assert.Equal(t, vault.RenewalCounted, res.Link.Renewal)
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 9000, Held: 4000}, daily)
	due, err := f.s.DuePauses(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, due, "count never touches the invoice")
	jobs := claimAll(t, f.s)
	require.Len(t, jobs, 1)
	assert.Equal(t, vault.EventThresholdCrossed, jobs[0].EventType, "the usual alert")
	require.NoError(t, f.s.CheckInvariant(ctx))

	_, err = f.s.ObserveObject(ctx, id, "in_r1", vault.Observation{Operation: "stripe_event", MovedKnown: true, Terminal: true})
	require.NoError(t, err)
	daily, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 9000}, daily, "invoice.voided releases it")
}

// A renewal first heard of once Stripe finalised it cannot be paused: it is
// counted, whatever the mode.
func testRenewalFinalisedIsCounted(t *testing.T) {
	ctx := context.Background()
	f := newFixtureWith(t, "k", renewalPolicy(t))
	id := f.key.ID
	MustCommit(t, f.s, id, "spent", 9000)
	mustLink(t, f.s, id, "sub_1")
	r := renewalOf("sub_1", "in_r1", 4000)
	r.Draft = false
	res, err := f.s.ApplyRenewal(ctx, r)
	require.NoError(t, err)
	assert.Equal(t, vault.RenewalCounted, res.Link.Renewal)
	assert.Contains(t, res.Message, "finalised before keybrake heard of it")
	due, err := f.s.DuePauses(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, due)
}

// A key in report mode enforces nothing: its renewal over the cap is counted,
// not paused.
func testRenewalInReportModeIsCounted(t *testing.T) {
	ctx := context.Background()
	p := renewalPolicy(t)
	p.Mode = policy.ModeReport
	f := newFixtureWith(t, "k", p)
	MustCommit(t, f.s, f.key.ID, "spent", 9000)
	mustLink(t, f.s, f.key.ID, "sub_1")
	res, err := f.s.ApplyRenewal(ctx, renewalOf("sub_1", "in_r1", 4000))
	require.NoError(t, err)
	assert.Equal(t, vault.RenewalCounted, res.Link.Renewal)
	due, err := f.s.DuePauses(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, due)
}

// A renewal over a budget's cap is paused like one over the key's: the one
// comparison, closest scope first.
func testRenewalOverBudgetCapPaused(t *testing.T) {
	ctx := context.Background()
	f := newFixtureWith(t, "k", renewalPolicy(t))
	b, err := f.s.CreateBudget(ctx, "tester", vault.BudgetSpec{Name: "team", Currency: "usd", DailyCap: MustDec(t, "30.00"),
		ExpiresAt: T0.Add(30 * 24 * time.Hour)})
	require.NoError(t, err)
	p := renewalPolicy(t)
	p.Budget = b.ID
	k, _ := MustMint(t, f.s, "member", p, nil)
	mustLink(t, f.s, k.ID, "sub_1")
	res, err := f.s.ApplyRenewal(ctx, renewalOf("sub_1", "in_r1", 4000))
	require.NoError(t, err)
	assert.Equal(t, vault.RenewalPaused, res.Link.Renewal)
	assert.Contains(t, res.Message, `budget "team"`)
}

// Links: the first stands; a renewal needs a linked subscription; bad input
// changes nothing; an ended subscription's link goes with the retention.
func testLinksAndTheirRetention(t *testing.T) {
	ctx := context.Background()
	f := newFixtureWith(t, "k", renewalPolicy(t))
	id := f.key.ID
	other, _ := MustMint(t, f.s, "other", Policy(t, "100.00", "150.00", ""), nil)
	mustLink(t, f.s, id, "sub_1")
	l, created, err := f.s.LinkObject(ctx, vault.ObjectLink{Upstream: "default", ObjectID: "sub_1", KeyID: other.ID})
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, id, l.KeyID, "the first link stands")

	_, err = f.s.ApplyRenewal(ctx, renewalOf("sub_nobody", "in_r1", 4000))
	assert.ErrorIs(t, err, vault.ErrNotFound)
	for name, r := range map[string]vault.Renewal{
		"no invoice":      {Upstream: "default", SubscriptionID: "sub_1", AmountDue: 1, Currency: "usd"},
		"negative amount": {Upstream: "default", InvoiceID: "in_1", SubscriptionID: "sub_1", AmountDue: -1, Currency: "usd"},
		"no currency":     {Upstream: "default", InvoiceID: "in_1", SubscriptionID: "sub_1", AmountDue: 1},
	} {
		_, err := f.s.ApplyRenewal(ctx, r)
		assert.ErrorIs(t, err, vault.ErrInvalid, name)
	}
	_, _, err = f.s.LinkObject(ctx, vault.ObjectLink{Upstream: "default", ObjectID: "", KeyID: id})
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, _, err = f.s.LinkObject(ctx, vault.ObjectLink{Upstream: "default", ObjectID: "sub_2", KeyID: "key_nope"})
	assert.ErrorIs(t, err, vault.ErrNotFound)
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{}, daily)

	require.NoError(t, f.s.EndLink(ctx, "default", "sub_1"))
	f.clock.Advance(vault.ObjectRetention - time.Hour)
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	_, err = f.s.GetLink(ctx, "default", "sub_1")
	require.NoError(t, err, "kept within the retention")
	f.clock.Advance(2 * time.Hour)
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	_, err = f.s.GetLink(ctx, "default", "sub_1")
	assert.ErrorIs(t, err, vault.ErrNotFound)
}

// A renewal carried by a Stripe event is metered in the transaction that
// records the event's id: a duplicate delivery changes nothing, and the
// invoice's later event is applied to its exposure like any object's.
func testRenewalInTheEventsTransaction(t *testing.T) {
	ctx := context.Background()
	f := newFixtureWith(t, "k", renewalPolicy(t))
	id := f.key.ID
	mustLink(t, f.s, id, "sub_1")
	event := func(evID string, moved int64, terminal bool, in *vault.IndirectEvent) vault.StripeEventResult {
		t.Helper()
		res, err := f.s.ApplyStripeEvent(ctx, vault.StripeEvent{ID: evID, Type: "invoice.updated", Upstream: "default", SignedAt: f.clock.Now(),
			ObjectID: in.Renewal.InvoiceID, Indirect: in, Read: func(string) (vault.Observation, bool) {
				return vault.Observation{Moved: moved, MovedKnown: true, Terminal: terminal}, true
			}})
		require.NoError(t, err)
		return res
	}
	created := &vault.IndirectEvent{Renewal: &vault.Renewal{InvoiceID: "in_r1", SubscriptionID: "sub_1", AmountDue: 4000,
		Currency: "usd", Draft: true}}
	res := event("evt_1", 0, false, created)
	assert.Equal(t, vault.StripeEventApplied, res.Outcome)
	assert.Equal(t, vault.RenewalHeld, res.Renewal)
	assert.Equal(t, []string{"in_r1"}, res.Linked)
	assert.Equal(t, vault.StripeEventDuplicate, event("evt_1", 0, false, created).Outcome)
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Held: 4000}, daily)

	paid := &vault.IndirectEvent{Renewal: &vault.Renewal{InvoiceID: "in_r1", SubscriptionID: "sub_1", AmountDue: 4000, Currency: "usd"}}
	res = event("evt_2", 4000, true, paid)
	assert.Equal(t, vault.StripeEventApplied, res.Outcome)
	assert.Empty(t, res.Linked, "decided once, by the first event")
	daily, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 4000}, daily, "invoice.paid commits it")

	other := &vault.IndirectEvent{Renewal: &vault.Renewal{InvoiceID: "in_x", SubscriptionID: "sub_nobody", AmountDue: 4000, Currency: "usd", Draft: true}}
	assert.Equal(t, vault.StripeEventDropped, event("evt_3", 0, false, other).Outcome, "a subscription no key started")
}

// A commit links what its request created in the settle's transaction; a
// release links nothing.
func testSettleLinksWhatItCreated(t *testing.T) {
	ctx := context.Background()
	f := newFixtureWith(t, "k", renewalPolicy(t))
	id := f.key.ID
	for _, c := range []struct {
		idem, sub string
		outcome   vault.SettleOutcome
	}{{"created", "sub_9", vault.SettleCommit}, {"declined", "sub_10", vault.SettleRelease}} {
		MustReserve(t, f.s, Charge(id, c.idem, 3000))
		amount := int64(3000)
		if c.outcome != vault.SettleCommit {
			amount = 0
		}
		MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: c.idem, Outcome: c.outcome, Amount: amount,
			Link: &vault.ObjectLink{ObjectID: c.sub}})
	}
	l, err := f.s.GetLink(ctx, "default", "sub_9")
	require.NoError(t, err)
	assert.Equal(t, id, l.KeyID)
	_, err = f.s.GetLink(ctx, "default", "sub_10")
	assert.ErrorIs(t, err, vault.ErrNotFound)
}
