package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// FuzzProxyRequest drives random requests (method, request target, extra header
// lines, body) through the whole pipeline in front of the fake Stripe. Every
// answer is either Stripe's (the request was forwarded) or a Stripe-shaped 4xx
// refusal; nothing panics; and every money-moving request that reached the fake
// carries an upstream idempotency key whose hold exists in the vault.
//
// The default run replays the seeds (and the malformed corpus); fuzz with
// go test -fuzz FuzzProxyRequest ./proxy/.
func FuzzProxyRequest(f *testing.F) {
	e := MustEnv(f)
	tok, key := e.MustKey(f, Policy("99.00", func(p *policy.Policy) { p.Operations = []string{"*"} }))

	form := "Content-Type: application/x-www-form-urlencoded\n"
	f.Add("POST", "/v1/charges", form+"Idempotency-Key: a", []byte("amount=100&currency=usd&source=tok_visa"))
	f.Add("POST", "/v1/charges", form+"Idempotency-Key: a", []byte("amount=100&amount=100000&currency=usd"))
	f.Add("POST", "/v1/charges?amount=1", form+"Idempotency-Key: b", []byte("amount=100&currency=usd"))
	f.Add("POST", "/v1/payment_intents", form+"Idempotency-Key: \"c\"", []byte("amount=2000&currency=usd&confirm=true&payment_method=pm_card_visa"))
	f.Add("POST", "/v1/charges/ch_x/capture", form+"Idempotency-Key: d", []byte(""))
	f.Add("POST", "/v1/refunds", form+"Idempotency-Key: e", []byte("charge=ch_x&amount=50"))
	f.Add("GET", "/v1/charges?limit=2", "", []byte(""))
	f.Add("GET", "/v1/customers/cus_1", "Stripe-Account: acct_1", []byte(""))
	f.Add("DELETE", "/v1/customers/cus_1", "", []byte(""))
	f.Add("POST", "/v1/customers", form, []byte("email=a%40b.c"))
	f.Add("POST", "/v1/charges", "Content-Type: application/json\nIdempotency-Key: f", []byte(`{"amount":100}`))
	f.Add("POST", "/v1/charges", form+"Content-Encoding: gzip\nIdempotency-Key: g", []byte("amount=1&currency=usd"))
	f.Add("POST", "/v1/charges", form+"X-HTTP-Method-Override: GET", []byte("amount=1&currency=usd"))
	f.Add("POST", "/v1/charges/../payouts", form+"Idempotency-Key: h", []byte("amount=1&currency=usd"))
	f.Add("PATCH", "/v1/charges", form, []byte("amount=1"))
	f.Add("POST", "/v2/core/accounts", "Content-Type: application/json", []byte(`{"a":1}`))
	// Captures, raises and lines: money moved or added on an existing object.
	f.Add("POST", "/v1/payment_intents/pi_x/capture", form+"Idempotency-Key: i", []byte("amount_to_capture=500&final_capture=false"))
	f.Add("POST", "/v1/payment_intents/pi_x/capture", form+"Idempotency-Key: j", []byte("amount_to_capture=500&amount_to_capture=50000"))
	f.Add("POST", "/v1/payment_intents/pi_x", form+"Idempotency-Key: k", []byte("amount=9000"))
	f.Add("POST", "/v1/payment_intents/pi_x/increment_authorization", form+"Idempotency-Key: l", []byte("amount=9000"))
	f.Add("POST", "/v1/payment_intents/pi_x/cancel", form, []byte(""))
	f.Add("POST", "/v1/invoiceitems/ii_x", form+"Idempotency-Key: m", []byte("unit_amount_decimal=5000"))
	f.Add("POST", "/v1/invoices/in_x/add_lines", form+"Idempotency-Key: n", []byte("lines[0][amount]=500&lines[1][price_data][currency]=usd&lines[1][price_data][unit_amount]=5&lines[1][quantity]=3"))
	f.Add("POST", "/v1/invoices/in_x/lines/il_x", form+"Idempotency-Key: o", []byte("quantity=3"))
	f.Add("POST", "/v1/subscriptions/sub_x", form+"Idempotency-Key: p", []byte("proration_behavior=always_invoice"))
	for _, c := range proxytest.MalformedCases(f) {
		if c.PadTo > 0 || c.BodyBase64 != "" {
			continue
		}
		var lines []string
		for k, v := range c.Headers {
			lines = append(lines, k+": "+v)
		}
		lines = append(lines, "Idempotency-Key: corpus")
		f.Add(c.Method, c.Path, strings.Join(lines, "\n"), []byte(c.Body))
	}

	seen := 0
	f.Fuzz(func(t *testing.T, method, target, headers string, body []byte) {
		var raw bytes.Buffer
		fmt.Fprintf(&raw, "%s %s HTTP/1.1\r\nHost: keybrake.test\r\nAuthorization: Bearer %s\r\n", method, target, tok)
		for line := range strings.SplitSeq(headers, "\n") {
			if strings.TrimSpace(line) != "" {
				raw.WriteString(strings.TrimRight(line, "\r") + "\r\n")
			}
		}
		fmt.Fprintf(&raw, "Content-Length: %d\r\n\r\n", len(body))
		raw.Write(body)
		req, err := http.ReadRequest(bufio.NewReader(&raw))
		if err != nil {
			t.Skip("not an HTTP/1.1 request net/http would serve")
		}
		req.RemoteAddr = "127.0.0.1:1"

		rec := httptest.NewRecorder()
		e.Proxy.ServeHTTP(rec, req)

		res := rec.Result()
		if strings.HasPrefix(res.Header.Get("Request-Id"), "req_kb_") && res.Header.Get("Idempotent-Replayed") == "" {
			// keybrake's own answer: a Stripe-shaped refusal, never a 5xx of its own
			// (502/504 would mean the fake was unreachable, which it is not).
			assert.GreaterOrEqual(t, res.StatusCode, 400)
			assert.Less(t, res.StatusCode, 500, "keybrake failed: %s", rec.Body.Bytes())
			var body struct {
				Error struct {
					Type    string `json:"type"`
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), "%s", rec.Body.Bytes())
			assert.NotEmpty(t, body.Error.Type)
			assert.NotEmpty(t, body.Error.Code)
			assert.NotEmpty(t, body.Error.Message)
			assert.Equal(t, "false", res.Header.Get("Stripe-Should-Retry"))
		}

		fresh := e.Fake.RequestsFrom(seen)
		seen += len(fresh)
		if len(fresh) == 0 {
			return
		}
		// Newest first: this request's hold, if any, is among the latest.
		holds, _, err := e.Store.ListHolds(context.Background(), "", 20, "")
		require.NoError(t, err)
		upstreamKeys := map[string]bool{}
		for _, h := range holds {
			upstreamKeys[vault.UpstreamKey(key.ID, h.IdempotencyKey)] = true
		}
		for _, r := range fresh {
			assert.Equal(t, "Bearer "+upstreamSecret, r.Header.Get("Authorization"))
			if r.Method != http.MethodPost {
				continue
			}
			params, err := stripeapi.ParseForm(r.Body)
			require.NoError(t, err, "a forwarded body is one keybrake could read")
			cls, err := stripeapi.Classify(r.Method, r.Path, params)
			require.NoError(t, err, "a forwarded request is one keybrake could classify")
			if cls.MovesMoney {
				assert.True(t, upstreamKeys[r.IdempotencyKey], "money-moving %s %s forwarded without a hold", r.Method, r.Path)
			}
		}
	})
}
