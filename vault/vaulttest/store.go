package vaulttest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// testUpstreamCreatedOnce: concurrent registrations of one new upstream name
// report it created exactly once (the admin API's 201), and every write of an
// upstream changes the version Authenticate reads with the key, which the
// proxy's secret cache is keyed on.
func testUpstreamCreatedOnce(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	const writers = 8
	for round := range 3 {
		name := "up-" + strconv.Itoa(round)
		var created atomic.Int32
		var wg sync.WaitGroup
		for i := range writers {
			wg.Go(func() {
				_, c, err := s.PutUpstream(ctx, "alice", name, "stripe", "sk_test_"+strconv.Itoa(i))
				assert.NoError(t, err)
				if c {
					created.Add(1)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int32(1), created.Load(), "round %d: one of %d writers created %s", round, writers, name)
	}

	_, _, err := s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_one")
	require.NoError(t, err)
	_, tok, err := s.MintKey(ctx, "alice", vault.MintRequest{Name: "k", Upstream: "default", Policy: Policy(t, "99", "", "")})
	require.NoError(t, err)
	k1, err := s.Authenticate(ctx, tok)
	require.NoError(t, err)
	assert.NotZero(t, k1.UpstreamVersion)
	up, _, err := s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_two")
	require.NoError(t, err)
	k2, err := s.Authenticate(ctx, tok)
	require.NoError(t, err)
	assert.NotEqual(t, k1.UpstreamVersion, k2.UpstreamVersion, "a replaced secret changes the version the key is read with")
	assert.Equal(t, up.Version, k2.UpstreamVersion)
}

func testUpstreams(t *testing.T) {
	ctx := context.Background()
	clock := NewClock(T0)
	s := mustOpen(t, clock)

	up, created, err := s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_abcdef1234")
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, vault.Upstream{Name: "default", Vendor: "stripe", SecretLast4: "1234", CreatedAt: T0, UpdatedAt: T0, Version: uint64(T0.UnixNano())}, up,
		"a new upstream's version starts from the store's clock, so a name registered again never reuses one")
	first := up.Version

	clock.Advance(time.Minute)
	up, created, err = s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_zzzz9876")
	require.NoError(t, err)
	assert.False(t, created, "a replaced upstream is not created")
	assert.Equal(t, first+1, up.Version, "every write changes the version")
	assert.Equal(t, "9876", up.SecretLast4)
	assert.Equal(t, T0, up.CreatedAt, "replacing keeps the creation time")
	assert.Equal(t, T0.Add(time.Minute), up.UpdatedAt)

	secret, err := s.UpstreamSecret(ctx, "default")
	require.NoError(t, err)
	assert.Equal(t, "sk_test_zzzz9876", secret)

	_, _, err = s.PutUpstream(ctx, "alice", "other", "stripe", "sk_test_other0000")
	require.NoError(t, err)
	ups, err := s.ListUpstreams(ctx)
	require.NoError(t, err)
	require.Len(t, ups, 2)
	assert.Equal(t, "default", ups[0].Name)
	assert.Equal(t, "other", ups[1].Name)

	got, err := s.GetUpstream(ctx, "other")
	require.NoError(t, err)
	assert.Equal(t, "0000", got.SecretLast4)

	invalid := map[string]struct{ name, vendor, secret string }{
		"empty name":     {"", "stripe", "sk_x"},
		"other vendor":   {"x", "paypal", "sk_x"},
		"empty secret":   {"x", "stripe", "  "},
		"control in nam": {"a\x00b", "stripe", "sk_x"},
	}
	for name, tc := range invalid {
		t.Run(name, func(t *testing.T) {
			_, _, err := s.PutUpstream(ctx, "alice", tc.name, tc.vendor, tc.secret)
			assert.ErrorIs(t, err, vault.ErrInvalid)
		})
	}

	_, err = s.GetUpstream(ctx, "nope")
	assert.ErrorIs(t, err, vault.ErrNotFound)
	_, err = s.UpstreamSecret(ctx, "nope")
	assert.ErrorIs(t, err, vault.ErrNotFound)
	assert.ErrorIs(t, s.DeleteUpstream(ctx, "alice", "nope"), vault.ErrNotFound)

	// In use by a key that is not revoked: conflict; once revoked: deletable.
	_, _, err = s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_abcdef1234")
	require.NoError(t, err)
	k, _, err := s.MintKey(ctx, "alice", vault.MintRequest{Name: "k", Upstream: "other", Policy: Policy(t, "99", "", "")})
	require.NoError(t, err)
	assert.ErrorIs(t, s.DeleteUpstream(ctx, "alice", "other"), vault.ErrConflict)
	_, err = s.RevokeKey(ctx, "alice", k.ID)
	require.NoError(t, err)
	require.NoError(t, s.DeleteUpstream(ctx, "alice", "other"))
	_, err = s.GetUpstream(ctx, "other")
	assert.ErrorIs(t, err, vault.ErrNotFound)

	entries, _, err := s.ListAudit(ctx, 0, "")
	require.NoError(t, err)
	var actions []string
	for _, e := range entries {
		actions = append(actions, e.Action)
		assert.NotContains(t, string(e.Before)+string(e.After), "sk_test", "no secret in the audit log")
	}
	assert.Equal(t, []string{"upstream.delete", "key.revoke", "key.mint", "upstream.put", "upstream.put", "upstream.put", "upstream.put"}, actions)
}

func testUpstreamSecretTampered(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	MustUpstream(t, s, "sk_test_abcdef1234")
	require.NoError(t, engine.Update(s.e, context.Background(), func(tx engine.Tx, _ time.Time) error {
		v, err := tx.Get(engine.BucketUpstreams, []byte("default"))
		if err != nil {
			return err
		}
		var rec map[string]any
		if err := json.Unmarshal(v, &rec); err != nil {
			return err
		}
		// A sealed secret moved to another upstream does not open there.
		rec["name"] = "copy"
		moved, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		if err := tx.Put(engine.BucketUpstreams, []byte("copy"), moved); err != nil {
			return err
		}
		// Nor does a tampered one.
		sealed, err := base64.StdEncoding.DecodeString(rec["sealed_secret"].(string))
		if err != nil {
			return err
		}
		sealed[len(sealed)-3] ^= 0x40
		rec["name"], rec["sealed_secret"] = "default", sealed
		tampered, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		return tx.Put(engine.BucketUpstreams, []byte("default"), tampered)
	}))
	_, err := s.UpstreamSecret(ctx, "default")
	assert.ErrorIs(t, err, vault.ErrSealed)
	_, err = s.UpstreamSecret(ctx, "copy")
	assert.ErrorIs(t, err, vault.ErrSealed)
}

func testMintAndAuthenticate(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	MustUpstream(t, s, "sk_test_abcdef1234")

	k, tok := MustMint(t, s, "cust_123", Policy(t, "99.00", "110.00", ""), map[string]string{"customer_id": "cust_123"})
	assert.True(t, strings.HasPrefix(tok, "vk_"))
	assert.Len(t, tok, 3+43, "vk_ + base64url of 32 bytes")
	assert.True(t, strings.HasPrefix(k.ID, "key_"))
	assert.Len(t, k.ID, 4+26)
	assert.Equal(t, tok[:10], k.TokenPrefix)
	assert.Equal(t, TokenHash(tok), k.TokenHash)
	assert.Equal(t, vault.KeyActive, k.Status)
	assert.Equal(t, "default", k.Upstream)
	assert.Equal(t, T0, k.CreatedAt)

	got, err := s.Authenticate(ctx, tok)
	require.NoError(t, err)
	assert.Equal(t, k.ID, got.ID)
	assert.True(t, got.Policy.DailyCap.Equal(*MustDec(t, "99")))

	for name, bad := range map[string]string{
		"empty":      "",
		"no prefix":  strings.TrimPrefix(tok, "vk_"),
		"wrong one":  tok[:len(tok)-1] + flip(tok[len(tok)-1]),
		"too short":  tok[:20],
		"stripe key": "sk_test_abcdef1234",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := s.Authenticate(ctx, bad)
			assert.ErrorIs(t, err, vault.ErrKeyInvalid)
		})
	}

	_, _, err = s.MintKey(ctx, "a", vault.MintRequest{Name: "cust_123", Policy: Policy(t, "1", "", "")})
	assert.ErrorIs(t, err, vault.ErrConflict, "names are unique")
	_, _, err = s.MintKey(ctx, "a", vault.MintRequest{Name: "x", Upstream: "nope", Policy: Policy(t, "1", "", "")})
	assert.ErrorIs(t, err, vault.ErrNotFound)
	assert.Contains(t, err.Error(), `"nope"`)

	bad := Policy(t, "5.001", "-1", "")
	bad.Currency = "USD"
	_, _, err = s.MintKey(ctx, "a", vault.MintRequest{Name: "x", Policy: bad})
	require.ErrorIs(t, err, vault.ErrInvalid)
	var ve *policy.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.GreaterOrEqual(t, len(ve.Errors), 2, "every problem at once")

	expired := Policy(t, "1", "", "")
	expired.ExpiresAt = T0.Add(-time.Hour)
	_, _, err = s.MintKey(ctx, "a", vault.MintRequest{Name: "x", Policy: expired})
	assert.ErrorIs(t, err, vault.ErrInvalid)

	// Ids sort by creation, even within one millisecond.
	var ids []string
	for i := range 5 {
		k, _ := MustMint(t, s, "same-ms-"+string(rune('a'+i)), Policy(t, "1", "", ""), nil)
		ids = append(ids, k.ID)
	}
	for i := 1; i < len(ids); i++ {
		assert.Less(t, ids[i-1], ids[i])
	}
}

