package api

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

func mcpTool(tb testing.TB, name string) *toolSpec {
	tb.Helper()
	for _, t := range mcpTools {
		if t.name == name {
			return t
		}
	}
	tb.Fatalf("no tool %s", name)
	return nil
}

// TestMCPToolOperations holds the tools and the catalogue together: each tool's
// operation (what a policy names to allow it) and whether it moves money.
func TestMCPToolOperations(t *testing.T) {
	t.Parallel()
	want := map[string]struct {
		op    string
		money bool
	}{
		"create_customer":       {"customers.create", false},
		"list_customers":        {"customers.read", false},
		"create_product":        {"products.create", false},
		"list_products":         {"products.read", false},
		"create_price":          {"prices.create", false},
		"list_prices":           {"prices.read", false},
		"create_payment_link":   {"payment_links.create", true},
		"create_invoice":        {"invoices.create", false},
		"list_invoices":         {"invoices.read", false},
		"create_invoice_item":   {"invoiceitems.create", true},
		"finalize_invoice":      {"invoices.finalize", true},
		"retrieve_balance":      {"balance.read", false},
		"create_refund":         {"refunds.create", true},
		"create_payment_intent": {"payment_intents.create", true},
		"list_payment_intents":  {"payment_intents.read", false},
		"list_subscriptions":    {"subscriptions.read", false},
		"cancel_subscription":   {"subscriptions.delete", false},
		"update_subscription":   {"subscriptions.update", false},
		"list_coupons":          {"coupons.read", false},
		"create_coupon":         {"coupons.create", false},
		"list_disputes":         {"disputes.read", false},
		"update_dispute":        {"disputes.update", false},
		"stripe_request":        {"", false},
		"get_budget":            {"", false},
		"request_budget_raise":  {"", false},

		"stripe_api_read":                 {"", false},
		"stripe_api_write":                {"", false},
		"stripe_api_search":               {"", false},
		"stripe_api_details":              {"", false},
		"list_available_accounts_or_orgs": {"", false},
	}
	require.Len(t, mcpTools, len(want))
	for _, tool := range mcpTools {
		w, ok := want[tool.name]
		require.True(t, ok, tool.name)
		assert.Equal(t, w.op, tool.op, tool.name)
		assert.Equal(t, w.money, tool.money, tool.name)

		// Every listed form is a valid tool: an object schema whose required
		// arguments exist, and hints that say what the tool does.
		for _, def := range tool.defs {
			schema := def.InputSchema.(map[string]any)
			assert.Equal(t, "object", schema["type"], tool.name)
			props := schema["properties"].(map[string]any)
			req, _ := schema["required"].([]string)
			for _, r := range req {
				assert.Contains(t, props, r, tool.name)
			}
			require.NotNil(t, def.Annotations, tool.name)
			ann := def.Annotations
			switch {
			case tool.method == http.MethodGet || tool.name == toolGetBudget || tool.name == toolAPIRead || tool.describes():
				assert.True(t, ann.ReadOnlyHint, tool.name)
			case tool.money:
				assert.True(t, *ann.DestructiveHint, tool.name)
				assert.True(t, ann.IdempotentHint, tool.name)
			default:
				require.NotNil(t, ann.DestructiveHint, tool.name)
			}
		}
		if tool.money {
			// Without an idempotency_key keybrake derives one: no money tool requires it.
			assert.NotContains(t, tool.defs[0].InputSchema.(map[string]any)["required"], idempotencyArg, tool.name)
			assert.NotContains(t, tool.defs[1].InputSchema.(map[string]any)["required"], idempotencyArg, tool.name)
		}
	}
	assert.False(t, *mcpTool(t, "create_customer").defs[0].Annotations.DestructiveHint)
	assert.True(t, *mcpTool(t, "cancel_subscription").defs[0].Annotations.DestructiveHint)
	assert.True(t, *mcpTool(t, "stripe_request").defs[0].Annotations.DestructiveHint)
	assert.True(t, *mcpTool(t, "stripe_api_write").defs[0].Annotations.DestructiveHint)
	assert.True(t, mcpTool(t, "stripe_api_read").defs[0].Annotations.ReadOnlyHint)
}

