package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// septemberPolicy is a usd policy for September 2026 (the test clock is 2026-09-14
// 12:00 UTC) with a daily cap of 10.00 and a period cap of 100.00.
const septemberPolicy = `{"vendor":"stripe","currency":"usd","daily_cap":"10.00","period_cap":"100.00",
  "period_start":"2026-09-01T00:00:00Z","expires_at":"2026-10-01T00:00:00Z"}`

// dashboardGETs are the read-only summaries, each with a query that is valid.
var dashboardGETs = []string{"/api/v1/overview", "/api/v1/usage?ids=%s", "/api/v1/keys/%s/spend"}

func TestAdminDashboardReadsNeedAToken(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("k", "", nil, septemberPolicy)
	for _, p := range dashboardGETs {
		path := strings.ReplaceAll(p, "%s", k.ID)
		r := env.Do(http.MethodGet, path, "", nil)
		assert.Equal(t, http.StatusUnauthorized, r.Status, path)
		r.Problem(t)
		r = env.Do(http.MethodGet, path, env.viewerToken, nil)
		assert.Equal(t, http.StatusOK, r.Status, "a viewer may read %s: %s", path, r.Body)
		r = env.Do(http.MethodGet, path+sep(path)+"bogus=1", env.viewerToken, nil)
		assert.Equal(t, http.StatusUnprocessableEntity, r.Status, path)
		assert.Contains(t, r.ErrorFields(t), "bogus", "a misspelt parameter is refused, not ignored")
		r = env.Do(http.MethodPost, path, env.adminToken, "{}")
		assert.Equal(t, http.StatusMethodNotAllowed, r.Status, "%s is read-only", path)
	}
}

// sep is the separator that appends one more query parameter to path.
func sep(path string) string {
	if strings.Contains(path, "?") {
		return "&"
	}
	return "?"
}

