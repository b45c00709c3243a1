package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDashboardBudgetsAndRaisesInABrowser: a key under a full budget is
// refused, the refusal names the budget in the key's ledger; the key asks for
// a raise of its own cap, an admin approves it on the raise requests page, the
// key's page shows it and can end it; the budgets page shows the tree, the
// budget's bar and the key under it.
func TestDashboardBudgetsAndRaisesInABrowser(t *testing.T) {
	t.Parallel()
	d := MustDashboard(t, "sk_test_raises")
	b, m, ui, shots := d.b, d.m, d.ui, d.shots

	var org, team struct {
		ID string `json:"id"`
	}
	require.Equal(t, http.StatusCreated, adminDo(t, http.MethodPost, m.AdminURL()+"/api/v1/budgets", d.admin,
		map[string]any{"name": "acme", "currency": "usd", "daily_cap": "100.00"}, &org))
	require.Equal(t, http.StatusCreated, adminDo(t, http.MethodPost, m.AdminURL()+"/api/v1/budgets", d.admin,
		map[string]any{"name": "acme-agents", "parent": org.ID, "currency": "usd", "daily_cap": "20.00"}, &team))
	keyID, vaultKey := d.MustMint("agent_7", "agents", map[string]any{"currency": "usd", "daily_cap": "50.00", "budget": team.ID})
	charge := d.charger(vaultKey, "usd")
	require.NoError(t, charge(2000))
	require.Error(t, charge(100), "the team's budget is full")

	var rr struct {
		ID string `json:"id"`
	}
	require.Equal(t, http.StatusCreated, adminDo(t, http.MethodPost, m.PublicURL()+"/keybrake/v1/raise-requests", vaultKey,
		map[string]any{"window": "daily", "amount": "10.00", "until": time.Now().Add(6 * time.Hour).UTC().Format(time.RFC3339),
			"reason": "one more order today"}, &rr))

	b.Do(chromedp.Navigate(d.signInLink))
	b.WaitFor("the overview", `document.querySelector('main h1')?.textContent === 'Overview'`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`a[data-nav="raises"]`)))
	b.WaitFor("the pending request", `!!document.querySelector('button[data-action="approve"]')`, uiWait)
	pending := b.Text(".pending-region table")
	assert.Contains(t, pending, "agent_7")
	assert.Contains(t, pending, "10.00")
	assert.Contains(t, pending, "one more order today")
	b.Screenshot(shots, "raise-requests")
	b.Do(chromedp.Click(chromedp.CSS(`button[data-action="approve"]`)))
	b.WaitFor("the confirmation", `!!document.querySelector('dialog[open]')`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`dialog[open] .button.primary`)))
	b.WaitFor("nothing pending", `document.querySelector('.pending-region .empty')?.textContent === 'No raise request is pending.'`, uiWait)
	assert.Contains(t, b.Text(".notice-region"), "Approved")
	assert.Contains(t, b.Text(".decided-region"), "approved")

	// The key's page: the raised cap, the raise, the refusal naming the budget.
	b.Do(chromedp.Navigate(ui + "#/keys/" + keyID))
	b.WaitFor("the raise", `!!document.querySelector('.raises-region [data-raise]')`, uiWait)
	assert.Contains(t, b.Eval(`document.querySelector('.usage-region [data-window=daily]').textContent`), "20.00 of 60.00 USD")
	assert.Contains(t, b.Text(".raises-region"), "one more order today")
	assert.Contains(t, b.Text(".ledger-region"), "by budget "+team.ID)
	b.Screenshot(shots, "key-raised")
	b.Do(chromedp.Click(chromedp.CSS(`button[data-action="end-raise"]`)))
	b.WaitFor("the confirmation", `!!document.querySelector('dialog[open]')`, uiWait)
	b.Do(chromedp.Click(chromedp.CSS(`dialog[open] .button.danger`)))
	b.WaitFor("the raise ended", `!document.querySelector('.raises-region') && document.querySelector('.usage-region [data-window=daily]')?.textContent.includes('20.00 of 50.00 USD')`, uiWait)

	// The budgets page: the tree, the team's full bar, the key under it.
	b.Do(chromedp.Click(chromedp.CSS(`a[data-nav="budgets"]`)))
	b.WaitFor("the budgets", `!!document.querySelector('[data-budget="`+team.ID+`"]')`, uiWait)
	assert.Equal(t, "1", b.Eval(`document.querySelector('[data-budget="`+team.ID+`"]').dataset.depth`), "the team is under the organisation")
	teamText := b.Eval(`document.querySelector('[data-budget="` + team.ID + `"]').textContent`)
	assert.Contains(t, teamText, "acme-agents")
	assert.Contains(t, teamText, "20.00 of 20.00 USD")
	assert.Contains(t, teamText, "agent_7")
	assert.Contains(t, b.Eval(`document.querySelector('[data-budget="`+org.ID+`"] > .usage-grid').textContent`), "20.00 of 100.00 USD",
		"the organisation counts its team's money")
	b.Screenshot(shots, "budgets")
	b.AssertNoConsoleErrors(m.AdminURL() + "/api/v1/")
}
