package proxy_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/vault"
)

// A request with a revoked key is refused with a log line that names the path
// and the key (id and name), and is counted on the key with its address; a
// token that is no key's is counted by the proxy, with no key named.
func TestRefusedKeysAreLoggedAndCounted(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	ctx := context.Background()
	tok, key := e.MustKey(t, Policy("99.00"))
	_, err := e.Store.RevokeKey(ctx, "test", key.ID)
	require.NoError(t, err)

	for range 3 {
		AssertRefusal(t, e.Post(t, "/v1/charges", tok, "a", form("amount", "100", "currency", "usd", "source", "tok_visa")),
			http.StatusUnauthorized, "vault_key_revoked")
	}
	AssertRefusal(t, e.MustSend(t, http.MethodGet, "/v1/customers/cus_1?expand[]=x", tok, nil, ""), http.StatusUnauthorized, "vault_key_revoked")

	var refused []map[string]any
	for _, l := range e.Logs.LogLines(t) {
		if l["reason"] == "vault_key_revoked" {
			refused = append(refused, l)
		}
	}
	require.Len(t, refused, 4)
	assert.Equal(t, "/v1/charges", refused[0]["path"])
	assert.Equal(t, "/v1/customers/cus_1", refused[3]["path"], "the path, without the query")
	assert.Equal(t, key.ID, refused[0]["key_id"])
	assert.Equal(t, key.Name, refused[0]["key_name"])
	assert.Equal(t, "127.0.0.1", refused[0]["remote_addr"])

	e.Proxy.FlushKeyRefusals(ctx)
	got, err := e.Store.GetKey(ctx, key.ID)
	require.NoError(t, err)
	assert.Equal(t, int64(4), got.Refused.Count)
	assert.Equal(t, "vault_key_revoked", got.Refused.Code)
	assert.Equal(t, "127.0.0.1", got.Refused.RemoteAddr)
	assert.Equal(t, "/v1/customers/cus_1", got.Refused.Path)

	before := e.Proxy.UnknownKeyRefusals().Count
	AssertRefusal(t, e.MustSend(t, http.MethodGet, "/v1/balance", "vk_"+key.ID, nil, ""), http.StatusUnauthorized, "vault_key_invalid")
	u := e.Proxy.UnknownKeyRefusals()
	assert.Equal(t, before+1, u.Count)
	assert.Equal(t, "/v1/balance", u.Path)
	assert.Equal(t, "127.0.0.1", u.RemoteAddr)
	lines := e.Logs.LogLines(t)
	last := lines[len(lines)-1]
	assert.Equal(t, "/v1/balance", last["path"])
	assert.Equal(t, "", last["key_id"])
	assert.Equal(t, "", last["key_name"])
}

// A vault key that a shell pipeline mangled is refused with an error that says
// what is wrong with it.
func TestMangledVaultKeysAreNamed(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	cases := map[string]struct {
		auth string
		want string
	}{
		"jq's null":     {"Bearer null", `the vault key is the word "null"`},
		"basic null":    {"Basic bnVsbDo=", `the vault key is the word "null"`},
		"empty bearer":  {"Bearer ", "the vault key is empty"},
		"empty basic":   {"Basic Og==", "the vault key is empty"},
		"not vk_":       {"Bearer abc123", "a vault key starts with vk_"},
		"cut short":     {"Bearer " + tok[:20], "it was cut short or has something appended"},
		"appended":      {"Bearer " + tok + "x", "it was cut short or has something appended"},
		"bad character": {"Bearer " + tok[:len(tok)-1] + "!", "only letters, digits, - and _"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := e.MustSend(t, http.MethodGet, "/v1/balance", "", http.Header{"Authorization": {tc.auth}}, "")
			AssertRefusal(t, r, http.StatusUnauthorized, "vault_key_invalid")
			assert.Contains(t, r.ErrMessage(), tc.want)
			assert.NotContains(t, r.ErrMessage(), "Invalid vault key provided")
		})
	}
}

// The refusal of an unknown token is stamped with the store's clock, like
// every other decision about a key, not the process's: on a replica whose own
// clock is two days fast, the last refusal is still at the store's now.
func TestUnknownKeyRefusalFollowsTheStoreClock(t *testing.T) {
	t.Parallel()
	storeClock, processClock := &offsetClock{}, &offsetClock{}
	processClock.Advance(48 * time.Hour)
	e := MustEnv(t, withClocks(storeClock.Now, processClock.Now))
	before := time.Now()
	AssertRefusal(t, e.MustSend(t, http.MethodGet, "/v1/balance", "vk_unknown", nil, ""), http.StatusUnauthorized, "vault_key_invalid")
	u := e.Proxy.UnknownKeyRefusals()
	assert.Equal(t, int64(1), u.Count)
	assert.False(t, u.Last.Before(before), "stamped at the store's now")
	assert.True(t, u.Last.Before(before.Add(24*time.Hour)), "not at the process's clock, two days fast: %s", u.Last)
}

// refusalWrites counts the proxy's RecordKeyRefusal calls on the real store.
type refusalWrites struct {
	vault.Store
	n atomic.Int64
}

func (s *refusalWrites) RecordKeyRefusal(ctx context.Context, id string, r vault.KeyRefusal) error {
	s.n.Add(1)
	return s.Store.RecordKeyRefusal(ctx, id, r)
}

// A holder of a revoked token cannot make the store write at will: a burst of
// refusals is added up in memory and written once, and the key's count is
// exact after the write.
func TestRevokedKeyBurstWritesTheStoreOnce(t *testing.T) {
	t.Parallel()
	writes := &refusalWrites{}
	e := MustEnv(t, func(o *envOptions) {
		o.wrapStore = func(s vault.Store) vault.Store { writes.Store = s; return writes }
	})
	proxy.SetRefusalFlushInterval(e.Proxy, time.Hour) // only Shutdown writes, however slow the burst
	ctx := context.Background()
	tok, key := e.MustKey(t, Policy("99.00"))
	_, err := e.Store.RevokeKey(ctx, "test", key.ID)
	require.NoError(t, err)

	const burst = 200
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			path := "/v1/balance"
			if i == 0 {
				path = "/v1/charges"
			}
			resp := e.MustSend(t, http.MethodGet, path, tok, nil, "")
			assert.Equal(t, http.StatusUnauthorized, resp.Status)
		})
	}
	wg.Wait()
	assert.Zero(t, writes.n.Load(), "nothing written before the flush")
	e.Proxy.Shutdown(ctx)
	assert.Equal(t, int64(1), writes.n.Load(), "store writes for %d refusals", burst)
	got, err := e.Store.GetKey(ctx, key.ID)
	require.NoError(t, err)
	assert.Equal(t, int64(burst), got.Refused.Count)
	assert.Equal(t, "vault_key_revoked", got.Refused.Code)
	assert.Equal(t, "127.0.0.1", got.Refused.RemoteAddr)

	e.Proxy.Shutdown(ctx)
	assert.Equal(t, int64(1), writes.n.Load(), "nothing pending, nothing written")
}
