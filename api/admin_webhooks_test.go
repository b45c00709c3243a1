package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAdminWebhooks: the endpoints API on a real store, every answer checked
// against the OpenAPI document: the secret once, internal destinations
// refused, viewers read only, If-Match, rotate, test, deliveries, retry,
// delete, and the audit of each write.
func TestAdminWebhooks(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	const public = "https://93.184.215.14/keybrake"
	for name, u := range map[string]string{
		"loopback":   "http://127.0.0.1:9000/hook",
		"localhost":  "http://localhost:9000/hook",
		"private":    "http://10.1.2.3/hook",
		"metadata":   "http://169.254.169.254/latest/meta-data",
		"ipv6 local": "http://[::1]/hook",
		"mapped":     "http://[::ffff:192.168.0.1]/hook",
	} {
		r := env.Do(http.MethodPost, "/api/v1/webhooks", env.adminToken, map[string]any{"url": u, "events": []string{"*"}})
		require.Equal(t, http.StatusUnprocessableEntity, r.Status, name)
		assert.Equal(t, []string{"url"}, r.ErrorFields(t), name)
	}
	r := env.Do(http.MethodPost, "/api/v1/webhooks", env.viewerToken, map[string]any{"url": public, "events": []string{"*"}})
	require.Equal(t, http.StatusForbidden, r.Status)
	r = env.Do(http.MethodPost, "/api/v1/webhooks", env.adminToken, map[string]any{"url": public, "events": []string{"nope"}})
	require.Equal(t, http.StatusUnprocessableEntity, r.Status)

	r = env.Do(http.MethodPost, "/api/v1/webhooks", env.adminToken, map[string]any{
		"url": public, "events": []string{"budget.threshold_crossed", "spend_cap.refused"}, "thresholds": []int{90, 50},
		"description": "billing on-call",
	})
	require.Equal(t, http.StatusCreated, r.Status, string(r.Body))
	var created struct {
		ID         string `json:"id"`
		Secret     string `json:"secret"`
		Thresholds []int  `json:"thresholds"`
		Version    int    `json:"version"`
	}
	r.Decode(t, &created)
	assert.True(t, strings.HasPrefix(created.Secret, "whsec_"))
	assert.Equal(t, []int{50, 90}, created.Thresholds)
	assert.Equal(t, `"1"`, r.Header.Get("ETag"))

	r = env.Do(http.MethodGet, "/api/v1/webhooks/"+created.ID, env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	assert.NotContains(t, string(r.Body), created.Secret, "the secret is shown once")
	r = env.Do(http.MethodGet, "/api/v1/webhooks", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	assert.Len(t, r.JSON(t)["webhooks"], 1)

	r = env.Do(http.MethodPatch, "/api/v1/webhooks/"+created.ID, env.adminToken, map[string]any{"description": "x"}, "If-Match", `"7"`)
	require.Equal(t, http.StatusPreconditionFailed, r.Status)
	r = env.Do(http.MethodPatch, "/api/v1/webhooks/"+created.ID, env.adminToken, map[string]any{"url": "http://192.168.1.1/"})
	require.Equal(t, http.StatusUnprocessableEntity, r.Status)
	r = env.Do(http.MethodPatch, "/api/v1/webhooks/"+created.ID, env.adminToken, map[string]any{"status": "disabled"}, "If-Match", `"1"`)
	require.Equal(t, http.StatusOK, r.Status)
	assert.Equal(t, "disabled", r.JSON(t)["status"])
	r = env.Do(http.MethodPost, "/api/v1/webhooks/"+created.ID+"/test", env.adminToken, nil)
	require.Equal(t, http.StatusConflict, r.Status, "a disabled endpoint gets no test")
	r = env.Do(http.MethodPatch, "/api/v1/webhooks/"+created.ID, env.adminToken, map[string]any{"status": "enabled"})
	require.Equal(t, http.StatusOK, r.Status)

	r = env.Do(http.MethodPost, "/api/v1/webhooks/"+created.ID+"/rotate-secret", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	rotated := r.JSON(t)
	assert.NotEqual(t, created.Secret, rotated["secret"])
	assert.NotEmpty(t, rotated["previous_secret_until"])

	r = env.Do(http.MethodPost, "/api/v1/webhooks/"+created.ID+"/test", env.adminToken, nil)
	require.Equal(t, http.StatusAccepted, r.Status)
	delivery := r.JSON(t)
	assert.Equal(t, "webhook.test", delivery["event_type"])
	assert.Equal(t, "pending", delivery["state"])
	r = env.Do(http.MethodGet, "/api/v1/webhooks/"+created.ID+"/deliveries", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	assert.Len(t, r.JSON(t)["deliveries"], 1)
	r = env.Do(http.MethodPost, "/api/v1/webhooks/"+created.ID+"/deliveries/"+delivery["id"].(string)+"/retry", env.adminToken, nil)
	require.Equal(t, http.StatusConflict, r.Status, "a pending delivery is not retried")
	r = env.Do(http.MethodPost, "/api/v1/webhooks/"+created.ID+"/deliveries/dlv_zz/retry", env.adminToken, nil)
	require.Equal(t, http.StatusNotFound, r.Status)

	r = env.Do(http.MethodDelete, "/api/v1/webhooks/"+created.ID, env.viewerToken, nil)
	require.Equal(t, http.StatusForbidden, r.Status)
	r = env.Do(http.MethodDelete, "/api/v1/webhooks/"+created.ID, env.adminToken, nil)
	require.Equal(t, http.StatusNoContent, r.Status)
	r = env.Do(http.MethodGet, "/api/v1/webhooks/"+created.ID, env.adminToken, nil)
	require.Equal(t, http.StatusNotFound, r.Status)

	r = env.Do(http.MethodGet, "/api/v1/audit", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	for _, action := range []string{"webhook.create", "webhook.update", "webhook.rotate_secret", "webhook.test", "webhook.delete"} {
		assert.Contains(t, string(r.Body), `"`+action+`"`)
	}
	assert.NotContains(t, string(r.Body), created.Secret)
	assert.NotContains(t, string(r.Body), rotated["secret"].(string))
}
