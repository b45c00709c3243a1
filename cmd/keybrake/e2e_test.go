package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
)

// adminDo sends a JSON request to the admin API and decodes a JSON answer into out
// (when out is not nil). It returns the status.
func adminDo(tb testing.TB, method, u, token string, in, out any) int {
	tb.Helper()
	return adminDoWith(tb, http.DefaultClient, method, u, token, in, out)
}

// adminDoWith is adminDo through client.
func adminDoWith(tb testing.TB, client *http.Client, method, u, token string, in, out any) int {
	tb.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		require.NoError(tb, err)
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u, body)
	require.NoError(tb, err)
	req.Header.Set("Authorization", "Bearer "+token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	require.NoError(tb, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	if out != nil && resp.StatusCode < 300 {
		require.NoError(tb, json.Unmarshal(data, out), string(data))
	}
	if resp.StatusCode >= 300 {
		tb.Logf("%s %s: %d %s", method, u, resp.StatusCode, data)
	}
	return resp.StatusCode
}

// MustStripeClient is a stripe-go client pointed at keybrake's proxy with a vault key.
func MustStripeClient(tb testing.TB, proxyURL, vaultKey string) *stripe.Client {
	tb.Helper()
	retries := int64(0)
	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(proxyURL),
		MaxNetworkRetries: &retries,
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripe.NewClient(vaultKey, stripe.WithBackends(backends))
}

// usageWindow is one window of GET /api/v1/keys/{id}/usage.
type usageWindow struct {
	Cap       *string `json:"cap"`
	Committed string  `json:"committed"`
	Held      string  `json:"held"`
	Remaining *string `json:"remaining"`
}

// usageAnswer is GET /api/v1/keys/{id}/usage.
type usageAnswer struct {
	Currency string       `json:"currency"`
	Daily    *usageWindow `json:"daily"`
	Period   *usageWindow `json:"period"`
}

func TestEndToEndMintChargeAndReadUsage(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_e2e")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	ctx := context.Background()

	adminToken := strings.TrimSpace(MustRunCommand(t, env{}, "token", "--data-dir", dataDir, "--sub", "e2e"))
	viewerToken := strings.TrimSpace(MustRunCommand(t, env{}, "token", "--data-dir", dataDir, "--role", "viewer"))

	mint := map[string]any{
		"name":     "vault_key_cust_123",
		"upstream": "default",
		"labels":   map[string]string{"customer_id": "cust_123"},
		"policy": map[string]any{
			"vendor":     "stripe",
			"currency":   "usd",
			"daily_cap":  "50.00",
			"period_cap": "60.00",
			"expires_at": time.Now().Add(72 * time.Hour).UTC().Format(time.RFC3339),
		},
	}
	assert.Equal(t, http.StatusForbidden, adminDo(t, http.MethodPost, m.AdminURL()+"/api/v1/keys", viewerToken, mint, nil),
		"a viewer token may not mint")
	var minted struct {
		ID      string `json:"id"`
		Token   string `json:"token"`
		BaseURL string `json:"base_url"`
	}
	require.Equal(t, http.StatusCreated, adminDo(t, http.MethodPost, m.AdminURL()+"/api/v1/keys", adminToken, mint, &minted))
	require.True(t, strings.HasPrefix(minted.Token, "vk_"), minted.Token)
	assert.Equal(t, m.PublicURL(), minted.BaseURL)

	sc := MustStripeClient(t, minted.BaseURL, minted.Token)
	ch, err := sc.V1Charges.Create(ctx, &stripe.ChargeCreateParams{
		Amount:   stripe.Int64(2500),
		Currency: stripe.String("usd"),
		Source:   &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
	})
	require.NoError(t, err)
	assert.Equal(t, int64(2500), ch.Amount)
	require.Len(t, fake.Charges(), 1)

	// 25 + 30 passes the daily cap of 50: refused before Stripe.
	before := fake.Count()
	_, err = sc.V1Charges.Create(ctx, &stripe.ChargeCreateParams{
		Amount:   stripe.Int64(3000),
		Currency: stripe.String("usd"),
		Source:   &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
	})
	var serr *stripe.Error
	require.ErrorAs(t, err, &serr)
	assert.Equal(t, http.StatusPaymentRequired, serr.HTTPStatusCode)
	assert.Equal(t, "spend_cap_exceeded", string(serr.Code))
	assert.Equal(t, before, fake.Count(), "the refused charge never reached Stripe")

	var usage usageAnswer
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, m.AdminURL()+"/api/v1/keys/"+minted.ID+"/usage", viewerToken, nil, &usage))
	assert.Equal(t, "usd", usage.Currency)
	require.NotNil(t, usage.Daily)
	require.NotNil(t, usage.Period)
	assertMoney(t, "25", usage.Daily.Committed)
	assertMoney(t, "0", usage.Daily.Held)
	assertMoney(t, "25", usage.Period.Committed)
	require.NotNil(t, usage.Period.Remaining)
	assertMoney(t, "35", *usage.Period.Remaining)
	assert.Equal(t, int64(2500), fake.TotalMoved("usd"))

	// serve wires the proxy, the store and the version into one registry served
	// at /metrics (no token needed).
	status, body := MustGet(t, m.AdminURL()+"/metrics", "")
	require.Equal(t, http.StatusOK, status, string(body))
	for _, line := range []string{
		`keybrake_proxy_requests_total{operation="charges.create",outcome="allowed"} 1`,
		`keybrake_proxy_requests_total{operation="charges.create",outcome="refused"} 1`,
		`keybrake_proxy_refusals_total{mode="enforce",reason="spend_cap_exceeded"} 1`,
		`keybrake_upstream_request_duration_seconds_count{kind="forward",status_class="2xx"} 1`,
		`keybrake_store_commit_batch_size_sum 3`, // the charge's hold and settle, the refusal's event
		`keybrake_committed_minor_units{currency="usd",window="period"} 2500`,
		`keybrake_holds_unknown 0`,
		`keybrake_keys_active 1`,
		`keybrake_build_info{goversion="` + runtime.Version() + `",version="` + buildVersion() + `"} 1`,
	} {
		assert.True(t, slices.Contains(strings.Split(string(body), "\n"), line), "/metrics has %s", line)
	}
}

