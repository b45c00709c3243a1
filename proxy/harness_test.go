package proxy_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

const upstreamSecret = "sk_test_keybrakeupstream"

// env is one keybrake proxy on 127.0.0.1 with a real vault in t.TempDir() in front
// of a fake Stripe.
type env struct {
	Store vault.Store
	Fake  *proxytest.FakeStripe
	Proxy *proxy.Proxy
	URL   string
	// Metrics is the registry the proxy's collectors are registered on.
	Metrics *prometheus.Registry
	// Hits counts the requests that reached the proxy's listener.
	Hits atomic.Int64
	Logs *syncBuffer
	// DBPath and Master open the same database again (after the store is closed).
	DBPath string
	Master []byte

	mu     sync.Mutex
	limits map[string]int64 // per currency: the sum of the enforce-mode caps minted
	tokens []string

	ownStoreChecks bool
}

type envOptions struct {
	upstreamTimeout time.Duration
	upstreamURL     string // default: the fake
	secret          string // registered upstream secret (default upstreamSecret)
	ownStoreChecks  bool   // the test closes the store itself and checks what it needs
	storeNow        func() time.Time
	proxyNow        func() time.Time
	wrapStore       func(vault.Store) vault.Store // what the proxy sees of the real store
}

// MustEnv starts a vault, a fake Stripe and the proxy. Its cleanup re-checks the
// store invariant and that the fake never moved more than the caps allow, and
// that no token or secret reached the logs.
func MustEnv(tb testing.TB, opts ...func(*envOptions)) *env {
	tb.Helper()
	o := envOptions{upstreamTimeout: 10 * time.Second, secret: upstreamSecret}
	for _, f := range opts {
		f(&o)
	}
	master := make([]byte, 32)
	_, _ = rand.Read(master)
	dbPath := filepath.Join(tb.TempDir(), "keybrake.db")
	store, err := bolt.Open(dbPath, bolt.Options{
		MasterKey: master,
		Lease:     o.upstreamTimeout + 5*time.Second,
		Now:       o.storeNow,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(tb, err)
	tb.Cleanup(func() { assert.NoError(tb, store.Close()) })

	e := &env{Store: store, Logs: &syncBuffer{}, limits: map[string]int64{}, DBPath: dbPath, Master: master,
		ownStoreChecks: o.ownStoreChecks}
	e.Fake = proxytest.NewFakeStripe(tb, upstreamSecret)
	_, _, err = store.PutUpstream(context.Background(), "test", "default", "stripe", o.secret)
	require.NoError(tb, err)

	tb.Cleanup(func() { e.checkInvariants(tb) })

	up := o.upstreamURL
	if up == "" {
		up = e.Fake.URL
	}
	upURL, err := url.Parse(up)
	require.NoError(tb, err)
	e.Metrics = prometheus.NewRegistry()
	var proxyStore vault.Store = store
	if o.wrapStore != nil {
		proxyStore = o.wrapStore(store)
	}
	p, err := proxy.New(proxy.Config{
		Registerer:      e.Metrics,
		Store:           proxyStore,
		Upstream:        upURL,
		UpstreamTimeout: o.upstreamTimeout,
		Now:             o.proxyNow,
		Logger:          slog.New(slog.NewJSONHandler(e.Logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	require.NoError(tb, err)
	e.Proxy = p

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.Hits.Add(1)
		p.ServeHTTP(w, r)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	srv.Listener = ln
	srv.Start()
	tb.Cleanup(srv.Close)
	e.URL = srv.URL
	return e
}

func withUpstreamTimeout(d time.Duration) func(*envOptions) {
	return func(o *envOptions) { o.upstreamTimeout = d }
}

func withClocks(store, proxy func() time.Time) func(*envOptions) {
	return func(o *envOptions) { o.storeNow, o.proxyNow = store, proxy }
}

func withOwnStoreChecks() func(*envOptions) {
	return func(o *envOptions) { o.ownStoreChecks = true }
}

func withUpstreamURL(u, secret string) func(*envOptions) {
	return func(o *envOptions) { o.upstreamURL, o.secret = u, secret }
}

func (e *env) checkInvariants(tb testing.TB) {
	tb.Helper()
	e.Fake.WaitIdle(tb)
	if !e.ownStoreChecks {
		assert.NoError(tb, e.Store.CheckInvariant(context.Background()), "store invariant")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for cur, limit := range e.limits {
		assert.LessOrEqual(tb, e.Fake.TotalMoved(cur), limit, "money moved at the fake in %s exceeds the caps", cur)
		assert.LessOrEqual(tb, e.Fake.TotalCharged(cur), limit, "charged at the fake in %s exceeds the caps", cur)
	}
	logs := e.Logs.String()
	assert.NotContains(tb, logs, upstreamSecret, "the upstream secret reached the logs")
	for _, tok := range e.tokens {
		assert.NotContains(tb, logs, tok, "a vault token reached the logs")
	}
}

// Policy is a test policy: usd, the given daily cap (major units), valid from an
// hour ago for 30 days.
func Policy(dailyCap string, mods ...func(*policy.Policy)) policy.Policy {
	now := time.Now()
	d := decimal.RequireFromString(dailyCap)
	p := policy.Policy{
		Vendor:      policy.VendorStripe,
		Currency:    "usd",
		DailyCap:    &d,
		PeriodStart: now.Add(-time.Hour).Truncate(time.Second),
		ExpiresAt:   now.Add(30 * 24 * time.Hour).Truncate(time.Second),
		Operations:  []string{"charges.*", "payment_intents.*", "refunds.create", "customers.*", "*.read"},
	}
	for _, m := range mods {
		m(&p)
	}
	return p
}

// MustKey mints a vault key with pol and returns its token.
func (e *env) MustKey(tb testing.TB, pol policy.Policy) (string, vault.Key) {
	tb.Helper()
	pol.Normalize(time.Now())
	var buf [6]byte
	_, _ = rand.Read(buf[:])
	key, token, err := e.Store.MintKey(context.Background(), "test", vault.MintRequest{
		Name:     fmt.Sprintf("test-%x", buf),
		Upstream: "default",
		Policy:   pol,
	})
	require.NoError(tb, err)
	if pol.Mode != policy.ModeReport {
		var limit int64 = -1
		for _, cp := range []*decimal.Decimal{pol.DailyCap, pol.PeriodCap} {
			if cp == nil {
				continue
			}
			m, err := policy.ToMinor(pol.Currency, *cp)
			require.NoError(tb, err)
			if limit < 0 || m < limit {
				limit = m
			}
		}
		e.mu.Lock()
		if limit >= 0 {
			e.limits[pol.Currency] += limit
		}
		e.tokens = append(e.tokens, token)
		e.mu.Unlock()
	}
	return token, key
}

// Client is the real stripe-go client pointed at the proxy with token.
func (e *env) Client(token string, retries int64) *stripe.Client {
	return stripe.NewClient(token, stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(e.URL),
		MaxNetworkRetries: stripe.Int64(retries),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
}

// reply is a raw answer of the proxy.
type reply struct {
	Status int
	Header http.Header
	Raw    []byte
	Body   map[string]any
}

func (r reply) ErrCode() string {
	e, _ := r.Body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func (r reply) ErrMessage() string {
	e, _ := r.Body["error"].(map[string]any)
	s, _ := e["message"].(string)
	return s
}

func (r reply) ErrType() string {
	e, _ := r.Body["error"].(map[string]any)
	s, _ := e["type"].(string)
	return s
}

func (r reply) Keybrake() map[string]any {
	e, _ := r.Body["error"].(map[string]any)
	k, _ := e["keybrake"].(map[string]any)
	return k
}

// MustSend sends a raw request to the proxy and reads the answer.
func (e *env) MustSend(tb testing.TB, method, target, token string, header http.Header, body string) reply {
	tb.Helper()
	req, err := http.NewRequest(method, e.URL+target, strings.NewReader(body))
	require.NoError(tb, err)
	if body == "" {
		req.Body = http.NoBody
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if token != "" && req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if method == http.MethodPost && req.Header.Get("Content-Type") == "" && body != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return MustDo(tb, http.DefaultClient, req)
}

// MustDo sends req and reads the whole answer.
func MustDo(tb testing.TB, client *http.Client, req *http.Request) reply {
	tb.Helper()
	resp, err := client.Do(req)
	require.NoError(tb, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	r := reply{Status: resp.StatusCode, Header: resp.Header, Raw: raw}
	_ = json.Unmarshal(raw, &r.Body)
	return r
}

// Post sends a form POST with an idempotency key (none when idem is "").
func (e *env) Post(tb testing.TB, path, token, idem string, form url.Values) reply {
	tb.Helper()
	h := http.Header{}
	if idem != "" {
		h.Set("Idempotency-Key", idem)
	}
	return e.MustSend(tb, http.MethodPost, path, token, h, form.Encode())
}

// AssertRefusal checks a Stripe-shaped refusal.
func AssertRefusal(tb testing.TB, r reply, status int, code string) {
	tb.Helper()
	assert.Equal(tb, status, r.Status, "status; body %s", r.Raw)
	assert.Equal(tb, code, r.ErrCode(), "code; body %s", r.Raw)
	assert.Equal(tb, "application/json", r.Header.Get("Content-Type"))
	assert.True(tb, strings.HasPrefix(r.Header.Get("Request-Id"), "req_kb_"), "Request-Id %q", r.Header.Get("Request-Id"))
	assert.NotEmpty(tb, r.Header.Get("Stripe-Should-Retry"))
	assert.NotEmpty(tb, r.ErrType())
}

// StripeErr extracts the *stripe.Error of an SDK call.
func StripeErr(tb testing.TB, err error) *stripe.Error {
	tb.Helper()
	require.Error(tb, err)
	se, ok := err.(*stripe.Error)
	require.True(tb, ok, "not a *stripe.Error: %T %v", err, err)
	return se
}

// chargeParams are stripe-go params of a charge with an idempotency key.
func chargeParams(amount int64, currency, idem string) *stripe.ChargeCreateParams {
	p := &stripe.ChargeCreateParams{
		Amount:   stripe.Int64(amount),
		Currency: stripe.String(currency),
		Source:   &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
	}
	if idem != "" {
		p.SetIdempotencyKey(idem)
	}
	return p
}

// syncBuffer collects the proxy's log output.
type syncBuffer struct{ proxytest.Buffer }

// LogLines returns the decoded canonical log lines.
func (b *syncBuffer) LogLines(tb testing.TB) []map[string]any {
	tb.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(tb, json.Unmarshal([]byte(line), &m))
		if m["msg"] == "stripe request" {
			out = append(out, m)
		}
	}
	return out
}

// Request is what the fake Stripe saw of one request.
type Request = proxytest.Request

func stringsReader(s string) io.Reader { return strings.NewReader(s) }
