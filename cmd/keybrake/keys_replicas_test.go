package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// TestRememberedKeysAcrossReplicas: a replica serves a key it authenticated
// before from memory, and what another replica changes still holds on its very
// next request: a lower cap refuses a charge before Stripe sees it, a
// replaced secret is the one its reads and its amount lookups send, a rotated
// token is refused on a charge and on a read, and a revoked key too.
func TestRememberedKeysAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	fake, store, k, tok, rs := twoReplicasWithKey(t, "remembered")
	serving := rs.proxyURL(1)
	charge := func(token, idem string, amount int64) (int, string) {
		t.Helper()
		return mustCharge(t, serving, token, idem, amount)
	}
	read := func(token, path string) (int, string) {
		t.Helper()
		status, body := MustGet(t, serving+path, token)
		return status, string(body)
	}
	allAuthorizedFrom := func(i int) {
		t.Helper()
		for _, r := range fake.RequestsFrom(i) {
			assert.True(t, r.Authorized, "%s %s reached Stripe with the replaced secret", r.Method, r.Path)
		}
	}

	// Replica 1 authenticates the key, and remembers it.
	status, body := charge(tok, "first", 1000)
	require.Equal(t, http.StatusOK, status, body)
	var ch struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(body), &ch))
	status, body = read(tok, "/v1/charges/"+ch.ID)
	require.Equal(t, http.StatusOK, status, body)

	// A lower cap, written through another replica: the next charge is refused.
	p := MustPolicy(t, 15)
	_, err := store.UpdateKey(ctx, "test", k.ID, p, nil)
	require.NoError(t, err)
	before := fake.Count()
	status, body = charge(tok, "over-new-cap", 1000)
	assert.Equal(t, http.StatusPaymentRequired, status, body)
	assert.Contains(t, body, "cap")
	assert.Equal(t, before, fake.Count(), "refused before Stripe")

	// A replaced secret: a read, which makes no Reserve, and a confirm, whose
	// amount is looked up first, send the new one.
	fake.SetSecret("sk_test_after_2222")
	_, _, err = store.PutUpstream(ctx, "test", upstreamDefault, "stripe", "sk_test_after_2222")
	require.NoError(t, err)
	before = fake.Count()
	status, body = read(tok, "/v1/charges/"+ch.ID)
	assert.Equal(t, http.StatusOK, status, body)
	allAuthorizedFrom(before)
	pi := fake.AddPaymentIntent(300, "usd", "")
	// Replaced again, without a read between: the confirm's amount is looked
	// up with the key replica 1 remembers, read again first.
	fake.SetSecret("sk_test_third_3333")
	_, _, err = store.PutUpstream(ctx, "test", upstreamDefault, "stripe", "sk_test_third_3333")
	require.NoError(t, err)
	before = fake.Count()
	status, b, err := postForm(ctx, http.DefaultClient, serving+"/v1/payment_intents/"+pi+"/confirm", tok, "confirm", url.Values{})
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status, "%s", b)
	assert.Greater(t, fake.Count(), before+1, "the amount was looked up, then the confirm sent")
	allAuthorizedFrom(before)

	// A rotated token: the old one is refused on a charge and a read.
	_, newTok, err := store.RotateKey(ctx, "test", k.ID)
	require.NoError(t, err)
	before = fake.Count()
	status, body = charge(tok, "old-token", 100)
	assert.Equal(t, http.StatusUnauthorized, status, body)
	assert.Contains(t, body, "vault_key_invalid")
	status, body = read(tok, "/v1/charges/"+ch.ID)
	assert.Equal(t, http.StatusUnauthorized, status, body)
	assert.Contains(t, body, "vault_key_invalid")
	assert.Equal(t, before, fake.Count(), "nothing reached Stripe under the old token")

	// The new token reads, then the key is revoked: both refused.
	status, body = read(newTok, "/v1/charges/"+ch.ID)
	require.Equal(t, http.StatusOK, status, body)
	_, err = store.RevokeKey(ctx, "test", k.ID)
	require.NoError(t, err)
	before = fake.Count()
	status, body = read(newTok, "/v1/charges/"+ch.ID)
	assert.Equal(t, http.StatusUnauthorized, status, body)
	assert.Contains(t, body, "vault_key_revoked")
	status, body = charge(newTok, "revoked", 100)
	assert.Equal(t, http.StatusUnauthorized, status, body)
	assert.Contains(t, body, "vault_key_revoked")
	assert.Equal(t, before, fake.Count(), "nothing reached Stripe after the revocation")

	rs.stopAll()
	fake.WaitIdle(t)
	assertMetered(t, store, k.ID, 1300)
}

// mustCharge posts a charge of amount cents with idempotency key idem to the
// proxy at proxyURL and returns the status and body.
func mustCharge(t *testing.T, proxyURL, token, idem string, amount int64) (int, string) {
	t.Helper()
	status, body, err := postForm(context.Background(), http.DefaultClient, proxyURL+"/v1/charges", token, idem, chargeForm(amount, idem))
	require.NoError(t, err)
	return status, string(body)
}

// TestRememberedKeysAreNotRefusedStale: a replica never refuses a key on what
// it remembers of it. A key not valid yet, then made valid through another
// replica, is served on the next request; a key that expires, extended
// through another replica before it does, is served once its old expiry
// has passed.
func TestRememberedKeysAreNotRefusedStale(t *testing.T) {
	ctx := context.Background()
	fake, store, _, _, rs := twoReplicasWithKey(t, "unused")
	serving := rs.proxyURL(1)
	mint := func(name string, change func(p *policy.Policy)) (vault.Key, string) {
		p := MustPolicy(t, 50)
		change(&p)
		k, tok, err := store.MintKey(ctx, "test", vault.MintRequest{Name: name, Upstream: upstreamDefault, Policy: p})
		require.NoError(t, err)
		return k, tok
	}
	update := func(k vault.Key, change func(p *policy.Policy)) {
		p := k.Policy
		change(&p)
		_, err := store.UpdateKey(ctx, "test", k.ID, p, nil)
		require.NoError(t, err)
	}
	charge := func(token, idem string) (int, string) {
		t.Helper()
		return mustCharge(t, serving, token, idem, 100)
	}

	later, laterTok := mint("later", func(p *policy.Policy) { p.PeriodStart = time.Now().Add(time.Hour).UTC().Truncate(time.Second) })
	status, body := charge(laterTok, "too-early")
	require.Equal(t, http.StatusForbidden, status, body)
	assert.Contains(t, body, "vault_key_not_yet_valid")
	update(later, func(p *policy.Policy) { p.PeriodStart = time.Now().Add(-time.Minute).UTC().Truncate(time.Second) })
	status, body = charge(laterTok, "valid-now")
	assert.Equal(t, http.StatusOK, status, "made valid through another replica: %s", body)

	expiry := time.Now().Add(4 * time.Second).UTC().Truncate(time.Second) // time for the first charge on a loaded machine
	soon, soonTok := mint("soon", func(p *policy.Policy) { p.ExpiresAt = expiry })
	status, body = charge(soonTok, "before-expiry")
	require.Equal(t, http.StatusOK, status, body)
	update(soon, func(p *policy.Policy) { p.ExpiresAt = expiry.Add(time.Hour) })
	time.Sleep(time.Until(expiry.Add(200 * time.Millisecond)))
	status, body = charge(soonTok, "after-old-expiry")
	assert.Equal(t, http.StatusOK, status, "extended through another replica: %s", body)

	rs.stopAll()
	fake.WaitIdle(t)
	assertMetered(t, store, later.ID, 100)
	assertMetered(t, store, soon.ID, 200)
}
