package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Clients iterate over listings and labels without a null check: an empty listing
// is [], a key without labels has {}, and a time that has not happened (revoked_at,
// settled_at) is left out rather than null or the zero time.
func TestAdminViewsNeverNull(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)

	for path, member := range map[string]string{
		"/api/v1/upstreams":          "upstreams",
		"/api/v1/keys":               "keys",
		"/api/v1/holds":              "holds",
		"/api/v1/holds?state=held":   "holds",
		"/api/v1/keys?status=active": "keys",
	} {
		r := env.Do(http.MethodGet, path, env.viewerToken, nil)
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", path, r.Body)
		assert.Equal(t, []any{}, r.JSON(t)[member], "%s lists nothing as []", path)
	}

	env.MustUpstream("default")
	k := env.MustMint("no-labels", "", nil, seedLegacyPolicy)

	r := env.Do(http.MethodGet, "/api/v1/keys/"+k.ID, env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	m := r.JSON(t)
	assert.Equal(t, map[string]any{}, m["labels"])
	assert.NotContains(t, m, "revoked_at")

	r = env.Do(http.MethodGet, "/api/v1/keys/"+k.ID+"/events", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	assert.Equal(t, []any{}, r.JSON(t)["events"])

	env.MustHold(k.ID, "still-held", 500, "")
	r = env.Do(http.MethodGet, "/api/v1/holds?state=held", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	holds, ok := r.JSON(t)["holds"].([]any)
	require.True(t, ok, "body: %s", r.Body)
	require.Len(t, holds, 1)
	hold, ok := holds[0].(map[string]any)
	require.True(t, ok)
	assert.NotContains(t, hold, "settled_at", "a hold still held has not settled")
	assert.NotNil(t, hold["windows"])
}