func testRotateAndRevoke(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, oldTok := MustMint(t, s, "k", Policy(t, "99", "", ""), nil)

	res := MustReserve(t, s, Charge(k.ID, "a", 500))
	require.Equal(t, vault.ReserveClaimed, res.Outcome)
	MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 500})

	rotated, newTok, err := s.RotateKey(ctx, "alice", k.ID)
	require.NoError(t, err)
	assert.Equal(t, k.ID, rotated.ID)
	assert.NotEqual(t, oldTok, newTok)
	_, err = s.Authenticate(ctx, oldTok)
	assert.ErrorIs(t, err, vault.ErrKeyInvalid, "old token dead at once")
	got, err := s.Authenticate(ctx, newTok)
	require.NoError(t, err)
	assert.Equal(t, k.ID, got.ID)
	daily, _ := usageOf(t, s, k.ID)
	assert.Equal(t, int64(500), daily.Committed, "same usage")

	revoked, err := s.RevokeKey(ctx, "alice", k.ID)
	require.NoError(t, err)
	assert.Equal(t, vault.KeyRevoked, revoked.Status)
	assert.Equal(t, T0, revoked.RevokedAt)
	again, err := s.RevokeKey(ctx, "alice", k.ID)
	require.NoError(t, err, "revoking twice is fine")
	assert.Equal(t, revoked, again)

	_, err = s.Authenticate(ctx, newTok)
	assert.ErrorIs(t, err, vault.ErrKeyRevoked)
	_, err = s.Reserve(ctx, Charge(k.ID, "b", 1))
	assert.ErrorIs(t, err, vault.ErrKeyRevoked)
	_, _, err = s.RotateKey(ctx, "alice", k.ID)
	assert.ErrorIs(t, err, vault.ErrConflict)
	_, err = s.UpdateKey(ctx, "alice", k.ID, Policy(t, "5", "", ""), nil)
	assert.ErrorIs(t, err, vault.ErrConflict)
	_, err = s.RevokeKey(ctx, "alice", "key_nope")
	assert.ErrorIs(t, err, vault.ErrNotFound)
	_, _, err = s.RotateKey(ctx, "alice", "key_nope")
	assert.ErrorIs(t, err, vault.ErrNotFound)
}