func TestAdminUsageOfSeveralKeys(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	a := env.MustMint("a", "", nil, septemberPolicy)
	b := env.MustMint("b", "", nil, `{"vendor":"stripe","currency":"usd","period_cap":"5.00","expires_at":"2026-10-01T00:00:00Z"}`)
	env.MustHold(a.ID, "a-1", 250, vault.SettleCommit)
	env.MustHold(b.ID, "b-1", 120, "")
	r := env.Do(http.MethodPost, "/api/v1/keys/"+b.ID+"/revoke", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)

	r = env.Do(http.MethodGet, "/api/v1/usage?ids="+b.ID+",%20"+a.ID+","+b.ID, env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var got struct {
		Usage []struct {
			KeyID  string `json:"key_id"`
			Status string `json:"status"`
			usageAnswer
		} `json:"usage"`
	}
	r.Decode(t, &got)
	require.Len(t, got.Usage, 2, "in the order asked, each key once")
	assert.Equal(t, b.ID, got.Usage[0].KeyID)
	assert.Equal(t, "revoked", got.Usage[0].Status)
	assert.Nil(t, got.Usage[0].Daily.Cap)
	assert.Equal(t, "1.20", got.Usage[0].Period.Held)
	assert.Equal(t, strp("3.80"), got.Usage[0].Period.Remaining)
	assert.Equal(t, a.ID, got.Usage[1].KeyID)
	assert.Equal(t, "active", got.Usage[1].Status)
	assert.Equal(t, env.MustUsage(a.ID), got.Usage[1].usageAnswer, "the same usage GET /keys/{id}/usage answers")

	tooMany := make([]string, vault.MaxKeysUsage+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("key_%d", i)
	}
	for query, field := range map[string]string{
		"":                                   "ids",
		"?ids=":                              "ids",
		"?ids=,,":                            "ids",
		"?ids=" + strings.Join(tooMany, ","): "ids",
		"?ids=a&ids=b":                       "ids",
	} {
		r := env.Do(http.MethodGet, "/api/v1/usage"+query, env.viewerToken, nil)
		assert.Equal(t, http.StatusUnprocessableEntity, r.Status, "%.60s: %s", query, r.Body)
		assert.Equal(t, []string{field}, r.ErrorFields(t), query)
	}
	r = env.Do(http.MethodGet, "/api/v1/usage?ids="+a.ID+",key_nope", env.viewerToken, nil)
	assert.Equal(t, http.StatusNotFound, r.Status)
	assert.Contains(t, r.Problem(t).Detail, "key_nope")
}

func TestAdminKeySpendPerDay(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("k", "", nil, septemberPolicy)
	env.clock.Set(time.Date(2026, 9, 3, 8, 0, 0, 0, time.UTC))
	env.MustHold(k.ID, "sep-3", 450, vault.SettleCommit)
	env.MustHold(k.ID, "sep-3-lost", 50, vault.SettleUnknown)
	env.clock.Set(adminTestNow)
	env.MustHold(k.ID, "today", 725, vault.SettleCommit)
	env.MustHold(k.ID, "today-flight", 100, "")
	env.MustHold(k.ID, "today-declined", 100, vault.SettleRelease)

	r := env.Do(http.MethodGet, "/api/v1/keys/"+k.ID+"/spend", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var got struct {
		KeyID       string    `json:"key_id"`
		Currency    string    `json:"currency"`
		Timezone    string    `json:"timezone"`
		DailyCap    *string   `json:"daily_cap"`
		PeriodStart time.Time `json:"period_start"`
		ExpiresAt   time.Time `json:"expires_at"`
		Truncated   bool      `json:"truncated"`
		Days        []struct {
			Date      string    `json:"date"`
			Start     time.Time `json:"start"`
			End       time.Time `json:"end"`
			Committed string    `json:"committed"`
			Held      string    `json:"held"`
		} `json:"days"`
	}
	r.Decode(t, &got)
	assert.Equal(t, k.ID, got.KeyID)
	assert.Equal(t, "usd", got.Currency)
	assert.Equal(t, "UTC", got.Timezone)
	assert.Equal(t, strp("10.00"), got.DailyCap)
	assert.Equal(t, time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC), got.PeriodStart)
	assert.Equal(t, time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC), got.ExpiresAt)
	assert.False(t, got.Truncated)
	require.Len(t, got.Days, 14, "2026-09-01 to 2026-09-14")
	assert.Equal(t, "2026-09-01", got.Days[0].Date)
	assert.Equal(t, time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC), got.Days[0].Start)
	assert.Equal(t, time.Date(2026, 9, 2, 0, 0, 0, 0, time.UTC), got.Days[0].End)
	assert.Equal(t, "0.00", got.Days[0].Committed)
	assert.Equal(t, "2026-09-03", got.Days[2].Date)
	assert.Equal(t, "4.50", got.Days[2].Committed)
	assert.Equal(t, "0.50", got.Days[2].Held, "an unknown hold stays held")
	assert.Equal(t, "2026-09-14", got.Days[13].Date)
	assert.Equal(t, "7.25", got.Days[13].Committed)
	assert.Equal(t, "1.00", got.Days[13].Held)
	u := env.MustUsage(k.ID)
	assert.Equal(t, u.Daily.Committed, got.Days[13].Committed, "today equals the daily window's usage")
	assert.Equal(t, u.Daily.Held, got.Days[13].Held)

	// A key without a daily cap answers null; one whose period starts later has no day yet.
	later := env.MustMint("later", "", nil, `{"vendor":"stripe","period_cap":"5.00",
	  "period_start":"2026-09-20T00:00:00Z","expires_at":"2026-10-01T00:00:00Z"}`)
	r = env.Do(http.MethodGet, "/api/v1/keys/"+later.ID+"/spend", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	m := r.JSON(t)
	assert.Nil(t, m["daily_cap"])
	assert.Equal(t, []any{}, m["days"])

	r = env.Do(http.MethodGet, "/api/v1/keys/key_nope/spend", env.viewerToken, nil)
	assert.Equal(t, http.StatusNotFound, r.Status)
	r.Problem(t)
}

