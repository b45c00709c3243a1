package vault

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/keybrake/keybrake/policy"
)

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	clock := newClock(t0)

	t.Run("short master key", func(t *testing.T) {
		_, err := Open(filepath.Join(t.TempDir(), "x.db"), Options{MasterKey: []byte("short")})
		assert.ErrorIs(t, err, ErrInvalid)
	})

	t.Run("wrong master key", func(t *testing.T) {
		s, path := MustOpen(t, clock)
		require.NoError(t, s.Close())
		other := bytes.Repeat([]byte{7}, 32)
		_, err := Open(path, Options{MasterKey: other})
		assert.ErrorIs(t, err, ErrSealed)
	})

	t.Run("newer schema", func(t *testing.T) {
		s, path := MustOpen(t, clock)
		require.NoError(t, s.db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(metaSchemaVersion, u64(schemaVersion+1))
		}))
		require.NoError(t, s.Close())
		_, err := Open(path, Options{MasterKey: testMasterKey})
		assert.ErrorIs(t, err, ErrSchemaVersion)
	})

	t.Run("locked", func(t *testing.T) {
		_, path := MustOpen(t, clock)
		_, err := Open(path, Options{MasterKey: testMasterKey, OpenTimeout: 50 * time.Millisecond})
		assert.ErrorIs(t, err, ErrLocked)
	})

	t.Run("closed", func(t *testing.T) {
		s, _ := MustOpen(t, clock)
		require.NoError(t, s.Close())
		require.NoError(t, s.Close(), "closing twice is fine")
		_, err := s.GetKey(ctx, "key_x")
		assert.ErrorIs(t, err, ErrClosed)
		_, err = s.Reserve(ctx, charge("key_x", "a", 1))
		assert.ErrorIs(t, err, ErrClosed)
	})

	t.Run("every bucket and the schema version", func(t *testing.T) {
		s, _ := MustOpen(t, clock)
		require.NoError(t, s.db.View(func(tx *bolt.Tx) error {
			for _, b := range allBuckets {
				assert.NotNil(t, tx.Bucket(b), string(b))
			}
			assert.Equal(t, u64(schemaVersion), tx.Bucket(bucketMeta).Get(metaSchemaVersion))
			return nil
		}))
	})
}

func TestSealer(t *testing.T) {
	sl, err := newSealer(testMasterKey)
	require.NoError(t, err)
	other, err := newSealer(bytes.Repeat([]byte{1}, 32))
	require.NoError(t, err)
	sealed, err := sl.seal([]byte("sk_live_secret"), upstreamAD("default"))
	require.NoError(t, err)
	again, err := sl.seal([]byte("sk_live_secret"), upstreamAD("default"))
	require.NoError(t, err)
	assert.NotEqual(t, sealed, again, "random nonce")
	assert.NotContains(t, string(sealed), "sk_live_secret")

	pt, err := sl.open(sealed, upstreamAD("default"))
	require.NoError(t, err)
	assert.Equal(t, "sk_live_secret", string(pt))

	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	cases := map[string]struct {
		s      *sealer
		sealed []byte
		ad     []byte
	}{
		"wrong key":        {other, sealed, upstreamAD("default")},
		"other place":      {sl, sealed, upstreamAD("other")},
		"tampered":         {sl, tampered, upstreamAD("default")},
		"truncated":        {sl, sealed[:10], upstreamAD("default")},
		"unknown version":  {sl, append([]byte{9}, sealed[1:]...), upstreamAD("default")},
		"empty ciphertext": {sl, nil, upstreamAD("default")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := tc.s.open(tc.sealed, tc.ad)
			assert.ErrorIs(t, err, ErrSealed)
		})
	}
}