func testUpdateKey(t *testing.T) {
	ctx := context.Background()
	clock := NewClock(T0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, tok := MustMint(t, s, "k", Policy(t, "99", "110", ""), map[string]string{"a": "1"})
	MustReserve(t, s, Charge(k.ID, "a", 4000))
	MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 4000})

	clock.Advance(time.Minute)
	np := Policy(t, "50", "60", "")
	updated, err := s.UpdateKey(ctx, "bob", k.ID, np, map[string]string{"b": "2"})
	require.NoError(t, err)
	assert.True(t, updated.Policy.DailyCap.Equal(*MustDec(t, "50")))
	assert.Equal(t, map[string]string{"b": "2"}, updated.Labels)
	assert.Equal(t, T0.Add(time.Minute), updated.UpdatedAt)
	assert.Equal(t, k.TokenHash, updated.TokenHash)
	daily, period := usageOf(t, s, k.ID)
	assert.Equal(t, int64(4000), daily.Committed, "usage untouched")
	assert.Equal(t, int64(4000), period.Committed)
	got, err := s.Authenticate(ctx, tok)
	require.NoError(t, err)
	assert.True(t, got.Policy.PeriodCap.Equal(*MustDec(t, "60")))

	eur := np
	eur.Currency = "eur"
	_, err = s.UpdateKey(ctx, "bob", k.ID, eur, nil)
	require.ErrorIs(t, err, vault.ErrInvalid)
	var ve *policy.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "currency", ve.Errors[0].Field)

	nocap := Policy(t, "", "", "")
	_, err = s.UpdateKey(ctx, "bob", k.ID, nocap, nil)
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = s.UpdateKey(ctx, "bob", "key_nope", np, nil)
	assert.ErrorIs(t, err, vault.ErrNotFound)

	entries, _, err := s.ListAudit(ctx, 1, "")
	require.NoError(t, err)
	require.Len(t, entries, 1)
	e := entries[0]
	assert.Equal(t, "bob", e.Actor)
	assert.Equal(t, "key.update", e.Action)
	assert.Equal(t, k.ID, e.Target)
	assert.Equal(t, T0.Add(time.Minute), e.Time)
	var before, after map[string]any
	require.NoError(t, json.Unmarshal(e.Before, &before))
	require.NoError(t, json.Unmarshal(e.After, &after))
	assert.Equal(t, "99.00", before["policy"].(map[string]any)["daily_cap"])
	assert.Equal(t, "50.00", after["policy"].(map[string]any)["daily_cap"])
	assert.Equal(t, map[string]any{"a": "1"}, before["labels"])
	assert.Equal(t, map[string]any{"b": "2"}, after["labels"])
	for _, doc := range []map[string]any{before, after} {
		assert.NotContains(t, doc, "token_hash")
		assert.NotContains(t, doc, "token_prefix")
	}
}