func TestMCPToolsForAPolicy(t *testing.T) {
	t.Parallel()
	names := func(p policy.Policy) []string {
		var out []string
		for _, tool := range toolsFor(&vault.Key{Policy: p}) {
			out = append(out, tool.Name)
		}
		return out
	}
	// No operations named: every read and the money-in operations of the default
	// set, nothing that sends money out or creates other objects.
	def := names(policy.Policy{})
	assert.Contains(t, def, "create_payment_intent")
	assert.Contains(t, def, "create_invoice_item")
	assert.Contains(t, def, "list_customers")
	assert.NotContains(t, def, "create_refund")
	assert.NotContains(t, def, "create_customer")
	assert.NotContains(t, def, "cancel_subscription")

	only := names(policy.Policy{Operations: []string{"refunds.create"}})
	assert.Equal(t, []string{"create_refund", "stripe_request", "stripe_api_read", "stripe_api_write", "stripe_api_search",
		"stripe_api_details", "list_available_accounts_or_orgs", "get_budget", "request_budget_raise"}, only)

	// Report mode forwards what the policy would refuse: every tool is usable.
	report := names(policy.Policy{Operations: []string{"refunds.create"}, Mode: policy.ModeReport})
	assert.Len(t, report, len(mcpTools))

	derive := toolsFor(&vault.Key{Policy: policy.Policy{Operations: []string{"refunds.create"},
		Idempotency: policy.Idempotency{Mode: policy.IdempotencyDerive, Fields: []string{"payment_intent"}}}})
	assert.Same(t, mcpTool(t, "create_refund").defs[1], derive[0])
}

