package vaulttest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// claimFixture is a store with one active key, on a settable clock.
type claimFixture struct {
	s     *Store
	clock *Clock
	key   vault.Key
}

func newClaimFixture(t *testing.T) *claimFixture {
	t.Helper()
	clock := NewClock(T0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := MustMint(t, s, "claims", Policy(t, "100.00", "", ""), nil)
	return &claimFixture{s: s, clock: clock, key: k}
}

// MustClaim claims and requires no error.
func MustClaim(tb testing.TB, s *Store, keyID, key, fp string, lease time.Duration) vault.ClaimResult {
	tb.Helper()
	res, err := s.Claim(context.Background(), keyID, key, fp, lease)
	require.NoError(tb, err)
	return res
}

func testClaimLifecycle(t *testing.T) {
	ctx := context.Background()
	f := newClaimFixture(t)
	id := f.key.ID
	const lease = time.Minute

	first := MustClaim(t, f.s, id, "job-1", "fp-a", lease)
	require.Equal(t, vault.ClaimOutcomeClaimed, first.Outcome)
	assert.False(t, first.TookOver)
	assert.NotZero(t, first.Claim.FencingToken)
	assert.Equal(t, vault.ClaimInProgress, first.Claim.State)
	assert.Equal(t, T0.Add(lease), first.Claim.LeaseExpiresAt)
	assert.Equal(t, T0, first.Claim.CreatedAt)

	busy := MustClaim(t, f.s, id, "job-1", "fp-a", lease)
	assert.Equal(t, vault.ClaimOutcomeInProgress, busy.Outcome)
	assert.Equal(t, T0.Add(lease), busy.Claim.LeaseExpiresAt, "the live lease, for Retry-After")
	assert.Zero(t, busy.Claim.FencingToken, "the owner's token is never shown to another caller")

	other := MustClaim(t, f.s, id, "job-1", "fp-b", lease)
	assert.Equal(t, vault.ClaimOutcomeFingerprintMismatch, other.Outcome)
	assert.Zero(t, other.Claim.FencingToken)

	got, err := f.s.GetClaim(ctx, id, "job-1")
	require.NoError(t, err)
	assert.Equal(t, vault.ClaimInProgress, got.State)
	assert.Zero(t, got.FencingToken)
	assert.Nil(t, got.Result)

	err = f.s.CompleteClaim(ctx, id, "job-1", first.Claim.FencingToken+1, []byte(`{"x":1}`))
	assert.ErrorIs(t, err, vault.ErrConflict, "a token that is not the owner's")
	f.clock.Advance(time.Second)
	result := []byte(`{"charge":"ch_123","amount":6000}`)
	require.NoError(t, f.s.CompleteClaim(ctx, id, "job-1", first.Claim.FencingToken, result))
	require.NoError(t, f.s.CompleteClaim(ctx, id, "job-1", first.Claim.FencingToken, result),
		"the owner's retry with the same result succeeds")
	err = f.s.CompleteClaim(ctx, id, "job-1", first.Claim.FencingToken, []byte(`{"charge":"ch_999"}`))
	assert.ErrorIs(t, err, vault.ErrConflict, "a completed claim keeps its first result")
	assert.ErrorIs(t, f.s.ReleaseClaim(ctx, id, "job-1", first.Claim.FencingToken), vault.ErrConflict, "a completed claim cannot be released")

	done := MustClaim(t, f.s, id, "job-1", "fp-a", lease)
	require.Equal(t, vault.ClaimOutcomeCompleted, done.Outcome)
	assert.JSONEq(t, string(result), string(done.Claim.Result))
	assert.Equal(t, vault.ClaimCompleted, done.Claim.State)
	assert.Equal(t, T0.Add(time.Second), done.Claim.CompletedAt)
	assert.True(t, done.Claim.LeaseExpiresAt.IsZero())
	assert.Zero(t, done.Claim.FencingToken)

	assert.Equal(t, vault.ClaimOutcomeFingerprintMismatch, MustClaim(t, f.s, id, "job-1", "fp-b", lease).Outcome,
		"a completed claim is bound to its fingerprint too")

	got, err = f.s.GetClaim(ctx, id, "job-1")
	require.NoError(t, err)
	assert.Equal(t, vault.ClaimCompleted, got.State)
	assert.JSONEq(t, string(result), string(got.Result))

	_, err = f.s.GetClaim(ctx, id, "job-2")
	assert.ErrorIs(t, err, vault.ErrNotFound)
	assert.ErrorIs(t, f.s.CompleteClaim(ctx, id, "job-2", 1, []byte(`1`)), vault.ErrNotFound)
	assert.ErrorIs(t, f.s.ReleaseClaim(ctx, id, "job-2", 1), vault.ErrNotFound)
}

func testClaimLeaseTakeover(t *testing.T) {
	ctx := context.Background()
	f := newClaimFixture(t)
	id := f.key.ID
	const lease = 30 * time.Second

	old := MustClaim(t, f.s, id, "job", "fp", lease)
	require.Equal(t, vault.ClaimOutcomeClaimed, old.Outcome)

	f.clock.Advance(lease - time.Nanosecond)
	assert.Equal(t, vault.ClaimOutcomeInProgress, MustClaim(t, f.s, id, "job", "fp", lease).Outcome, "the lease is live until its last instant")

	f.clock.Advance(time.Nanosecond)
	now := f.clock.Now()
	taken := MustClaim(t, f.s, id, "job", "fp", 2*lease)
	require.Equal(t, vault.ClaimOutcomeClaimed, taken.Outcome)
	assert.True(t, taken.TookOver)
	assert.Greater(t, taken.Claim.FencingToken, old.Claim.FencingToken)
	assert.Equal(t, now.Add(2*lease), taken.Claim.LeaseExpiresAt)
	assert.Equal(t, T0, taken.Claim.CreatedAt, "a takeover keeps the claim's creation time")

	assert.ErrorIs(t, f.s.CompleteClaim(ctx, id, "job", old.Claim.FencingToken, []byte(`"late"`)), vault.ErrConflict, "the stale owner's complete is refused")
	assert.ErrorIs(t, f.s.ReleaseClaim(ctx, id, "job", old.Claim.FencingToken), vault.ErrConflict, "the stale owner's release is refused")
	require.NoError(t, f.s.CompleteClaim(ctx, id, "job", taken.Claim.FencingToken, []byte(`"done"`)))
	got, err := f.s.GetClaim(ctx, id, "job")
	require.NoError(t, err)
	assert.Equal(t, `"done"`, string(got.Result))
}

func testClaimLapsedLeaseStillBelongsToItsOwner(t *testing.T) {
	ctx := context.Background()
	f := newClaimFixture(t)
	c := MustClaim(t, f.s, f.key.ID, "job", "fp", time.Second)
	f.clock.Advance(time.Hour)
	require.NoError(t, f.s.CompleteClaim(ctx, f.key.ID, "job", c.Claim.FencingToken, []byte(`true`)),
		"nobody took the lapsed lease over: the owner may still complete")
	assert.Equal(t, vault.ClaimOutcomeCompleted, MustClaim(t, f.s, f.key.ID, "job", "fp", time.Second).Outcome)
}

func testClaimRelease(t *testing.T) {
	ctx := context.Background()
	f := newClaimFixture(t)
	id := f.key.ID

	first := MustClaim(t, f.s, id, "job", "fp", time.Minute)
	assert.ErrorIs(t, f.s.ReleaseClaim(ctx, id, "job", first.Claim.FencingToken+7), vault.ErrConflict)
	require.NoError(t, f.s.ReleaseClaim(ctx, id, "job", first.Claim.FencingToken))
	_, err := f.s.GetClaim(ctx, id, "job")
	assert.ErrorIs(t, err, vault.ErrNotFound, "a released claim is gone")
	assert.ErrorIs(t, f.s.ReleaseClaim(ctx, id, "job", first.Claim.FencingToken), vault.ErrNotFound)

	again := MustClaim(t, f.s, id, "job", "fp-other", time.Minute)
	require.Equal(t, vault.ClaimOutcomeClaimed, again.Outcome, "released work can be claimed at once, with any fingerprint")
	assert.False(t, again.TookOver)
	assert.Greater(t, again.Claim.FencingToken, first.Claim.FencingToken,
		"a token is never handed out twice, even after a release")
	assert.ErrorIs(t, f.s.CompleteClaim(ctx, id, "job", first.Claim.FencingToken, []byte(`1`)), vault.ErrConflict, "the released owner cannot complete the new owner's claim")
}

func testClaimsOfTwoKeysNeverMeet(t *testing.T) {
	ctx := context.Background()
	f := newClaimFixture(t)
	other, _ := MustMint(t, f.s, "other", Policy(t, "100.00", "", ""), nil)

	a := MustClaim(t, f.s, f.key.ID, "shared", "fp-a", time.Minute)
	b := MustClaim(t, f.s, other.ID, "shared", "fp-b", time.Minute)
	require.Equal(t, vault.ClaimOutcomeClaimed, a.Outcome)
	require.Equal(t, vault.ClaimOutcomeClaimed, b.Outcome, "the same claim key under another vault key is another claim")

	assert.ErrorIs(t, f.s.CompleteClaim(ctx, other.ID, "shared", a.Claim.FencingToken, []byte(`"a"`)), vault.ErrConflict, "one key's token does not complete the other key's claim")
	require.NoError(t, f.s.CompleteClaim(ctx, f.key.ID, "shared", a.Claim.FencingToken, []byte(`"a"`)))
	got, err := f.s.GetClaim(ctx, other.ID, "shared")
	require.NoError(t, err)
	assert.Equal(t, vault.ClaimInProgress, got.State)
	assert.Equal(t, "fp-b", got.Fingerprint)

	// "a" NUL "b" under one key and "a" under a key named like "…NUL b" cannot collide:
	// key ids never contain NUL.
	_, err = f.s.GetClaim(ctx, f.key.ID+"\x00shared", "x")
	assert.ErrorIs(t, err, vault.ErrNotFound)
}

func testClaimKeyStates(t *testing.T) {
	ctx := context.Background()
	f := newClaimFixture(t)
	c := MustClaim(t, f.s, f.key.ID, "job", "fp", time.Minute)

	_, err := f.s.Claim(ctx, "key_unknown", "job", "fp", time.Minute)
	assert.ErrorIs(t, err, vault.ErrNotFound)

	expiring, _ := MustMint(t, f.s, "expiring", Policy(t, "1.00", "", ""), nil)
	e := MustClaim(t, f.s, expiring.ID, "job", "fp", time.Minute)

	_, err = f.s.RevokeKey(ctx, "tester", f.key.ID)
	require.NoError(t, err)
	_, err = f.s.Claim(ctx, f.key.ID, "job2", "fp", time.Minute)
	assert.ErrorIs(t, err, vault.ErrKeyRevoked)
	assert.ErrorIs(t, f.s.CompleteClaim(ctx, f.key.ID, "job", c.Claim.FencingToken, []byte(`1`)), vault.ErrKeyRevoked)
	assert.ErrorIs(t, f.s.ReleaseClaim(ctx, f.key.ID, "job", c.Claim.FencingToken), vault.ErrKeyRevoked)

	f.clock.Set(time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)) // the policy's expires_at
	_, err = f.s.Claim(ctx, expiring.ID, "job2", "fp", time.Minute)
	assert.ErrorIs(t, err, vault.ErrKeyExpired)
	assert.ErrorIs(t, f.s.CompleteClaim(ctx, expiring.ID, "job", e.Claim.FencingToken, []byte(`1`)), vault.ErrKeyExpired)
	assert.ErrorIs(t, f.s.ReleaseClaim(ctx, expiring.ID, "job", e.Claim.FencingToken), vault.ErrKeyExpired)
}

