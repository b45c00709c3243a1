package main

import (
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWebhooksDashboardInABrowser: the webhooks page lists an endpoint with
// its recent deliveries (a threshold crossing delivered to a receiver that
// verifies it), sends a test event, and retries a delivery, which reaches
// the receiver again with the same webhook-id.
func TestWebhooksDashboardInABrowser(t *testing.T) {
	t.Parallel()
	d := MustDashboard(t, "sk_test_webhooks_ui", "--webhook-allow-private")
	b := d.b
	rcv := newReceiver(t)
	hookID := mustCreateWebhook(t, d.m.AdminURL()+"/api/v1", d.admin, rcv, []string{"budget.threshold_crossed"}, []int{80})
	_, vaultKey := d.MustMint("hooks_ui", "billing", map[string]any{"currency": "usd", "daily_cap": "10.00"})
	require.NoError(t, d.charger(vaultKey, "usd")(900))
	waitFor(t, uiWait, "the crossing delivered", func() bool { return len(rcv.got("budget.threshold_crossed")) == 1 })

	b.Do(chromedp.Navigate(d.signInLink))
	b.WaitFor("the overview", `!!document.querySelector('.main-nav a[data-nav="webhooks"]')`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`.main-nav a[data-nav="webhooks"]`)))
	b.WaitFor("the endpoint", `!!document.querySelector('section[data-webhook="`+hookID+`"] table')`, uiWait)
	page := b.Text("main")
	assert.Contains(t, page, rcv.URL+"/hooks")
	assert.Contains(t, page, "budget.threshold_crossed")
	assert.Contains(t, page, "delivered")
	b.Screenshot(d.shots, "webhooks")

	b.Do(chromedp.Click(chromedp.CSS(`section[data-webhook="` + hookID + `"] .actions button`)))
	waitFor(t, uiWait, "the test event received", func() bool { return len(rcv.got("webhook.test")) == 1 })
	b.WaitFor("the test delivery listed as delivered",
		`[...document.querySelectorAll('tbody tr')].some((tr) => tr.textContent.includes('webhook.test') && tr.textContent.includes('delivered'))`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`tbody tr:first-child button[data-retry]`)))
	waitFor(t, uiWait, "the retried delivery received", func() bool { return len(rcv.got("webhook.test")) == 2 })
	got := rcv.got("webhook.test")
	assert.Equal(t, got[0].ID, got[1].ID, "a retry keeps the webhook-id")
	assert.Contains(t, b.Text(".notice-region"), "sent again")
	assert.Zero(t, rcv.rejected.Load())
	b.AssertNoConsoleErrors("")
}
