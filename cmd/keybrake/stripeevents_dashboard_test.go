package main

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUpstreamWebhookSecretsInABrowser: the upstreams page sets an upstream's
// webhook signing secrets (two while rotating), shows only their last four,
// puts the API's field error on its field, and the events endpoint then
// accepts a delivery signed with the secret.
func TestUpstreamWebhookSecretsInABrowser(t *testing.T) {
	t.Parallel()
	d := MustDashboard(t, "sk_test_whsec_ui")
	b := d.b
	const current, previous = "whsec_uitestcurrentC0DE", "whsec_uitestpreviousF00D"

	b.Do(chromedp.Navigate(d.signInLink))
	b.WaitFor("the overview", `!!document.querySelector('.main-nav a[data-nav="upstreams"]')`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`.main-nav a[data-nav="upstreams"]`)))
	b.WaitFor("the upstreams", `!!document.querySelector('table.data tbody tr') && !!document.querySelector('form.webhook-secrets-form')`, uiWait)
	assert.Contains(t, b.Text("table.data"), "none: Stripe's events are refused")

	// Not a signing secret: the API's error lands on its field.
	b.Do(
		chromedp.SendKeys(chromedp.CSS(`input[name="webhook_upstream"]`), upstreamDefault),
		chromedp.SendKeys(chromedp.CSS(`input[name="webhook_secret"]`), "sk_test_not_a_whsec"),
		chromedp.Click(chromedp.CSS(`form.webhook-secrets-form button[type="submit"]`)),
	)
	b.WaitFor("the field error", `!!document.querySelector('form.webhook-secrets-form [data-field="webhook_secrets[0]"] .field-error')`, uiWait)

	b.Eval(`document.querySelector('input[name="webhook_secret"]').value = ''; 'ok'`)
	b.Do(
		chromedp.SendKeys(chromedp.CSS(`input[name="webhook_secret"]`), current),
		chromedp.SendKeys(chromedp.CSS(`input[name="webhook_secret_previous"]`), previous),
		chromedp.Click(chromedp.CSS(`form.webhook-secrets-form button[type="submit"]`)),
	)
	b.WaitFor("saved", `document.querySelector('.notice-region').textContent.includes('either secret')`, uiWait)
	b.WaitFor("the last four listed", `document.querySelector('table.data').textContent.includes('••••C0DE')`, uiWait)
	page := b.Text("main")
	assert.Contains(t, page, "••••F00D")
	assert.NotContains(t, page, "uitestcurrent", "a webhook secret never comes back")
	b.Screenshot(d.shots, "upstreams-webhook-secrets")

	secrets, err := d.m.Store().UpstreamWebhookSecrets(context.Background(), upstreamDefault)
	require.NoError(t, err)
	assert.Equal(t, []string{current, previous}, secrets)
	ev := d.fake.EventOf("payment_intent.succeeded", map[string]any{"id": "pi_ui", "object": "payment_intent",
		"amount": 100, "amount_received": 100, "currency": "usd", "status": "succeeded"})
	status, body, err := d.fake.Deliver(strings.TrimSuffix(d.m.ProxyURL(), "/")+"/keybrake/v1/stripe/events/"+upstreamDefault, previous, ev)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status, "%s", body)
	b.AssertNoConsoleErrors(d.m.AdminURL() + "/api/v1/")
}