func TestMCPToolRequests(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		tool string
		args string
		want toolCall
	}{
		"payment link with redirect": {"create_payment_link",
			`{"price": "price_1", "quantity": 3, "redirect_url": "https://example.com/x?a=1", "idempotency_key": "pl-1"}`,
			toolCall{method: "POST", path: "/v1/payment_links", idempotencyKey: "pl-1", params: url.Values{
				"line_items[0][price]": {"price_1"}, "line_items[0][quantity]": {"3"},
				"after_completion[type]": {"redirect"}, "after_completion[redirect][url]": {"https://example.com/x?a=1"},
				"restrictions[completed_sessions][limit]": {"1"}}}},
		"payment intent keeps big integers exact": {"create_payment_intent",
			`{"amount": 999999999999, "currency": "usd", "metadata": {"order": "42", "b": "x"}, "confirm": false}`,
			toolCall{method: "POST", path: "/v1/payment_intents", params: url.Values{
				"amount": {"999999999999"}, "currency": {"usd"}, "metadata[order]": {"42"}, "metadata[b]": {"x"},
				"confirm": {"false"}}}},
		"invoice with its fixed collection method": {"create_invoice", `{"customer": "cus_1", "days_until_due": 30}`,
			toolCall{method: "POST", path: "/v1/invoices", params: url.Values{
				"customer": {"cus_1"}, "days_until_due": {"30"}, "collection_method": {"send_invoice"},
				"pending_invoice_items_behavior": {"exclude"}}}},
		"invoice item prices with pricing[price]": {"create_invoice_item",
			`{"customer": "cus_1", "price": "price_1", "invoice": "in_1", "idempotency_key": "ii"}`,
			toolCall{method: "POST", path: "/v1/invoiceitems", idempotencyKey: "ii", params: url.Values{
				"customer": {"cus_1"}, "pricing[price]": {"price_1"}, "invoice": {"in_1"}}}},
		"path argument": {"finalize_invoice", `{"invoice": "in_123"}`,
			toolCall{method: "POST", path: "/v1/invoices/in_123/finalize", params: url.Values{}}},
		"delete": {"cancel_subscription", `{"subscription": "sub_9"}`,
			toolCall{method: "DELETE", path: "/v1/subscriptions/sub_9", params: url.Values{}}},
		"read with a limit": {"list_customers", `{"limit": 5, "email": "a@b.example"}`,
			toolCall{method: "GET", path: "/v1/customers", params: url.Values{"limit": {"5"}, "email": {"a@b.example"}}}},
		"null is absent": {"list_customers", `{"limit": null}`,
			toolCall{method: "GET", path: "/v1/customers", params: url.Values{}}},
		"nested items": {"update_subscription",
			`{"subscription": "sub_1", "items": [{"id": "si_1", "deleted": true}, {"price": "price_2", "quantity": 2}]}`,
			toolCall{method: "POST", path: "/v1/subscriptions/sub_1", params: url.Values{
				"items[0][id]": {"si_1"}, "items[0][deleted]": {"true"},
				"items[1][price]": {"price_2"}, "items[1][quantity]": {"2"}}}},
		"percentages as written": {"create_coupon", `{"name": "Spring", "percent_off": 12.5}`,
			toolCall{method: "POST", path: "/v1/coupons", params: url.Values{"name": {"Spring"}, "percent_off": {"12.5"}}}},
		"general request, form body": {"stripe_request",
			`{"method": "POST", "path": "/v1/checkout/sessions", "idempotency_key": "cs-1", "stripe_account": "acct_1",
			  "params": {"mode": "payment", "line_items": [{"price_data": {"currency": "usd", "unit_amount": 1500,
			  "product_data": {"name": "T"}}, "quantity": 1}], "metadata": {}}}`,
			toolCall{method: "POST", path: "/v1/checkout/sessions", idempotencyKey: "cs-1", stripeAccount: "acct_1",
				params: url.Values{"mode": {"payment"}, "metadata": {""},
					"line_items[0][price_data][currency]":           {"usd"},
					"line_items[0][price_data][unit_amount]":        {"1500"},
					"line_items[0][price_data][product_data][name]": {"T"},
					"line_items[0][quantity]":                       {"1"}}}},
		"general request, query": {"stripe_request",
			`{"method": "GET", "path": "/v1/charges", "params": {"limit": 3, "expand": ["data.customer"]}}`,
			toolCall{method: "GET", path: "/v1/charges", params: url.Values{"limit": {"3"}, "expand[0]": {"data.customer"}}}},
		"general request, v2 JSON": {"stripe_request",
			`{"method": "POST", "path": "/v2/core/events", "params": {"amount": 12345678901234567890}}`,
			toolCall{method: "POST", path: "/v2/core/events", params: url.Values{},
				jsonBody: []byte(`{"amount":12345678901234567890}`)}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := mcpTool(t, tc.tool).request(json.RawMessage(tc.args))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestMCPToolArgumentErrors(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		tool, args, msg string
	}{
		"not an object":      {"list_customers", `[1]`, "must be a JSON object"},
		"unknown argument":   {"list_customers", `{"emial": "x"}`, `unknown argument "emial"; list_customers takes limit, email`},
		"missing required":   {"create_payment_intent", `{"currency": "usd"}`, `"amount" is required`},
		"fractional amount":  {"create_payment_intent", `{"amount": 10.5, "currency": "usd"}`, `"amount" must be an integer`},
		"exponent amount":    {"create_payment_intent", `{"amount": 1e3, "currency": "usd"}`, `"amount" must be an integer`},
		"amount as a string": {"create_payment_intent", `{"amount": "100", "currency": "usd"}`, `"amount" must be an integer`},
		"negative amount":    {"create_refund", `{"payment_intent": "pi_1", "amount": -5}`, "from 1 to 999999999999"},
		"amount over 12 digits": {"create_payment_intent", `{"amount": 1000000000000, "currency": "usd"}`,
			"from 1 to 999999999999"},
		"limit out of range":  {"list_products", `{"limit": 101}`, "from 1 to 100"},
		"id with a slash":     {"finalize_invoice", `{"invoice": "in_1/../../charges"}`, "a Stripe object id"},
		"enum":                {"list_subscriptions", `{"status": "everything"}`, "one of active, past_due"},
		"boolean":             {"create_payment_intent", `{"amount": 1, "currency": "usd", "confirm": "yes"}`, "true or false"},
		"metadata of objects": {"create_payment_intent", `{"amount": 1, "currency": "usd", "metadata": {"a": {}}}`, "an object of strings"},
		"items not a list":    {"update_subscription", `{"subscription": "sub_1", "items": {"id": "si_1"}}`, "a JSON array"},
		"foreign path":        {"stripe_request", `{"method": "GET", "path": "https://evil.example/v1/charges"}`, "starting with /v1/"},
		"query in the path":   {"stripe_request", `{"method": "GET", "path": "/v1/charges?limit=1"}`, "may not carry a query"},
		"delete with params":  {"stripe_request", `{"method": "DELETE", "path": "/v1/customers/cus_1", "params": {"a": 1}}`, "takes no params"},
		"unknown method":      {"stripe_request", `{"method": "PUT", "path": "/v1/charges"}`, "one of GET, POST, DELETE"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := mcpTool(t, tc.tool).request(json.RawMessage(tc.args))
			var bad *argError
			require.ErrorAs(t, err, &bad)
			assert.Contains(t, bad.msg, tc.msg)
		})
	}
}