func testClaimArguments(t *testing.T) {
	ctx := context.Background()
	f := newClaimFixture(t)
	id := f.key.ID

	keys := map[string]struct {
		key   string
		valid bool
	}{
		"plain":                 {"invoice-2026-09-cus_123", true},
		"slash and spaces":      {"billing/2026-09/cus 123", true},
		"255 characters":        {strings.Repeat("k", 255), true},
		"255 multibyte":         {strings.Repeat("é", 255), true},
		"empty":                 {"", false},
		"256 characters":        {strings.Repeat("k", 256), false},
		"control character":     {"a\nb", false},
		"NUL":                   {"a\x00b", false},
		"not UTF-8":             {"a\xffb", false},
		"DEL is a control char": {"a\x7fb", false},
	}
	for name, tc := range keys {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.valid, vault.ValidClaimKey(tc.key))
			res, err := f.s.Claim(ctx, id, tc.key, "fp", time.Minute)
			if !tc.valid {
				assert.ErrorIs(t, err, vault.ErrInvalid)
				_, err = f.s.GetClaim(ctx, id, tc.key)
				assert.ErrorIs(t, err, vault.ErrInvalid)
				assert.ErrorIs(t, f.s.CompleteClaim(ctx, id, tc.key, 1, []byte(`1`)), vault.ErrInvalid)
				assert.ErrorIs(t, f.s.ReleaseClaim(ctx, id, tc.key, 1), vault.ErrInvalid)
				return
			}
			require.NoError(t, err)
			require.Equal(t, vault.ClaimOutcomeClaimed, res.Outcome)
			require.NoError(t, f.s.CompleteClaim(ctx, id, tc.key, res.Claim.FencingToken, []byte(`{}`)))
			got, err := f.s.GetClaim(ctx, id, tc.key)
			require.NoError(t, err)
			assert.Equal(t, tc.key, got.Key)
		})
	}

	_, err := f.s.Claim(ctx, id, "job", strings.Repeat("f", vault.MaxClaimFingerprintLen+1), time.Minute)
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = f.s.Claim(ctx, id, "job", "fp", 0)
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = f.s.Claim(ctx, "", "job", "fp", time.Minute)
	assert.ErrorIs(t, err, vault.ErrInvalid)

	c := MustClaim(t, f.s, id, "job", "fp", time.Minute)
	for name, result := range map[string][]byte{
		"not JSON": []byte(`{"a":`),
		"empty":    nil,
		"too big":  append(append([]byte(`"`), bytes.Repeat([]byte("x"), vault.MaxClaimResultBytes)...), '"'),
	} {
		assert.ErrorIs(t, f.s.CompleteClaim(ctx, id, "job", c.Claim.FencingToken, result), vault.ErrInvalid, name)
	}
}

