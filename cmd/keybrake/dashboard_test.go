package main

import (
	"context"
	"flag"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/proxy/proxytest"
)

// updateDocs makes the browser tests write the screenshots that the README and
// docs/dashboard.md show (docs/dashboard-*.png) from their run.
var updateDocs = flag.Bool("update-docs", false, "write docs/dashboard-*.png from the browser tests")

// uiWait is how long the browser tests wait for the page to show a change: the
// dashboard refreshes every 5 s.
const uiWait = 12 * time.Second

// signInLinkRE finds the first-start banner's sign-in link.
var signInLinkRE = regexp.MustCompile(`Sign-in link:\s+(\S+)`)

func TestServeBannerPrintsTheDashboardAndASignInLink(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_banner")
	m := MustServe(t, t.TempDir(), fake.URL, env{})
	banner := m.stderr.String()
	token := bootstrapToken(t, banner)

	assert.Contains(t, banner, "Dashboard:             "+m.AdminURL()+"/ui/\n")
	match := signInLinkRE.FindStringSubmatch(banner)
	require.NotNil(t, match, banner)
	assert.Equal(t, m.AdminURL()+"/ui/#token="+token, match[1], "the token travels in the fragment, never in the query")
	assert.NotContains(t, match[1], "?")

	status, body := MustGet(t, strings.Split(match[1], "#")[0], "")
	assert.Equal(t, http.StatusOK, status)
	assert.Contains(t, string(body), `<script type="module" src="/ui/assets/`)
	assert.Contains(t, banner, "Mint more tokens with: keybrake token --role admin --data-dir ")
}

// With the JWT secret in the environment, the banner's hint says that token needs
// it there too: the data directory holds no jwt.secret to find.
func TestServeBannerNamesTheJWTSecretsVariable(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_banner")
	m := MustServe(t, t.TempDir(), fake.URL, env{envJWTSecret: "an-environment-jwt-secret-0123456789abcdef"})
	banner := m.stderr.String()
	assert.Contains(t, banner, "Mint more tokens with: keybrake token --role admin, with this server's KEYBRAKE_JWT_SECRET in its environment\n")
	assert.NotContains(t, banner, "--data-dir")
}