func TestAdminOverview(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")

	r := env.Do(http.MethodGet, "/api/v1/overview", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	empty := r.JSON(t)
	for _, member := range []string{"spend", "near_cap"} {
		assert.Equal(t, []any{}, empty[member], "an empty vault lists nothing as []")
	}
	assert.Equal(t, map[string]any{"count": 0.0, "oldest": []any{}}, empty["unknown_holds"])

	k := env.MustMint("k", "", nil, septemberPolicy)
	env.MustMint("other", "", nil, `{"vendor":"stripe","currency":"jpy","daily_cap":"5000","expires_at":"2026-10-01T00:00:00Z"}`)
	env.MustHold(k.ID, "a", 850, vault.SettleCommit)
	env.MustHold(k.ID, "lost", 20, vault.SettleUnknown)
	res, err := env.store.Reserve(context.Background(), vault.ReserveRequest{
		KeyID: k.ID, IdempotencyKey: "too-much", Fingerprint: "fp", Metered: true,
		Request: policy.Request{Operation: "charges.create", Amount: 500, Currency: "usd"},
	})
	require.NoError(t, err)
	require.Equal(t, vault.ReserveRefused, res.Outcome)

	r = env.Do(http.MethodGet, "/api/v1/overview", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var got struct {
		Time time.Time      `json:"time"`
		Keys map[string]int `json:"keys"`
		Sp   []struct {
			Currency string            `json:"currency"`
			Keys     int               `json:"keys"`
			Today    map[string]string `json:"today"`
			Period   map[string]string `json:"period"`
		} `json:"spend"`
		NearCapPercent int `json:"near_cap_percent"`
		NearCap        []struct {
			KeyID       string    `json:"key_id"`
			Name        string    `json:"name"`
			Window      string    `json:"window"`
			Currency    string    `json:"currency"`
			Timezone    string    `json:"timezone"`
			Cap         string    `json:"cap"`
			Committed   string    `json:"committed"`
			Held        string    `json:"held"`
			UsedPercent int       `json:"used_percent"`
			ResetAt     time.Time `json:"reset_at"`
		} `json:"near_cap"`
		NearCapTotal int `json:"near_cap_total"`
		Refusals     struct {
			Since     time.Time `json:"since"`
			Total     int       `json:"total"`
			Truncated bool      `json:"truncated"`
			ByReason  []struct {
				Decision string `json:"decision"`
				Reason   string `json:"reason"`
				Count    int    `json:"count"`
			} `json:"by_reason"`
		} `json:"refusals"`
		UnknownHolds struct {
			Count  int `json:"count"`
			Oldest []struct {
				ID                     string `json:"id"`
				KeyID                  string `json:"key_id"`
				Amount                 string `json:"amount"`
				UpstreamIdempotencyKey string `json:"upstream_idempotency_key"`
			} `json:"oldest"`
		} `json:"unknown_holds"`
	}
	r.Decode(t, &got)
	assert.Equal(t, adminTestNow, got.Time)
	assert.Equal(t, map[string]int{"active": 2, "revoked": 0, "expired": 0}, got.Keys)
	require.Len(t, got.Sp, 2)
	assert.Equal(t, "jpy", got.Sp[0].Currency)
	assert.Equal(t, map[string]string{"committed": "0", "held": "0"}, got.Sp[0].Today, "jpy has no decimals")
	assert.Equal(t, "usd", got.Sp[1].Currency)
	assert.Equal(t, 1, got.Sp[1].Keys)
	assert.Equal(t, map[string]string{"committed": "8.50", "held": "0.20"}, got.Sp[1].Today)
	assert.Equal(t, map[string]string{"committed": "8.50", "held": "0.20"}, got.Sp[1].Period)

	assert.Equal(t, 80, got.NearCapPercent)
	assert.Equal(t, 1, got.NearCapTotal)
	require.Len(t, got.NearCap, 1)
	assert.Equal(t, k.ID, got.NearCap[0].KeyID)
	assert.Equal(t, "k", got.NearCap[0].Name)
	assert.Equal(t, "daily", got.NearCap[0].Window)
	assert.Equal(t, "UTC", got.NearCap[0].Timezone)
	assert.Equal(t, "10.00", got.NearCap[0].Cap)
	assert.Equal(t, "8.50", got.NearCap[0].Committed)
	assert.Equal(t, "0.20", got.NearCap[0].Held)
	assert.Equal(t, 87, got.NearCap[0].UsedPercent)
	assert.Equal(t, time.Date(2026, 9, 15, 0, 0, 0, 0, time.UTC), got.NearCap[0].ResetAt)

	assert.Equal(t, adminTestNow.Add(-time.Hour), got.Refusals.Since)
	assert.Equal(t, 1, got.Refusals.Total)
	require.Len(t, got.Refusals.ByReason, 1)
	assert.Equal(t, "refused", got.Refusals.ByReason[0].Decision)
	assert.Equal(t, "spend_cap_exceeded", got.Refusals.ByReason[0].Reason)

	assert.Equal(t, 1, got.UnknownHolds.Count)
	require.Len(t, got.UnknownHolds.Oldest, 1)
	assert.Equal(t, vault.HoldID(k.ID, "lost"), got.UnknownHolds.Oldest[0].ID)
	assert.Equal(t, "0.20", got.UnknownHolds.Oldest[0].Amount)
	assert.Equal(t, vault.UpstreamKey(k.ID, "lost"), got.UnknownHolds.Oldest[0].UpstreamIdempotencyKey)
}

// What an operator needs during an incident: the overview and the holds name
// each unknown hold's key, list the revoked keys still in use (and count the
// tokens that are no key's), say which near-cap key only reports; a key says
// how often it was refused since it was revoked; the ledger names the caller's
// idempotency key; the upstreams say where they point and in which mode.
func TestAdminOverviewNamesKeysForAnIncident(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	ctx := context.Background()
	k := env.MustMint("agent_run_7", "", nil, septemberPolicy)
	report := env.MustMint("dry_run", "", nil, `{"vendor":"stripe","currency":"usd","daily_cap":"10.00","mode":"report",
  "period_start":"2026-09-01T00:00:00Z","expires_at":"2026-10-01T00:00:00Z"}`)
	env.MustHold(k.ID, "order-42", 850, vault.SettleCommit)
	env.MustHold(k.ID, "lost", 20, vault.SettleUnknown)
	env.MustHold(report.ID, "big", 1600, vault.SettleCommit)
	gone := env.MustMint("revoked_one", "", nil, septemberPolicy)
	_, err := env.store.RevokeKey(ctx, "test", gone.ID)
	require.NoError(t, err)
	balance := func(auth string) {
		req, err := http.NewRequest(http.MethodGet, env.proxyURL+"/v1/balance", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	}
	balance("Bearer " + gone.Token)
	balance("Bearer " + gone.Token)
	env.stripe.FlushKeyRefusals(ctx) // what the proxy writes a second later
	balance("Bearer null")

	r := env.Do(http.MethodGet, "/api/v1/overview", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var ov struct {
		NearCap []struct {
			Name string `json:"name"`
			Mode string `json:"mode"`
		} `json:"near_cap"`
		UnknownHolds struct {
			Oldest []struct {
				KeyName string `json:"key_name"`
			} `json:"oldest"`
		} `json:"unknown_holds"`
		RefusedKeys struct {
			Total int `json:"total"`
			Keys  []struct {
				KeyID   string `json:"key_id"`
				Name    string `json:"name"`
				Status  string `json:"status"`
				Refused struct {
					Count      int    `json:"count"`
					Code       string `json:"code"`
					RemoteAddr string `json:"remote_addr"`
					Path       string `json:"path"`
				} `json:"refused"`
			} `json:"keys"`
		} `json:"refused_keys"`
		UnknownKeys struct {
			Count int    `json:"count"`
			Path  string `json:"path"`
		} `json:"unknown_keys"`
		Demo bool `json:"demo"`
	}
	r.Decode(t, &ov)
	require.Len(t, ov.UnknownHolds.Oldest, 1)
	assert.Equal(t, "agent_run_7", ov.UnknownHolds.Oldest[0].KeyName)
	modes := map[string]string{}
	for _, n := range ov.NearCap {
		modes[n.Name] = n.Mode
	}
	assert.Equal(t, map[string]string{"agent_run_7": "enforce", "dry_run": "report"}, modes)
	assert.Equal(t, 1, ov.RefusedKeys.Total)
	require.Len(t, ov.RefusedKeys.Keys, 1)
	rk := ov.RefusedKeys.Keys[0]
	assert.Equal(t, gone.ID, rk.KeyID)
	assert.Equal(t, "revoked_one", rk.Name)
	assert.Equal(t, "revoked", rk.Status)
	assert.Equal(t, 2, rk.Refused.Count)
	assert.Equal(t, "vault_key_revoked", rk.Refused.Code)
	assert.Equal(t, "127.0.0.1", rk.Refused.RemoteAddr)
	assert.Equal(t, "/v1/balance", rk.Refused.Path)
	assert.Equal(t, 1, ov.UnknownKeys.Count)
	assert.Equal(t, "/v1/balance", ov.UnknownKeys.Path)
	assert.False(t, ov.Demo)

	r = env.Do(http.MethodGet, "/api/v1/keys/"+gone.ID, env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	assert.Equal(t, 2.0, r.JSON(t)["refused"].(map[string]any)["count"])

	r = env.Do(http.MethodGet, "/api/v1/holds?state=unknown", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	holds := r.JSON(t)["holds"].([]any)
	require.Len(t, holds, 1)
	assert.Equal(t, "agent_run_7", holds[0].(map[string]any)["key_name"])

	r = env.Do(http.MethodGet, "/api/v1/keys/"+k.ID+"/events", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var idems []any
	for _, e := range r.JSON(t)["events"].([]any) {
		idems = append(idems, e.(map[string]any)["idempotency_key"])
	}
	assert.Contains(t, idems, "order-42")

	r = env.Do(http.MethodGet, "/api/v1/upstreams", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	up := r.JSON(t)["upstreams"].([]any)[0].(map[string]any)
	assert.Equal(t, "test", up["mode"])
	assert.Equal(t, env.fake.URL, up["base_url"])
}