func TestMCPErrorResults(t *testing.T) {
	t.Parallel()
	flat := func(res *mcp.CallToolResult) map[string]any {
		m, ok := res.StructuredContent.(map[string]any)
		require.True(t, ok)
		return m
	}
	text := func(res *mcp.CallToolResult) string { return res.Content[0].(*mcp.TextContent).Text }

	perRequest := errorResult(http.StatusPaymentRequired, []byte(`{"error": {"type": "invalid_request_error",
		"code": "spend_cap_exceeded", "message": "per-request cap of 10.00 usd would be exceeded: 12.00 requested",
		"keybrake": {"reason": "spend_cap_exceeded", "cap": "per_request", "limit": "10.00", "remaining": "10.00",
		"requested": "12.00", "currency": "usd", "request_id": "req_kb_1"}}}`))
	assert.True(t, perRequest.IsError)
	assert.Equal(t, map[string]any{"type": "invalid_request_error", "code": "spend_cap_exceeded",
		"message": "per-request cap of 10.00 usd would be exceeded: 12.00 requested", "reason": "spend_cap_exceeded",
		"cap": "per_request", "limit": "10.00", "remaining": "10.00", "requested": "12.00", "currency": "usd",
		"request_id": "req_kb_1", "status": 402, "source": "keybrake"}, flat(perRequest))
	assert.Equal(t, "Stripe API error: keybrake refused this call (spend_cap_exceeded): per-request cap of 10.00 usd would be exceeded: "+
		"12.00 requested. "+perRequestAdvice, text(perRequest))

	declined := errorResult(http.StatusPaymentRequired, []byte(`{"error": {"type": "card_error", "code": "card_declined",
		"decline_code": "generic_decline", "message": "Your card was declined.", "payment_intent": {"id": "pi_1", "amount": 1099}}}`))
	assert.True(t, declined.IsError)
	assert.Equal(t, "stripe", flat(declined)["source"])
	assert.Equal(t, "generic_decline", flat(declined)["decline_code"])
	assert.Equal(t, json.Number("1099"), flat(declined)["payment_intent"].(map[string]any)["amount"])
	assert.Equal(t, "Stripe API error: Your card was declined. (Stripe answered 402 card_error, code card_declined)", text(declined))

	derived := errorResult(http.StatusBadRequest, []byte(`{"error": {"type": "idempotency_error",
		"code": "idempotency_key_required", "param": "customer", "message": "This vault key derives idempotency keys `+
		`from the request: the parameter \"customer\" is required.", "keybrake": {"reason": "idempotency_key_required",
		"field": "customer", "request_id": "req_kb_2"}}}`))
	assert.Equal(t, "customer", flat(derived)["field"])
	assert.NotContains(t, text(derived), "Pass an idempotency_key", "a derive-mode key needs the field, not a key")
	assert.Contains(t, text(derived), `the parameter "customer" is required. Nothing reached Stripe; add that argument`)

	garbage := errorResult(http.StatusBadGateway, []byte("<html>bad gateway</html>"))
	assert.Equal(t, "stripe", flat(garbage)["source"])
	assert.Equal(t, "Stripe API error: Stripe answered 502: <html>bad gateway</html>", text(garbage))

	in := &answerRecorder{header: http.Header{}, limit: 8}
	in.WriteHeader(http.StatusOK)
	n, err := in.Write([]byte(`{"id": "a very long answer"}`))
	require.NoError(t, err)
	assert.Equal(t, 28, n, "the writer takes everything, keeps the limit")
	tooLarge := in.result()
	assert.True(t, tooLarge.IsError)
	assert.Equal(t, codeAnswerTooLarge, flat(tooLarge)["code"])
}