// TestDashboardInABrowser drives the dashboard of a real `keybrake serve` with a
// headless Chromium: sign in with the first-start link, mint a key through the
// form, charge through the proxy with stripe-go and watch the key's daily bar
// and numbers change, find the cap refusal in the ledger, revoke the key; then a
// viewer, who has no mint button, and a refused token, which goes back to sign-in.
func TestDashboardInABrowser(t *testing.T) {
	t.Parallel()
	d := MustDashboard(t, "sk_test_dashboard")
	b, m, fake, ui, shots := d.b, d.m, d.fake, d.ui, d.shots

	// Sign in with the link: the token leaves the address bar at once.
	b.Do(chromedp.Navigate(d.signInLink))
	b.WaitFor("the overview", `document.querySelector('main h1')?.textContent === 'Overview'`, uiWait)
	assert.Equal(t, ui+"#/", b.Eval(`location.href`), "no token left in the address bar")
	assert.Contains(t, b.Text(".session .who"), "bootstrap")
	assert.Contains(t, b.Text("main"), "No key has spent anything yet.")

	// Mint through the form. A bad cap is shown next to its field, the token once.
	b.Do(chromedp.Click(chromedp.CSS(`a[data-nav="keys"]`)))
	b.WaitFor("the empty key list", `document.querySelector('main .empty')?.textContent === 'No vault key yet.'`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`a[data-action="mint"]`)))
	b.WaitFor("the mint form", `!!document.querySelector('form.mint-form')`, uiWait)
	b.Do(
		chromedp.SendKeys(chromedp.CSS(`input[name="name"]`), "vault_key_cust_42"),
		chromedp.SendKeys(chromedp.CSS(`textarea[name="labels"]`), "customer_id=cust_42\nteam=billing"),
		chromedp.SendKeys(chromedp.CSS(`input[name="daily_cap"]`), "50.005"),
		chromedp.SendKeys(chromedp.CSS(`input[name="period_cap"]`), "100.00"),
		chromedp.Click(chromedp.CSS(`form.mint-form button[type="submit"]`)),
	)
	b.WaitFor("the field error", `!!document.querySelector('[data-field="policy.daily_cap"] .field-error')`, uiWait)
	assert.NotEmpty(t, b.Text(`[data-field="policy.daily_cap"] .field-error`))
	assert.Equal(t, "true", b.Eval(`document.querySelector('input[name="daily_cap"]').getAttribute('aria-invalid')`))
	assert.Contains(t, b.Text(".error-summary"), "The key was not minted")
	b.Do(
		chromedp.SetValue(chromedp.CSS(`input[name="daily_cap"]`), "50.00"),
		chromedp.Click(chromedp.CSS(`form.mint-form button[type="submit"]`)),
	)
	b.WaitFor("the new token", `!!document.querySelector('input.token')`, uiWait)
	assert.Contains(t, b.Text(".token-panel"), "it will not be shown again")
	vaultKey := b.Eval(`document.querySelector('input.token').value`)
	require.True(t, strings.HasPrefix(vaultKey, "vk_"), vaultKey)
	assert.Contains(t, b.Text(".token-panel"), m.PublicURL(), "the base URL for the SDKs")
	assert.Contains(t, b.Text(".token-panel"), "stripe.NewClient")
	b.Screenshot(shots, "minted")

	// The key list shows it, with empty bars.
	b.Do(chromedp.Navigate(ui + "#/keys"))
	row := `document.querySelector('table.data tbody tr')`
	dailyText := row + `?.querySelector('[data-window="daily"] .usage-text')?.textContent`
	dailyBar := row + `?.querySelector('[data-window="daily"] .seg-committed')?.dataset.percent`
	b.WaitFor("the key in the list", row+`?.querySelector('.key-name')?.textContent === 'vault_key_cust_42'`, uiWait)
	assert.Equal(t, "0", b.Eval(dailyBar))
	assert.Contains(t, b.Text("table.data tbody tr"), "customer_id=cust_42")
	assert.Contains(t, b.Text("table.data tbody tr"), "active")

	// Two charges through the proxy: the bar and its numbers follow, without a reload.
	b.Eval(`window.__noReload = 'still here'`)
	charge := d.charger(vaultKey, "usd")
	require.NoError(t, charge(2000))
	b.WaitFor("20.00 committed today", dailyText+`?.includes('20.00 of 50.00 USD')`, uiWait)
	assert.Equal(t, "40", b.Eval(dailyBar))
	assert.Empty(t, b.Eval(row+`.className`), "40 % is not near the cap")
	require.NoError(t, charge(2500))
	b.WaitFor("45.00 committed today", dailyText+`?.includes('45.00 of 50.00 USD')`, uiWait)
	assert.Equal(t, "90", b.Eval(dailyBar))
	assert.Equal(t, "row-near", b.Eval(row+`.className`), "90 % of the cap stands out")
	assert.Contains(t, b.Eval(dailyText), "90 %")
	assert.Equal(t, "still here", b.Eval(`window.__noReload`), "the page refreshed its data, not itself")

	// Two more keys, one at its cap, for the picture.
	nyPolicy := map[string]any{"daily_cap": "30.00", "period_cap": "500.00", "timezone": "America/New_York"}
	fullID, full := d.MustMint("vault_key_cust_77", "billing", nyPolicy)
	require.NoError(t, d.charger(full, "usd")(3000))
	agentID, agentKey := d.MustMint("agent_run_2026_12_01", "agents", nyPolicy)
	b.WaitFor("the key at its cap", `document.querySelector('table.data tbody tr.row-full')?.textContent.includes('at cap')`, uiWait)
	b.Screenshot(shots, "keys")

	// 45 + 10 passes the daily cap of 50: refused before Stripe, and in the ledger.
	var serr *stripe.Error
	require.ErrorAs(t, charge(1000), &serr)
	assert.Equal(t, "spend_cap_exceeded", string(serr.Code))
	require.Len(t, fake.Charges(), 3)
	b.Do(chromedp.Click(chromedp.CSS(`table.data tbody tr .key-name`)))
	b.WaitFor("the key's page", `document.querySelector('main h1')?.textContent.startsWith('vault_key_cust_42')`, uiWait)
	b.WaitFor("the refusal in the ledger", `!!document.querySelector('.ledger-region tr.row-refused')`, uiWait)
	refused := b.Text(".ledger-region tr.row-refused")
	assert.Contains(t, refused, "refused")
	assert.Contains(t, refused, "spend_cap_exceeded")
	assert.Contains(t, refused, "10.00 USD")
	assert.Contains(t, b.Text(".ledger-summary"), "1 refused")
	rows := `String(document.querySelectorAll('.ledger-region tbody tr').length)`
	assert.Equal(t, "5", b.Eval(rows), "two charges allowed and settled, one refused")
	b.WaitFor("the spend chart", `!!document.querySelector('svg.spend-chart .day rect.committed')`, uiWait)
	assert.Contains(t, b.Eval(`document.querySelector('svg.spend-chart desc').textContent`), "45.00 USD committed")
	assert.Contains(t, b.Text(".usage-region [data-window=daily]"), "45.00")
	b.Screenshot(shots, "key")
	b.Do(chromedp.Click(chromedp.CSS(`.ledger-tools input[type="checkbox"]`)))
	assert.Equal(t, "1", b.Eval(rows), "the filter shows the refusal alone")
	b.Do(chromedp.Click(chromedp.CSS(`.ledger-tools input[type="checkbox"]`)))

	// Narrow screens get the same pages, stacked; the chart is redrawn for its width.
	b.Do(chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	b.WaitFor("the chart redrawn", `document.querySelector('svg.spend-chart').viewBox.baseVal.width < 390`, uiWait)
	b.Screenshot(shots, "key-390")
	b.Do(chromedp.Navigate(ui + "#/keys"))
	b.WaitFor("the key list", row+`?.querySelector('.key-name')`, uiWait)
	b.Screenshot(shots, "keys-390")
	assert.Equal(t, "false", b.Eval(`String(document.documentElement.scrollWidth > window.innerWidth)`), "nothing wider than the screen")
	b.Do(chromedp.EmulateViewport(1280, 800))

	// Revoke, after confirming: the status changes and the key stops working.
	b.Do(chromedp.Click(chromedp.CSS(`table.data tbody tr .key-name`)))
	b.WaitFor("the revoke button", `!!document.querySelector('button[data-action="revoke"]')`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`button[data-action="revoke"]`)))
	b.WaitFor("the confirmation", `!!document.querySelector('dialog[open]')`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`dialog[open] .button.danger`)))
	b.WaitFor("the revoked status", `document.querySelector('main h1 .badge')?.textContent === 'revoked'`, uiWait)
	assert.Equal(t, "false", b.Eval(`String(!!document.querySelector('button[data-action="revoke"]'))`))
	require.ErrorAs(t, charge(100), &serr)
	assert.Equal(t, "vault_key_revoked", string(serr.Code))
	b.Do(chromedp.Navigate(ui + "#/keys"))
	b.WaitFor("revoked in the list", row+`?.querySelector('.badge')?.textContent === 'revoked'`, uiWait)

	// A viewer signs in by pasting a token: no mint button, no revoke button.
	b.Do(chromedp.Click(chromedp.CSS(".sign-out")))
	b.WaitFor("the sign-in page", `!!document.querySelector('form.signin-form')`, uiWait)
	assert.Contains(t, b.Text("main"), "You signed out.")
	b.Screenshot(shots, "signin")
	viewer := strings.TrimSpace(MustRunCommand(t, env{}, "token", "--data-dir", d.dataDir, "--role", "viewer", "--sub", "vera"))
	b.Do(
		chromedp.SendKeys(chromedp.CSS(`textarea[name="token"]`), viewer),
		chromedp.Click(chromedp.CSS(`form.signin-form button[type="submit"]`)),
	)
	b.WaitFor("signed in as the viewer", `document.querySelector('.session .who')?.textContent.includes('vera')`, uiWait)
	b.Do(chromedp.Navigate(ui + "#/keys"))
	b.WaitFor("the key list", row+`?.querySelector('.key-name')`, uiWait)
	assert.Equal(t, "false", b.Eval(`String(!!document.querySelector('[data-action="mint"]'))`), "a viewer has no mint button")
	b.Do(chromedp.Navigate(ui + "#/mint"))
	b.WaitFor("the refusal", `document.querySelector('main h1')?.textContent === 'Admins only'`, uiWait)
	b.Do(chromedp.Navigate(ui + "#/keys/" + fullID))
	b.WaitFor("an active key's page", `document.querySelector('main h1')?.textContent.startsWith('vault_key_cust_77')`, uiWait)
	assert.Equal(t, "false", b.Eval(`String(!!document.querySelector('[data-action]'))`), "a viewer has no revoke, rotate or edit button")
	// A viewer sees a key's money objects, without the Refresh button.
	pi, err := MustStripeClient(t, m.PublicURL(), agentKey).V1PaymentIntents.Create(context.Background(),
		&stripe.PaymentIntentCreateParams{Amount: stripe.Int64(500), Currency: stripe.String("usd")})
	require.NoError(t, err)
	b.Do(chromedp.Navigate(ui + "#/keys/" + agentID))
	b.WaitFor("the PaymentIntent's exposure", `document.querySelector('.exposure-region tbody tr')?.textContent.includes('`+pi.ID+`')`, uiWait)
	assert.Contains(t, b.Text(".exposure-region tbody tr"), "5.00 USD")
	assert.Equal(t, "false", b.Eval(`String(!!document.querySelector('[data-action]'))`), "a viewer has no Refresh button")

	// A token the API refuses ends the session: back to sign-in, with the reason.
	forged, err := api.IssueToken([]byte("another-secret-another-secret-0123456789"), "mallory", api.RoleAdmin, time.Hour, time.Now())
	require.NoError(t, err)
	b.Eval(`sessionStorage.setItem('keybrake.token', '` + forged + `'); 'ok'`)
	b.Do(chromedp.Reload())
	b.WaitFor("back to sign-in", `!!document.querySelector('form.signin-form')`, uiWait)
	assert.Contains(t, b.Text("main"), "You were signed out")
	assert.Contains(t, b.Text("main"), "bad signature")
	assert.Equal(t, "null", b.Eval(`String(sessionStorage.getItem('keybrake.token'))`))

	b.AssertNoConsoleErrors(m.AdminURL() + "/api/v1/")
}

