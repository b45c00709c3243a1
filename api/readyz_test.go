package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
)

// readyAnswer is a decoded GET /readyz.
type readyAnswer struct {
	Status string `json:"status"`
	Reason string `json:"reason"`
}

func getReady(tb testing.TB, url string) (int, readyAnswer) {
	tb.Helper()
	resp, err := http.Get(url + "/readyz")
	require.NoError(tb, err)
	defer resp.Body.Close()
	var a readyAnswer
	require.NoError(tb, json.NewDecoder(resp.Body).Decode(&a))
	assert.Equal(tb, "no-store", resp.Header.Get("Cache-Control"))
	return resp.StatusCode, a
}

func TestReadyzOnBothListeners(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t) // no upstream yet
	proxyListener := httptest.NewServer(api.NewProxyListener(api.ProxyConfig{Store: env.store, Stripe: http.NotFoundHandler()}))
	t.Cleanup(proxyListener.Close)

	// The admin answers are checked against the OpenAPI document.
	r := env.Do(http.MethodGet, "/readyz", "", nil)
	assert.Equal(t, http.StatusServiceUnavailable, r.Status)
	assert.JSONEq(t, `{"status": "not_ready", "reason": "no upstream is registered: start with STRIPE_SECRET_KEY set, or POST /api/v1/upstreams"}`, string(r.Body))
	status, a := getReady(t, proxyListener.URL)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Contains(t, a.Reason, "no upstream")

	env.MustUpstream("default")
	r = env.Do(http.MethodGet, "/readyz", "", nil)
	assert.Equal(t, http.StatusOK, r.Status)
	assert.JSONEq(t, `{"status": "ready"}`, string(r.Body))
	status, a = getReady(t, proxyListener.URL)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "ready", a.Status)

	require.NoError(t, env.store.Close())
	r = env.Do(http.MethodGet, "/readyz", "", nil)
	assert.Equal(t, http.StatusServiceUnavailable, r.Status)
	assert.JSONEq(t, `{"status": "not_ready", "reason": "the store is closed"}`, string(r.Body))
	status, a = getReady(t, proxyListener.URL)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Equal(t, "the store is closed", a.Reason)
	r = env.Do(http.MethodGet, "/healthz", "", nil)
	assert.Equal(t, http.StatusOK, r.Status, "liveness is not readiness: the process is still up")
}

func TestReadyzWithoutStore(t *testing.T) {
	t.Parallel()
	srv, _ := MustProxyListener(t) // no store: the agent endpoints are not mounted either
	status, a := getReady(t, srv.URL)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Equal(t, readyAnswer{Status: "not_ready", Reason: "no store is configured"}, a)
}