func TestUpstreams(t *testing.T) {
	ctx := context.Background()
	clock := newClock(t0)
	s, _ := MustOpen(t, clock)

	up, err := s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_abcdef1234")
	require.NoError(t, err)
	assert.Equal(t, Upstream{Name: "default", Vendor: "stripe", SecretLast4: "1234", CreatedAt: t0, UpdatedAt: t0}, up)

	clock.Advance(time.Minute)
	up, err = s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_zzzz9876")
	require.NoError(t, err)
	assert.Equal(t, "9876", up.SecretLast4)
	assert.Equal(t, t0, up.CreatedAt, "replacing keeps the creation time")
	assert.Equal(t, t0.Add(time.Minute), up.UpdatedAt)

	secret, err := s.UpstreamSecret(ctx, "default")
	require.NoError(t, err)
	assert.Equal(t, "sk_test_zzzz9876", secret)

	_, err = s.PutUpstream(ctx, "alice", "other", "stripe", "sk_test_other0000")
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
			_, err := s.PutUpstream(ctx, "alice", tc.name, tc.vendor, tc.secret)
			assert.ErrorIs(t, err, ErrInvalid)
		})
	}

	_, err = s.GetUpstream(ctx, "nope")
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = s.UpstreamSecret(ctx, "nope")
	assert.ErrorIs(t, err, ErrNotFound)
	assert.ErrorIs(t, s.DeleteUpstream(ctx, "alice", "nope"), ErrNotFound)

	// In use by a key that is not revoked: conflict; once revoked: deletable.
	_, err = s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_abcdef1234")
	require.NoError(t, err)
	k, _, err := s.MintKey(ctx, "alice", MintRequest{Name: "k", Upstream: "other", Policy: testPolicy(t, "99", "", "")})
	require.NoError(t, err)
	assert.ErrorIs(t, s.DeleteUpstream(ctx, "alice", "other"), ErrConflict)
	_, err = s.RevokeKey(ctx, "alice", k.ID)
	require.NoError(t, err)
	require.NoError(t, s.DeleteUpstream(ctx, "alice", "other"))
	_, err = s.GetUpstream(ctx, "other")
	assert.ErrorIs(t, err, ErrNotFound)

	entries, _, err := s.ListAudit(ctx, 0, "")
	require.NoError(t, err)
	var actions []string
	for _, e := range entries {
		actions = append(actions, e.Action)
		assert.NotContains(t, string(e.Before)+string(e.After), "sk_test", "no secret in the audit log")
	}
	assert.Equal(t, []string{"upstream.delete", "key.revoke", "key.mint", "upstream.put", "upstream.put", "upstream.put", "upstream.put"}, actions)
}

func TestUpstreamSecretTampered(t *testing.T) {
	ctx := context.Background()
	s, _ := MustOpen(t, newClock(t0))
	MustUpstream(t, s, "sk_test_abcdef1234")
	require.NoError(t, s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketUpstreams)
		var rec upstreamRec
		if _, err := getJSON(b, []byte("default"), &rec); err != nil {
			return err
		}
		rec.SealedSecret[len(rec.SealedSecret)-3] ^= 0x40
		return putJSON(b, []byte("default"), &rec)
	}))
	_, err := s.UpstreamSecret(ctx, "default")
	assert.ErrorIs(t, err, ErrSealed)

	// A sealed secret moved to another upstream does not open either.
	require.NoError(t, s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketUpstreams)
		sealed, err := s.seal.seal([]byte("sk_test_moved"), upstreamAD("default"))
		if err != nil {
			return err
		}
		rec := upstreamRec{Name: "copy", Vendor: "stripe", SealedSecret: sealed}
		return putJSON(b, []byte("copy"), &rec)
	}))
	_, err = s.UpstreamSecret(ctx, "copy")
	assert.ErrorIs(t, err, ErrSealed)
}

