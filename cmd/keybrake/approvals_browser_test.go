package main

import (
	"context"
	"net/http"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"
)

// TestDashboardApprovalsInABrowser: two charges above the key's approval
// threshold wait in the inbox (amount, key, customer, reason, age); the
// navigation's badge counts them; an admin approves one with a note and
// declines the other; the approved one's retry then reaches Stripe once.
func TestDashboardApprovalsInABrowser(t *testing.T) {
	t.Parallel()
	d := MustDashboard(t, "sk_test_approvals")
	b, fake, ui, shots := d.b, d.fake, d.ui, d.shots
	_, vaultKey := d.MustMint("billing_agent", "finance", map[string]any{"currency": "usd", "daily_cap": "1000.00",
		"approval": map[string]any{"above": "100.00"}})
	sc := MustStripeClient(t, d.m.PublicURL(), vaultKey)
	charge := func(idem string, cents int64, reason string) error {
		p := &stripe.ChargeCreateParams{Amount: stripe.Int64(cents), Currency: stripe.String("usd"),
			Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")}}
		p.SetIdempotencyKey(idem)
		p.Headers = http.Header{"Keybrake-Approval-Reason": {reason}}
		_, err := sc.V1Charges.Create(context.Background(), p)
		return err
	}
	for _, c := range []struct {
		idem, reason string
		cents        int64
	}{{"inv-1", "renewal of the Acme contract", 15000}, {"inv-2", "one-off setup fee", 17000}} {
		err := charge(c.idem, c.cents, c.reason)
		var se *stripe.Error
		require.ErrorAs(t, err, &se)
		require.Equal(t, stripe.ErrorCode("approval_required"), se.Code)
	}
	require.Equal(t, 0, fake.Count())

	b.Do(chromedp.Navigate(d.signInLink))
	b.WaitFor("the badge", `document.querySelector('[data-count="approvals"]')?.textContent === '2'`, uiWait)
	b.Do(chromedp.Navigate(ui + "#/approvals"))
	b.WaitFor("the inbox", `document.querySelectorAll('button[data-action="approve"]').length === 2`, uiWait)
	inbox := b.Text("main table.data tbody")
	assert.Contains(t, inbox, "150.00")
	assert.Contains(t, inbox, "170.00")
	assert.Contains(t, inbox, "billing_agent")
	assert.Contains(t, inbox, "renewal of the Acme contract")
	b.Screenshot(shots, "approvals")

	// The newest first: inv-2 (170.00) is the first row.
	b.Do(chromedp.Click(chromedp.CSS(`button[data-focus-id^="decline:"]`)))
	b.WaitFor("the decline dialog", `!!document.querySelector('dialog[open] input[name="note"]')`, uiWait)
	assert.Contains(t, b.Text("dialog[open]"), "one-off setup fee")
	b.Do(chromedp.SetValue(chromedp.CSS(`dialog[open] input[name="note"]`), "not agreed"),
		chromedp.Click(chromedp.CSS(`dialog[open] .button.danger`)))
	b.WaitFor("one left", `document.querySelectorAll('button[data-action="approve"]').length === 1`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`button[data-action="approve"]`)))
	b.WaitFor("the approve dialog", `!!document.querySelector('dialog[open] input[name="note"]')`, uiWait)
	b.Do(chromedp.SetValue(chromedp.CSS(`dialog[open] input[name="note"]`), "checked the contract"),
		chromedp.Click(chromedp.CSS(`dialog[open] .button.primary`)))
	b.WaitFor("the inbox empty", `document.querySelector('main .empty')?.textContent.startsWith('No request waits')`, uiWait)
	b.WaitFor("the badge gone", `document.querySelector('[data-count="approvals"]')?.hidden === true`, uiWait)
	decided := b.Text("main")
	assert.Contains(t, decided, "checked the contract")
	assert.Contains(t, decided, "not agreed")

	require.NoError(t, charge("inv-1", 15000, "renewal of the Acme contract"), "approved: the retry goes through")
	err := charge("inv-2", 17000, "one-off setup fee")
	var se *stripe.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, stripe.ErrorCode("approval_declined"), se.Code)
	assert.Equal(t, 1, fake.Count())
	b.AssertNoConsoleErrors(d.m.AdminURL() + "/api/v1/")
}
