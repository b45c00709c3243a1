package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
)

// TestMCPApprovalRequired: a money tool takes reason; a call that needs
// approval is isError with the approval's id and what to do; get_budget lists
// the pending approval; approved, the same call with the same idempotency_key
// goes through once.
func TestMCPApprovalRequired(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	key, token := env.MustKey("agent-approvals", `{"vendor":"stripe","currency":"usd","daily_cap":"1000.00",
		"expires_at":"2026-12-31T00:00:00Z","operations":["payment_intents.create","refunds.create","*.read"],
		"approval":{"above":"100.00"}}`, nil)
	rpc := mcpCaller(t, env, token)
	schemas := map[string]map[string]any{}
	for _, tl := range rpc("tools/list", map[string]any{})["tools"].([]any) {
		m := tl.(map[string]any)
		schemas[m["name"].(string)] = m["inputSchema"].(map[string]any)["properties"].(map[string]any)
	}
	assert.Contains(t, schemas["create_payment_intent"], "reason")
	assert.Contains(t, schemas["create_refund"], "approval_reason", "Stripe's own reason keeps its name")
	assert.NotContains(t, schemas["list_customers"], "reason")

	call := map[string]any{"name": "create_payment_intent", "arguments": map[string]any{
		"amount": 15000, "currency": "usd", "idempotency_key": "mcp-big", "reason": "the quarterly invoice of cus_7"}}
	res := rpc("tools/call", call)
	require.Equal(t, true, res["isError"], "%v", res)
	sc := res["structuredContent"].(map[string]any)
	assert.Equal(t, "approval_required", sc["code"])
	id, _ := sc["approval_id"].(string)
	require.True(t, strings.HasPrefix(id, "apr_"), "%v", sc)
	text := res["content"].([]any)[0].(map[string]any)["text"].(string)
	assert.Contains(t, text, id)
	assert.Contains(t, text, "same idempotency_key")
	assert.Equal(t, 0, env.fake.Count())

	budget := rpc("tools/call", map[string]any{"name": "get_budget", "arguments": map[string]any{}})
	assert.Contains(t, budget["content"].([]any)[0].(map[string]any)["text"], "Pending approval "+id)
	pending := budget["structuredContent"].(map[string]any)["pending_approvals"].([]any)
	require.Len(t, pending, 1)
	assert.Equal(t, "the quarterly invoice of cus_7", pending[0].(map[string]any)["reason"])

	a, err := env.store.GetApproval(context.Background(), id)
	require.NoError(t, err)
	assert.Equal(t, key.ID, a.KeyID)
	assert.Equal(t, "the quarterly invoice of cus_7", a.Reason)
	_, err = env.store.DecideApproval(context.Background(), "alice", id, true, "")
	require.NoError(t, err)
	res = rpc("tools/call", call)
	assert.Nil(t, res["isError"], "%v", res)
	assert.Equal(t, "payment_intent", res["structuredContent"].(map[string]any)["object"])
	res = rpc("tools/call", call)
	assert.Nil(t, res["isError"])
	assert.Equal(t, 1, env.fake.Count(), "forwarded once")
	used, err := env.store.GetApproval(context.Background(), id)
	require.NoError(t, err)
	assert.Equal(t, vault.ApprovalUsed, used.State)
}
