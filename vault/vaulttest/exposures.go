package vaulttest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// An operator's view of a key's money objects: the objects with live exposure,
// Stripe's answer applied at the operator's request, and a release without it.

// exposureFixture is a key with money objects in every state a listing must
// tell apart:
//
//	pi_a   6000 held since T0, created under the connected account acct_1
//	pi_b   2000 held on T0's day + 1000 raised the next day
//	ch_done settled: committed 1500, nothing held
//	pi_other another key's
type exposureFixture struct {
	*meteringFixture
	other vault.Key
}

func newExposureFixture(t *testing.T) *exposureFixture {
	t.Helper()
	f := &exposureFixture{meteringFixture: newMeteringFixture(t)}
	id := f.key.ID
	settleOn(t, f.s, id, "create-a", 6000, 0, "pi_a", vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true, StripeAccount: "acct_1"})
	settleOn(t, f.s, id, "create-b", 2000, 0, "pi_b", vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true})
	settleOn(t, f.s, id, "done", 1500, 1500, "ch_done", vault.ObjectSettle{Created: true, Terminal: true})
	f.other, _ = MustMint(t, f.s, "other", Policy(t, "100.00", "150.00", ""), nil)
	settleOn(t, f.s, f.other.ID, "create", 500, 0, "pi_other", vault.ObjectSettle{Created: true, Expose: true})
	f.clock.Advance(24 * time.Hour)
	settleOn(t, f.s, id, "raise-b", 1000, 0, "pi_b", vault.ObjectSettle{Expose: true})
	return f
}

func testListExposures(t *testing.T) {
	ctx := context.Background()
	f := newExposureFixture(t)
	id := f.key.ID

	all, next, err := f.s.ListExposures(ctx, id, 0, "")
	require.NoError(t, err)
	assert.Empty(t, next)
	require.Len(t, all, 2, "only the objects with live exposure, none of another key's")
	assert.Equal(t, vault.ExposedObject{
		ObjectID: "pi_a", Currency: "usd",
		Exposure:  vault.Exposure{Held: 6000, Own: true, MovedSeen: true, StripeAccount: "acct_1"},
		Windows:   []vault.WindowAmount{{WindowID: "day:2026-09-14", Amount: 6000}, {WindowID: "period", Amount: 6000}},
		CreatedAt: T0, UpdatedAt: T0,
	}, all[0])
	b := all[1]
	assert.Equal(t, "pi_b", b.ObjectID)
	assert.Equal(t, int64(3000), b.Held)
	assert.Equal(t, []vault.WindowAmount{
		{WindowID: "day:2026-09-14", Amount: 2000}, {WindowID: "period", Amount: 3000}, {WindowID: "day:2026-09-15", Amount: 1000},
	}, b.Windows, "each part on the windows it was placed on")
	assert.Equal(t, T0, b.CreatedAt, "when the key first counted it")
	assert.Equal(t, T0.Add(24*time.Hour), b.UpdatedAt)

	// One a page: the cursor walks on, and ends.
	page, next, err := f.s.ListExposures(ctx, id, 1, "")
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, "pi_a", page[0].ObjectID)
	require.NotEmpty(t, next)
	page, next, err = f.s.ListExposures(ctx, id, 1, next)
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, "pi_b", page[0].ObjectID)
	assert.Empty(t, next, "pi_b is the last object with exposure; ch_done after it has none")

	others, _, err := f.s.ListExposures(ctx, f.other.ID, 0, "")
	require.NoError(t, err)
	require.Len(t, others, 1)
	assert.Equal(t, "pi_other", others[0].ObjectID)

	_, _, err = f.s.ListExposures(ctx, id, 0, "!not-a-cursor")
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, _, err = f.s.ListExposures(ctx, "key_nope", 0, "")
	assert.ErrorIs(t, err, vault.ErrNotFound)
	fresh, _ := MustMint(t, f.s, "fresh", Policy(t, "100.00", "", ""), nil)
	none, next, err := f.s.ListExposures(ctx, fresh.ID, 0, "")
	require.NoError(t, err)
	assert.NotNil(t, none, "an empty page, not nil")
	assert.Empty(t, none)
	assert.Empty(t, next)
}

// auditEntries returns the audit entries of action, newest first.
func auditEntries(tb testing.TB, s vault.Store, action string) []vault.AuditEntry {
	tb.Helper()
	entries, _, err := s.ListAudit(context.Background(), 500, "")
	require.NoError(tb, err)
	var out []vault.AuditEntry
	for _, e := range entries {
		if e.Action == action {
			out = append(out, e)
		}
	}
	return out
}