func TestMintAndAuthenticate(t *testing.T) {
	ctx := context.Background()
	s, _ := MustOpen(t, newClock(t0))
	MustUpstream(t, s, "sk_test_abcdef1234")

	k, tok := MustMint(t, s, "cust_123", testPolicy(t, "99.00", "110.00", ""), map[string]string{"customer_id": "cust_123"})
	assert.True(t, strings.HasPrefix(tok, "vk_"))
	assert.Len(t, tok, 3+43, "vk_ + base64url of 32 bytes")
	assert.True(t, strings.HasPrefix(k.ID, "key_"))
	assert.Len(t, k.ID, 4+26)
	assert.Equal(t, tok[:10], k.TokenPrefix)
	assert.Equal(t, tokenHash(tok), k.TokenHash)
	assert.Equal(t, KeyActive, k.Status)
	assert.Equal(t, "default", k.Upstream)
	assert.Equal(t, t0, k.CreatedAt)

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
			assert.ErrorIs(t, err, ErrKeyInvalid)
		})
	}

	_, _, err = s.MintKey(ctx, "a", MintRequest{Name: "cust_123", Policy: testPolicy(t, "1", "", "")})
	assert.ErrorIs(t, err, ErrConflict, "names are unique")
	_, _, err = s.MintKey(ctx, "a", MintRequest{Name: "x", Upstream: "nope", Policy: testPolicy(t, "1", "", "")})
	assert.ErrorIs(t, err, ErrNotFound)
	assert.Contains(t, err.Error(), `"nope"`)

	bad := testPolicy(t, "5.001", "-1", "")
	bad.Currency = "USD"
	_, _, err = s.MintKey(ctx, "a", MintRequest{Name: "x", Policy: bad})
	require.ErrorIs(t, err, ErrInvalid)
	var ve *policy.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.GreaterOrEqual(t, len(ve.Errors), 2, "every problem at once")

	expired := testPolicy(t, "1", "", "")
	expired.ExpiresAt = t0.Add(-time.Hour)
	_, _, err = s.MintKey(ctx, "a", MintRequest{Name: "x", Policy: expired})
	assert.ErrorIs(t, err, ErrInvalid)

	// Ids sort by creation, even within one millisecond.
	var ids []string
	for i := range 5 {
		k, _ := MustMint(t, s, "same-ms-"+string(rune('a'+i)), testPolicy(t, "1", "", ""), nil)
		ids = append(ids, k.ID)
	}
	for i := 1; i < len(ids); i++ {
		assert.Less(t, ids[i-1], ids[i])
	}
}

func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}

func TestRotateAndRevoke(t *testing.T) {
	ctx := context.Background()
	s, _ := MustOpen(t, newClock(t0))
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, oldTok := MustMint(t, s, "k", testPolicy(t, "99", "", ""), nil)

	res := MustReserve(t, s, charge(k.ID, "a", 500))
	require.Equal(t, ReserveClaimed, res.Outcome)
	MustSettle(t, s, SettleRequest{KeyID: k.ID, IdempotencyKey: "a", Outcome: SettleCommit, Amount: 500})

	rotated, newTok, err := s.RotateKey(ctx, "alice", k.ID)
	require.NoError(t, err)
	assert.Equal(t, k.ID, rotated.ID)
	assert.NotEqual(t, oldTok, newTok)
	_, err = s.Authenticate(ctx, oldTok)
	assert.ErrorIs(t, err, ErrKeyInvalid, "old token dead at once")
	got, err := s.Authenticate(ctx, newTok)
	require.NoError(t, err)
	assert.Equal(t, k.ID, got.ID)
	daily, _ := usageOf(t, s, k.ID)
	assert.Equal(t, int64(500), daily.Committed, "same usage")

	revoked, err := s.RevokeKey(ctx, "alice", k.ID)
	require.NoError(t, err)
	assert.Equal(t, KeyRevoked, revoked.Status)
	assert.Equal(t, t0, revoked.RevokedAt)
	again, err := s.RevokeKey(ctx, "alice", k.ID)
	require.NoError(t, err, "revoking twice is fine")
	assert.Equal(t, revoked, again)

	_, err = s.Authenticate(ctx, newTok)
	assert.ErrorIs(t, err, ErrKeyRevoked)
	_, err = s.Reserve(ctx, charge(k.ID, "b", 1))
	assert.ErrorIs(t, err, ErrKeyRevoked)
	_, _, err = s.RotateKey(ctx, "alice", k.ID)
	assert.ErrorIs(t, err, ErrConflict)
	_, err = s.UpdateKey(ctx, "alice", k.ID, testPolicy(t, "5", "", ""), nil)
	assert.ErrorIs(t, err, ErrConflict)
	_, err = s.RevokeKey(ctx, "alice", "key_nope")
	assert.ErrorIs(t, err, ErrNotFound)
	_, _, err = s.RotateKey(ctx, "alice", "key_nope")
	assert.ErrorIs(t, err, ErrNotFound)
}