func testListKeys(t *testing.T) {
	ctx := context.Background()
	clock := NewClock(T0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	_, _, err := s.PutUpstream(ctx, "a", "eu", "stripe", "sk_test_eu")
	require.NoError(t, err)

	const n = 60
	var all []string
	for i := range n {
		p := Policy(t, "10", "", "")
		up := "default"
		labels := map[string]string{"team": "a", "n": strconv.Itoa(i)}
		if i%3 == 0 {
			up = "eu"
			labels["team"] = "b"
		}
		if i%10 == 0 {
			p.ExpiresAt = T0.Add(time.Hour) // expires once the clock moves on
		}
		k, _, err := s.MintKey(ctx, "a", vault.MintRequest{Name: "key-" + strconv.Itoa(i), Upstream: up, Labels: labels, Policy: p})
		require.NoError(t, err)
		all = append(all, k.ID)
		if i%7 == 0 {
			_, err := s.RevokeKey(ctx, "a", k.ID)
			require.NoError(t, err)
		}
	}
	clock.Advance(2 * time.Hour)

	collect := func(t *testing.T, f vault.KeyFilter) []vault.Key {
		var out []vault.Key
		for page := 0; ; page++ {
			require.Less(t, page, 100)
			keys, next, err := s.ListKeys(ctx, f)
			require.NoError(t, err)
			out = append(out, keys...)
			if next == "" {
				return out
			}
			require.NotEmpty(t, keys, "a page with a next cursor has keys")
			f.Cursor = next
		}
	}

	t.Run("default page size and order", func(t *testing.T) {
		keys, next, err := s.ListKeys(ctx, vault.KeyFilter{})
		require.NoError(t, err)
		assert.Len(t, keys, 50)
		assert.NotEmpty(t, next)
		got := collect(t, vault.KeyFilter{})
		require.Len(t, got, n)
		for i, k := range got {
			assert.Equal(t, all[i], k.ID, "oldest first")
		}
	})

	cases := map[string]struct {
		f    vault.KeyFilter
		want func(i int) bool
	}{
		"revoked":        {vault.KeyFilter{Status: vault.KeyRevoked, Limit: 7}, func(i int) bool { return i%7 == 0 }},
		"expired":        {vault.KeyFilter{Status: vault.KeyExpired, Limit: 3}, func(i int) bool { return i%10 == 0 && i%7 != 0 }},
		"active":         {vault.KeyFilter{Status: vault.KeyActive, Limit: 33}, func(i int) bool { return i%10 != 0 && i%7 != 0 }},
		"upstream":       {vault.KeyFilter{Upstream: "eu", Limit: 11}, func(i int) bool { return i%3 == 0 }},
		"label":          {vault.KeyFilter{Labels: map[string]string{"team": "b"}}, func(i int) bool { return i%3 == 0 }},
		"two labels":     {vault.KeyFilter{Labels: map[string]string{"team": "a", "n": "4"}}, func(i int) bool { return i == 4 }},
		"absent label":   {vault.KeyFilter{Labels: map[string]string{"x": "a"}}, func(i int) bool { return false }},
		"name prefix":    {vault.KeyFilter{NamePrefix: "key-1", Limit: 2}, func(i int) bool { return strings.HasPrefix("key-"+strconv.Itoa(i), "key-1") }},
		"upstream+state": {vault.KeyFilter{Upstream: "default", Status: vault.KeyActive, Limit: 500}, func(i int) bool { return i%3 != 0 && i%10 != 0 && i%7 != 0 }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var want []string
			for i, id := range all {
				if tc.want(i) {
					want = append(want, id)
				}
			}
			var got []string
			for _, k := range collect(t, tc.f) {
				got = append(got, k.ID)
			}
			assert.Equal(t, want, got)
		})
	}

	t.Run("limits", func(t *testing.T) {
		keys, _, err := s.ListKeys(ctx, vault.KeyFilter{Limit: 1000})
		require.NoError(t, err)
		assert.Len(t, keys, n, "the maximum, 500, covers them all")
		keys, next, err := s.ListKeys(ctx, vault.KeyFilter{Limit: n})
		require.NoError(t, err)
		assert.Len(t, keys, n)
		assert.Empty(t, next, "no empty last page")
	})

	t.Run("bad input", func(t *testing.T) {
		_, _, err := s.ListKeys(ctx, vault.KeyFilter{Cursor: "!!!"})
		assert.ErrorIs(t, err, vault.ErrInvalid)
		_, _, err = s.ListKeys(ctx, vault.KeyFilter{Status: "sleeping"})
		assert.ErrorIs(t, err, vault.ErrInvalid)
	})
}

