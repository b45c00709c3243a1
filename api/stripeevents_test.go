package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/proxy/fakestripe"
)

// The webhook secrets of an upstream: set through the admin API, sealed,
// never returned, at most two.
func TestUpstreamWebhookSecrets(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	const old, cur = "whsec_oldsecretAAAA", "whsec_newsecretBBBB"

	r := env.Do(http.MethodPatch, "/api/v1/upstreams/default", env.adminToken, map[string]any{"webhook_secrets": []string{cur, old}})
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var view struct {
		Last4 []string `json:"webhook_secrets_last4"`
	}
	r.Decode(t, &view)
	assert.Equal(t, []string{"BBBB", "AAAA"}, view.Last4)
	assert.NotContains(t, string(r.Body), "newsecret")

	secrets, err := env.store.UpstreamWebhookSecrets(t.Context(), "default")
	require.NoError(t, err)
	assert.Equal(t, []string{cur, old}, secrets)

	list := env.Do(http.MethodGet, "/api/v1/upstreams", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, list.Status)
	assert.Contains(t, string(list.Body), `"webhook_secrets_last4":["BBBB","AAAA"]`)
	assert.NotContains(t, string(list.Body), "secretBBBB")

	// A new API secret keeps the webhook secrets.
	env.MustUpstream("default")
	secrets, err = env.store.UpstreamWebhookSecrets(t.Context(), "default")
	require.NoError(t, err)
	assert.Equal(t, []string{cur, old}, secrets)

	for name, tc := range map[string]struct {
		body   any
		token  string
		path   string
		status int
	}{
		"three":          {map[string]any{"webhook_secrets": []string{cur, old, "whsec_third"}}, env.adminToken, "default", http.StatusUnprocessableEntity},
		"not a whsec":    {map[string]any{"webhook_secrets": []string{"sk_test_abc"}}, env.adminToken, "default", http.StatusUnprocessableEntity},
		"a space":        {map[string]any{"webhook_secrets": []string{"whsec_a b"}}, env.adminToken, "default", http.StatusUnprocessableEntity},
		"nothing":        {map[string]any{}, env.adminToken, "default", http.StatusUnprocessableEntity},
		"unknown member": {map[string]any{"secret": "sk_test_x"}, env.adminToken, "default", http.StatusUnprocessableEntity},
		"viewer":         {map[string]any{"webhook_secrets": []string{}}, env.viewerToken, "default", http.StatusForbidden},
		"no upstream":    {map[string]any{"webhook_secrets": []string{cur}}, env.adminToken, "nosuch", http.StatusNotFound},
	} {
		r := env.Do(http.MethodPatch, "/api/v1/upstreams/"+tc.path, tc.token, tc.body)
		assert.Equal(t, tc.status, r.Status, "%s: %s", name, r.Body)
	}
	secrets, err = env.store.UpstreamWebhookSecrets(t.Context(), "default")
	require.NoError(t, err)
	assert.Equal(t, []string{cur, old}, secrets, "refused changes changed nothing")

	// Registered with its webhook secret at once; [] removes them.
	r = env.Do(http.MethodPost, "/api/v1/upstreams", env.adminToken,
		map[string]any{"name": "eu", "secret": testStripeSecret, "webhook_secrets": []string{cur}})
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	assert.Contains(t, string(r.Body), `"webhook_secrets_last4":["BBBB"]`)
	r = env.Do(http.MethodPatch, "/api/v1/upstreams/eu", env.adminToken, map[string]any{"webhook_secrets": []string{}})
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	assert.Contains(t, string(r.Body), `"webhook_secrets_last4":[]`)

	for _, e := range env.MustAudit(100) {
		assert.NotContains(t, string(e.Before)+string(e.After), "secretBBBB", "the audit keeps no secret")
	}
}

// The events endpoint on the proxy listener: a delivery signed at the store's
// clock is received; one that is not answers 400 with its reason as the
// problem type; the tolerance is measured against the store's clock, not the
// process's.
func TestProxyListenerStripeEvents(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	const secret = "whsec_listenertest"
	_, err := env.store.SetUpstreamWebhookSecrets(t.Context(), "test", "default", []string{secret})
	require.NoError(t, err)
	url := env.proxyURL + "/keybrake/v1/stripe/events/default"
	ev := env.fake.EventOf("payment_intent.succeeded", map[string]any{"id": "pi_nobodys", "object": "payment_intent",
		"amount": 1000, "amount_received": 1000, "currency": "usd", "status": "succeeded"})

	status, body, err := fakestripe.DeliverAt(url, ev.JSON(), env.clock.Now(), secret)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var got map[string]any
	require.NoError(t, json.Unmarshal(body, &got))
	assert.Equal(t, map[string]any{"received": true, "outcome": "dropped"}, got)

	status, body, err = fakestripe.DeliverAt(url, ev.JSON(), env.clock.Now(), secret)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.Contains(t, string(body), `"duplicate"`)

	problem := func(status int, body []byte) api.Problem {
		t.Helper()
		var p api.Problem
		require.NoError(t, json.Unmarshal(body, &p), "%s", body)
		assert.Equal(t, status, p.Status)
		return p
	}
	ev2 := env.fake.EventOf("payment_intent.canceled", map[string]any{"id": "pi_other", "object": "payment_intent"})
	status, body, err = fakestripe.DeliverAt(url, ev2.JSON(), env.clock.Now(), "whsec_wrong")
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, api.ProblemStripeEvent+"signature_invalid", problem(status, body).Type)

	// Signed now by the process's clock, which is far from the store's.
	status, body, err = fakestripe.DeliverAt(url, ev2.JSON(), env.clock.Now().AddDate(0, 3, 0), secret)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, api.ProblemStripeEvent+"timestamp_outside_tolerance", problem(status, body).Type)

	status, body, err = fakestripe.DeliverAt(env.proxyURL+"/keybrake/v1/stripe/events/nosuch", ev2.JSON(), env.clock.Now(), secret)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, api.ProblemStripeEvent+"unknown_upstream", problem(status, body).Type)

	big := bytes.Repeat([]byte(" "), 2<<20)
	status, body, err = fakestripe.DeliverAt(url, big, env.clock.Now(), secret)
	require.NoError(t, err)
	assert.Equal(t, http.StatusRequestEntityTooLarge, status)
	assert.Equal(t, api.ProblemStripeEvent+"event_too_large", problem(status, body).Type)

	// No vault key is asked for, and no other method is served.
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), api.ContentTypeProblem))
}
