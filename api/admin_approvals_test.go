package api_test

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const approvalPolicy = `{"vendor":"stripe","currency":"usd","daily_cap":"1000.00","expires_at":"2026-10-01T00:00:00Z",
	"operations":["charges.create","*.read"],"approval":{"above":"200.00","timeout":"1h"}}`

// proxyCharge sends a charge through the proxy listener with the vault key.
func proxyCharge(t *testing.T, env *adminEnv, token, idem, amount string) (int, string) {
	t.Helper()
	form := url.Values{"amount": {amount}, "currency": {"usd"}, "source": {"tok_visa"}, "card[cvc]": {"123"}}
	req, err := http.NewRequest(http.MethodPost, env.proxyURL+"/v1/charges", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", idem)
	req.Header.Set("Keybrake-Approval-Reason", "annual plan for cus_9")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestApprovalsAdminAPI: the inbox lists the held request, one approval shows
// its parameters masked; a viewer and the vault key cannot decide; two admins
// deciding at once: one wins, the other gets 409 with the state; the decision
// is audited with who and the note.
func TestApprovalsAdminAPI(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("approvals-api", "", nil, approvalPolicy)
	assert.Equal(t, map[string]any{"above": "200.00", "timeout": "1h"}, k.Policy["approval"])

	status, body := proxyCharge(t, env, k.Token, "big", "25000")
	require.Equal(t, http.StatusPaymentRequired, status, body)
	require.Contains(t, body, `"approval_required"`)

	list := env.Do(http.MethodGet, "/api/v1/approvals?state=pending", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, list.Status, "%s", list.Body)
	var page struct {
		Approvals []map[string]any `json:"approvals"`
	}
	list.Decode(t, &page)
	require.Len(t, page.Approvals, 1)
	ap := page.Approvals[0]
	id := ap["id"].(string)
	assert.Equal(t, "250.00", ap["amount"])
	assert.Equal(t, "approvals-api", ap["key_name"])
	assert.Equal(t, "annual plan for cus_9", ap["reason"])
	assert.Nil(t, ap["parameters"], "the list leaves the parameters out")

	one := env.Do(http.MethodGet, "/api/v1/approvals/"+id, env.viewerToken, nil)
	require.Equal(t, http.StatusOK, one.Status)
	assert.Contains(t, string(one.Body), `{"name":"card[cvc]","value":"••••"}`, "card fields are masked")
	assert.NotContains(t, string(one.Body), "123")

	me := httpGet(t, env.proxyURL+"/keybrake/v1/me", k.Token)
	assert.Contains(t, me, id, "/me lists the key's pending approvals")

	assert.Equal(t, http.StatusForbidden, env.Do(http.MethodPost, "/api/v1/approvals/"+id+"/approve", env.viewerToken, map[string]string{}).Status)
	assert.Equal(t, http.StatusUnauthorized, env.Do(http.MethodPost, "/api/v1/approvals/"+id+"/approve", k.Token, map[string]string{}).Status,
		"the vault key that asked cannot decide")
	req, _ := http.NewRequest(http.MethodPost, env.proxyURL+"/keybrake/v1/approvals/"+id+"/approve", nil)
	req.Header.Set("Authorization", "Bearer "+k.Token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "the proxy listener decides nothing")

	bob := env.MustToken("bob@example.com", "admin")
	var (
		wg       sync.WaitGroup
		statuses [2]int
		bodies   [2]string
	)
	for i, tok := range []string{env.adminToken, bob} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			verb := []string{"approve", "decline"}[i]
			r := env.Do(http.MethodPost, "/api/v1/approvals/"+id+"/"+verb, tok, map[string]string{"note": "by " + verb})
			statuses[i], bodies[i] = r.Status, string(r.Body)
		}()
	}
	wg.Wait()
	assert.ElementsMatch(t, []int{http.StatusOK, http.StatusConflict}, statuses[:], "%v", bodies)
	for i := range 2 {
		if statuses[i] == http.StatusConflict {
			assert.Regexp(t, `is (approved|declined) \(decided by (alice|bob)@example.com\)`, bodies[i])
		}
	}
	audit := env.Do(http.MethodGet, "/api/v1/audit", env.adminToken, nil)
	assert.Contains(t, string(audit.Body), `"action":"approval.`)
	assert.Contains(t, string(audit.Body), `by `)

	bad := env.Do(http.MethodGet, "/api/v1/approvals?state=maybe", env.adminToken, nil)
	assert.Equal(t, http.StatusUnprocessableEntity, bad.Status)
	assert.Equal(t, http.StatusNotFound, env.Do(http.MethodGet, "/api/v1/approvals/apr_nope", env.adminToken, nil).Status)
	long := env.Do(http.MethodPost, "/api/v1/approvals/"+id+"/approve", env.adminToken, map[string]string{"note": strings.Repeat("n", 501)})
	assert.Equal(t, http.StatusUnprocessableEntity, long.Status)

	badPolicy := env.Do(http.MethodPost, "/api/v1/keys", env.adminToken, map[string]any{"name": "bad-approval",
		"policy": map[string]any{"vendor": "stripe", "daily_cap": "1.00", "expires_at": "2026-10-01T00:00:00Z",
			"approval": map[string]any{"above": "1.00", "timeout": "73h"}}})
	assert.Equal(t, http.StatusUnprocessableEntity, badPolicy.Status)
	assert.Contains(t, badPolicy.ErrorFields(t), "policy.approval.timeout")
}

// httpGet GETs url with a bearer token and returns the body.
func httpGet(t *testing.T, u, token string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	return string(b)
}
