package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// TestDashboardDuringAnIncidentInABrowser drives the dashboard as an operator
// during an incident: a key with an unknown hold is named on the overview, the
// holds page and the key list; a report-mode key past its cap is marked as
// such, not as a broken cap; a revoked key still in use is named with how often,
// when and from where; a key's held money is explained; the ledger finds a
// caller's idempotency key; the upstreams show where they point; the audit log
// filters; on a phone, pages open at their top. It signs in with the link of
// `keybrake token --link`.
func TestDashboardDuringAnIncidentInABrowser(t *testing.T) {
	t.Parallel()
	d := MustDashboard(t, "sk_test_incident")
	b, m, fake, ui, shots := d.b, d.m, d.fake, d.ui, d.shots
	ctx := context.Background()

	// agent_run_7: 12.00 committed (idempotency key order-42), 30.00 whose outcome
	// is unknown, and a PaymentIntent's 20.00 of exposure.
	agentID, agentKey := d.MustMint("agent_run_7", "agents", map[string]any{"currency": "eur", "daily_cap": "80.00", "timezone": "Europe/Paris"})
	sc := MustStripeClient(t, m.PublicURL(), agentKey)
	params := &stripe.ChargeCreateParams{Amount: stripe.Int64(1200), Currency: stripe.String("eur"),
		Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")}}
	params.SetIdempotencyKey("order-42")
	_, err := sc.V1Charges.Create(ctx, params)
	require.NoError(t, err)
	fake.FailNext(proxytest.FailBefore500, 1)
	require.Error(t, d.charger(agentKey, "eur")(3000), "Stripe answered 500: the outcome is unknown")
	pi, err := sc.V1PaymentIntents.Create(ctx, &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(2000), Currency: stripe.String("eur")})
	require.NoError(t, err)

	// dry_run: a report-mode key at 160 % of its daily cap.
	dryID, dryKey := d.MustMint("dry_run", "agents", map[string]any{"daily_cap": "10.00", "mode": "report"})
	require.NoError(t, d.charger(dryKey, "usd")(1600))

	// old_billing: revoked, and still used twice.
	oldID, oldKey := d.MustMint("old_billing", "billing", map[string]any{"daily_cap": "10.00"})
	require.Equal(t, 200, adminDo(t, "POST", m.AdminURL()+"/api/v1/keys/"+oldID+"/revoke", d.admin, nil, nil))
	for range 2 {
		require.Error(t, d.charger(oldKey, "usd")(100))
	}

	// Sign in with the link `keybrake token --link` prints.
	link := strings.TrimSpace(MustRunCommand(t, env{}, "token", "--data-dir", d.dataDir, "--link", "--admin-url", m.AdminURL(), "--sub", "oncall"))
	b.Do(chromedp.Navigate(link))
	b.WaitFor("the overview", `!!document.querySelector('.card-alert .unknown-list li')`, uiWait)
	assert.Contains(t, b.Text(".session .who"), "oncall")
	assert.Equal(t, ui+"#/", b.Eval(`location.href`), "no token left in the address bar")
	assert.Contains(t, b.Text(".card-alert .unknown-list"), "agent_run_7", "the unknown hold names its key")
	assert.Contains(t, b.Text(".card-alert .unknown-list"), "30.00 EUR")
	assert.Equal(t, "true", b.Eval(`String(document.querySelector('.cards').firstElementChild.classList.contains('card-alert'))`),
		"what needs an operator comes first")
	refused := b.Text(".refused-keys .refused-list")
	assert.Contains(t, refused, "old_billing")
	assert.Contains(t, refused, "refused 2 times since it was revoked")
	assert.Contains(t, refused, "from 127.0.0.1")
	nearCap := b.Text("main section:nth-of-type(1) table")
	assert.Contains(t, nearCap, "report mode")
	assert.Contains(t, nearCap, "160 % · would have been refused", "a report-mode key past its cap is not a broken cap")
	assert.Equal(t, "0", b.Eval(`String(document.querySelectorAll('main section:nth-of-type(1) .badge-bad').length)`), "nothing red for the report-mode key")
	b.Screenshot(shots, "overview-incident")
	if *updateDocs {
		copyToDocs(t, b.Screenshot(shots, "overview-incident"), "dashboard-overview.png")
	}

	// The holds page names the key; the key list flags it and marks report mode.
	b.Do(chromedp.Navigate(ui + "#/holds"))
	b.WaitFor("the unknown hold", `!!document.querySelector('button[data-action="release"]')`, uiWait)
	assert.Contains(t, b.Text("table.data tbody"), "agent_run_7")
	b.Screenshot(shots, "holds-incident")
	b.Do(chromedp.Navigate(ui + "#/keys"))
	b.WaitFor("the flagged key", `!!document.querySelector('tr.row-unknown .unknown-flag')`, uiWait)
	assert.Contains(t, b.Text("tr.row-unknown"), "agent_run_7")
	assert.Contains(t, b.Text("tr.row-unknown .unknown-flag"), "1 unknown hold")
	dryRow := `[...document.querySelectorAll('table.data tbody tr')].find((tr) => tr.textContent.includes('dry_run'))`
	assert.Equal(t, "true", b.Eval(`String(!!`+dryRow+`.querySelector('.mode-report'))`), "a report-mode key is marked")
	assert.Contains(t, b.Eval(dryRow+`.querySelector('[data-window="daily"]').textContent`), "report mode")
	assert.NotContains(t, b.Eval(dryRow+`.querySelector('[data-window="daily"]').textContent`), "at cap")
	assert.Equal(t, "row-report", b.Eval(dryRow+`.className`), "not marked as a broken cap")
	keyList := b.Screenshot(shots, "keys")
	if *updateDocs {
		copyToDocs(t, keyList, "dashboard-keys.png")
	}

	// The key's page: what its held money is, and the ledger as what happened.
	b.Do(chromedp.Navigate(ui + "#/keys/" + agentID))
	b.WaitFor("the held money", `!!document.querySelector('.held-breakdown [data-held="unknown"]')`, uiWait)
	held := b.Text(".held-breakdown")
	assert.Contains(t, held, "20.00 EUR as the exposure of 1 money object")
	assert.Contains(t, held, "30.00 EUR in 1 request whose outcome is unknown")
	assert.Equal(t, "#/holds", b.Eval(`document.querySelector('.held-breakdown [data-held="unknown"] a').getAttribute('href')`))
	assert.Contains(t, b.Text(".exposure-region tbody"), pi.ID)
	ledger := b.Text(".ledger-region tbody")
	assert.Contains(t, ledger, "order-42", "the caller's idempotency key")
	assert.Contains(t, ledger, "outcome unknown")
	assert.Contains(t, ledger, "held as exposure", "a PaymentIntent's money is held as its exposure, not committed")
	assert.NotContains(t, ledger, "settled")
	b.Do(chromedp.SendKeys(chromedp.CSS(`input.ledger-search`), "order-42"))
	b.WaitFor("the search", `document.querySelectorAll('.ledger-region tbody tr').length === 2`, uiWait)
	assert.Contains(t, b.Text(".ledger-region tbody tr:first-child"), "12.00 EUR moved and is committed")
	b.Screenshot(shots, "key-incident")
	if *updateDocs {
		copyToDocs(t, b.Screenshot(shots, "key-incident"), "dashboard-key.png")
	}
	b.Do(chromedp.Navigate(ui + "#/keys/" + dryID))
	b.WaitFor("the report-mode key", `!!document.querySelector('main h1 .mode-report')`, uiWait)
	assert.Contains(t, b.Text(".usage-region [data-window=daily]"), "an enforcing key would have refused 6.00 USD")
	b.Do(chromedp.Navigate(ui + "#/keys/" + oldID))
	b.WaitFor("the revoked key in use", `!!document.querySelector('.key-refused')`, uiWait)
	assert.Contains(t, b.Text(".key-refused"), "refused 2 times since it was revoked")

	// Upstreams: where they point and in which mode; the form replaces nothing by default.
	b.Do(chromedp.Navigate(ui + "#/upstreams"))
	b.WaitFor("the upstreams", `!!document.querySelector('table.data tbody tr')`, uiWait)
	up := b.Text("table.data tbody tr")
	assert.Contains(t, up, fake.URL)
	assert.Contains(t, up, "test")
	assert.Equal(t, "", b.Eval(`document.querySelector('input[name="name"]').value`), "not pre-filled with an existing upstream")
	b.Screenshot(shots, "upstreams-incident")

	// The audit log names keys beside their ids and filters by action.
	b.Do(chromedp.Navigate(ui + "#/audit"))
	b.WaitFor("the audit log", `document.querySelectorAll('table.data tbody tr').length >= 4`, uiWait)
	assert.Contains(t, b.Text("table.data"), "old_billing")
	b.Do(chromedp.SendKeys(chromedp.CSS(`input[name="action"]`), "key.revoke"))
	b.WaitFor("one entry", `document.querySelectorAll('table.data tbody tr').length === 1`, uiWait)
	assert.Contains(t, b.Text("table.data tbody"), "old_billing")

	// A phone: the overview's unknown holds above the fold; pages opened from
	// far down a list open at their top; dates and operations do not wrap.
	b.Do(chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	b.Do(chromedp.Navigate(ui + "#/"))
	b.WaitFor("the overview", `!!document.querySelector('.card-alert .unknown-list li')`, uiWait)
	assert.Equal(t, "true", b.Eval(`String(document.querySelector('.card-alert').getBoundingClientRect().top < window.innerHeight)`),
		"the unknown holds are above the fold")
	assert.Equal(t, "false", b.Eval(`String(document.documentElement.scrollWidth > window.innerWidth)`), "nothing wider than the screen")
	b.Screenshot(shots, "overview-390")
	b.Do(chromedp.Navigate(ui + "#/keys"))
	b.WaitFor("the key list", `document.querySelectorAll('table.data tbody tr').length >= 3`, uiWait)
	b.Eval(`window.scrollTo(0, document.body.scrollHeight); String(window.scrollY)`)
	require.NotEqual(t, "0", b.Eval(`String(window.scrollY)`), "the list is longer than the screen")
	b.Do(chromedp.Click(chromedp.CSS(`a.key-name[href="#/keys/` + agentID + `"]`)))
	b.WaitFor("the key's page", `document.querySelector('main h1')?.textContent.startsWith('agent_run_7')`, uiWait)
	assert.Equal(t, "0", b.Eval(`String(window.scrollY)`), "the key's page opens at its top, navigation included")
	b.WaitFor("the ledger", `!!document.querySelector('.ledger-region tbody tr')`, uiWait)
	assert.Equal(t, "nowrap", b.Eval(`getComputedStyle(document.querySelector('.ledger-region time')).whiteSpace`))
	assert.Equal(t, "true", b.Eval(`(() => {
		const op = document.querySelector('.ledger-region code.op');
		return String(op.getClientRects().length === 1 && op.getBoundingClientRect().height < 2 * parseFloat(getComputedStyle(op).lineHeight || '20'));
	})()`), "an operation's name is on one line")
	b.Screenshot(shots, "key-390")
	b.Eval(`window.scrollTo(0, document.body.scrollHeight); 'ok'`)
	b.Eval(`location.hash = '#/mint'; 'ok'`)
	b.WaitFor("the mint form", `!!document.querySelector('form.mint-form')`, uiWait)
	assert.Equal(t, "0", b.Eval(`String(window.scrollY)`), "the mint page opens at its top")
	b.Screenshot(shots, "mint-390")
	assert.Equal(t, "false", b.Eval(`String(document.documentElement.scrollWidth > window.innerWidth)`), "nothing wider than the screen")
	b.Do(chromedp.EmulateViewport(1280, 800))

	b.AssertNoConsoleErrors(m.AdminURL() + "/api/v1/")
}

// copyToDocs copies a screenshot into docs/ (with -update-docs).
func copyToDocs(tb testing.TB, shot, name string) {
	tb.Helper()
	data, err := os.ReadFile(shot)
	require.NoError(tb, err)
	require.NoError(tb, os.WriteFile(filepath.Join("..", "..", "docs", name), data, 0o644))
}