func testClaimResultIsSealedAtRest(t *testing.T) {
	ctx := context.Background()
	f := newClaimFixture(t)
	c := MustClaim(t, f.s, f.key.ID, "job", "fp", time.Minute)
	const marker = "ch_SECRETRESULTMARKER"
	require.NoError(t, f.s.CompleteClaim(ctx, f.key.ID, "job", c.Claim.FencingToken, []byte(`{"charge":"`+marker+`"}`)))

	var raw []byte
	require.NoError(t, engine.View(f.s.e, context.Background(), func(tx engine.Tx, _ time.Time) error {
		v, err := tx.Get(engine.BucketClaims, engine.ClaimKey(f.key.ID, "job"))
		raw = bytes.Clone(v)
		return err
	}))
	require.NotNil(t, raw)
	assert.NotContains(t, string(raw), marker, "the result is sealed")

	// A sealed result moved under another claim does not open there.
	other := MustClaim(t, f.s, f.key.ID, "job-b", "fp", time.Minute)
	require.NoError(t, f.s.CompleteClaim(ctx, f.key.ID, "job-b", other.Claim.FencingToken, []byte(`1`)))
	require.NoError(t, engine.Update(f.s.e, context.Background(), func(tx engine.Tx, _ time.Time) error {
		return tx.Put(engine.BucketClaims, engine.ClaimKey(f.key.ID, "job-b"),
			bytes.Replace(raw, []byte(`"key":"job"`), []byte(`"key":"job-b"`), 1))
	}))
	_, err := f.s.GetClaim(ctx, f.key.ID, "job-b")
	assert.ErrorIs(t, err, vault.ErrSealed)
	_, err = f.s.Claim(ctx, f.key.ID, "job-b", "fp", time.Minute)
	assert.ErrorIs(t, err, vault.ErrSealed, "a result that does not open is never returned")
}