// assertMoney compares decimal strings by value ("25" equals "25.00").
func assertMoney(tb testing.TB, want, got string) {
	tb.Helper()
	w, err := decimal.NewFromString(want)
	require.NoError(tb, err)
	g, err := decimal.NewFromString(got)
	require.NoError(tb, err, "%q is not a decimal", got)
	assert.True(tb, w.Equal(g), "want %s, got %s", want, got)
}

func TestBackupOnlineWhileServing(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_online")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	k, _ := MustMintKey(t, m.Store(), "online", 10)

	out := filepath.Join(t.TempDir(), "online.db")
	// The token is minted from the data directory's jwt.secret.
	stdout := MustRunCommand(t, env{}, "backup", "--out", out, "--admin-url", m.AdminURL(), "--data-dir", dataDir)
	assert.Contains(t, stdout, out)

	s := MustOpenStore(t, out, MustMasterKey(t, dataDir))
	got, err := s.GetKey(context.Background(), k.ID)
	require.NoError(t, err)
	assert.Equal(t, "online", got.Name)

	_, err = runCommand(env{}, "backup", "--out", filepath.Join(t.TempDir(), "x.db"), "--admin-url", m.AdminURL(),
		"--token", "not-a-jwt")
	assert.ErrorContains(t, err, "401", "a bad token is refused")
}

func TestGracefulShutdownLetsInFlightRequestFinish(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_graceful")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	k, vaultKey := MustMintKey(t, m.Store(), "graceful", 100)

	// Stripe takes its time with the next charge: it is still in flight when the
	// shutdown starts.
	fake.SetFailDelay(2 * time.Second)
	fake.FailNext(proxytest.FailAfterCreateDelay, 1)

	type result struct {
		status int
		body   []byte
		err    error
	}
	done := make(chan result, 1)
	go func() {
		client := &http.Client{Timeout: 30 * time.Second}
		status, body, err := postForm(context.Background(), client, m.ProxyURL()+"/v1/charges", vaultKey, "graceful-1",
			url.Values{"amount": {"700"}, "currency": {"usd"}, "source": {"tok_visa"}})
		done <- result{status, body, err}
	}()
	require.Eventually(t, func() bool { return fake.Count() >= 1 }, 10*time.Second, 5*time.Millisecond,
		"the charge reached Stripe")

	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()

	// The listener stops accepting while the request is still being served.
	proxyAddr := strings.TrimPrefix(m.ProxyURL(), "http://")
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", proxyAddr, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	}, 10*time.Second, 5*time.Millisecond, "the proxy listener closes")
	select {
	case r := <-done:
		require.FailNow(t, "the request finished before the listener closed: the test proves nothing", "%d %s", r.status, r.body)
	default:
	}

	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusOK, r.status, string(r.body))
	assert.Contains(t, string(r.body), `"ch_`)
	require.NoError(t, <-closed)

	// The store was closed cleanly with the charge committed, nothing left held.
	s := MustOpenStore(t, filepath.Join(dataDir, databaseFile), MustMasterKey(t, dataDir))
	_, windows, usage, err := s.KeyUsage(context.Background(), k.ID)
	require.NoError(t, err)
	require.NotEmpty(t, windows)
	for _, w := range windows {
		assert.Equal(t, int64(700), usage[w.ID].Committed, w.ID)
		assert.Zero(t, usage[w.ID].Held, w.ID)
	}
	unknown, _, err := s.ListHolds(context.Background(), vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	assert.Empty(t, unknown)
}