func TestUpdateKey(t *testing.T) {
	ctx := context.Background()
	clock := newClock(t0)
	s, _ := MustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, tok := MustMint(t, s, "k", testPolicy(t, "99", "110", ""), map[string]string{"a": "1"})
	MustReserve(t, s, charge(k.ID, "a", 4000))
	MustSettle(t, s, SettleRequest{KeyID: k.ID, IdempotencyKey: "a", Outcome: SettleCommit, Amount: 4000})

	clock.Advance(time.Minute)
	np := testPolicy(t, "50", "60", "")
	updated, err := s.UpdateKey(ctx, "bob", k.ID, np, map[string]string{"b": "2"})
	require.NoError(t, err)
	assert.True(t, updated.Policy.DailyCap.Equal(*MustDec(t, "50")))
	assert.Equal(t, map[string]string{"b": "2"}, updated.Labels)
	assert.Equal(t, t0.Add(time.Minute), updated.UpdatedAt)
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
	require.ErrorIs(t, err, ErrInvalid)
	var ve *policy.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "currency", ve.Errors[0].Field)

	nocap := testPolicy(t, "", "", "")
	_, err = s.UpdateKey(ctx, "bob", k.ID, nocap, nil)
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = s.UpdateKey(ctx, "bob", "key_nope", np, nil)
	assert.ErrorIs(t, err, ErrNotFound)

	entries, _, err := s.ListAudit(ctx, 1, "")
	require.NoError(t, err)
	require.Len(t, entries, 1)
	e := entries[0]
	assert.Equal(t, "bob", e.Actor)
	assert.Equal(t, "key.update", e.Action)
	assert.Equal(t, k.ID, e.Target)
	assert.Equal(t, t0.Add(time.Minute), e.Time)
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