func testGetKeyAndKeyUsage(t *testing.T) {
	ctx := context.Background()
	clock := NewClock(time.Date(2026, 9, 14, 23, 30, 0, 0, time.UTC))
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	p := Policy(t, "99.00", "110.00", "")
	p.Timezone = "America/New_York"
	k, _ := MustMint(t, s, "ny", p, map[string]string{"a": "b"})

	got, err := s.GetKey(ctx, k.ID)
	require.NoError(t, err)
	assert.Equal(t, k, got)
	_, err = s.GetKey(ctx, "key_nope")
	assert.ErrorIs(t, err, vault.ErrNotFound)
	_, _, _, err = s.KeyUsage(ctx, "key_nope")
	assert.ErrorIs(t, err, vault.ErrNotFound)

	MustReserve(t, s, Charge(k.ID, "a", 1500))
	MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 1000})
	MustReserve(t, s, Charge(k.ID, "b", 250))

	key, windows, usage, err := s.KeyUsage(ctx, k.ID)
	require.NoError(t, err)
	assert.Equal(t, k.ID, key.ID)
	require.Len(t, windows, 2)
	assert.Equal(t, policy.WindowID("day:2026-09-14"), windows[0].ID, "19:30 in New York is still the 14th")
	assert.Equal(t, int64(9900), windows[0].Cap)
	assert.Equal(t, policy.PeriodWindowID, windows[1].ID)
	assert.Equal(t, int64(11000), windows[1].Cap)
	assert.Equal(t, policy.Usage{
		"day:2026-09-14": {Committed: 1000, Held: 250},
		"period":         {Committed: 1000, Held: 250},
	}, usage)
}

