package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
)

// MustRaw sends exactly the given request line, headers and body over a fresh TCP
// connection (no client library cleans the path) and reads the answer.
func MustRaw(tb testing.TB, baseURL, method, target string, header http.Header, body []byte) reply {
	tb.Helper()
	u, err := url.Parse(baseURL)
	require.NoError(tb, err)
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	require.NoError(tb, err)
	defer conn.Close()
	require.NoError(tb, conn.SetDeadline(time.Now().Add(30*time.Second)))

	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", method, target, u.Host)
	names := make([]string, 0, len(header))
	for k := range header {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		for _, v := range header[k] {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n", len(body))
	go func() {
		// Written concurrently: keybrake may answer (413) before reading it all.
		_, _ = conn.Write(append(b.Bytes(), body...))
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(tb, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	r := reply{Status: resp.StatusCode, Header: resp.Header, Raw: raw}
	_ = json.Unmarshal(raw, &r.Body)
	return r
}

// Every case of testdata/malformed/cases.json is refused end to end with its
// status and code; nothing reaches Stripe.
func TestMalformedCorpus(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) { p.Operations = []string{"*"} }))
	cases := proxytest.MalformedCases(t)
	require.NotEmpty(t, cases)
	for i, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			body, err := c.RawBody()
			require.NoError(t, err)
			h := http.Header{}
			for k, v := range c.Headers {
				h.Set(k, v)
			}
			h.Set("Authorization", "Bearer "+tok)
			if h.Get("Idempotency-Key") == "" {
				h.Set("Idempotency-Key", fmt.Sprintf("corpus-%d", i))
			}
			r := MustRaw(t, e.URL, c.Method, c.Path, h, body)
			AssertRefusal(t, r, c.WantStatus, c.WantCode)
			assert.Equal(t, "false", r.Header.Get("Stripe-Should-Retry"))
		})
	}
	assert.Zero(t, e.Fake.Count(), "nothing malformed reaches Stripe")
	holds, _, err := e.Store.ListHolds(context.Background(), "", 10, "")
	require.NoError(t, err)
	assert.Empty(t, holds, "no refused request placed a hold")
}

// Every catalogue sample marked stripe_mock passes through keybrake and is
// accepted by stripe-mock's parameter validation.
func TestStripeMockBehindKeybrake(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stripe-mock: skipped with -short")
	}
	mock := proxytest.StripeMock(t)
	e := MustEnv(t, withUpstreamURL(mock.String(), proxytest.StripeMockKey))
	big := func(cur string) func(*policy.Policy) {
		return func(p *policy.Policy) {
			exp, ok := policy.Exponent(cur)
			require.True(t, ok)
			c := decimal.New(1, 14-exp) // 10^14 minor units: every sample fits
			p.Currency, p.DailyCap, p.Operations = cur, &c, []string{"*"}
			// The connected accounts the samples act on: acct_123 (GET
			// /v1/accounts/acct_123 touches it like a Stripe-Account header would),
			// and those of stripe-mock's fixtures: its charges and PaymentIntents
			// are destination charges to obj_123, its transfers and application
			// fees go to acct_1PgafTB7WZ01zgkW (a capture, a reversal or a fee
			// refund touches them).
			p.StripeAccounts = []string{"acct_123", "obj_123", "acct_1PgafTB7WZ01zgkW"}
		}
	}
	tokens := map[string]string{}
	tokenFor := func(cur string) string {
		if cur == "" {
			cur = "usd" // lookups at stripe-mock answer its usd fixtures
		}
		if tok, ok := tokens[cur]; ok {
			return tok
		}
		tok, _ := e.MustKey(t, Policy("1", big(cur)))
		tokens[cur] = tok
		return tok
	}
	var n int
	for i, c := range proxytest.CatalogueCases(t) {
		if !c.StripeMock {
			continue
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			target := c.Path
			if c.Query != "" {
				target += "?" + c.Query
			}
			h := http.Header{}
			h.Set("Authorization", "Bearer "+tokenFor(c.Want.Currency))
			if c.Method == http.MethodPost {
				ct := c.ContentType
				if ct == "" {
					ct = "application/x-www-form-urlencoded"
				}
				h.Set("Content-Type", ct)
				h.Set("Idempotency-Key", fmt.Sprintf("mock-%d", i))
			}
			r := MustRaw(t, e.URL, c.Method, target, h, []byte(c.Body))
			if c.Want.MovesMoney && !c.Want.AmountKnown && c.Want.Lookup == nil {
				// A valid Stripe request whose amount keybrake cannot know: refused
				// by design before it reaches Stripe.
				AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
				return
			}
			if c.Want.Operation == "subscriptions.create" && c.Want.AmountKnown {
				// stripe-mock's list of a customer's pending invoice items always
				// holds its fixture item, which the first invoice would draw in.
				AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
				assert.Contains(t, string(r.Raw), "pending invoice items")
				return
			}
			assert.True(t, r.Status >= 200 && r.Status < 300, "status %d: %s", r.Status, r.Raw)
			assert.False(t, strings.HasPrefix(r.Header.Get("Request-Id"), "req_kb_"), "answered by stripe-mock, not refused")
		})
	}
	require.Positive(t, n, "the catalogue marks samples for stripe-mock")
}
