package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// Stripe's generic MCP tools (stripe_api_read, stripe_api_write, …) end to end,
// with the MCP Go SDK's client against the real program in front of the fake Stripe.

// chargeCall is a stripe_api_write PostCharges call of amount cents.
func chargeCall(amount int, extra map[string]any) map[string]any {
	params := map[string]any{"amount": amount, "currency": "usd", "source": "tok_visa"}
	args := map[string]any{"stripe_api_operation_id": "PostCharges", "parameters": params}
	for k, v := range extra {
		if k == "description" {
			params[k] = v
			continue
		}
		args[k] = v
	}
	return args
}

func TestMCPGenericWritesStopAtTheCap(t *testing.T) {
	t.Parallel()
	s := MustMCPServer(t)
	_, token := s.MustMint(t, "five-dollars", map[string]any{"daily_cap": "5.00", "operations": []string{"charges.create"}})
	c := MustMCP(t, s.ProxyURL(), token)

	// Twenty different one-dollar charges at once, none with an idempotency key:
	// each gets its own derived key, and the cap lets five through.
	const calls = 20
	results := make([]*mcp.CallToolResult, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			results[i] = MustCall(t, c, "stripe_api_write", chargeCall(100, map[string]any{"description": fmt.Sprintf("dollar %02d", i)}))
		})
	}
	wg.Wait()
	ok := 0
	for _, res := range results {
		if !res.IsError {
			ok++
			continue
		}
		assert.Equal(t, "spend_cap_exceeded", structured(t, res)["code"], text(res))
		assert.True(t, strings.HasPrefix(text(res), "Stripe API error: "), text(res))
	}
	assert.Equal(t, 5, ok)
	assert.Equal(t, 5, s.fake.Count(), "only the calls under the cap reached Stripe")
	assert.Equal(t, int64(500), s.fake.TotalMoved("usd"), "Stripe moved exactly the cap")
}

func TestMCPGenericBlindRetryMovesMoneyOnce(t *testing.T) {
	t.Parallel()
	s := MustMCPServer(t)
	_, token := s.MustMint(t, "retrier", map[string]any{"daily_cap": "50.00",
		"operations": []string{"charges.create", "payment_intents.create", "*.read"}})
	c := MustMCP(t, s.ProxyURL(), token)

	first := MustCall(t, c, "stripe_api_write", chargeCall(700, nil))
	require.False(t, first.IsError, text(first))
	assert.Contains(t, text(first), "no idempotency_key was given, so keybrake derived kbm_")
	assert.Contains(t, text(first), "within 24 h is a retry")
	assert.Contains(t, text(first), "pass an idempotency_key of your own")
	// The agent did not see the answer and sends the same call again.
	again := MustCall(t, c, "stripe_api_write", chargeCall(700, nil))
	require.False(t, again.IsError, text(again))
	assert.Equal(t, structured(t, first)["id"], structured(t, again)["id"])
	assert.Contains(t, text(again), "stored answer of the first call")
	assert.Len(t, s.fake.Charges(), 1, "the blind retry moved no money")
	assert.Equal(t, int64(700), s.fake.TotalMoved("usd"))

	// A deliberate second, identical charge names its own key.
	second := MustCall(t, c, "stripe_api_write", chargeCall(700, map[string]any{"idempotency_key": "second-charge"}))
	require.False(t, second.IsError, text(second))
	assert.NotEqual(t, structured(t, first)["id"], structured(t, second)["id"])
	assert.NotContains(t, text(second), "derived")
	assert.Equal(t, int64(1400), s.fake.TotalMoved("usd"))

	// A named money tool behaves the same.
	pay := map[string]any{"amount": 300, "currency": "usd", "customer": "cus_9"}
	p1 := MustCall(t, c, "create_payment_intent", pay)
	require.False(t, p1.IsError, text(p1))
	assert.Contains(t, text(p1), "keybrake derived kbm_")
	p2 := MustCall(t, c, "create_payment_intent", pay)
	require.False(t, p2.IsError, text(p2))
	assert.Equal(t, structured(t, p1)["id"], structured(t, p2)["id"])
	assert.Len(t, s.fake.PaymentIntents(), 1)

	// A read names its path parameters inside parameters.
	read := MustCall(t, c, "stripe_api_read", map[string]any{"stripe_api_operation_id": "GetChargesCharge",
		"parameters": map[string]any{"charge": structured(t, first)["id"]}})
	require.False(t, read.IsError, text(read))
	assert.Equal(t, structured(t, first)["id"], structured(t, read)["id"])
	assert.Equal(t, 1, s.fake.CountWhere(func(r proxytest.Request) bool { return r.Method == http.MethodGet }))
}

