package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// The MCP endpoint end to end: the MCP Go SDK's client over Streamable HTTP against
// the real program (`keybrake serve` on 127.0.0.1:0) in front of the fake Stripe.

// bearerTransport sends every request with the vault key as the bearer token, as
// an MCP client configured with a header does.
type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// MustMCP connects an MCP client to keybrake's /mcp with token and closes it in
// tb.Cleanup.
func MustMCP(tb testing.TB, proxyURL, token string) *mcp.ClientSession {
	tb.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "keybrake-e2e", Version: "1"}, nil)
	s, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint:   proxyURL + "/mcp",
		HTTPClient: &http.Client{Transport: bearerTransport{token}, Timeout: 30 * time.Second},
		MaxRetries: -1,
	}, nil)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// mcpServer is a running keybrake with a fake Stripe and an admin token.
type mcpServer struct {
	testMain
	fake  *proxytest.FakeStripe
	admin string
}

func MustMCPServer(tb testing.TB) mcpServer {
	tb.Helper()
	fake := proxytest.NewFakeStripe(tb, "sk_test_mcp")
	dataDir := tb.TempDir()
	m := MustServe(tb, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	admin := strings.TrimSpace(MustRunCommand(tb, env{}, "token", "--data-dir", dataDir, "--sub", "mcp-e2e"))
	return mcpServer{testMain: m, fake: fake, admin: admin}
}

// MustMint mints a usd key through the admin API with the policy fields given
// (vendor, currency and expiry are added) and returns its id and token.
func (s mcpServer) MustMint(tb testing.TB, name string, pol map[string]any) (id, token string) {
	tb.Helper()
	pol["vendor"], pol["currency"] = "stripe", "usd"
	pol["expires_at"] = time.Now().Add(72 * time.Hour).UTC().Format(time.RFC3339)
	var minted struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	require.Equal(tb, http.StatusCreated, adminDo(tb, http.MethodPost, s.AdminURL()+"/api/v1/keys", s.admin,
		map[string]any{"name": name, "policy": pol}, &minted))
	return minted.ID, minted.Token
}

// MustCall calls a tool; a protocol error fails the test (a refusal is a result).
func MustCall(tb testing.TB, s *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	tb.Helper()
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	require.NoError(tb, err, tool)
	return res
}

// structured decodes a result's structured content.
func structured(tb testing.TB, res *mcp.CallToolResult) map[string]any {
	tb.Helper()
	raw, err := json.Marshal(res.StructuredContent)
	require.NoError(tb, err)
	var m map[string]any
	require.NoError(tb, json.Unmarshal(raw, &m), "structured content %s", raw)
	return m
}

// text joins a result's text content.
func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// toolsByName lists the tools the session sees.
func toolsByName(tb testing.TB, s *mcp.ClientSession) map[string]*mcp.Tool {
	tb.Helper()
	res, err := s.ListTools(context.Background(), nil)
	require.NoError(tb, err)
	out := map[string]*mcp.Tool{}
	for _, t := range res.Tools {
		out[t.Name] = t
	}
	return out
}

// required is the list of required arguments of a listed tool.
func required(tool *mcp.Tool) []string {
	schema, _ := tool.InputSchema.(map[string]any)
	var out []string
	list, _ := schema["required"].([]any)
	for _, v := range list {
		out = append(out, v.(string))
	}
	return out
}

func TestMCPToolsFollowThePolicy(t *testing.T) {
	t.Parallel()
	s := MustMCPServer(t)
	_, links := s.MustMint(t, "links", map[string]any{"daily_cap": "50.00",
		"operations": []string{"products.create", "prices.create", "payment_links.create", "*.read"}})
	_, payments := s.MustMint(t, "payments", map[string]any{"daily_cap": "50.00",
		"operations": []string{"payment_intents.create", "refunds.create"}})
	_, derived := s.MustMint(t, "derived", map[string]any{"daily_cap": "50.00",
		"operations":  []string{"payment_intents.create"},
		"idempotency": map[string]any{"mode": "derive", "fields": []string{"customer", "metadata[order]"}}})

	l := toolsByName(t, MustMCP(t, s.ProxyURL(), links))
	p := toolsByName(t, MustMCP(t, s.ProxyURL(), payments))
	d := toolsByName(t, MustMCP(t, s.ProxyURL(), derived))

	names := func(m map[string]*mcp.Tool) []string {
		var out []string
		for n := range m {
			out = append(out, n)
		}
		slices.Sort(out)
		return out
	}
	// Stripe's generic tools are listed to every key; what they reach is the policy's.
	generic := []string{"list_available_accounts_or_orgs", "stripe_api_details", "stripe_api_read", "stripe_api_search", "stripe_api_write"}
	withGeneric := func(tools ...string) []string { return slices.Sorted(slices.Values(append(tools, generic...))) }
	assert.Equal(t, withGeneric("create_payment_link", "create_price", "create_product", "get_budget", "list_coupons",
		"list_customers", "list_disputes", "list_invoices", "list_payment_intents", "list_prices", "list_products",
		"list_subscriptions", "request_budget_raise", "retrieve_balance", "stripe_request"), names(l))
	assert.Equal(t, withGeneric("create_payment_intent", "create_refund", "get_budget", "request_budget_raise", "stripe_request"), names(p))
	assert.Equal(t, withGeneric("create_payment_intent", "get_budget", "request_budget_raise", "stripe_request"), names(d))
	assert.True(t, p["stripe_api_read"].Annotations.ReadOnlyHint)
	assert.True(t, *p["stripe_api_write"].Annotations.DestructiveHint)
	assert.Equal(t, []string{"stripe_api_operation_id"}, required(p["stripe_api_write"]))

	// Reads are read-only; money-moving tools are destructive and idempotent
	// under their key, which keybrake derives when the agent gives none.
	read := l["list_customers"].Annotations
	require.NotNil(t, read)
	assert.True(t, read.ReadOnlyHint)
	assert.True(t, l["get_budget"].Annotations.ReadOnlyHint)
	for _, tool := range []*mcp.Tool{p["create_payment_intent"], p["create_refund"], d["create_payment_intent"]} {
		require.NotNil(t, tool.Annotations, tool.Name)
		assert.False(t, tool.Annotations.ReadOnlyHint, tool.Name)
		require.NotNil(t, tool.Annotations.DestructiveHint, tool.Name)
		assert.True(t, *tool.Annotations.DestructiveHint, tool.Name)
		assert.Contains(t, tool.Description, "Moves money", tool.Name)
	}
	assert.ElementsMatch(t, []string{"amount", "currency"}, required(p["create_payment_intent"]))
	assert.Contains(t, p["create_payment_intent"].InputSchema.(map[string]any)["properties"].(map[string]any)["idempotency_key"].(map[string]any)["description"],
		"keybrake derives one")
	assert.NotContains(t, required(p["create_refund"]), "idempotency_key")
	assert.NotContains(t, required(d["create_payment_intent"]), "idempotency_key", "a derive-mode key needs none")
	assert.ElementsMatch(t, []string{"amount", "currency"}, required(d["create_payment_intent"]))
	link := l["create_payment_link"]
	require.NotNil(t, link.Annotations.DestructiveHint)
	assert.True(t, *link.Annotations.DestructiveHint, "a payment link is metered when it is created")
	assert.ElementsMatch(t, []string{"price", "quantity"}, required(link))

	// A policy change shows at the next list, without reconnecting.
	keys := struct {
		Keys []struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"keys"`
	}{}
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, s.AdminURL()+"/api/v1/keys?q=payments", s.admin, nil, &keys))
	require.Len(t, keys.Keys, 1)
	patch := map[string]any{"policy": map[string]any{"operations": []string{"payment_intents.create", "*.read"}}}
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodPatch, s.AdminURL()+"/api/v1/keys/"+keys.Keys[0].ID, s.admin, patch, nil))
	p2 := toolsByName(t, MustMCP(t, s.ProxyURL(), payments))
	assert.Contains(t, p2, "list_customers")
	assert.NotContains(t, p2, "create_refund")
}

func TestMCPPaymentsUnderTheCap(t *testing.T) {
	t.Parallel()
	s := MustMCPServer(t)
	keyID, token := s.MustMint(t, "agent", map[string]any{"daily_cap": "80.00",
		"operations": []string{"products.create", "prices.create", "payment_links.create", "payment_intents.create", "*.read"}})
	c := MustMCP(t, s.ProxyURL(), token)

	// A payment link: product, price, link. The link is payable once, and what
	// that payment moves (2 × 15.00) is committed when the link is created.
	res := MustCall(t, c, "create_product", map[string]any{"name": "Consulting hour"})
	require.False(t, res.IsError, text(res))
	product := structured(t, res)["id"].(string)
	res = MustCall(t, c, "create_price", map[string]any{"product": product, "unit_amount": 1500, "currency": "usd"})
	require.False(t, res.IsError, text(res))
	price := structured(t, res)["id"].(string)
	res = MustCall(t, c, "create_payment_link", map[string]any{"price": price, "quantity": 2,
		"redirect_url": "https://example.com/thanks", "idempotency_key": "link-1"})
	require.False(t, res.IsError, text(res))
	link := structured(t, res)
	assert.Equal(t, "payment_link", link["object"])
	assert.Contains(t, link["url"], "https://buy.stripe.com/")
	require.Len(t, s.fake.PaymentLinks(), 1)
	assert.Equal(t, int64(2), s.fake.PaymentLinks()[0].Quantity)

	// A PaymentIntent of 25.00 under the daily cap of 50.00.
	pay := map[string]any{"amount": 2500, "currency": "usd", "customer": "cus_42", "idempotency_key": "order-42"}
	res = MustCall(t, c, "create_payment_intent", pay)
	require.False(t, res.IsError, text(res))
	pi := structured(t, res)
	assert.Equal(t, "payment_intent", pi["object"])
	assert.Equal(t, float64(2500), pi["amount"])
	assert.Contains(t, text(res), "25.00 left in the daily window")
	posts := func() int {
		return s.fake.CountWhere(func(r proxytest.Request) bool {
			return r.Method == http.MethodPost && r.Path == "/v1/payment_intents"
		})
	}
	require.Equal(t, 1, posts())

	// The same idempotency key again: the stored answer, executed once.
	res = MustCall(t, c, "create_payment_intent", pay)
	require.False(t, res.IsError, text(res))
	assert.Equal(t, pi["id"], structured(t, res)["id"])
	assert.Contains(t, text(res), "stored answer of the first call")
	assert.Equal(t, 1, posts(), "a retry with the same key is not executed again")

	// 30.00 more would pass the cap: refused with the figures, nothing reaches Stripe.
	before := s.fake.Count()
	res = MustCall(t, c, "create_payment_intent", map[string]any{"amount": 3000, "currency": "usd", "idempotency_key": "order-43"})
	require.True(t, res.IsError)
	refusal := structured(t, res)
	assert.Equal(t, "spend_cap_exceeded", refusal["code"])
	assert.Equal(t, "keybrake", refusal["source"])
	assert.Equal(t, float64(402), refusal["status"])
	assert.Equal(t, "daily", refusal["cap"])
	assert.Equal(t, "usd", refusal["currency"])
	assertMoney(t, "80", refusal["limit"].(string))
	assertMoney(t, "30", refusal["committed"].(string))
	assertMoney(t, "25", refusal["held"].(string))
	assertMoney(t, "30", refusal["requested"].(string))
	assertMoney(t, "25", refusal["remaining"].(string))
	resetAt, err := time.Parse(time.RFC3339, refusal["reset_at"].(string))
	require.NoError(t, err)
	assert.True(t, resetAt.After(time.Now()), "reset_at %s is ahead", resetAt)
	assert.Contains(t, text(res), "daily cap of 80.00 usd would be exceeded: 30.00 committed, 25.00 held, 30.00 requested, 25.00 remaining; resets at")
	assert.Contains(t, text(res), "Do not retry before the window resets")
	assert.Equal(t, before, s.fake.Count(), "the refused call never reached Stripe")

	// Arguments that do not fit are refused with what to fix.
	res = MustCall(t, c, "create_payment_intent", map[string]any{"amount": 10.5, "currency": "usd", "idempotency_key": "x"})
	require.True(t, res.IsError)
	assert.Equal(t, "invalid_arguments", structured(t, res)["code"])
	assert.Contains(t, text(res), `"amount" must be an integer`)
	assert.Equal(t, before, s.fake.Count())

	// A read through the general tool, and the budget as GET /keybrake/v1/me says it.
	res = MustCall(t, c, "stripe_request", map[string]any{"method": "GET", "path": "/v1/payment_intents",
		"params": map[string]any{"customer": "cus_42"}})
	require.False(t, res.IsError, text(res))
	list := structured(t, res)["data"].([]any)
	require.Len(t, list, 1)
	assert.Equal(t, pi["id"], list[0].(map[string]any)["id"])

	res = MustCall(t, c, "get_budget", nil)
	require.False(t, res.IsError, text(res))
	budget := structured(t, res)
	status, me := MustGet(t, s.ProxyURL()+"/keybrake/v1/me", token)
	require.Equal(t, http.StatusOK, status)
	var meView map[string]any
	require.NoError(t, json.Unmarshal(me, &meView))
	assert.Equal(t, meView["windows"], budget["windows"])
	daily := budget["windows"].(map[string]any)["daily"].(map[string]any)
	assertMoney(t, "25", daily["remaining"].(string))
	assert.Contains(t, text(res), "daily: 25.00 of 80.00 usd left (30.00 committed, 25.00 held for requests in flight, unknown outcomes and money objects that can still move money)")

	// The ledger says which calls came through MCP.
	var events struct {
		Events []struct {
			Decision string `json:"decision"`
			Reason   string `json:"reason"`
			Tool     string `json:"tool"`
		} `json:"events"`
	}
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, s.AdminURL()+"/api/v1/keys/"+keyID+"/events", s.admin, nil, &events))
	var got []string
	for _, e := range events.Events {
		got = append(got, fmt.Sprintf("%s/%s/%s", e.Decision, e.Reason, e.Tool))
	}
	assert.Equal(t, []string{
		"refused/spend_cap_exceeded/create_payment_intent",
		"settled/commit/create_payment_intent",
		"allowed//create_payment_intent",
		"settled/commit/create_payment_link",
		"allowed//create_payment_link",
	}, got)
}

func TestMCPConcurrentCallsStopAtTheCap(t *testing.T) {
	t.Parallel()
	s := MustMCPServer(t)
	_, token := s.MustMint(t, "five-dollars", map[string]any{"daily_cap": "5.00",
		"operations": []string{"payment_intents.create"}})
	c := MustMCP(t, s.ProxyURL(), token)

	const calls = 20
	results := make([]*mcp.CallToolResult, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			results[i] = MustCall(t, c, "create_payment_intent", map[string]any{
				"amount": 100, "currency": "usd", "idempotency_key": fmt.Sprintf("dollar-%02d", i)})
		})
	}
	wg.Wait()
	ok, refused := 0, 0
	for _, res := range results {
		if !res.IsError {
			ok++
			continue
		}
		assert.Equal(t, "spend_cap_exceeded", structured(t, res)["code"], text(res))
		refused++
	}
	assert.Equal(t, 5, ok)
	assert.Equal(t, 15, refused)
	assert.Equal(t, int64(500), s.fake.TotalMoved("usd"), "Stripe moved exactly the cap")
	assert.Equal(t, 5, s.fake.Count(), "only the calls under the cap reached Stripe")
}

func TestMCPAuthentication(t *testing.T) {
	t.Parallel()
	s := MustMCPServer(t)
	keyID, token := s.MustMint(t, "revoked-soon", map[string]any{"daily_cap": "5.00"})
	c := MustMCP(t, s.ProxyURL(), token)
	res := MustCall(t, c, "get_budget", nil)
	require.False(t, res.IsError, text(res))

	require.Equal(t, http.StatusOK, adminDo(t, http.MethodPost, s.AdminURL()+"/api/v1/keys/"+keyID+"/revoke", s.admin, nil, nil))
	_, err := c.CallTool(context.Background(), &mcp.CallToolParams{Name: "get_budget"})
	require.Error(t, err, "a revoked key's next call fails")
	assert.Contains(t, err.Error(), "Unauthorized")

	// What any MCP client sees: the transport's 401 with a Bearer challenge and the reason.
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",` +
		`"capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`
	for name, tc := range map[string]struct {
		auth, challenge, body string
	}{
		"none":    {"", `Bearer realm="keybrake"`, "missing Authorization header"},
		"unknown": {"Bearer vk_" + strings.Repeat("A", 43), `error="invalid_token"`, "invalid vault key"},
		"cut":     {"Bearer vk_unknown", `error="invalid_token"`, "it was cut short"},
		"revoked": {"Bearer " + token, `error_description="this vault key has been revoked"`, "this vault key has been revoked"},
	} {
		req, err := http.NewRequest(http.MethodPost, s.ProxyURL()+"/mcp", strings.NewReader(initialize))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, name)
		assert.Contains(t, resp.Header.Get("WWW-Authenticate"), tc.challenge, name)
		assert.Contains(t, string(body), tc.body, name)
	}
}

func TestMCPDeriveModeNeedsNoKey(t *testing.T) {
	t.Parallel()
	s := MustMCPServer(t)
	_, token := s.MustMint(t, "derived", map[string]any{"daily_cap": "50.00",
		"operations":  []string{"payment_intents.create"},
		"idempotency": map[string]any{"mode": "derive", "fields": []string{"customer", "metadata[order]"}}})
	c := MustMCP(t, s.ProxyURL(), token)

	pay := map[string]any{"amount": 900, "currency": "usd", "customer": "cus_7", "metadata": map[string]any{"order": "7"}}
	first := MustCall(t, c, "create_payment_intent", pay)
	require.False(t, first.IsError, text(first))
	// An agent that invents a new key per retry still pays once.
	pay["idempotency_key"] = "fresh-uuid-1"
	again := MustCall(t, c, "create_payment_intent", pay)
	require.False(t, again.IsError, text(again))
	assert.Equal(t, structured(t, first)["id"], structured(t, again)["id"])
	assert.Equal(t, int64(900), s.fake.TotalMoved("usd"))

	pay["amount"] = 1900
	other := MustCall(t, c, "create_payment_intent", pay)
	require.True(t, other.IsError)
	assert.Equal(t, "idempotency_key_reused", structured(t, other)["code"])

	missing := MustCall(t, c, "create_payment_intent", map[string]any{"amount": 100, "currency": "usd", "customer": "cus_7"})
	require.True(t, missing.IsError)
	assert.Equal(t, "metadata[order]", structured(t, missing)["field"])
	assert.Equal(t, int64(900), s.fake.TotalMoved("usd"))
}