func testListAuditPaginates(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	for i := range 12 {
		_, _, err := s.PutUpstream(ctx, "alice", "up-"+strconv.Itoa(i), "stripe", "sk_test_"+strconv.Itoa(i))
		require.NoError(t, err)
	}
	var targets []string
	cursor := ""
	for page := 0; ; page++ {
		require.Less(t, page, 10)
		entries, next, err := s.ListAudit(ctx, 5, cursor)
		require.NoError(t, err)
		for _, e := range entries {
			targets = append(targets, e.Target)
			assert.Equal(t, "upstream.put", e.Action)
			assert.Nil(t, e.Before)
			assert.Contains(t, string(e.After), `"secret_last4"`)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	require.Len(t, targets, 12)
	for i, target := range targets {
		assert.Equal(t, "up-"+strconv.Itoa(11-i), target, "newest first")
	}
	_, _, err := s.ListAudit(ctx, 5, encodeCursor("evt_0000000000000001"))
	assert.ErrorIs(t, err, vault.ErrInvalid)
}

// testCheckInvariantDetects corrupts a consistent store in one way per case and
// requires CheckInvariant to notice: the check the other tests rely on bites.
func testCheckInvariantDetects(t *testing.T) {
	cases := map[string]func(tx engine.Tx, keyID string) error{
		"held counter off by one": func(tx engine.Tx, keyID string) error {
			c, _, err := engine.GetCounter(tx, keyID, "period")
			if err != nil {
				return err
			}
			c.Held++
			return engine.PutCounter(tx, keyID, "period", c)
		},
		"committed counter without a ledger entry": func(tx engine.Tx, keyID string) error {
			c, _, err := engine.GetCounter(tx, keyID, "day:2026-09-14")
			if err != nil {
				return err
			}
			c.Committed += 5
			return engine.PutCounter(tx, keyID, "day:2026-09-14", c)
		},
		"over the cap": func(tx engine.Tx, keyID string) error {
			h := &engine.HoldRec{ID: vault.HoldID(keyID, "forged"), KeyID: keyID, IdempotencyKey: "forged", Amount: 9000,
				WindowIDs: []policy.WindowID{"day:2026-09-14", "period"}, State: vault.HoldHeld, CreatedAt: T0}
			if err := engine.PutRecord(tx, &engine.Record{KeyID: keyID, Idem: "forged", State: vault.RecordInProgress, Hold: h}); err != nil {
				return err
			}
			if err := engine.PutEvent(tx, &vault.Event{KeyID: keyID, WindowIDs: h.WindowIDs, HeldDelta: h.Amount}); err != nil {
				return err
			}
			return engine.AddToWindows(tx, keyID, h.WindowIDs, h.Amount, 0, 0)
		},
		"record and hold disagree": func(tx engine.Tx, keyID string) error {
			r, err := engine.GetRecord(tx, keyID, "held")
			if err != nil {
				return err
			}
			r.Hold.State = vault.HoldUnknown
			return engine.PutRecord(tx, r)
		},
		"hold index out of step": func(tx engine.Tx, keyID string) error {
			r, err := engine.GetRecord(tx, keyID, "held")
			if err != nil {
				return err
			}
			return tx.Delete(engine.BucketHoldIndex, engine.HoldIndexKey(r.Hold))
		},
	}
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := mustOpen(t, NewClock(T0))
			MustUpstream(t, s, "sk_test_abcdef1234")
			k, _ := MustMint(t, s, "k", Policy(t, "100.00", "150.00", ""), nil)
			MustReserve(t, s, Charge(k.ID, "held", 2000))
			MustReserve(t, s, Charge(k.ID, "done", 1000))
			MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: "done", Outcome: vault.SettleCommit, Amount: 1000})
			require.NoError(t, s.CheckInvariant(ctx), "consistent before")

			require.NoError(t, engine.Update(s.e, context.Background(), func(tx engine.Tx, _ time.Time) error { return corrupt(tx, k.ID) }))
			err := s.CheckInvariant(ctx)
			assert.ErrorIs(t, err, vault.ErrInvariant)
			require.NoError(t, s.Close()) // the cleanup's check would fail, as it should
		})
	}
}