func TestListKeys(t *testing.T) {
	ctx := context.Background()
	clock := newClock(t0)
	s, _ := MustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	_, err := s.PutUpstream(ctx, "a", "eu", "stripe", "sk_test_eu")
	require.NoError(t, err)

	const n = 60
	var all []string
	for i := range n {
		p := testPolicy(t, "10", "", "")
		up := "default"
		labels := map[string]string{"team": "a", "n": strconv.Itoa(i)}
		if i%3 == 0 {
			up = "eu"
			labels["team"] = "b"
		}
		if i%10 == 0 {
			p.ExpiresAt = t0.Add(time.Hour) // expires once the clock moves on
		}
		k, _, err := s.MintKey(ctx, "a", MintRequest{Name: "key-" + strconv.Itoa(i), Upstream: up, Labels: labels, Policy: p})
		require.NoError(t, err)
		all = append(all, k.ID)
		if i%7 == 0 {
			_, err := s.RevokeKey(ctx, "a", k.ID)
			require.NoError(t, err)
		}
	}
	clock.Advance(2 * time.Hour)

	collect := func(t *testing.T, f KeyFilter) []Key {
		var out []Key
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
		keys, next, err := s.ListKeys(ctx, KeyFilter{})
		require.NoError(t, err)
		assert.Len(t, keys, 50)
		assert.NotEmpty(t, next)
		got := collect(t, KeyFilter{})
		require.Len(t, got, n)
		for i, k := range got {
			assert.Equal(t, all[i], k.ID, "oldest first")
		}
	})

	cases := map[string]struct {
		f    KeyFilter
		want func(i int) bool
	}{
		"revoked":        {KeyFilter{Status: KeyRevoked, Limit: 7}, func(i int) bool { return i%7 == 0 }},
		"expired":        {KeyFilter{Status: KeyExpired, Limit: 3}, func(i int) bool { return i%10 == 0 && i%7 != 0 }},
		"active":         {KeyFilter{Status: KeyActive, Limit: 33}, func(i int) bool { return i%10 != 0 && i%7 != 0 }},
		"upstream":       {KeyFilter{Upstream: "eu", Limit: 11}, func(i int) bool { return i%3 == 0 }},
		"label":          {KeyFilter{Labels: map[string]string{"team": "b"}}, func(i int) bool { return i%3 == 0 }},
		"two labels":     {KeyFilter{Labels: map[string]string{"team": "a", "n": "4"}}, func(i int) bool { return i == 4 }},
		"absent label":   {KeyFilter{Labels: map[string]string{"x": "a"}}, func(i int) bool { return false }},
		"name prefix":    {KeyFilter{NamePrefix: "key-1", Limit: 2}, func(i int) bool { return strings.HasPrefix("key-"+strconv.Itoa(i), "key-1") }},
		"upstream+state": {KeyFilter{Upstream: "default", Status: KeyActive, Limit: 500}, func(i int) bool { return i%3 != 0 && i%10 != 0 && i%7 != 0 }},
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
		keys, _, err := s.ListKeys(ctx, KeyFilter{Limit: 1000})
		require.NoError(t, err)
		assert.Len(t, keys, n, "the maximum, 500, covers them all")
		keys, next, err := s.ListKeys(ctx, KeyFilter{Limit: n})
		require.NoError(t, err)
		assert.Len(t, keys, n)
		assert.Empty(t, next, "no empty last page")
	})

	t.Run("bad input", func(t *testing.T) {
		_, _, err := s.ListKeys(ctx, KeyFilter{Cursor: "!!!"})
		assert.ErrorIs(t, err, ErrInvalid)
		_, _, err = s.ListKeys(ctx, KeyFilter{Status: "sleeping"})
		assert.ErrorIs(t, err, ErrInvalid)
	})
}

func TestNoSecretOrTokenInFile(t *testing.T) {
	ctx := context.Background()
	s, path := MustOpen(t, newClock(t0))
	const secret = "sk_live_SuperSecretValue_9f8e7d6c5b4a"
	MustUpstream(t, s, secret)
	k, tok := MustMint(t, s, "k", testPolicy(t, "99", "", ""), nil)
	_, tok2, err := s.RotateKey(ctx, "a", k.ID)
	require.NoError(t, err)
	const body = `{"id":"ch_SecretResponseBody_123","object":"charge"}`
	MustReserve(t, s, charge(k.ID, "a", 100))
	MustSettle(t, s, SettleRequest{KeyID: k.ID, IdempotencyKey: "a", Outcome: SettleCommit, Amount: 100,
		Response: &StoredResponse{Status: 200, Body: []byte(body)}})
	require.NoError(t, s.Close())

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	for name, needle := range map[string]string{
		"secret":            secret,
		"secret body":       "SuperSecretValue",
		"first token":       tok,
		"first token body":  tok[3:],
		"second token":      tok2,
		"second token body": tok2[3:],
		"response body":     "ch_SecretResponseBody_123",
	} {
		assert.False(t, bytes.Contains(data, []byte(needle)), "%s found in the database file", name)
	}
	assert.True(t, bytes.Contains(data, []byte(tokenHash(tok2))), "the check itself can find what is there")
}

func TestKeyStatusAt(t *testing.T) {
	k := Key{Status: KeyActive, Policy: testPolicy(t, "1", "", "")}
	assert.Equal(t, KeyActive, k.StatusAt(t0))
	assert.Equal(t, KeyExpired, k.StatusAt(k.Policy.ExpiresAt))
	k.Status = KeyRevoked
	assert.Equal(t, KeyRevoked, k.StatusAt(k.Policy.ExpiresAt))
}

