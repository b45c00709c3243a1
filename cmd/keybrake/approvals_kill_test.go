package main

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/fakestripe"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// TestKill9WithApprovals kills the real `keybrake serve` with SIGKILL while an
// approval is pending, once it is approved, and while the approved request is
// being forwarded (the fake Stripe holds it): nothing is lost, the held
// amounts stay counted, and no request reaches Stripe twice under one
// idempotency key — the forward cut off by the kill is resumed under the
// same upstream key, which Stripe replays.
func TestKill9WithApprovals(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the real binary")
	}
	t.Parallel()
	bin := MustBuildBinary(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_kill9_approvals")
	dataDir := t.TempDir()
	masterText, err := newMasterKeyText()
	require.NoError(t, err)
	masterKey, err := decodeMasterKey(masterText)
	require.NoError(t, err)
	const jwtSecret = "kill9-approvals-jwt-secret-0123456789ab"

	var keyID, vaultKey string
	func() {
		s, err := bolt.Open(filepath.Join(dataDir, databaseFile), bolt.Options{MasterKey: masterKey})
		require.NoError(t, err)
		defer s.Close()
		_, _, err = s.PutUpstream(context.Background(), "test", upstreamDefault, "stripe", fake.Secret)
		require.NoError(t, err)
		p := MustPolicy(t, 1000)
		above := decimal.RequireFromString("10.00")
		p.Approval = &policy.Approval{Above: &above, Timeout: time.Hour}
		k, token, err := s.MintKey(context.Background(), "test", vault.MintRequest{Name: "kill9-approvals", Upstream: upstreamDefault, Policy: p})
		require.NoError(t, err)
		keyID, vaultKey = k.ID, token
	}()

	environ := childEnviron(envMasterKey+"="+masterText, envJWTSecret+"="+jwtSecret, envStripeKey+"="+fake.Secret)
	args := []string{"serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--stripe-url", fake.URL, "--log-format", "json", "--upstream-timeout", "10s"}
	var cur *child
	start := func() (proxyURL, adminURL string) {
		cur = startChild(t, bin, args, environ)
		proxyURL = "http://" + cur.waitReady(t)
		return proxyURL, "http://" + *cur.admin.Load()
	}
	t.Cleanup(func() {
		if cur != nil {
			_ = cur.cmd.Process.Kill()
			<-cur.exited
		}
	})
	kill := func() {
		require.Error(t, cur.signalAndWait(t, syscall.SIGKILL, 10*time.Second), "killed")
	}
	charge := func(proxyURL, idem string) (int, string) {
		form := url.Values{"amount": {"2500"}, "currency": {"usd"}, "source": {"tok_visa"}, "metadata[order]": {idem}}
		req, err := http.NewRequest(http.MethodPost, proxyURL+"/v1/charges", strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+vaultKey)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", idem)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	token, err := api.IssueToken([]byte(jwtSecret), "ops@example.com", api.RoleAdmin, time.Hour, time.Now())
	require.NoError(t, err)
	approvalOf := func(adminURL, idem string) string {
		var page struct {
			Approvals []struct {
				ID             string `json:"id"`
				IdempotencyKey string `json:"idempotency_key"`
			} `json:"approvals"`
		}
		require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, adminURL+"/api/v1/approvals", token, nil, &page))
		for _, a := range page.Approvals {
			if a.IdempotencyKey == idem {
				return a.ID
			}
		}
		t.Fatalf("no approval for %s", idem)
		return ""
	}
	decide := func(adminURL, idem, verb string) {
		require.Equal(t, http.StatusOK, adminDo(t, http.MethodPost, adminURL+"/api/v1/approvals/"+approvalOf(adminURL, idem)+"/"+verb, token,
			map[string]string{"note": "kill9"}, nil))
	}

	// Pending, then killed.
	proxyURL, _ := start()
	for _, idem := range []string{"a", "b", "c"} {
		status, body := charge(proxyURL, idem)
		require.Equal(t, http.StatusPaymentRequired, status, body)
		require.Contains(t, body, "approval_required")
	}
	kill()
	proxyURL, adminURL := start()
	status, body := charge(proxyURL, "a")
	require.Equal(t, http.StatusPaymentRequired, status, "still pending after the kill: %s", body)

	// Approved, then killed.
	decide(adminURL, "a", "approve")
	decide(adminURL, "b", "approve")
	decide(adminURL, "c", "decline")
	kill()
	proxyURL, _ = start()
	status, body = charge(proxyURL, "a")
	require.Equal(t, http.StatusOK, status, "approved before the kill: %s", body)

	// Being forwarded: the fake holds b's request until keybrake is killed.
	reached := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	fake.SetHook(func(r fakestripe.Request) {
		if r.Method == http.MethodPost && r.Params.Get("metadata[order]") == "b" {
			once.Do(func() {
				close(reached)
				<-release
			})
		}
	})
	go func() { _, _ = charge(proxyURL, "b") }()
	<-reached
	kill()
	close(release)
	fake.WaitIdle(t)
	fake.SetHook(nil)
	proxyURL, _ = start()
	status, body = charge(proxyURL, "b")
	require.Equal(t, http.StatusOK, status, "resumed under the same upstream key: %s", body)
	status, body = charge(proxyURL, "c")
	require.Equal(t, http.StatusPaymentRequired, status, body)
	assert.Contains(t, body, "approval_declined")
	for _, idem := range []string{"a", "b"} {
		status, _ := charge(proxyURL, idem)
		assert.Equal(t, http.StatusOK, status, "a replay")
	}
	require.NoError(t, cur.signalAndWait(t, syscall.SIGTERM, 20*time.Second))
	cur = nil

	charges := map[string]int{}
	for _, ch := range fake.Charges() {
		charges[ch.IdempotencyKey]++
	}
	assert.Equal(t, map[string]int{vault.UpstreamKey(keyID, "a"): 1, vault.UpstreamKey(keyID, "b"): 1}, charges,
		"each approved request moved money once; the declined one never reached Stripe")
	s, err := bolt.Open(filepath.Join(dataDir, databaseFile), bolt.Options{MasterKey: masterKey})
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.CheckInvariant(context.Background()))
	assertMetered(t, s, keyID, fake.TotalCharged("usd"))
	_, windows, usage, err := s.KeyUsage(context.Background(), keyID)
	require.NoError(t, err)
	for _, w := range windows {
		assert.Equal(t, policy.Counter{Committed: 5000}, usage[w.ID], "%s: a and b committed, c released", w.ID)
	}
}