// eventsOn returns the key's ledger events about objectID, newest first.
func eventsOn(tb testing.TB, s vault.Store, keyID, objectID string) []vault.Event {
	tb.Helper()
	events, _, err := s.ListEvents(context.Background(), keyID, 500, "")
	require.NoError(tb, err)
	var out []vault.Event
	for _, e := range events {
		if e.ObjectID == objectID {
			out = append(out, e)
		}
	}
	return out
}

// A refresh applies Stripe's answer as a read through keybrake would, and the
// audit log says who asked and what it changed.
func testRefreshExposure(t *testing.T) {
	ctx := context.Background()
	f := newExposureFixture(t)
	id := f.key.ID

	// Still live at Stripe: nothing changes, but the refresh is recorded.
	res, err := f.s.RefreshExposure(ctx, "alice", id, "pi_b", vault.Observation{Operation: "ignored", MovedKnown: true})
	require.NoError(t, err)
	assert.Zero(t, res.Committed)
	assert.Zero(t, res.Released)
	assert.Equal(t, res.Before, res.After)
	assert.Equal(t, int64(3000), res.After.Held)

	// Cancelled at Stripe: its exposure is released on the windows it held.
	res, err = f.s.RefreshExposure(ctx, "alice", id, "pi_b", vault.Observation{MovedKnown: true, Terminal: true})
	require.NoError(t, err)
	assert.Equal(t, int64(3000), res.Released)
	assert.Zero(t, res.Committed)
	assert.Equal(t, int64(3000), res.Before.Held)
	assert.Zero(t, res.After.Held)
	assert.True(t, res.After.Closed)
	assert.Empty(t, res.After.Windows)
	assert.Equal(t, policy.Counter{Held: 6000, Committed: 1500}, counterOf(t, f.s, id, "day:2026-09-14"), "pi_a's 6000 stay")
	assert.Equal(t, policy.Counter{}, counterOf(t, f.s, id, "day:2026-09-15"))
	var released int64
	for _, e := range eventsOn(t, f.s, id, "pi_b") {
		if e.Decision == vault.DecisionExposure {
			assert.Equal(t, "release", e.Reason)
			assert.Equal(t, "exposure.refresh", e.Operation, "the ledger names the operator's refresh")
			released += e.Amount
		}
	}
	assert.Equal(t, int64(3000), released)

	// Confirmed in a browser: what moved is committed from the exposure.
	res, err = f.s.RefreshExposure(ctx, "bob", id, "pi_a", vault.Observation{Moved: 6000, MovedKnown: true, Terminal: true})
	require.NoError(t, err)
	assert.Equal(t, int64(6000), res.Committed)
	assert.Zero(t, res.Released)
	assert.Equal(t, vault.Exposure{Committed: 6000, Moved: 6000, MovedSeen: true, Own: true, Closed: true, StripeAccount: "acct_1"}, res.After.Exposure)
	assert.Equal(t, policy.Counter{Committed: 7500}, counterOf(t, f.s, id, "day:2026-09-14"))
	exposed, _, err := f.s.ListExposures(ctx, id, 0, "")
	require.NoError(t, err)
	assert.Empty(t, exposed, "nothing is left exposed")

	// An object with nothing left: nothing to apply, still recorded.
	res, err = f.s.RefreshExposure(ctx, "bob", id, "ch_done", vault.Observation{Moved: 9000, MovedKnown: true})
	require.NoError(t, err)
	assert.Zero(t, res.Committed+res.Released)

	entries := auditEntries(t, f.s, "exposure.refresh")
	require.Len(t, entries, 4, "every refresh, changed or not")
	e := entries[1] // pi_a
	assert.Equal(t, "bob", e.Actor)
	assert.Equal(t, id, e.Target, "on the key's audit trail")
	var before, after map[string]any
	require.NoError(t, json.Unmarshal(e.Before, &before))
	require.NoError(t, json.Unmarshal(e.After, &after))
	assert.Equal(t, map[string]any{"object_id": "pi_a", "currency": "usd", "held": 6000.0, "committed": 0.0}, before)
	assert.Equal(t, map[string]any{"object_id": "pi_a", "currency": "usd", "held": 0.0, "committed": 6000.0, "moved": 6000.0, "closed": true}, after)

	for name, call := range map[string]func() error{
		"unknown object": func() error { _, err := f.s.RefreshExposure(ctx, "a", id, "pi_nope", vault.Observation{}); return err },
		"another's":      func() error { _, err := f.s.RefreshExposure(ctx, "a", id, "pi_other", vault.Observation{}); return err },
		"unknown key": func() error {
			_, err := f.s.RefreshExposure(ctx, "a", "key_nope", "pi_a", vault.Observation{})
			return err
		},
		"empty object id": func() error { _, err := f.s.RefreshExposure(ctx, "a", id, "", vault.Observation{}); return err },
		"negative moved": func() error {
			_, err := f.s.RefreshExposure(ctx, "a", id, "pi_a", vault.Observation{Moved: -1, MovedKnown: true})
			return err
		},
	} {
		want := vault.ErrNotFound
		if name == "empty object id" || name == "negative moved" {
			want = vault.ErrInvalid
		}
		assert.ErrorIs(t, call(), want, name)
	}
	assert.Len(t, auditEntries(t, f.s, "exposure.refresh"), 4, "a refused refresh writes nothing")
	require.NoError(t, f.s.CheckInvariant(ctx))
}