func TestDerivedIDs(t *testing.T) {
	assert.Equal(t, HoldID("key_a", "x"), HoldID("key_a", "x"))
	assert.NotEqual(t, HoldID("key_a", "bc"), HoldID("key_ab", "c"))
	assert.NotEqual(t, UpstreamKey("key_a", "x"), UpstreamKey("key_b", "x"))
	assert.LessOrEqual(t, len(UpstreamKey("key_a", strings.Repeat("x", 255))), 255)
	assert.True(t, strings.HasPrefix(HoldID("k", "i"), "hold_"))
	assert.Len(t, HoldID("k", "i"), 5+26)
}

func TestErrorsAreTranslated(t *testing.T) {
	assert.ErrorIs(t, translate(errors.New("disk on fire")), ErrStorage)
	assert.ErrorIs(t, translate(ErrNotFound), ErrNotFound)
	assert.ErrorIs(t, translate(bolterrors.ErrDatabaseNotOpen), ErrClosed)
	assert.ErrorIs(t, translate(bolterrors.ErrTimeout), ErrLocked)
	assert.NotErrorIs(t, translate(bolterrors.ErrTimeout), bolterrors.ErrTimeout, "bbolt errors do not leak")
}

func TestGetKeyAndKeyUsage(t *testing.T) {
	ctx := context.Background()
	clock := newClock(time.Date(2026, 9, 14, 23, 30, 0, 0, time.UTC))
	s, _ := MustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	p := testPolicy(t, "99.00", "110.00", "")
	p.Timezone = "America/New_York"
	k, _ := MustMint(t, s, "ny", p, map[string]string{"a": "b"})

	got, err := s.GetKey(ctx, k.ID)
	require.NoError(t, err)
	assert.Equal(t, k, got)
	_, err = s.GetKey(ctx, "key_nope")
	assert.ErrorIs(t, err, ErrNotFound)
	_, _, _, err = s.KeyUsage(ctx, "key_nope")
	assert.ErrorIs(t, err, ErrNotFound)

	MustReserve(t, s, charge(k.ID, "a", 1500))
	MustSettle(t, s, SettleRequest{KeyID: k.ID, IdempotencyKey: "a", Outcome: SettleCommit, Amount: 1000})
	MustReserve(t, s, charge(k.ID, "b", 250))

	key, windows, usage, err := s.KeyUsage(ctx, k.ID)
	require.NoError(t, err)
	assert.Equal(t, k.ID, key.ID)
	require.Len(t, windows, 2)
	assert.Equal(t, "day:2026-09-14", windows[0].ID, "19:30 in New York is still the 14th")
	assert.Equal(t, int64(9900), windows[0].Cap)
	assert.Equal(t, "period", windows[1].ID)
	assert.Equal(t, int64(11000), windows[1].Cap)
	assert.Equal(t, policy.Usage{
		"day:2026-09-14": {Committed: 1000, Held: 250},
		"period":         {Committed: 1000, Held: 250},
	}, usage)
}

