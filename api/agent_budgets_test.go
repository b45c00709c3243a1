package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
)

// TestAgentSeesItsBudgetChain: /keybrake/v1/me lists the budgets a key
// draws on, closest first, with what is left; an MCP payment over the team's
// budget is refused naming the team.
func TestAgentSeesItsBudgetChain(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	ctx := context.Background()
	start := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	orgCap, teamCap := decimal.RequireFromString("50.00"), decimal.RequireFromString("20.00")
	org, err := env.store.CreateBudget(ctx, "test", vault.BudgetSpec{Name: "org", Currency: "usd", PeriodCap: &orgCap, PeriodStart: start})
	require.NoError(t, err)
	team, err := env.store.CreateBudget(ctx, "test", vault.BudgetSpec{Name: "team", Parent: org.ID, Currency: "usd", DailyCap: &teamCap, PeriodStart: start})
	require.NoError(t, err)
	_, token := env.MustKey("agent", `{"vendor":"stripe","currency":"usd","daily_cap":"100.00","budget":"`+team.ID+`",
		"expires_at":"2026-12-31T00:00:00Z","operations":["payment_intents.create","*.read"]}`, nil)

	r := env.Do(http.MethodGet, "/keybrake/v1/me", token, nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var me struct {
		Budgets []struct {
			Scope  map[string]string            `json:"scope"`
			Daily  *struct{ Remaining *string } `json:"daily"`
			Period *struct{ Remaining *string } `json:"period"`
		} `json:"budgets"`
	}
	r.Decode(t, &me)
	require.Len(t, me.Budgets, 2)
	assert.Equal(t, map[string]string{"kind": "budget", "id": team.ID, "name": "team"}, me.Budgets[0].Scope)
	assert.Equal(t, "20.00", *me.Budgets[0].Daily.Remaining)
	assert.Equal(t, org.ID, me.Budgets[1].Scope["id"])
	assert.Equal(t, "50.00", *me.Budgets[1].Period.Remaining)

	hdr := http.Header{
		"Authorization":        {"Bearer " + token},
		"Accept":               {"application/json, text/event-stream"},
		"Mcp-Protocol-Version": {"2025-06-18"},
	}
	call, err := env.Try(http.MethodPost, "/mcp", hdr, map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "create_payment_intent",
			"arguments": map[string]any{"amount": 2500, "currency": "usd", "idempotency_key": "over-team"}}})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, call.Status, "%s", call.Body)
	var out struct {
		Result struct {
			IsError           bool           `json:"isError"`
			StructuredContent map[string]any `json:"structuredContent"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal(call.Body, &out), "%s", call.Body)
	assert.True(t, out.Result.IsError)
	assert.Equal(t, "spend_cap_exceeded", out.Result.StructuredContent["code"])
	assert.Equal(t, map[string]any{"kind": "budget", "id": team.ID, "name": "team"}, out.Result.StructuredContent["scope"])
}