// An operator may release an exposure without Stripe's word: the ledger and the
// audit log record it as the operator's decision.
func testReleaseExposure(t *testing.T) {
	ctx := context.Background()
	f := newExposureFixture(t)
	id := f.key.ID

	res, err := f.s.ReleaseExposure(ctx, "carol", id, "pi_b")
	require.NoError(t, err)
	assert.Equal(t, int64(3000), res.Released)
	assert.Zero(t, res.Committed)
	assert.Zero(t, res.After.Held)
	assert.False(t, res.After.Closed, "Stripe never said it was done")
	assert.Equal(t, policy.Counter{Held: 6000, Committed: 1500}, counterOf(t, f.s, id, "day:2026-09-14"))
	assert.Equal(t, policy.Counter{}, counterOf(t, f.s, id, "day:2026-09-15"))
	_, period := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Held: 6000, Committed: 1500}, period)

	events := eventsOn(t, f.s, id, "pi_b")
	require.GreaterOrEqual(t, len(events), 2)
	for _, e := range events[:2] { // one per part, newest first
		assert.Equal(t, vault.DecisionResolved, e.Decision)
		assert.Equal(t, "operator:released", e.Reason)
		assert.Equal(t, "exposure.release", e.Operation)
		assert.Equal(t, -e.Amount, e.HeldDelta)
	}
	assert.Equal(t, int64(3000), events[0].Amount+events[1].Amount)

	entries := auditEntries(t, f.s, "exposure.release")
	require.Len(t, entries, 1)
	assert.Equal(t, "carol", entries[0].Actor)
	assert.Equal(t, id, entries[0].Target)
	assert.Contains(t, string(entries[0].Before), `"held":3000`)

	_, err = f.s.ReleaseExposure(ctx, "carol", id, "pi_b")
	assert.ErrorIs(t, err, vault.ErrConflict, "nothing is left to release")
	_, err = f.s.ReleaseExposure(ctx, "carol", id, "ch_done")
	assert.ErrorIs(t, err, vault.ErrConflict)
	_, err = f.s.ReleaseExposure(ctx, "carol", id, "pi_nope")
	assert.ErrorIs(t, err, vault.ErrNotFound)
	_, err = f.s.ReleaseExposure(ctx, "carol", id, "")
	assert.ErrorIs(t, err, vault.ErrInvalid)
	assert.Len(t, auditEntries(t, f.s, "exposure.release"), 1)
	require.NoError(t, f.s.CheckInvariant(ctx))
}

// The connected account an object was settled under is kept for later lookups,
// and follows the last answer.
func testExposureKeepsItsAccount(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	settleOn(t, f.s, id, "create", 3000, 0, "pi_1", vault.ObjectSettle{Created: true, Expose: true, StripeAccount: "acct_1", StripeContext: "acct_1/acct_2"})
	exp := exposureOf(t, f.s, id, "pi_1")
	assert.Equal(t, "acct_1", exp.StripeAccount)
	assert.Equal(t, "acct_1/acct_2", exp.StripeContext)
	settleOn(t, f.s, id, "raise", 1000, 0, "pi_1", vault.ObjectSettle{Expose: true, StripeAccount: "acct_1"})
	exp = exposureOf(t, f.s, id, "pi_1")
	assert.Equal(t, "acct_1", exp.StripeAccount)
	assert.Empty(t, exp.StripeContext)
}