func TestListAuditPaginates(t *testing.T) {
	ctx := context.Background()
	s, _ := MustOpen(t, newClock(t0))
	for i := range 12 {
		_, err := s.PutUpstream(ctx, "alice", "up-"+strconv.Itoa(i), "stripe", "sk_test_"+strconv.Itoa(i))
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
	assert.ErrorIs(t, err, ErrInvalid)
}

// TestCheckInvariantDetects corrupts a consistent store in one way per case and
// requires CheckInvariant to notice: the check the other tests rely on bites.
func TestCheckInvariantDetects(t *testing.T) {
	cases := map[string]func(tx *boltTx, keyID string) error{
		"held counter off by one": func(tx *boltTx, keyID string) error {
			c, _, err := getCounter(tx, keyID, "period")
			if err != nil {
				return err
			}
			c.Held++
			return putCounter(tx, keyID, "period", c)
		},
		"committed counter without a ledger entry": func(tx *boltTx, keyID string) error {
			c, _, err := getCounter(tx, keyID, "day:2026-09-14")
			if err != nil {
				return err
			}
			c.Committed += 5
			return putCounter(tx, keyID, "day:2026-09-14", c)
		},
		"over the cap": func(tx *boltTx, keyID string) error {
			h := &holdRec{ID: HoldID(keyID, "forged"), KeyID: keyID, IdempotencyKey: "forged", Amount: 9000,
				WindowIDs: []string{"day:2026-09-14", "period"}, State: HoldHeld, CreatedAt: t0}
			if err := putRecord(tx, &recordRec{KeyID: keyID, Idem: "forged", State: RecordInProgress, Hold: h}); err != nil {
				return err
			}
			if err := putEvent(tx, &Event{KeyID: keyID, WindowIDs: h.WindowIDs, HeldDelta: h.Amount}); err != nil {
				return err
			}
			return addToWindows(tx, keyID, h.WindowIDs, h.Amount, 0, 0)
		},
		"record and hold disagree": func(tx *boltTx, keyID string) error {
			r, err := getRecord(tx, keyID, "held")
			if err != nil {
				return err
			}
			r.Hold.State = HoldUnknown
			return putRecord(tx, r)
		},
		"hold index out of step": func(tx *boltTx, keyID string) error {
			r, err := getRecord(tx, keyID, "held")
			if err != nil {
				return err
			}
			return tx.Bucket(bucketHoldIndex).Delete(holdIndexKey(r.Hold))
		},
	}
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s, _ := MustOpen(t, newClock(t0))
			MustUpstream(t, s, "sk_test_abcdef1234")
			k, _ := MustMint(t, s, "k", testPolicy(t, "100.00", "150.00", ""), nil)
			MustReserve(t, s, charge(k.ID, "held", 2000))
			MustReserve(t, s, charge(k.ID, "done", 1000))
			MustSettle(t, s, SettleRequest{KeyID: k.ID, IdempotencyKey: "done", Outcome: SettleCommit, Amount: 1000})
			require.NoError(t, s.CheckInvariant(ctx), "consistent before")

			require.NoError(t, s.db.Update(func(tx *bolt.Tx) error { return corrupt(tx, k.ID) }))
			err := s.CheckInvariant(ctx)
			assert.ErrorIs(t, err, ErrInvariant)
			require.NoError(t, s.Close()) // the cleanup's check would fail, as it should
		})
	}
}

func TestRecordEvent(t *testing.T) {
	clock := newClock(t0)
	s, _ := MustOpen(t, clock)
	MustUpstream(t, s, "sk_test_secret")
	k, _ := MustMint(t, s, "k", testPolicy(t, "10.00", "", ""), nil)
	ctx := context.Background()

	for name, ev := range map[string]Event{
		"no key":    {Operation: "customers.create"},
		"money":     {KeyID: k.ID, Amount: 1},
		"a hold":    {KeyID: k.ID, HoldID: "hold_x"},
		"held":      {KeyID: k.ID, HeldDelta: 1},
		"committed": {KeyID: k.ID, CommittedDelta: 1},
	} {
		assert.ErrorIs(t, s.RecordEvent(ctx, ev), ErrInvalid, name)
	}

	clock.Advance(time.Minute)
	require.NoError(t, s.RecordEvent(ctx, Event{KeyID: k.ID, Operation: "customers.create",
		Decision: "would_refuse", Reason: "operation_not_allowed", Time: t0.Add(-time.Hour)}))
	events, _, err := s.ListEvents(ctx, k.ID, 10, "")
	require.NoError(t, err)
	require.Len(t, events, 1)
	assert.Equal(t, DecisionWouldRefuse, events[0].Decision)
	assert.Equal(t, "operation_not_allowed", events[0].Reason)
	assert.Equal(t, "customers.create", events[0].Operation)
	assert.True(t, events[0].Time.Equal(t0.Add(time.Minute)), "stamped with the store clock, not the caller's: %s", events[0].Time)
	assert.NotEmpty(t, events[0].ID)
}