// TestDashboardOverviewHoldsAndKeyboardInABrowser drives the overview, the
// unknown holds (resolved from the page), the cap editor and the mint form's
// errors, by keyboard where a user would type.
func TestDashboardOverviewHoldsAndKeyboardInABrowser(t *testing.T) {
	t.Parallel()
	d := MustDashboard(t, "sk_test_holds")
	b, m, fake, ui, shots := d.b, d.m, d.fake, d.ui, d.shots

	// A key that spent 12.00, has 30.00 whose outcome is unknown, and was refused once.
	keyID, vaultKey := d.MustMint("agent_run_7", "agents", map[string]any{"currency": "eur", "daily_cap": "50.00",
		"per_request_cap": "35.00", "timezone": "Europe/Paris"})
	charge := d.charger(vaultKey, "eur")
	require.NoError(t, charge(1200))
	fake.FailNext(proxytest.FailBefore500, 1)
	require.Error(t, charge(3000), "Stripe answered 500: the outcome is unknown")
	require.Error(t, charge(4000), "over the per-request cap")

	b.Do(chromedp.Navigate(d.signInLink))
	b.WaitFor("the overview", `!!document.querySelector('.card-alert')`, uiWait)
	overview := b.Text("main")
	assert.Contains(t, overview, "Spend in EUR")
	assert.Contains(t, overview, "12.00")
	assert.Contains(t, overview, "1 hold whose outcome is unknown")
	assert.Contains(t, b.Text("main section:nth-of-type(1) table"), "84 %", "12.00 + 30.00 held of 50.00")
	assert.Contains(t, b.Text("main section:nth-of-type(2) table"), "spend_cap_exceeded")
	b.Screenshot(shots, "overview")

	// The unknown hold: what to look up at Stripe, then resolve it as released.
	b.Do(chromedp.Click(chromedp.CSS(`a[href="#/holds"].button`)))
	b.WaitFor("the unknown hold", `!!document.querySelector('button[data-action="release"]')`, uiWait)
	holds := b.Text("table.data tbody")
	assert.Contains(t, holds, "30.00 EUR")
	assert.Contains(t, holds, "keybrake_", "the Idempotency-Key Stripe saw")
	b.Screenshot(shots, "holds")
	b.Do(chromedp.Click(chromedp.CSS(`button[data-action="release"]`)))
	b.WaitFor("the confirmation", `!!document.querySelector('dialog[open]')`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`dialog[open] .button.primary`)))
	b.WaitFor("no unknown hold left", `document.querySelector('main .empty')?.textContent.startsWith('No hold has an unknown outcome')`, uiWait)
	assert.Contains(t, b.Text(".notice-region"), "resolved as released")

	// The key's caps, edited by keyboard: a bad value is shown in the dialog, a
	// good one saved; Escape closes a dialog and gives the focus back.
	b.Do(chromedp.Navigate(ui + "#/keys/" + keyID))
	b.WaitFor("the key", `!!document.querySelector('button[data-action="edit-caps"]')`, uiWait)
	assert.Contains(t, b.Eval(`document.querySelector('.usage-region [data-window=daily]').textContent`), "12.00 of 50.00 EUR",
		"the released hold no longer counts")
	b.Do(chromedp.Focus(chromedp.CSS(`button[data-action="rotate"]`)), chromedp.KeyEvent(kb.Enter))
	b.WaitFor("the rotate dialog", `document.activeElement?.closest('dialog[open]')?.textContent.includes('Cancel')`, uiWait)
	assert.Equal(t, "Cancel", b.Eval(`document.activeElement.textContent`), "the safe choice has the focus")
	b.Do(chromedp.KeyEvent(kb.Escape))
	b.WaitFor("the dialog closed", `!document.querySelector('dialog') && document.activeElement?.dataset.action === 'rotate'`, uiWait)

	b.Do(chromedp.Focus(chromedp.CSS(`button[data-action="edit-caps"]`)), chromedp.KeyEvent(kb.Enter))
	b.WaitFor("the caps dialog", `!!document.querySelector('dialog[open] input[name="daily_cap"]')`, uiWait)
	b.Do(
		chromedp.SetValue(chromedp.CSS(`dialog[open] input[name="per_request_cap"]`), "35.001"),
		chromedp.Focus(chromedp.CSS(`dialog[open] input[name="per_request_cap"]`)),
		chromedp.KeyEvent(kb.Enter),
	)
	b.WaitFor("the field error", `!!document.querySelector('dialog[open] [data-field="policy.per_request_cap"] .field-error')`, uiWait)
	assert.Contains(t, b.Text(`dialog[open] .error-summary`), "The caps were not changed")
	b.Screenshot(shots, "edit-caps")
	b.Do(
		chromedp.SetValue(chromedp.CSS(`dialog[open] input[name="daily_cap"]`), "80.00"),
		chromedp.SetValue(chromedp.CSS(`dialog[open] input[name="per_request_cap"]`), "35.00"),
		chromedp.Focus(chromedp.CSS(`dialog[open] input[name="daily_cap"]`)),
		chromedp.KeyEvent(kb.Enter),
	)
	b.WaitFor("the new cap", `document.querySelector('.usage-region [data-window=daily]')?.textContent.includes('12.00 of 80.00 EUR')`, uiWait)
	assert.Contains(t, b.Text(".notice-region"), "The caps are saved.")

	// A PaymentIntent created through keybrake holds its amount; cancelled at
	// Stripe directly, where keybrake cannot see it, it is freed by Refresh.
	pi, err := MustStripeClient(t, m.PublicURL(), vaultKey).V1PaymentIntents.Create(context.Background(),
		&stripe.PaymentIntentCreateParams{Amount: stripe.Int64(2000), Currency: stripe.String("eur")})
	require.NoError(t, err)
	b.Do(chromedp.Reload())
	exposureRow := `document.querySelector('.exposure-region tbody tr')`
	b.WaitFor("the PaymentIntent's exposure", exposureRow+`?.textContent.includes('`+pi.ID+`')`, uiWait)
	assert.Contains(t, b.Text(".exposure-region tbody tr"), "20.00 EUR")
	assert.Contains(t, b.Text(".exposure-region tbody tr"), "payment intent")
	dailyUsage := `document.querySelector('.usage-region [data-window=daily]').textContent`
	assert.Contains(t, b.Eval(dailyUsage), "12.00 + 20.00 held of 80.00 EUR")
	b.Screenshot(shots, "exposure")
	_, err = MustStripeClient(t, fake.URL, fake.Secret).V1PaymentIntents.Cancel(context.Background(), pi.ID, &stripe.PaymentIntentCancelParams{})
	require.NoError(t, err)
	b.Do(chromedp.Click(chromedp.CSS(`button[data-action="refresh-exposure"][data-object="` + pi.ID + `"]`)))
	b.WaitFor("the refresh's result", `document.querySelector('.exposure-result')?.textContent.includes('released 20.00 EUR')`, uiWait)
	b.WaitFor("nothing left exposed", `document.querySelector('.exposure-region .empty')?.textContent.startsWith('No money object')`, uiWait)
	assert.Contains(t, b.Eval(dailyUsage), "12.00 of 80.00 EUR", "the held money dropped")
	b.Screenshot(shots, "exposure-refreshed")

	// An event that came through the MCP endpoint names its tool in the ledger.
	// (The event's tool field is optional; this page's answers are rewritten so
	// that one has it.)
	assert.Equal(t, "false", b.Eval(`String(!!document.querySelector('.ledger-region th')?.parentElement.textContent.includes('MCP tool'))`))
	b.Eval(`(() => {
		const orig = window.fetch;
		window.fetch = async (url, opts) => {
			const r = await orig(url, opts);
			if (!String(url).includes('/events')) return r;
			const data = await r.json();
			data.events[0].tool = 'create_charge';
			return new Response(JSON.stringify(data), {status: r.status, headers: r.headers});
		};
		return 'patched';
	})()`)
	b.WaitFor("the MCP tool column", `[...document.querySelectorAll('.ledger-region th')].some((th) => th.textContent === 'MCP tool')`, uiWait)
	assert.Equal(t, "create_charge", b.Text(`.ledger-region tbody tr:first-child td[data-label="MCP tool"]`))

	// An API error is a message, not a blank page.
	b.Do(chromedp.Navigate(ui + "#/keys/key_nope"))
	b.WaitFor("the error", `document.querySelector('main [role=alert]')?.textContent.includes('No such key')`, uiWait)
	assert.Contains(t, b.Text("main [role=alert]"), "404")

	// The mint form: every control has a label; the API's errors land on their fields.
	b.Do(chromedp.Navigate(ui + "#/mint"))
	b.WaitFor("the mint form", `!!document.querySelector('form.mint-form')`, uiWait)
	assert.Equal(t, "0", b.Eval(`String([...document.querySelectorAll('main input, main select, main textarea')]
		.filter((el) => el.labels.length === 0 && !el.getAttribute('aria-label')).length)`), "every form control is labelled")
	b.Do(
		chromedp.SetValue(chromedp.CSS(`input[name="expires_at"]`), "2020-01-01T00:00"),
		chromedp.SendKeys(chromedp.CSS(`textarea[name="operations"]`), "charges.create\nRefunds.Create"),
		chromedp.Click(chromedp.CSS(`form.mint-form button[type="submit"]`)),
	)
	b.WaitFor("the field errors", `document.querySelectorAll('.field-error').length >= 4`, uiWait)
	for _, f := range []string{"name", "policy.daily_cap", "policy.expires_at", "policy.operations"} {
		assert.NotEmpty(t, b.Text(`[data-field="`+f+`"] .field-error`), f)
	}
	assert.Equal(t, "true", b.Eval(`String(document.activeElement.classList.contains('error-summary'))`), "the focus moves to the summary")
	b.Screenshot(shots, "mint-errors")

	b.Do(chromedp.Navigate(ui + "#/audit"))
	b.WaitFor("the audit log", `document.querySelectorAll('table.data tbody tr').length >= 4`, uiWait)
	assert.Contains(t, b.Text("table.data"), "hold.resolve")
	b.Screenshot(shots, "audit")
	b.Do(chromedp.Navigate(ui + "#/upstreams"))
	b.WaitFor("the upstreams", `!!document.querySelector('table.data tbody tr')`, uiWait)
	assert.Contains(t, b.Text("table.data"), "••••"+fake.Secret[len(fake.Secret)-4:])
	assert.NotContains(t, b.Text("main"), fake.Secret, "the secret never comes back")
	b.Screenshot(shots, "upstreams")

	// A token that expires while the page is open sends the user back to
	// sign in. On a loaded machine the token may expire before the page has
	// shown anything with it; the page must still end at sign-in.
	short := strings.TrimSpace(MustRunCommand(t, env{}, "token", "--data-dir", d.dataDir, "--ttl", "3s"))
	b.Eval(`sessionStorage.setItem('keybrake.token', '` + short + `'); 'ok'`)
	b.Do(chromedp.Reload())
	b.WaitFor("the upstreams or sign-in", `!!document.querySelector('table.data tbody tr, form.signin-form')`, uiWait)
	b.WaitFor("back to sign-in", `!!document.querySelector('form.signin-form')`, uiWait)
	assert.Contains(t, b.Text("main"), "Your token has expired")

	b.AssertNoConsoleErrors(m.AdminURL() + "/api/v1/")
}

