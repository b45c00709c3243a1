package api_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
)

// TestAdminConcurrentPatchesOfTwoReplicasBothApply: two admin APIs over one
// store, as two replicas are over one database, each patch another field of
// the same key at the same moment — one lowers the daily cap, the other sets
// a label. Both answer 200 and both changes are in the key afterwards: the
// merge patch is applied to the key as it is inside the store's transaction,
// not to a read taken before the other replica wrote.
func TestAdminConcurrentPatchesOfTwoReplicasBothApply(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("raced", "", nil, seedLegacyPolicy)
	other := httptest.NewServer(api.NewAdmin(api.AdminConfig{Store: env.store, JWTSecret: env.secret, Now: env.clock.Now,
		Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(other.Close)

	patch := func(base, body string) int {
		req, err := http.NewRequest(http.MethodPatch, base+"/api/v1/keys/"+k.ID, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+env.adminToken)
		req.Header.Set("Content-Type", "application/merge-patch+json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	const rounds = 40
	lost := 0
	for i := range rounds {
		capCents := 500 + i // a new cap each round, so a lost one shows
		capText := fmt.Sprintf("%d.%02d", capCents/100, capCents%100)
		var wg sync.WaitGroup
		var capStatus, labelStatus int
		wg.Go(func() { capStatus = patch(env.srv.URL, `{"policy":{"daily_cap":"`+capText+`"}}`) })
		wg.Go(func() { labelStatus = patch(other.URL, fmt.Sprintf(`{"labels":{"round":"%d"}}`, i)) })
		wg.Wait()
		require.Equal(t, http.StatusOK, capStatus)
		require.Equal(t, http.StatusOK, labelStatus)
		r := env.Do(http.MethodGet, "/api/v1/keys/"+k.ID, env.adminToken, nil)
		require.Equal(t, http.StatusOK, r.Status)
		var got mintedKey
		r.Decode(t, &got)
		if got.Policy["daily_cap"] != capText || got.Labels["round"] != fmt.Sprint(i) {
			lost++
			t.Logf("round %d: daily_cap %v (sent %s), label %q", i, got.Policy["daily_cap"], capText, got.Labels["round"])
		}
	}
	assert.Zero(t, lost, "rounds of %d that lost an update", rounds)
}

// TestAdminKeyETagAndIfMatch: every answer about a key carries its ETag; a
// PATCH with If-Match applies only to that version of the key (412 once it
// changed), "*" only asks that the key exists, and an ETag keybrake never
// gave matches nothing.
func TestAdminKeyETagAndIfMatch(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("tagged", "", nil, seedLegacyPolicy)

	r := env.Do(http.MethodGet, "/api/v1/keys/"+k.ID, env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	etag := r.Header.Get("ETag")
	require.Equal(t, `"1"`, etag)

	r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, `{"labels":{"a":"1"}}`, "If-Match", etag)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	next := r.Header.Get("ETag")
	assert.Equal(t, `"2"`, next)

	r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, `{"policy":{"daily_cap":"1.00"}}`, "If-Match", etag)
	require.Equal(t, http.StatusPreconditionFailed, r.Status, "body: %s", r.Body)
	assert.Equal(t, api.ProblemPrecondition, r.Problem(t).Type)
	r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, `{}`, "If-Match", etag)
	assert.Equal(t, http.StatusPreconditionFailed, r.Status, "an empty patch checks the ETag too")
	for _, bad := range []string{`W/"2"`, `2`, `"2", "3"`, `"x"`} {
		r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, `{"labels":{"b":"2"}}`, "If-Match", bad)
		assert.Equal(t, http.StatusPreconditionFailed, r.Status, "If-Match %s", bad)
	}
	r = env.Do(http.MethodGet, "/api/v1/keys/"+k.ID, env.adminToken, nil)
	var got mintedKey
	r.Decode(t, &got)
	assert.Equal(t, "99.00", got.Policy["daily_cap"], "the refused patches changed nothing")
	assert.Equal(t, map[string]string{"a": "1"}, got.Labels)
	assert.Equal(t, next, r.Header.Get("ETag"))

	r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.adminToken, `{"labels":{"b":"2"}}`, "If-Match", "*")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	r = env.Do(http.MethodPatch, "/api/v1/keys/key_nope", env.adminToken, `{"labels":{"b":"2"}}`, "If-Match", "*")
	assert.Equal(t, http.StatusNotFound, r.Status)

	r = env.Do(http.MethodPost, "/api/v1/keys/"+k.ID+"/rotate", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	assert.Equal(t, `"4"`, r.Header.Get("ETag"), "a rotation is a new version")
	r = env.Do(http.MethodPost, "/api/v1/keys/"+k.ID+"/revoke", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	assert.Equal(t, `"5"`, r.Header.Get("ETag"))
}
