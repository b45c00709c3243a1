package vaulttest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// testLapsedLeaseBecomesUnknown: a request whose process died leaves its
// record in flight; nobody waits for that process to come back. While its
// lease is live the reaper leaves it alone (another process may be serving
// it); once the lease lapsed the reaper turns it into outcome unknown with
// its hold still counted, and a retry with the same idempotency key resumes
// it under the same hold.
func testLapsedLeaseBecomesUnknown(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	claimed := MustReserve(t, f.s, Charge(id, "dies", 4000))
	require.Equal(t, vault.ReserveClaimed, claimed.Outcome)
	lease := claimed.Record.LeaseUntil

	f.clock.Set(lease.Add(-time.Second))
	_, err := f.s.Reap(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[vault.RecordState]int{vault.RecordInProgress: 1}, recordStates(t, f.s), "a live lease is left alone")
	n, err := f.s.CountHolds(ctx, vault.HoldUnknown)
	require.NoError(t, err)
	assert.Zero(t, n)

	f.clock.Set(lease)
	removed, err := f.s.Reap(ctx)
	require.NoError(t, err)
	assert.Zero(t, removed, "nothing is removed: the record is kept")
	assert.Equal(t, map[vault.RecordState]int{vault.RecordUnknown: 1}, recordStates(t, f.s))
	unknown, _, err := f.s.ListHolds(ctx, vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	require.Len(t, unknown, 1)
	assert.Equal(t, claimed.Hold.ID, unknown[0].ID)
	daily, period := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Held: 4000}, daily, "the hold is still counted")
	assert.Equal(t, policy.Counter{Held: 4000}, period)

	// The money may have moved: nothing new fits beyond what is held.
	refused := MustReserve(t, f.s, Charge(id, "more", 6001))
	assert.Equal(t, vault.ReserveRefused, refused.Outcome)

	res := MustReserve(t, f.s, Charge(id, "dies", 4000))
	require.Equal(t, vault.ReserveResume, res.Outcome)
	assert.Equal(t, claimed.Hold.ID, res.Hold.ID)
	assert.Equal(t, claimed.Record.UpstreamKey, res.Record.UpstreamKey, "forwarded again under the same upstream key")
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "dies", Outcome: vault.SettleCommit, Amount: 4000})
	daily, _ = usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 4000}, daily)
}

// testDaylightSavingDay: a key's day follows its time zone through a change
// of the clocks: the 23-hour day of spring forward in New York is one window,
// and the next day starts at its local midnight.
func testDaylightSavingDay(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	clock := NewClock(time.Date(2026, 3, 8, 0, 30, 0, 0, ny)) // EST, before the change at 02:00
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	p := Policy(t, "100.00", "", "")
	p.Timezone = "America/New_York"
	p.PeriodStart = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	p.ExpiresAt = time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	k, _ := MustMint(t, s, "ny", p, nil)

	first := MustReserve(t, s, Charge(k.ID, "early", 6000))
	require.Equal(t, vault.ReserveClaimed, first.Outcome)
	assert.Equal(t, []policy.WindowID{"day:2026-03-08", "period"}, first.Hold.WindowIDs)

	clock.Set(time.Date(2026, 3, 8, 23, 30, 0, 0, ny)) // EDT: 22 hours of wall time later, the same day
	late := MustReserve(t, s, Charge(k.ID, "late", 5000))
	assert.Equal(t, vault.ReserveRefused, late.Outcome, "60 + 50 would exceed the day's 100")

	clock.Set(time.Date(2026, 3, 9, 0, 0, 0, 0, ny))
	next := MustReserve(t, s, Charge(k.ID, "next", 5000))
	require.Equal(t, vault.ReserveClaimed, next.Outcome, "a new day at local midnight")
	assert.Equal(t, []policy.WindowID{"day:2026-03-09", "period"}, next.Hold.WindowIDs)
	_, windows, _, err := s.KeyUsage(context.Background(), k.ID)
	require.NoError(t, err)
	assert.Equal(t, time.Date(2026, 3, 10, 0, 0, 0, 0, ny), windows[0].End)
}

// testNoSecretOrTokenStored: what the store keeps — every key and value of
// every bucket — holds no upstream secret, no token and no stored answer in
// clear.
func testNoSecretOrTokenStored(t *testing.T) {
	s := mustOpen(t, NewClock(T0))
	AssertNoSecretStored(t, s, func() []byte { return rawStore(t, s) })
}

// AssertNoSecretStored stores an upstream secret, two tokens of a key, a
// Stripe answer and a claim's result in s, then requires that none of them is
// in clear in what stored returns (a store's file, its tables), while the hash
// of a token, which is stored, is found there.
func AssertNoSecretStored(t *testing.T, s vault.Store, stored func() []byte) {
	ctx := context.Background()
	const secret = "sk_live_SuperSecretValue_9f8e7d6c5b4a"
	MustUpstream(t, s, secret)
	k, tok := MustMint(t, s, "k", Policy(t, "99", "", ""), nil)
	_, tok2, err := s.RotateKey(ctx, "a", k.ID)
	require.NoError(t, err)
	const body = `{"id":"ch_SecretResponseBody_123","object":"charge"}`
	MustReserve(t, s, Charge(k.ID, "a", 100))
	MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 100,
		Response: &vault.StoredResponse{Status: 200, Body: []byte(body)}})
	c, err := s.Claim(ctx, k.ID, "job", "fp", time.Minute)
	require.NoError(t, err)
	require.NoError(t, s.CompleteClaim(ctx, k.ID, "job", c.Claim.FencingToken, []byte(`{"ch":"ch_SecretClaimResult_456"}`)))

	raw := stored()
	for name, needle := range map[string]string{
		"secret":            secret,
		"secret body":       "SuperSecretValue",
		"first token":       tok,
		"first token body":  tok[3:],
		"second token":      tok2,
		"second token body": tok2[3:],
		"response body":     "ch_SecretResponseBody_123",
		"claim result":      "ch_SecretClaimResult_456",
	} {
		assert.False(t, bytes.Contains(raw, []byte(needle)), "%s found in the store", name)
	}
	assert.True(t, bytes.Contains(raw, []byte(TokenHash(tok2))), "the check itself can find what is there")
}

// testBackup: a store either writes a copy of itself, or says that its
// engine's own tools back it up (errors.ErrUnsupported) and writes nothing.
func testBackup(t *testing.T) {
	f := newMeteringFixture(t)
	MustCommit(t, f.s, f.key.ID, "a", 100)
	var buf bytes.Buffer
	n, err := f.s.Backup(context.Background(), &buf)
	if errors.Is(err, errors.ErrUnsupported) {
		assert.Zero(t, n)
		assert.Zero(t, buf.Len())
		return
	}
	require.NoError(t, err)
	assert.Positive(t, n)
	assert.Equal(t, int64(buf.Len()), n)
}