func TestMCPGenericRefusals(t *testing.T) {
	t.Parallel()
	s := MustMCPServer(t)
	acct := s.fake.AddConnectedAccount("usd", 0)
	_, token := s.MustMint(t, "charges-only", map[string]any{"daily_cap": "50.00",
		"operations": []string{"charges.create", "*.read"}, "stripe_accounts": []string{acct}})
	c := MustMCP(t, s.ProxyURL(), token)
	refused := func(res *mcp.CallToolResult, code string) {
		t.Helper()
		require.True(t, res.IsError, text(res))
		assert.Equal(t, code, structured(t, res)["code"], text(res))
		assert.Equal(t, "keybrake", structured(t, res)["source"])
		assert.True(t, strings.HasPrefix(text(res), "Stripe API error: "), text(res))
	}

	// A refund the policy does not name, through the generic write: refused by
	// its operation, whatever the tool is called.
	refund := MustCall(t, c, "stripe_api_write", map[string]any{"stripe_api_operation_id": "PostRefunds",
		"parameters": map[string]any{"charge": "ch_1", "amount": 100}})
	refused(refund, "operation_not_allowed")
	assert.Contains(t, text(refund), `operation "refunds.create" is not allowed`)

	// An account outside the policy, as a Stripe-Account header would be.
	refused(MustCall(t, c, "stripe_api_write", chargeCall(100, map[string]any{"stripe_context": "acct_notmine"})),
		"account_not_allowed")
	// livemode must be the upstream's: the test key is not live.
	live := MustCall(t, c, "stripe_api_write", chargeCall(100, map[string]any{"livemode": true}))
	refused(live, "livemode_mismatch")
	assert.Contains(t, text(live), "this vault key acts in test mode")
	// A read given to write, a write given to read, an unknown operation.
	refused(MustCall(t, c, "stripe_api_write", map[string]any{"stripe_api_operation_id": "GetBalance"}), "invalid_arguments")
	wrong := MustCall(t, c, "stripe_api_read", chargeCall(100, nil))
	refused(wrong, "invalid_arguments")
	assert.Contains(t, text(wrong), "PostCharges is a write (POST /v1/charges): stripe_api_read only reads; call stripe_api_write")
	unknown := MustCall(t, c, "stripe_api_write", map[string]any{"stripe_api_operation_id": "PostMoneyToMe"})
	refused(unknown, "invalid_arguments")
	assert.Contains(t, text(unknown), "call stripe_api_search")
	missing := MustCall(t, c, "stripe_api_read", map[string]any{"stripe_api_operation_id": "GetChargesCharge"})
	refused(missing, "invalid_arguments")
	assert.Contains(t, text(missing), "parameters.charge is required")
	assert.Equal(t, 0, s.fake.Count(), "no refused call reached Stripe")

	// The allowed account and the right mode pass, under that account.
	ok := MustCall(t, c, "stripe_api_write", chargeCall(100, map[string]any{"stripe_context": acct, "livemode": false}))
	require.False(t, ok.IsError, text(ok))
	reqs := s.fake.Requests()
	require.Len(t, reqs, 1)
	assert.Equal(t, acct, reqs[0].Header.Get("Stripe-Account"))

	accounts := MustCall(t, c, "list_available_accounts_or_orgs", nil)
	require.False(t, accounts.IsError, text(accounts))
	assert.Equal(t, map[string]any{"livemode": false, "accounts": []any{
		map[string]any{"stripe_context": nil, "kind": "platform"},
		map[string]any{"stripe_context": acct, "kind": "connected_account"},
	}}, structured(t, accounts))
}

func TestMCPGenericSearchFollowsThePolicy(t *testing.T) {
	t.Parallel()
	s := MustMCPServer(t)
	_, refunds := s.MustMint(t, "refunds", map[string]any{"daily_cap": "50.00", "operations": []string{"refunds.create", "charges.create"}})
	_, charges := s.MustMint(t, "charges", map[string]any{"daily_cap": "50.00", "operations": []string{"charges.create"}})

	ids := func(res *mcp.CallToolResult) []string {
		t.Helper()
		require.False(t, res.IsError, text(res))
		var out []string
		for _, op := range structured(t, res)["operations"].([]any) {
			out = append(out, op.(map[string]any)["stripe_api_operation_id"].(string))
		}
		return out
	}
	r := MustCall(t, MustMCP(t, s.ProxyURL(), refunds), "stripe_api_search", map[string]any{"query": "refund"})
	assert.Contains(t, ids(r), "PostRefunds")
	first := structured(t, r)["operations"].([]any)[0].(map[string]any)
	assert.Equal(t, "PostRefunds", first["stripe_api_operation_id"], "the plain create ranks first")
	assert.Equal(t, "stripe_api_write", first["tool"])
	assert.Equal(t, true, first["moves_money"])
	assert.Contains(t, fmt.Sprint(first["parameters"]), "payment_intent")

	cs := MustMCP(t, s.ProxyURL(), charges)
	assert.NotContains(t, ids(MustCall(t, cs, "stripe_api_search", map[string]any{"query": "refund"})), "PostRefunds",
		"a key that may not refund does not find refunds")
	assert.Contains(t, ids(MustCall(t, cs, "stripe_api_search", map[string]any{"query": "create charge"})), "PostCharges")

	d := MustCall(t, cs, "stripe_api_details", map[string]any{"stripe_api_operation_id": "PostRefunds"})
	require.False(t, d.IsError, text(d))
	assert.Equal(t, false, structured(t, d)["allowed"])
	assert.Contains(t, text(d), "does not allow it")
}