func testRecordEvent(t *testing.T) {
	clock := NewClock(T0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_secret")
	k, _ := MustMint(t, s, "k", Policy(t, "10.00", "", ""), nil)
	ctx := context.Background()

	for name, ev := range map[string]vault.Event{
		"no key":    {Operation: "customers.create"},
		"money":     {KeyID: k.ID, Amount: 1},
		"a hold":    {KeyID: k.ID, HoldID: "hold_x"},
		"held":      {KeyID: k.ID, HeldDelta: 1},
		"committed": {KeyID: k.ID, CommittedDelta: 1},
	} {
		assert.ErrorIs(t, s.RecordEvent(ctx, ev), vault.ErrInvalid, name)
	}

	clock.Advance(time.Minute)
	require.NoError(t, s.RecordEvent(ctx, vault.Event{KeyID: k.ID, Operation: "customers.create",
		Decision: "would_refuse", Reason: "operation_not_allowed", Time: T0.Add(-time.Hour)}))
	events, _, err := s.ListEvents(ctx, k.ID, 10, "")
	require.NoError(t, err)
	require.Len(t, events, 1)
	assert.Equal(t, vault.DecisionWouldRefuse, events[0].Decision)
	assert.Equal(t, "operation_not_allowed", events[0].Reason)
	assert.Equal(t, "customers.create", events[0].Operation)
	assert.True(t, events[0].Time.Equal(T0.Add(time.Minute)), "stamped with the store clock, not the caller's: %s", events[0].Time)
	assert.NotEmpty(t, events[0].ID)
}

// testChangesReachTheNextRead: what a store may keep in memory for the hot
// path — the key of a token, an upstream's secret — follows every change: a
// rotation, a policy change, a revocation and a new secret are seen by the
// very next call, including while other goroutines authenticate all along.
func testChangesReachTheNextRead(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, tok := MustMint(t, s, "k", Policy(t, "99", "", ""), nil)
	for range 2 { // the second time from whatever the first kept
		got, err := s.Authenticate(ctx, tok)
		require.NoError(t, err)
		assert.Equal(t, k.ID, got.ID)
		secret, err := s.UpstreamSecret(ctx, "default")
		require.NoError(t, err)
		assert.Equal(t, "sk_test_abcdef1234", secret)
	}

	_, _, err := s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_new5678")
	require.NoError(t, err)
	secret, err := s.UpstreamSecret(ctx, "default")
	require.NoError(t, err)
	assert.Equal(t, "sk_test_new5678", secret, "a new secret is read at once")

	_, err = s.UpdateKey(ctx, "alice", k.ID, Policy(t, "5", "", ""), map[string]string{"v": "2"})
	require.NoError(t, err)
	got, err := s.Authenticate(ctx, tok)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"v": "2"}, got.Labels, "a changed key is read at once")
	assert.Equal(t, "5", got.Policy.DailyCap.String())

	_, newTok, err := s.RotateKey(ctx, "alice", k.ID)
	require.NoError(t, err)
	_, err = s.Authenticate(ctx, tok)
	assert.ErrorIs(t, err, vault.ErrKeyInvalid, "the old token is dead at once")
	_, err = s.Authenticate(ctx, newTok)
	require.NoError(t, err)

	// Callers authenticate all along while the key is revoked: every call that
	// begins once RevokeKey has returned is refused, whatever the calls before
	// it left behind.
	var revoked atomic.Bool
	stop := make(chan struct{})
	var wg, started sync.WaitGroup
	var late atomic.Int64
	enough := make(chan struct{}) // closed at the 100th refused late call
	const callers = 4
	started.Add(callers)
	for range callers {
		wg.Go(func() {
			for first := true; ; first = false {
				select {
				case <-stop:
					return
				default:
				}
				after := revoked.Load()
				_, err := s.Authenticate(ctx, newTok)
				if first {
					started.Done()
				}
				if after {
					if !errors.Is(err, vault.ErrKeyRevoked) {
						t.Errorf("an authentication that began after the revocation got %v", err)
						return
					}
					if late.Add(1) == 100 {
						close(enough)
					}
				}
			}
		})
	}
	stopped := make(chan struct{}) // every caller gave up
	go func() {
		wg.Wait()
		close(stopped)
	}()
	started.Wait() // each caller has authenticated before the revocation
	_, err = s.RevokeKey(ctx, "alice", k.ID)
	require.NoError(t, err)
	revoked.Store(true)
	select {
	case <-enough:
	case <-stopped:
	}
	close(stop)
	<-stopped
}
