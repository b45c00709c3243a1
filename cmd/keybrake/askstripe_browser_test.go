package main

import (
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// TestAskStripeInABrowser: an unknown hold's "Ask Stripe" says what it will
// do, sends the request again, and says which happened — here Stripe had
// never executed it, so it executes it now and the hold is committed, once.
func TestAskStripeInABrowser(t *testing.T) {
	t.Parallel()
	d := MustDashboard(t, "sk_test_ask")
	b, fake := d.b, d.fake
	_, vaultKey := d.MustMint("ask_run", "agents", map[string]any{"currency": "usd", "daily_cap": "50.00"})
	charge := d.charger(vaultKey, "usd")
	fake.FailNext(proxytest.FailBefore500, 1)
	require.Error(t, charge(3000), "Stripe answered 500 before executing: the outcome is unknown")
	require.Empty(t, fake.Charges())

	b.Do(chromedp.Navigate(d.signInLink))
	b.WaitFor("the overview", `!!document.querySelector('a[href="#/holds"]')`, uiWait)
	b.Do(chromedp.Navigate(d.ui + "#/holds"))
	b.WaitFor("the unknown hold", `!!document.querySelector('button[data-action="ask-stripe"]')`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`button[data-action="ask-stripe"]`)))
	b.WaitFor("the confirmation", `!!document.querySelector('dialog[open]')`, uiWait)
	dialog := b.Text("dialog[open]")
	assert.Contains(t, dialog, "same Stripe Idempotency-Key")
	assert.Contains(t, dialog, "executes it now")
	assert.Empty(t, fake.Charges(), "nothing is sent before the confirmation")
	b.Do(chromedp.Click(chromedp.CSS(`dialog[open] .button.primary`)))
	b.WaitFor("the answer", `!!document.querySelector('[data-ask-result]')`, uiWait)
	assert.Equal(t, "executed", b.Eval(`document.querySelector('[data-ask-result]').dataset.askResult`))
	assert.Contains(t, b.Text(".notice-region"), "Stripe had not executed it: it executed it now.")
	assert.Contains(t, b.Text(".notice-region"), "is committed")
	b.WaitFor("no unknown hold left", `document.querySelector('main .empty')?.textContent.startsWith('No hold has an unknown outcome')`, uiWait)
	require.Len(t, fake.Charges(), 1, "executed once")
	assert.EqualValues(t, 3000, fake.Charges()[0].Amount)
	b.Screenshot(d.shots, "holds-ask-stripe")
}
