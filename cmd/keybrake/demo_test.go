package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/proxy/proxytest"
)

// MustServeDemo starts `keybrake serve --demo` in-process on 127.0.0.1:0 with
// dataDir, and closes it in t.Cleanup.
func MustServeDemo(tb testing.TB, dataDir string, e env) testMain {
	tb.Helper()
	tm := NewTestMain(e)
	ctx := context.Background()
	require.NoError(tb, tm.ParseFlags(ctx, []string{"serve", "--demo", "--data-dir", dataDir,
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-level", "warn"}))
	tb.Cleanup(func() { assert.NoError(tb, tm.Close()) })
	require.NoError(tb, tm.Run(ctx), "stderr: %s", tm.stderr)
	return tm
}

// serve --demo runs the README's walk-through without a Stripe account: the
// banner, the dashboard's overview and every answer say it is not Stripe, and
// a charge is committed money, as at Stripe.
func TestServeDemoWalkThrough(t *testing.T) {
	t.Parallel()
	m := MustServeDemo(t, t.TempDir(), env{})
	banner := m.stderr.String()
	assert.Contains(t, banner, "DEMO: the upstream is keybrake's built-in fake Stripe")
	assert.Contains(t, banner, "NOT Stripe")
	assert.True(t, strings.HasPrefix(banner, "keybrake "), "the first line comes before the store opens: %s", banner)
	token := bootstrapToken(t, banner)

	var key struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	require.Equal(t, http.StatusCreated, adminDo(t, http.MethodPost, m.AdminURL()+"/api/v1/keys", token, map[string]any{
		"name": "demo_key", "policy": map[string]any{"vendor": "stripe", "currency": "usd", "daily_cap": "50.00",
			"expires_at": time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)},
	}, &key))
	ch, err := MustStripeClient(t, m.PublicURL(), key.Token).V1Charges.Create(context.Background(), &stripe.ChargeCreateParams{
		Amount: stripe.Int64(2500), Currency: stripe.String("usd"),
		Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
	})
	require.NoError(t, err)
	assert.True(t, ch.Captured, "a charge is captured, as at Stripe")
	assert.Equal(t, demoHeaderValue, ch.LastResponse.Header.Get(headerDemo), "the proxy's answer says it is no Stripe")

	var usage struct {
		Daily usageWindow `json:"daily"`
	}
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, m.AdminURL()+"/api/v1/keys/"+key.ID+"/usage", token, nil, &usage))
	assert.Equal(t, "25.00", usage.Daily.Committed, "committed, not held")
	assert.Equal(t, "0.00", usage.Daily.Held)

	var ov struct {
		Demo bool `json:"demo"`
	}
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, m.AdminURL()+"/api/v1/overview", token, nil, &ov))
	assert.True(t, ov.Demo)
	status, _ := MustGet(t, m.AdminURL()+api.UIPath, "")
	assert.Equal(t, http.StatusOK, status)
	resp, err := http.Get(m.AdminURL() + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, demoHeaderValue, resp.Header.Get(headerDemo), "the admin listener's answers too")
}

// serve --demo never runs with a Stripe key: not one in the environment (a
// live one is named as such), not one in the store's upstreams; and its
// upstream is the fake, never a --stripe-url.
func TestServeDemoRefusesRealKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	start := func(e env, args ...string) error {
		tm := NewTestMain(e)
		err := tm.ParseFlags(ctx, append([]string{"serve", "--demo", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...))
		if err == nil {
			err = tm.Run(ctx)
		}
		assert.NoError(t, tm.Close())
		return err
	}
	err := start(env{envStripeKey: "sk_live_51Hreal"}, "--data-dir", t.TempDir())
	assert.ErrorContains(t, err, "refuses to start with a live Stripe key")
	assert.ErrorContains(t, start(env{envStripeKey: "sk_test_51Hreal"}, "--data-dir", t.TempDir()), "unset it")
	assert.ErrorContains(t, start(env{}, "--data-dir", t.TempDir(), "--stripe-url", "https://api.stripe.com"), "--demo and --stripe-url")

	// A vault with a real upstream is refused, and left as it was.
	dir := t.TempDir()
	fake := proxytest.NewFakeStripe(t, "sk_test_realvault")
	real := MustServe(t, dir, fake.URL, env{envStripeKey: fake.Secret})
	require.NoError(t, real.Close())
	err = start(env{}, "--data-dir", dir)
	assert.ErrorContains(t, err, `upstream "default" holds a real Stripe key`)
	again := MustServe(t, dir, fake.URL, env{})
	secret, err := again.Store().UpstreamSecret(ctx, "default")
	require.NoError(t, err)
	assert.Equal(t, fake.Secret, secret)
}

// Without --data-dir, the demo keeps its vault apart from the default one.
func TestServeDemoHasItsOwnDataDirectory(t *testing.T) {
	t.Parallel()
	tm := NewTestMain(env{})
	require.NoError(t, tm.ParseFlags(context.Background(), []string{"serve", "--demo"}))
	assert.Equal(t, demoDataDir, tm.Config.DataDir)
	tm = NewTestMain(env{"KEYBRAKE_DATA_DIR": "/somewhere"})
	require.NoError(t, tm.ParseFlags(context.Background(), []string{"serve", "--demo"}))
	assert.Equal(t, "/somewhere", tm.Config.DataDir)
}

// Under --demo every page of the dashboard says that the upstream is no Stripe,
// and the upstreams page names the mode.
func TestServeDemoDashboardSaysItIsNotStripe(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a browser test: -short skips it")
	}
	b := MustBrowser(t)
	shots := screenshotDir(t)
	m := MustServeDemo(t, t.TempDir(), env{})
	match := signInLinkRE.FindStringSubmatch(m.stderr.String())
	require.NotNil(t, match, m.stderr.String())
	b.Do(chromedp.Navigate(match[1]))
	b.WaitFor("the demo notice", `!document.querySelector('.demo-banner').hidden`, uiWait)
	assert.Contains(t, b.Text(".demo-banner"), "not Stripe")
	b.Screenshot(shots, "demo-overview")
	b.Do(chromedp.Navigate(m.AdminURL() + api.UIPath + "#/upstreams"))
	b.WaitFor("the upstream", `!!document.querySelector('table.data tbody tr')`, uiWait)
	assert.Contains(t, b.Text("table.data tbody tr"), "demo: not Stripe")
	assert.Contains(t, b.Text(".demo-banner"), "not Stripe", "on every page")
	b.AssertNoConsoleErrors(m.AdminURL() + "/api/v1/")
}