// TestMCPGenericRequests: stripe_api_read and stripe_api_write resolve the
// operationId to Stripe's method and path, take the path parameters out of
// parameters and encode the rest as Stripe reads forms.
func TestMCPGenericRequests(t *testing.T) {
	t.Parallel()
	m := &mcpEndpoint{}
	build := func(tool string, args map[string]any) (toolCall, error) {
		raw, err := json.Marshal(args)
		require.NoError(t, err)
		spec := mcpTool(t, tool)
		call, err := spec.request(raw)
		if err != nil {
			return call, err
		}
		err = m.genericRequest(t.Context(), tool == toolAPIWrite, &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Arguments: raw}}, &call)
		return call, err
	}
	call, err := build(toolAPIWrite, map[string]any{"stripe_api_operation_id": "PostPaymentIntentsIntentCapture",
		"parameters": map[string]any{"intent": "pi_1", "amount_to_capture": 500, "metadata": map[string]any{"b": "2", "a": "1"},
			"expand": []any{"latest_charge"}}, "stripe_context": "acct_1", "idempotency_key": "cap-1", "reason": "order shipped"})
	require.NoError(t, err)
	assert.Equal(t, http.MethodPost, call.method)
	assert.Equal(t, "/v1/payment_intents/pi_1/capture", call.path)
	assert.Equal(t, "amount_to_capture=500&expand%5B0%5D=latest_charge&metadata%5Ba%5D=1&metadata%5Bb%5D=2", call.params.Encode())
	assert.Equal(t, "acct_1", call.stripeAccount)
	assert.Equal(t, "cap-1", call.idempotencyKey)
	assert.Equal(t, "order shipped", call.approvalReason)

	call, err = build(toolAPIRead, map[string]any{"stripe_api_operation_id": "GetCustomers", "parameters": map[string]any{"limit": 3}})
	require.NoError(t, err)
	assert.Equal(t, "GET /v1/customers limit=3", call.method+" "+call.path+" "+call.params.Encode())

	for name, tc := range map[string]struct {
		tool string
		args map[string]any
		want string
	}{
		"read to write":     {toolAPIWrite, map[string]any{"stripe_api_operation_id": "GetCustomers"}, "GetCustomers is a read (GET /v1/customers): call stripe_api_read"},
		"write to read":     {toolAPIRead, map[string]any{"stripe_api_operation_id": "PostRefunds"}, "PostRefunds is a write (POST /v1/refunds)"},
		"delete to read":    {toolAPIRead, map[string]any{"stripe_api_operation_id": "DeleteCustomersCustomer"}, "stripe_api_read only reads"},
		"unknown":           {toolAPIWrite, map[string]any{"stripe_api_operation_id": "PostFreeMoney"}, "call stripe_api_search"},
		"path parameter":    {toolAPIRead, map[string]any{"stripe_api_operation_id": "GetCustomersCustomer"}, "parameters.customer is required"},
		"path id":           {toolAPIRead, map[string]any{"stripe_api_operation_id": "GetCustomersCustomer", "parameters": map[string]any{"customer": "../balance"}}, "must be an id"},
		"delete params":     {toolAPIWrite, map[string]any{"stripe_api_operation_id": "DeleteCustomersCustomer", "parameters": map[string]any{"customer": "cus_1", "x": "y"}}, "takes no parameters"},
		"read takes no key": {toolAPIRead, map[string]any{"stripe_api_operation_id": "GetCustomers", "idempotency_key": "k"}, `unknown argument "idempotency_key"`},
	} {
		_, err := build(tc.tool, tc.args)
		var bad *argError
		require.ErrorAs(t, err, &bad, name)
		assert.Contains(t, bad.msg, tc.want, name)
	}
}

// TestMCPSearchSpecs: the search finds by words among what the policy allows.
func TestMCPSearchSpecs(t *testing.T) {
	t.Parallel()
	ids := func(p policy.Policy, q string) []string {
		var out []string
		for _, op := range searchSpecs(&p, q) {
			out = append(out, op.ID)
		}
		return out
	}
	refunds := policy.Policy{Operations: []string{"refunds.*"}}
	got := ids(refunds, "refund")
	require.Greater(t, len(got), 2)
	assert.Contains(t, got[:2], "PostRefunds", "the plain create and list rank first")
	assert.Contains(t, got, "GetRefundsRefund")
	assert.Empty(t, ids(policy.Policy{Operations: []string{"charges.create"}}, "refund"))
	assert.Contains(t, ids(policy.Policy{Operations: []string{"charges.create"}, Mode: policy.ModeReport}, "refund"), "PostRefunds",
		"report mode forwards what the policy would refuse")
	assert.Equal(t, []string{"PostCustomers"}, ids(policy.Policy{Operations: []string{"customers.create"}}, "create a customer"))
	assert.Empty(t, ids(refunds, "refund zebra"), "every word must match")
}