func testReapClaims(t *testing.T) {
	ctx := context.Background()
	f := newClaimFixture(t)
	id := f.key.ID
	ttl := vault.DefaultIdempotencyTTL

	done := MustClaim(t, f.s, id, "done", "fp", time.Minute)
	require.NoError(t, f.s.CompleteClaim(ctx, id, "done", done.Claim.FencingToken, []byte(`1`)))
	abandoned := MustClaim(t, f.s, id, "abandoned", "fp", time.Minute)
	f.clock.Advance(ttl)
	live := MustClaim(t, f.s, id, "live", "fp", time.Hour)
	fresh := MustClaim(t, f.s, id, "fresh", "fp", time.Minute)
	require.NoError(t, f.s.CompleteClaim(ctx, id, "fresh", fresh.Claim.FencingToken, []byte(`2`)))

	// Exactly at the TTL nothing goes.
	n, err := f.s.Reap(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	for _, k := range []string{"done", "abandoned", "live", "fresh"} {
		_, err := f.s.GetClaim(ctx, id, k)
		require.NoError(t, err, k)
	}

	f.clock.Advance(2 * time.Minute)
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	_, err = f.s.GetClaim(ctx, id, "done")
	assert.ErrorIs(t, err, vault.ErrNotFound, "completed more than the TTL ago")
	_, err = f.s.GetClaim(ctx, id, "abandoned")
	assert.ErrorIs(t, err, vault.ErrNotFound, "lease lapsed more than the TTL ago")
	_, err = f.s.GetClaim(ctx, id, "live")
	assert.NoError(t, err, "a live lease stays")
	_, err = f.s.GetClaim(ctx, id, "fresh")
	assert.NoError(t, err, "completed within the TTL")

	again := MustClaim(t, f.s, id, "abandoned", "fp", time.Minute)
	require.Equal(t, vault.ClaimOutcomeClaimed, again.Outcome)
	assert.Greater(t, again.Claim.FencingToken, live.Claim.FencingToken, "reaping never lets a token come back")
	assert.Greater(t, again.Claim.FencingToken, abandoned.Claim.FencingToken)
}

// testClaimConcurrentLeaseExpiry has many goroutines claim one key while the clock
// moves past lease after lease. Checked against the history afterwards: fencing
// tokens are unique and strictly increase with claim time, and no lease overlaps the
// next owner's (exactly one owner at a time); only the last owner can complete.
func testClaimConcurrentLeaseExpiry(t *testing.T) {
	ctx := context.Background()
	f := newClaimFixture(t)
	id := f.key.ID
	const (
		workers = 48
		lease   = 4 * time.Second
	)
	rounds := 40
	if Long() {
		rounds = 400
	}

	type owner struct {
		token uint64
		until time.Time
	}
	var (
		mu     sync.Mutex
		owners []owner
		busy   int
		wg     sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				if w == 0 {
					f.clock.Advance(lease / 4)
				}
				res, err := f.s.Claim(ctx, id, "the-job", "fp", lease)
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				switch res.Outcome {
				case vault.ClaimOutcomeClaimed:
					owners = append(owners, owner{res.Claim.FencingToken, res.Claim.LeaseExpiresAt})
				case vault.ClaimOutcomeInProgress:
					busy++
				default:
					t.Errorf("unexpected outcome %d", res.Outcome)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	require.GreaterOrEqual(t, len(owners), rounds/4, "the lease changed hands again and again")
	assert.Positive(t, busy)
	slices.SortFunc(owners, func(a, b owner) int { return int(int64(a.token) - int64(b.token)) })
	for i := 1; i < len(owners); i++ {
		prev, cur := owners[i-1], owners[i]
		require.Less(t, prev.token, cur.token, "fencing tokens are unique")
		claimedAt := cur.until.Add(-lease)
		assert.False(t, claimedAt.Before(prev.until),
			"owner %d took over at %s, before owner %d's lease ended at %s", cur.token, claimedAt, prev.token, prev.until)
	}

	last := owners[len(owners)-1]
	for _, o := range owners[:len(owners)-1] {
		err := f.s.CompleteClaim(ctx, id, "the-job", o.token, []byte(fmt.Sprintf(`%d`, o.token)))
		require.ErrorIs(t, err, vault.ErrConflict, "stale owner %d", o.token)
	}
	require.NoError(t, f.s.CompleteClaim(ctx, id, "the-job", last.token, []byte(`"last"`)))
	done := MustClaim(t, f.s, id, "the-job", "fp", lease)
	assert.Equal(t, vault.ClaimOutcomeCompleted, done.Outcome)
	assert.Equal(t, `"last"`, string(done.Claim.Result))
}
