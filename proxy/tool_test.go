package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy"
)

// TestToolNameReachesLedgerAndLog runs one charge in process under a tool name (as
// the MCP endpoint does) and one from the network: the tool is in the first
// request's events and log line only, and a header cannot forge it.
func TestToolNameReachesLedgerAndLog(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	token, key := e.MustKey(t, Policy("50.00"))

	form := url.Values{"amount": {"1000"}, "currency": {"usd"}, "source": {"tok_visa"}}
	req := httptest.NewRequestWithContext(proxy.NewContextWithTool(context.Background(), "create_payment_intent"),
		http.MethodPost, "/v1/charges", strings.NewReader(form.Encode()))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "in-process")
	rec := httptest.NewRecorder()
	e.Proxy.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())

	h := http.Header{"Idempotency-Key": {"network"}, "Tool": {"forged"}, "X-Keybrake-Tool": {"forged"}}
	r := e.MustSend(t, http.MethodPost, "/v1/charges", token, h, form.Encode())
	require.Equal(t, http.StatusOK, r.Status, string(r.Raw))

	events, _, err := e.Store.ListEvents(context.Background(), key.ID, 0, "")
	require.NoError(t, err)
	var tools []string
	for _, ev := range events {
		tools = append(tools, string(ev.Decision)+":"+ev.Tool)
	}
	assert.Equal(t, []string{"settled:", "allowed:", "settled:create_payment_intent", "allowed:create_payment_intent"}, tools)

	lines := e.Logs.LogLines(t)
	require.Len(t, lines, 2)
	assert.Equal(t, "create_payment_intent", lines[0]["tool"])
	assert.NotContains(t, lines[1], "tool")
}
