package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// TestAdminEventsNameTheMCPTool checks that the ledger the admin API serves (and
// the dashboard shows) names the MCP tool of a request, in the documented shape,
// and leaves it out for a request that did not come through MCP.
func TestAdminEventsNameTheMCPTool(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("agent", "", nil, seedLegacyPolicy)
	ctx := context.Background()

	_, err := env.store.Reserve(ctx, vault.ReserveRequest{
		KeyID: k.ID, IdempotencyKey: "mcp-1", Fingerprint: "fp-1", Metered: true, Tool: "create_payment_intent",
		Request: policy.Request{Operation: "payment_intents.create", Amount: 2500, Currency: "usd"},
	})
	require.NoError(t, err)
	require.NoError(t, env.store.Settle(ctx, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: "mcp-1",
		Outcome: vault.SettleCommit, Amount: 2500, UpstreamStatus: http.StatusOK, Tool: "create_payment_intent",
		Response: &vault.StoredResponse{Status: http.StatusOK, Header: http.Header{}, Body: []byte(`{"id":"pi_1"}`)}}))
	env.MustHold(k.ID, "direct-1", 100, vault.SettleCommit)

	r := env.Do(http.MethodGet, "/api/v1/keys/"+k.ID+"/events", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var page struct {
		Events []map[string]any `json:"events"`
	}
	r.Decode(t, &page)
	require.Len(t, page.Events, 4)
	var tools []any
	for _, e := range page.Events {
		tools = append(tools, e["tool"])
	}
	assert.Equal(t, []any{nil, nil, "create_payment_intent", "create_payment_intent"}, tools)
}

// TestMCPOverPlainHTTP speaks MCP as curl would — plain JSON-RPC POSTs of the
// 2025-06-18 protocol with the vault key as bearer — against the proxy listener,
// and checks the access and canonical log lines (and that neither holds the token:
// the env's cleanup checks every log line for it).
func TestMCPOverPlainHTTP(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	_, token := env.MustKey("agent", `{"vendor":"stripe","currency":"usd","daily_cap":"20.00",
		"expires_at":"2026-12-31T00:00:00Z","operations":["payment_intents.create","*.read"]}`, nil)
	rpc := mcpCaller(t, env, token)

	init := rpc("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "curl", "version": "8"}})
	assert.Equal(t, "keybrake", init["serverInfo"].(map[string]any)["name"])
	assert.Contains(t, init["instructions"], "spend_cap_exceeded")

	tools := rpc("tools/list", map[string]any{})["tools"].([]any)
	assert.Len(t, tools, 18, "the reads, create_payment_intent, stripe_request, the five generic tools, get_budget "+
		"and request_budget_raise")

	res := rpc("tools/call", map[string]any{"name": "create_payment_intent",
		"arguments": map[string]any{"amount": 1500, "currency": "usd", "idempotency_key": "curl-1"}})
	assert.Equal(t, nil, res["isError"])
	assert.Equal(t, "payment_intent", res["structuredContent"].(map[string]any)["object"])

	res = rpc("tools/call", map[string]any{"name": "create_payment_intent",
		"arguments": map[string]any{"amount": 1500, "currency": "usd", "idempotency_key": "curl-2"}})
	assert.Equal(t, true, res["isError"])
	assert.Equal(t, "spend_cap_exceeded", res["structuredContent"].(map[string]any)["code"])

	// An agent out of budget asks for more: the request is pending, nothing changes yet.
	res = rpc("tools/call", map[string]any{"name": "request_budget_raise", "arguments": map[string]any{
		"window": "daily", "amount": "10.00", "until": "2026-09-14T18:00:00Z", "reason": "one more order today"}})
	assert.Equal(t, nil, res["isError"], "%v", res)
	rr := res["structuredContent"].(map[string]any)
	assert.Equal(t, "pending", rr["state"])
	assert.Equal(t, "10.00", rr["amount"])
	got, err := env.store.GetRaiseRequest(context.Background(), rr["id"].(string))
	require.NoError(t, err)
	assert.Equal(t, "one more order today", got.Reason)
	res = rpc("tools/call", map[string]any{"name": "request_budget_raise", "arguments": map[string]any{
		"window": "daily", "amount": "10.00", "until": "2026-12-30T18:00:00Z", "reason": "too far"}})
	assert.Equal(t, true, res["isError"], "more than 31 days ahead")
	assert.Contains(t, fmt.Sprint(res["structuredContent"]), "31 days")

	// GET opens no stream: keybrake never speaks first.
	r, err := env.Try(http.MethodGet, "/mcp", http.Header{"Authorization": {"Bearer " + token}, "Accept": {"text/event-stream"}}, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusMethodNotAllowed, r.Status)

	var toolLines, accessLines int
	for _, line := range strings.Split(strings.TrimSpace(env.logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		switch m["msg"] {
		case "stripe request":
			assert.Equal(t, "create_payment_intent", m["tool"], line)
			toolLines++
		case "mcp request":
			assert.NotEmpty(t, m["key_id"], line)
			accessLines++
		}
		if m["msg"] == "stripe request" || m["msg"] == "mcp request" {
			assert.IsType(t, float64(0), m["duration_ms"], "one duration field, in milliseconds, on every line: %s", line)
			assert.NotContains(t, m, "duration", line)
		}
	}
	assert.Equal(t, 2, toolLines, "one canonical line per tool call that reached the proxy")
	assert.Equal(t, 7, accessLines)
}

// mcpCaller returns a function that makes one plain JSON-RPC call of the
// 2025-06-18 protocol to /mcp with token as bearer and returns its result.
func mcpCaller(t *testing.T, env *agentEnv, token string) func(method string, params any) map[string]any {
	hdr := http.Header{
		"Authorization":        {"Bearer " + token},
		"Accept":               {"application/json, text/event-stream"},
		"Mcp-Protocol-Version": {"2025-06-18"},
	}
	return func(method string, params any) map[string]any {
		t.Helper()
		r, err := env.Try(http.MethodPost, "/mcp", hdr, map[string]any{"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", method, r.Body)
		assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
		assert.Empty(t, r.Header.Get("Mcp-Session-Id"), "stateless: no session")
		var out map[string]any
		require.NoError(t, json.Unmarshal(r.Body, &out), "%s", r.Body)
		require.Nil(t, out["error"], "%s", r.Body)
		return out["result"].(map[string]any)
	}
}

// BenchmarkMCPToolCall measures a money-moving tool call end to end over HTTP:
// JSON-RPC decoding, the vault key's authentication, the tool's arguments, the
// in-process proxy request (one durable Reserve, the fake Stripe, one durable
// Settle) and the result, from 16 parallel clients. Compare with the proxy's
// BenchmarkMeteredCharge, the same charge sent as REST.
func BenchmarkMCPToolCall(b *testing.B) {
	env := MustAgentEnv(b)
	_, token := env.MustKey("bench", `{"vendor":"stripe","currency":"usd","daily_cap":"100000000.00",
		"expires_at":"2026-12-31T00:00:00Z","operations":["payment_intents.create"]}`, nil)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var n atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_payment_intent",`+
				`"arguments":{"amount":100,"currency":"usd","idempotency_key":"bench-%d"}}}`, n.Add(1))
			req, err := http.NewRequest(http.MethodPost, env.srv.URL+"/mcp", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			raw, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || bytes.Contains(raw, []byte(`"isError":true`)) {
				b.Fatalf("status %d: %s (%v)", resp.StatusCode, raw, err)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