// dashboardEnv is a real `keybrake serve` in this process with a fake Stripe as
// its upstream, and a headless browser, not signed in yet.
type dashboardEnv struct {
	b          *testBrowser
	m          testMain
	fake       *proxytest.FakeStripe
	dataDir    string
	ui         string // the dashboard's URL
	signInLink string // from the first-start banner
	shots      string // where screenshots go
	admin      string // an admin token for the API
}

// MustDashboard starts keybrake (its upstream a fake Stripe accepting secret) and a
// browser; browser tests are skipped with -short.
func MustDashboard(t *testing.T, secret string, extra ...string) *dashboardEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("a browser test: -short skips it")
	}
	d := &dashboardEnv{b: MustBrowser(t), shots: screenshotDir(t), fake: proxytest.NewFakeStripe(t, secret), dataDir: t.TempDir()}
	d.m = MustServe(t, d.dataDir, d.fake.URL, env{envStripeKey: d.fake.Secret}, extra...)
	match := signInLinkRE.FindStringSubmatch(d.m.stderr.String())
	require.NotNil(t, match, "first-start banner: %s", d.m.stderr)
	d.signInLink = match[1]
	d.ui = d.m.AdminURL() + api.UIPath
	d.admin = strings.TrimSpace(MustRunCommand(t, env{}, "token", "--data-dir", d.dataDir))
	return d
}

