package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// auditEntry is one entry of GET /api/v1/audit.
type auditEntry struct {
	ID     string          `json:"id"`
	Actor  string          `json:"actor"`
	Action string          `json:"action"`
	Target string          `json:"target"`
	Before json.RawMessage `json:"before"`
	After  json.RawMessage `json:"after"`
}

// MustAudit reads the whole audit log, page by page (newest first).
func (env *adminEnv) MustAudit(limit int) []auditEntry {
	env.tb.Helper()
	var all []auditEntry
	cursor := ""
	for range 100 {
		path := fmt.Sprintf("/api/v1/audit?limit=%d", limit)
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		r := env.Do(http.MethodGet, path, env.viewerToken, nil)
		require.Equal(env.tb, http.StatusOK, r.Status, "body: %s", r.Body)
		var page struct {
			Entries    []auditEntry `json:"entries"`
			NextCursor string       `json:"next_cursor"`
		}
		r.Decode(env.tb, &page)
		require.LessOrEqual(env.tb, len(page.Entries), limit)
		all = append(all, page.Entries...)
		if page.NextCursor == "" {
			return all
		}
		cursor = page.NextCursor
	}
	env.tb.Fatal("audit pagination does not end")
	return nil
}

func TestAdminAuditRecordsEveryWrite(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	bob := env.MustToken("bob@example.com", api.RoleAdmin)

	env.MustUpstream("default")
	r := env.Do(http.MethodPost, "/api/v1/upstreams", bob, map[string]string{"name": "spare", "secret": testStripeSecret})
	require.Equal(t, http.StatusCreated, r.Status)
	k := env.MustMint("audited", "", map[string]string{"env": "prod"}, seedLegacyPolicy)
	r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, bob, `{"policy":{"daily_cap":"50"},"labels":{"env":"staging"}}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	r = env.Do(http.MethodPost, "/api/v1/keys/"+k.ID+"/rotate", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	var rotated mintedKey
	r.Decode(t, &rotated)
	env.MustHold(k.ID, "idem-unknown", 900, vault.SettleUnknown)
	hold := vault.HoldID(k.ID, "idem-unknown")
	r = env.Do(http.MethodPost, "/api/v1/holds/"+hold+"/resolve", bob, `{"outcome":"released"}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	r = env.Do(http.MethodPost, "/api/v1/keys/"+k.ID+"/revoke", bob, nil)
	require.Equal(t, http.StatusOK, r.Status)
	r = env.Do(http.MethodDelete, "/api/v1/upstreams/spare", bob, nil)
	require.Equal(t, http.StatusNoContent, r.Status, "body: %s", r.Body)
	// Refused writes leave no trace.
	r = env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, bob, `{"policy":{"daily_cap":"-1"}}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.Status)

	entries := env.MustAudit(2)
	var got []string
	for _, e := range entries {
		got = append(got, e.Action+" "+e.Actor)
	}
	assert.Equal(t, []string{ // newest first
		"upstream.delete bob@example.com",
		"key.revoke bob@example.com",
		"hold.resolve bob@example.com",
		"key.rotate alice@example.com",
		"key.update bob@example.com",
		"key.mint alice@example.com",
		"upstream.put bob@example.com",
		"upstream.put alice@example.com",
	}, got)

	byAction := map[string]auditEntry{}
	for _, e := range entries {
		byAction[e.Action] = e
	}
	upd := byAction["key.update"]
	assert.Equal(t, k.ID, upd.Target)
	var before, after struct {
		Policy map[string]any    `json:"policy"`
		Labels map[string]string `json:"labels"`
	}
	require.NoError(t, json.Unmarshal(upd.Before, &before), "before: %s", upd.Before)
	require.NoError(t, json.Unmarshal(upd.After, &after), "after: %s", upd.After)
	assert.Equal(t, "99.00", before.Policy["daily_cap"])
	assert.Equal(t, "50.00", after.Policy["daily_cap"])
	assert.Equal(t, "prod", before.Labels["env"])
	assert.Equal(t, "staging", after.Labels["env"])
	assert.Equal(t, "null", string(byAction["key.mint"].Before), "a mint has no before")
	assert.NotEqual(t, "null", string(byAction["key.mint"].After))
	assert.Equal(t, "null", string(byAction["upstream.delete"].After), "a delete has no after")
	assert.Equal(t, hold, byAction["hold.resolve"].Target)

	raw := env.Do(http.MethodGet, "/api/v1/audit?limit=500", env.adminToken, nil)
	require.Equal(t, http.StatusOK, raw.Status)
	for name, secret := range map[string]string{"upstream secret": testStripeSecret, "minted token": k.Token, "rotated token": rotated.Token} {
		assert.NotContains(t, string(raw.Body), secret, "the audit log never carries the %s", name)
	}
}

func TestAdminNoSecretInDataFileOrLogs(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("secretive", "", map[string]string{"customer_id": "cust_9"}, seedLegacyPolicy)
	r := env.Do(http.MethodPost, "/api/v1/keys/"+k.ID+"/rotate", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	var rotated mintedKey
	r.Decode(t, &rotated)
	env.MustHold(k.ID, "idem-1", 4200, vault.SettleCommit)
	// Requests that fail, so their log lines are written too.
	env.Do(http.MethodGet, "/api/v1/keys", "forged."+env.adminToken, nil)
	env.DoRaw(http.MethodGet, "/api/v1/keys", http.Header{"Authorization": {"Basic " + env.adminToken}}, nil)
	env.Do(http.MethodPost, "/api/v1/upstreams", env.adminToken, map[string]string{"name": "bad", "secret": "pk_" + testStripeSecret})
	env.Do(http.MethodPatch, "/api/v1/keys/"+k.ID, env.viewerToken, `{"policy":{"daily_cap":"1"}}`)
	r = env.Do(http.MethodGet, "/api/v1/backup", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	backup := r.Body

	require.NoError(t, env.store.Close())
	data, err := os.ReadFile(env.dbPath)
	require.NoError(t, err)
	logs := env.logs.String()
	require.NotEmpty(t, logs, "the handler logged something")
	require.Contains(t, logs, "admin request", "one line per request is logged")

	secrets := map[string]string{
		"upstream secret": testStripeSecret,
		"minted token":    k.Token,
		"rotated token":   rotated.Token,
		"admin JWT":       env.adminToken,
		"viewer JWT":      env.viewerToken,
		"JWT secret":      string(env.secret),
	}
	// JWT signatures alone must not leak either.
	for name, tok := range map[string]string{"admin JWT signature": env.adminToken, "viewer JWT signature": env.viewerToken} {
		secrets[name] = tok[strings.LastIndex(tok, ".")+1:]
	}
	// Token bodies without their prefix, in case something strips vk_.
	secrets["minted token body"] = strings.TrimPrefix(k.Token, "vk_")
	secrets["rotated token body"] = strings.TrimPrefix(rotated.Token, "vk_")
	assert.Empty(t, containsAny(string(data), secrets), "the bbolt file holds none of these")
	assert.Empty(t, containsAny(string(backup), secrets), "the backup holds none of these")
	assert.Empty(t, containsAny(logs, secrets), "the log holds none of these")
	// A sanity check that the grep can find things: the key id is in all three.
	assert.True(t, bytes.Contains(data, []byte(k.ID)))
	assert.Contains(t, logs, k.ID)
}

func TestAdminBackupIsAConsistentDatabase(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("backed-up", "", nil, seedLegacyPolicy)
	env.MustHold(k.ID, "idem-1", 1500, vault.SettleCommit)

	r := env.Do(http.MethodGet, "/api/v1/backup", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	assert.Equal(t, "application/octet-stream", r.Header.Get("Content-Type"))
	assert.Equal(t, `attachment; filename="keybrake-20260914T120000Z.db"`, r.Header.Get("Content-Disposition"))
	require.NotEmpty(t, r.Body)

	path := filepath.Join(t.TempDir(), "restored.db")
	require.NoError(t, os.WriteFile(path, r.Body, 0o600))
	restored, err := bolt.Open(path, bolt.Options{MasterKey: env.masterKey, Now: env.clock.Now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = restored.Close() })
	ctx := context.Background()
	got, windows, usage, err := restored.KeyUsage(ctx, k.ID)
	require.NoError(t, err)
	assert.Equal(t, "backed-up", got.Name)
	require.NotEmpty(t, windows)
	assert.EqualValues(t, 1500, usage[windows[0].ID].Committed)
	secret, err := restored.UpstreamSecret(ctx, "default")
	require.NoError(t, err)
	assert.Equal(t, testStripeSecret, secret, "the copy unseals with the same master key")
}

func TestAdminErrorsAreProblems(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	e, ok := env.handler.(*echo.Echo)
	require.True(t, ok)
	// Routes that fail the way a broken dependency would. (Only this test's server
	// has them; the OpenAPI check runs on its own.)
	e.GET("/test/boom", func(echo.Context) error {
		return fmt.Errorf("read bucket: %w", errors.New("page 7 checksum mismatch at 0xdeadbeef"))
	})
	e.GET("/test/panic", func(echo.Context) error { panic("nil map write in handler") })
	e.GET("/test/closed", func(echo.Context) error { return fmt.Errorf("list keys: %w", vault.ErrClosed) })

	r := env.Do(http.MethodGet, "/test/boom", "", nil)
	require.Equal(t, http.StatusInternalServerError, r.Status)
	p := r.Problem(t)
	assert.Equal(t, api.ProblemInternal, p.Type)
	assert.Equal(t, "internal server error", p.Detail, "no internal detail reaches the client")
	assert.NotContains(t, string(r.Body), "checksum")
	logs := env.logs.String()
	assert.Equal(t, 1, strings.Count(logs, "page 7 checksum mismatch"), "logged once: %s", logs)
	var line map[string]any
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "checksum mismatch") {
			require.NoError(t, json.Unmarshal([]byte(l), &line))
		}
	}
	assert.Equal(t, "ERROR", line["level"])
	assert.EqualValues(t, 500, line["status"])

	r = env.Do(http.MethodGet, "/test/panic", "", nil)
	require.Equal(t, http.StatusInternalServerError, r.Status)
	assert.NotContains(t, string(r.Body), "nil map")
	assert.Equal(t, 1, strings.Count(env.logs.String(), "nil map write in handler"))

	r = env.Do(http.MethodGet, "/test/closed", "", nil)
	assert.Equal(t, http.StatusServiceUnavailable, r.Status)
	assert.Equal(t, api.ProblemUnavailable, r.Problem(t).Type)

	r = env.Do(http.MethodGet, "/api/v1/nothing-here", env.adminToken, nil)
	assert.Equal(t, http.StatusNotFound, r.Status)
	assert.Equal(t, api.ProblemNotFound, r.Problem(t).Type)

	r = env.Do(http.MethodPut, "/api/v1/keys", env.adminToken, `{}`)
	assert.Equal(t, http.StatusMethodNotAllowed, r.Status)
	assert.Equal(t, api.ProblemMethodNotAllowed, r.Problem(t).Type)
	assert.Contains(t, r.Header.Get("Allow"), http.MethodPost)

	r = env.Do(http.MethodGet, "/healthz", "", nil)
	assert.Equal(t, http.StatusOK, r.Status)
	assert.JSONEq(t, `{"status":"ok"}`, string(r.Body))

	// 4xx are logged at WARN, with the actor when known.
	env.Do(http.MethodGet, "/api/v1/keys/key_missing", env.adminToken, nil)
	found := false
	for _, l := range strings.Split(env.logs.String(), "\n") {
		if strings.Contains(l, "key_missing") {
			found = true
			assert.Contains(t, l, `"level":"WARN"`)
			assert.Contains(t, l, `"actor":"alice@example.com"`)
			assert.Contains(t, l, `"status":404`)
		}
	}
	assert.True(t, found, "the 404 was logged")
}

// TestAdminCompact: an admin compacts the running store; the data is all
// there afterwards, in a file that is no larger.
func TestAdminCompact(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("compacted", "", nil, seedLegacyPolicy)
	env.MustHold(k.ID, "idem-1", 1500, vault.SettleCommit)

	r := env.Do(http.MethodPost, "/api/v1/compact", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var got struct {
		Before int64 `json:"bytes_before"`
		After  int64 `json:"bytes_after"`
	}
	r.Decode(t, &got)
	assert.Positive(t, got.After)
	assert.LessOrEqual(t, got.After, got.Before)

	r = env.Do(http.MethodGet, "/api/v1/keys/"+k.ID+"/usage", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	assert.Contains(t, string(r.Body), `"committed":"15.00"`, "the key's usage is still there: %s", r.Body)
	assert.Equal(t, http.StatusUnprocessableEntity, env.Do(http.MethodPost, "/api/v1/compact?now=1", env.adminToken, nil).Status)
}
