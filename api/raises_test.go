package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// agentDo sends a request to the proxy listener's agent endpoints with a vault key.
func (env *adminEnv) agentDo(method, path, token string, body any) adminResponse {
	env.tb.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(env.tb, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, env.proxyURL+path, rd)
	require.NoError(env.tb, err)
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(env.tb, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(env.tb, err)
	return adminResponse{Status: resp.StatusCode, Header: resp.Header, Body: got}
}

type raiseAnswer struct {
	ID        string `json:"id"`
	Window    string `json:"window"`
	Amount    string `json:"amount"`
	Until     string `json:"until"`
	Reason    string `json:"reason"`
	CreatedBy string `json:"created_by"`
	Active    bool   `json:"active"`
	RequestID string `json:"request_id"`
	EndedBy   string `json:"ended_by"`
}

type raisedUsage struct {
	Daily struct {
		Cap       *string `json:"cap"`
		BaseCap   *string `json:"base_cap"`
		Remaining *string `json:"remaining"`
	} `json:"daily"`
	PerRequest struct {
		Cap     *string `json:"cap"`
		BaseCap *string `json:"base_cap"`
	} `json:"per_request"`
	Raises []raiseAnswer `json:"raises"`
}

func TestKeyRaisesThroughTheAdminAPI(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("raised", "", nil, `{"vendor":"stripe","daily_cap":"100.00","per_request_cap":"20.00","expires_at":"2026-10-01T00:00:00Z"}`)
	path := "/api/v1/keys/" + k.ID + "/raises"
	until := adminTestNow.Add(30 * time.Minute).Format(time.RFC3339)

	r := env.Do(http.MethodPost, path, env.viewerToken, map[string]any{"window": "daily", "amount": "50.00", "until": until})
	assert.Equal(t, http.StatusForbidden, r.Status, "a viewer cannot raise")
	for name, body := range map[string]map[string]any{
		"no window":       {"amount": "50.00", "until": until},
		"unknown window":  {"window": "weekly", "amount": "50.00", "until": until},
		"zero amount":     {"window": "daily", "amount": "0", "until": until},
		"too precise":     {"window": "daily", "amount": "1.001", "until": until},
		"until passed":    {"window": "daily", "amount": "1", "until": adminTestNow.Add(-time.Minute).Format(time.RFC3339)},
		"over 31 days":    {"window": "daily", "amount": "1", "until": adminTestNow.Add(32 * 24 * time.Hour).Format(time.RFC3339)},
		"no period cap":   {"window": "period", "amount": "1", "until": until},
		"unknown field":   {"window": "daily", "amount": "1", "until": until, "cap": "5"},
		"no until at all": {"window": "daily", "amount": "1"},
	} {
		r := env.Do(http.MethodPost, path, env.adminToken, body)
		assert.Equal(t, http.StatusUnprocessableEntity, r.Status, "%s: %s", name, r.Body)
	}

	r = env.Do(http.MethodPost, path, env.adminToken, map[string]any{"window": "daily", "amount": "50.00", "until": until, "reason": "quarter close"})
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	var raise raiseAnswer
	r.Decode(t, &raise)
	assert.Equal(t, raiseAnswer{ID: raise.ID, Window: "daily", Amount: "50.00", Until: until, Reason: "quarter close",
		CreatedBy: "alice@example.com", Active: true}, raise)
	r = env.Do(http.MethodPost, path, env.adminToken, map[string]any{"window": "per_request", "amount": 5, "until": until})
	require.Equal(t, http.StatusCreated, r.Status, "a number is taken as its decimal text: %s", r.Body)

	var u raisedUsage
	env.Do(http.MethodGet, "/api/v1/keys/"+k.ID+"/usage", env.viewerToken, nil).Decode(t, &u)
	assert.Equal(t, strp("150.00"), u.Daily.Cap, "the effective cap")
	assert.Equal(t, strp("100.00"), u.Daily.BaseCap)
	assert.Equal(t, strp("25.00"), u.PerRequest.Cap)
	assert.Equal(t, strp("20.00"), u.PerRequest.BaseCap)
	assert.Len(t, u.Raises, 2)

	// Spend under the raise, then let it end: the cap is back, remaining is 0, not negative.
	for _, idem := range []string{"a", "b", "c", "d", "e", "f"} {
		env.MustHold(k.ID, idem, 2000, "commit") // 120.00 of the raised 150.00
	}
	env.clock.Set(adminTestNow.Add(30 * time.Minute))
	u = raisedUsage{}
	env.Do(http.MethodGet, "/api/v1/keys/"+k.ID+"/usage", env.adminToken, nil).Decode(t, &u)
	assert.Equal(t, strp("100.00"), u.Daily.Cap)
	assert.Nil(t, u.Daily.BaseCap)
	assert.Equal(t, strp("0.00"), u.Daily.Remaining)
	assert.Empty(t, u.Raises)
	var list struct {
		Raises []raiseAnswer `json:"raises"`
	}
	env.Do(http.MethodGet, path, env.viewerToken, nil).Decode(t, &list)
	require.Len(t, list.Raises, 2, "ended raises are still listed")
	assert.False(t, list.Raises[0].Active)

	r = env.Do(http.MethodDelete, path+"/"+raise.ID, env.adminToken, nil)
	assert.Equal(t, http.StatusConflict, r.Status, "it has ended already: %s", r.Body)
	assert.Equal(t, http.StatusNotFound, env.Do(http.MethodDelete, path+"/raise_nope", env.adminToken, nil).Status)
	assert.Equal(t, http.StatusNotFound, env.Do(http.MethodGet, "/api/v1/keys/key_nope/raises", env.adminToken, nil).Status)
	assert.Equal(t, http.StatusNotFound, env.Do(http.MethodGet, "/api/v1/budgets/bud_nope/raises", env.adminToken, nil).Status)
}

func TestEndARaiseEarly(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("ended", "", nil, `{"vendor":"stripe","daily_cap":"100.00","expires_at":"2026-10-01T00:00:00Z"}`)
	path := "/api/v1/keys/" + k.ID + "/raises"
	r := env.Do(http.MethodPost, path, env.adminToken, map[string]any{"window": "daily", "amount": "10", "until": adminTestNow.Add(time.Hour).Format(time.RFC3339)})
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	var raise raiseAnswer
	r.Decode(t, &raise)
	assert.Equal(t, http.StatusForbidden, env.Do(http.MethodDelete, path+"/"+raise.ID, env.viewerToken, nil).Status)
	r = env.Do(http.MethodDelete, path+"/"+raise.ID, env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	r.Decode(t, &raise)
	assert.False(t, raise.Active)
	assert.Equal(t, "alice@example.com", raise.EndedBy)
	assert.Equal(t, strp("100.00"), env.MustUsage(k.ID).Daily.Cap)
}

type raiseRequestAnswer struct {
	ID        string `json:"id"`
	KeyID     string `json:"key_id"`
	State     string `json:"state"`
	Amount    string `json:"amount"`
	RaiseID   string `json:"raise_id"`
	DecidedBy string `json:"decided_by"`
	Note      string `json:"note"`
}

func TestRaiseRequestsFromTheAgent(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("asking", "", nil, `{"vendor":"stripe","daily_cap":"100.00","expires_at":"2026-10-01T00:00:00Z"}`)
	other := env.MustMint("other", "", nil, `{"vendor":"stripe","daily_cap":"100.00","expires_at":"2026-10-01T00:00:00Z"}`)
	ask := map[string]any{"window": "daily", "amount": "25.00", "until": adminTestNow.Add(3 * time.Hour).Format(time.RFC3339), "reason": "month-end batch"}

	r := env.agentDo(http.MethodPost, "/keybrake/v1/raise-requests", k.Token, map[string]any{"window": "daily", "amount": "-1", "until": ask["until"]})
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status, "body: %s", r.Body)
	var ids []string
	for range 5 {
		r := env.agentDo(http.MethodPost, "/keybrake/v1/raise-requests", k.Token, ask)
		require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
		var rr raiseRequestAnswer
		r.Decode(t, &rr)
		assert.Equal(t, "pending", rr.State)
		assert.Regexp(t, `^rr_`, rr.ID)
		assert.Equal(t, "/keybrake/v1/raise-requests/"+rr.ID, r.Header.Get("Location"))
		ids = append(ids, rr.ID)
	}
	r = env.agentDo(http.MethodPost, "/keybrake/v1/raise-requests", k.Token, ask)
	assert.Equal(t, http.StatusConflict, r.Status, "a sixth pending request: %s", r.Body)
	assert.Contains(t, string(r.Body), "5 raise requests pending")
	assert.Equal(t, http.StatusNotFound, env.agentDo(http.MethodGet, "/keybrake/v1/raise-requests/"+ids[0], other.Token, nil).Status,
		"another key's request does not exist for it")

	var pending struct {
		RaiseRequests []raiseRequestAnswer `json:"raise_requests"`
	}
	env.Do(http.MethodGet, "/api/v1/raise-requests?state=pending", env.viewerToken, nil).Decode(t, &pending)
	assert.Len(t, pending.RaiseRequests, 5)
	assert.Equal(t, http.StatusUnprocessableEntity, env.Do(http.MethodGet, "/api/v1/raise-requests?state=maybe", env.adminToken, nil).Status)

	assert.Equal(t, http.StatusForbidden, env.Do(http.MethodPost, "/api/v1/raise-requests/"+ids[0]+"/approve", env.viewerToken, nil).Status,
		"a viewer cannot approve")
	r = env.Do(http.MethodPost, "/api/v1/raise-requests/"+ids[0]+"/approve", env.adminToken, map[string]string{"note": "ok"})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var approved raiseRequestAnswer
	r.Decode(t, &approved)
	assert.Equal(t, "approved", approved.State)
	assert.Equal(t, "alice@example.com", approved.DecidedBy)
	assert.NotEmpty(t, approved.RaiseID)
	assert.Equal(t, http.StatusConflict, env.Do(http.MethodPost, "/api/v1/raise-requests/"+ids[0]+"/decline", env.adminToken, nil).Status)
	r = env.Do(http.MethodPost, "/api/v1/raise-requests/"+ids[1]+"/decline", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "a decision without a body: %s", r.Body)

	// The agent sees its request decided and the raise in /me.
	var own raiseRequestAnswer
	env.agentDo(http.MethodGet, "/keybrake/v1/raise-requests/"+ids[0], k.Token, nil).Decode(t, &own)
	assert.Equal(t, approved, own)
	var me struct {
		Windows struct {
			Daily struct {
				Cap     *string `json:"cap"`
				BaseCap *string `json:"base_cap"`
			} `json:"daily"`
		} `json:"windows"`
		Raises []raiseAnswer `json:"raises"`
	}
	r = env.agentDo(http.MethodGet, "/keybrake/v1/me", k.Token, nil)
	require.Equal(t, http.StatusOK, r.Status)
	r.Decode(t, &me)
	assert.Equal(t, strp("125.00"), me.Windows.Daily.Cap)
	assert.Equal(t, strp("100.00"), me.Windows.Daily.BaseCap)
	require.Len(t, me.Raises, 1)
	assert.Equal(t, ids[0], me.Raises[0].RequestID)
	assert.Equal(t, "month-end batch", me.Raises[0].Reason)

	// Two decided: the key may ask again.
	assert.Equal(t, http.StatusCreated, env.agentDo(http.MethodPost, "/keybrake/v1/raise-requests", k.Token, ask).Status)
}

func TestTwoAdminsDecideARaiseRequestAtOnce(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("contested", "", nil, `{"vendor":"stripe","daily_cap":"100.00","expires_at":"2026-10-01T00:00:00Z"}`)
	r := env.agentDo(http.MethodPost, "/keybrake/v1/raise-requests", k.Token,
		map[string]any{"window": "daily", "amount": "10", "until": adminTestNow.Add(time.Hour).Format(time.RFC3339), "reason": "x"})
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	var rr raiseRequestAnswer
	r.Decode(t, &rr)
	bob := env.MustToken("bob@example.com", "admin")
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses []int
	)
	for i, tok := range []string{env.adminToken, bob, env.adminToken, bob} {
		verb := []string{"approve", "decline"}[i%2]
		wg.Go(func() {
			st := env.Do(http.MethodPost, "/api/v1/raise-requests/"+rr.ID+"/"+verb, tok, nil).Status
			mu.Lock()
			statuses = append(statuses, st)
			mu.Unlock()
		})
	}
	wg.Wait()
	assert.ElementsMatch(t, []int{http.StatusOK, http.StatusConflict, http.StatusConflict, http.StatusConflict}, statuses)
}