// MustMint mints a key through the admin API with a policy of stripe, usd unless
// policy says otherwise, valid for 20 days, plus policy's members, and the label
// team. It returns the key's id and token.
func (d *dashboardEnv) MustMint(name, team string, policy map[string]any) (id, token string) {
	d.b.tb.Helper()
	p := map[string]any{"vendor": "stripe", "expires_at": time.Now().Add(20 * 24 * time.Hour).UTC().Format(time.RFC3339)}
	for k, v := range policy {
		p[k] = v
	}
	var minted struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	require.Equal(d.b.tb, http.StatusCreated, adminDo(d.b.tb, http.MethodPost, d.m.AdminURL()+"/api/v1/keys", d.admin,
		map[string]any{"name": name, "labels": map[string]string{"team": team}, "policy": p}, &minted))
	return minted.ID, minted.Token
}

// charger returns a func that charges cents in currency through keybrake with
// stripe-go and the vault key.
func (d *dashboardEnv) charger(vaultKey, currency string) func(cents int64) error {
	sc := MustStripeClient(d.b.tb, d.m.PublicURL(), vaultKey)
	return func(cents int64) error {
		_, err := sc.V1Charges.Create(context.Background(), &stripe.ChargeCreateParams{
			Amount: stripe.Int64(cents), Currency: stripe.String(currency),
			Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
		})
		return err
	}
}
