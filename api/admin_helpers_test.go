package api_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// adminTestNow is the fixed instant admin tests run at (both the store's and the
// API's clock), so windows and expiries are deterministic.
var adminTestNow = time.Date(2026, 9, 14, 12, 0, 0, 0, time.UTC)

// adminTestClock is a settable clock shared by the store and the handler.
type adminTestClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *adminTestClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *adminTestClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// adminLogBuffer collects log output from concurrent handlers.
type adminLogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *adminLogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *adminLogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// adminEnv is a real admin API on 127.0.0.1 over a real bbolt store in a temp dir.
type adminEnv struct {
	tb          testing.TB
	srv         *httptest.Server
	handler     http.Handler
	store       vault.Store
	dbPath      string
	masterKey   []byte
	secret      []byte
	clock       *adminTestClock
	logs        *adminLogBuffer
	adminToken  string
	viewerToken string

	// fake is the Stripe the proxy forwards to (unless adminEnvOptions.upstream
	// replaces it), proxyURL the proxy listener's base URL: money objects are
	// made through keybrake there, and refreshed through the admin API.
	fake        *proxytest.FakeStripe
	proxyURL    string
	stripe      *proxy.Proxy     // the proxy behind proxyURL
	upstreamSrv *httptest.Server // adminEnvOptions.upstream's server

	router routers.Router
}

// adminEnvOptions tweak MustAdminEnv.
type adminEnvOptions struct {
	publicURL string
	// upstream, when set, answers the proxy's requests to Stripe instead of the
	// fake, with upstreamTimeout (default 10 s) as the proxy's timeout.
	upstream        http.Handler
	upstreamTimeout time.Duration
}

// MustAdminEnv starts the admin API over a fresh store, with admin and viewer tokens
// issued at the test clock. Every response the helpers receive is checked against
// the OpenAPI document.
func MustAdminEnv(tb testing.TB, opts ...adminEnvOptions) *adminEnv {
	tb.Helper()
	var o adminEnvOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.publicURL == "" {
		o.publicURL = "http://127.0.0.1:8080"
	}
	env := &adminEnv{
		tb:        tb,
		dbPath:    filepath.Join(tb.TempDir(), "keybrake.db"),
		masterKey: bytes.Repeat([]byte{0x42}, 32),
		secret:    []byte("test-jwt-secret-0123456789abcdef-xyz"),
		clock:     &adminTestClock{now: adminTestNow},
		logs:      &adminLogBuffer{},
	}
	logger := slog.New(slog.NewJSONHandler(env.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	store, err := bolt.Open(env.dbPath, bolt.Options{MasterKey: env.masterKey, Now: env.clock.Now, Logger: logger})
	require.NoError(tb, err)
	env.store = store
	tb.Cleanup(func() { _ = store.Close() })

	env.fake = proxytest.NewFakeStripe(tb, testStripeSecret)
	upstreamURL := env.fake.URL
	if o.upstream != nil {
		env.upstreamSrv = httptest.NewServer(o.upstream)
		tb.Cleanup(env.upstreamSrv.Close)
		upstreamURL = env.upstreamSrv.URL
	}
	upstream, err := url.Parse(upstreamURL)
	require.NoError(tb, err)
	stripeProxy, err := proxy.New(proxy.Config{Store: store, Upstream: upstream, UpstreamTimeout: cmp.Or(o.upstreamTimeout, 10*time.Second),
		Now: env.clock.Now, Logger: logger})
	require.NoError(tb, err)
	proxySrv := httptest.NewServer(api.NewProxyListener(api.ProxyConfig{Store: store, Logger: logger, Stripe: stripeProxy, Now: env.clock.Now}))
	tb.Cleanup(proxySrv.Close)
	env.proxyURL = proxySrv.URL
	env.stripe = stripeProxy

	env.handler = api.NewAdmin(api.AdminConfig{
		Store:     store,
		Logger:    logger,
		JWTSecret: env.secret,
		PublicURL: o.publicURL,
		Now:       env.clock.Now,
		Stripe:    stripeProxy,
	})
	env.srv = httptest.NewServer(env.handler)
	tb.Cleanup(env.srv.Close)

	env.adminToken = env.MustToken("alice@example.com", api.RoleAdmin)
	env.viewerToken = env.MustToken("victor@example.com", api.RoleViewer)

	env.router = MustOpenAPIRouter(tb)
	return env
}

// openAPIRouter routes requests to the operations of api.OpenAPIDocument,
// loaded and validated once per test binary: the document is 220 KB, and
// loading it cost about 1.7 s of CPU under -race in each of the 70 test
// environments that check their answers against it. The document and its
// router are only read once built (kin-openapi keeps the patterns it
// compiles in a sync.Map), so the parallel tests share them.
var openAPIRouter = sync.OnceValues(func() (routers.Router, error) {
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPIDocument())
	if err != nil {
		return nil, fmt.Errorf("load the OpenAPI document: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("validate the OpenAPI document: %w", err)
	}
	return legacy.NewRouter(doc)
})

// MustOpenAPIRouter returns the shared router of api.OpenAPIDocument (see
// openAPIRouter).
func MustOpenAPIRouter(tb testing.TB) routers.Router {
	tb.Helper()
	r, err := openAPIRouter()
	require.NoError(tb, err)
	return r
}

// closeUpstream stops adminEnvOptions.upstream's server: Stripe is unreachable.
func (env *adminEnv) closeUpstream() { env.upstreamSrv.Close() }

// MustOpenAPIDoc loads and validates an OpenAPI document.
func MustOpenAPIDoc(tb testing.TB, data []byte) *openapi3.T {
	tb.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(data)
	require.NoError(tb, err)
	require.NoError(tb, doc.Validate(context.Background()))
	return doc
}

// MustToken issues an admin-API token at the test clock.
func (env *adminEnv) MustToken(sub, role string) string {
	env.tb.Helper()
	tok, err := api.IssueToken(env.secret, sub, role, time.Hour, env.clock.Now())
	require.NoError(env.tb, err)
	return tok
}

// adminResponse is what a request got back.
type adminResponse struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into a generic map.
func (r adminResponse) JSON(tb testing.TB) map[string]any {
	tb.Helper()
	var m map[string]any
	require.NoError(tb, json.Unmarshal(r.Body, &m), "body: %s", r.Body)
	return m
}

// Decode decodes the body into v.
func (r adminResponse) Decode(tb testing.TB, v any) {
	tb.Helper()
	require.NoError(tb, json.Unmarshal(r.Body, v), "body: %s", r.Body)
}

// Problem decodes a problem+json body and checks its media type and status.
func (r adminResponse) Problem(tb testing.TB) api.Problem {
	tb.Helper()
	assert.Equal(tb, api.ContentTypeProblem, r.Header.Get("Content-Type"), "body: %s", r.Body)
	var p api.Problem
	require.NoError(tb, json.Unmarshal(r.Body, &p), "body: %s", r.Body)
	assert.Equal(tb, r.Status, p.Status)
	assert.NotEmpty(tb, p.Type)
	assert.NotEmpty(tb, p.Title)
	return p
}

// ErrorFields returns the field names of a problem's errors.
func (r adminResponse) ErrorFields(tb testing.TB) []string {
	tb.Helper()
	p := r.Problem(tb)
	fields := make([]string, 0, len(p.Errors))
	for _, e := range p.Errors {
		fields = append(fields, e.Field)
	}
	return fields
}

// Do sends a request with the given token ("" for none) and body (nil, a string sent
// as is, or a value encoded as JSON).
func (env *adminEnv) Do(method, path, token string, body any, header ...string) adminResponse {
	env.tb.Helper()
	hdr := http.Header{}
	if token != "" {
		hdr.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		hdr.Set(header[i], header[i+1])
	}
	return env.DoRaw(method, path, hdr, body)
}

// DoRaw sends a request with exactly the given headers.
func (env *adminEnv) DoRaw(method, path string, hdr http.Header, body any) adminResponse {
	env.tb.Helper()
	var rd io.Reader
	var raw []byte
	switch b := body.(type) {
	case nil:
	case string:
		raw = []byte(b)
	case []byte:
		raw = b
	default:
		var err error
		raw, err = json.Marshal(b)
		require.NoError(env.tb, err)
	}
	if raw != nil {
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, env.srv.URL+path, rd)
	require.NoError(env.tb, err)
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	if raw != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := env.srv.Client().Do(req)
	require.NoError(env.tb, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(env.tb, err)
	out := adminResponse{Status: resp.StatusCode, Header: resp.Header, Body: got}
	env.checkAgainstOpenAPI(req, raw, out)
	return out
}

// checkAgainstOpenAPI validates a response of a documented route against the
// OpenAPI document: its status must be documented and its body must match. A request
// the server accepted (2xx) must match the document too.
func (env *adminEnv) checkAgainstOpenAPI(req *http.Request, body []byte, resp adminResponse) {
	env.tb.Helper()
	route, params, err := env.router.FindRoute(req)
	if err != nil {
		return // not a documented route (404/405 tests)
	}
	if resp.Status < 300 {
		in := &openapi3filter.RequestValidationInput{
			Request:    req.Clone(context.Background()),
			PathParams: params,
			Route:      route,
			Options:    &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true},
		}
		in.Request.Body = io.NopCloser(bytes.NewReader(body))
		err := openapi3filter.ValidateRequest(context.Background(), in)
		assert.NoError(env.tb, err, "%s %s was accepted (%d) but does not match the OpenAPI document; body: %s",
			req.Method, req.URL.Path, resp.Status, truncate(body))
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request:    req,
			PathParams: params,
			Route:      route,
			Options:    &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status:  resp.Status,
		Header:  resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(resp.Body)
	err = openapi3filter.ValidateResponse(context.Background(), in)
	assert.NoError(env.tb, err, "%s %s → %d does not match the OpenAPI document; body: %s",
		req.Method, req.URL.Path, resp.Status, truncate(resp.Body))
}

func truncate(b []byte) string {
	if len(b) > 600 {
		return string(b[:600]) + "…"
	}
	return string(b)
}

// seedLegacyPolicy is the seed's literal legacy policy, with an expiry after the
// test clock.
const seedLegacyPolicy = `{"vendor":"stripe","daily_usd_cap":99,"period_usd_cap":110,"expires_at":"2026-10-01T00:00:00Z"}`

// testStripeSecret is the upstream secret every test registers.
const testStripeSecret = "sk_test_51KeybrakeSECRETdoNotLeak9f3a"

// MustUpstream registers the upstream name.
func (env *adminEnv) MustUpstream(name string) {
	env.tb.Helper()
	r := env.Do(http.MethodPost, "/api/v1/upstreams", env.adminToken,
		map[string]string{"name": name, "vendor": "stripe", "secret": testStripeSecret})
	require.Contains(env.tb, []int{http.StatusCreated, http.StatusOK}, r.Status, "body: %s", r.Body)
}

// mintedKey is the part of a mint answer tests use.
type mintedKey struct {
	ID       string            `json:"id"`
	Name     string            `json:"name"`
	Token    string            `json:"token"`
	BaseURL  string            `json:"base_url"`
	Status   string            `json:"status"`
	Upstream string            `json:"upstream"`
	Labels   map[string]string `json:"labels"`
	Policy   map[string]any    `json:"policy"`
}

// MustMint mints a key with the given name, labels and raw policy JSON on upstream
// ("" for the default).
func (env *adminEnv) MustMint(name, upstream string, labels map[string]string, policyJSON string) mintedKey {
	env.tb.Helper()
	body := map[string]any{"name": name, "policy": json.RawMessage(policyJSON)}
	if upstream != "" {
		body["upstream"] = upstream
	}
	if labels != nil {
		body["labels"] = labels
	}
	r := env.Do(http.MethodPost, "/api/v1/keys", env.adminToken, body)
	require.Equal(env.tb, http.StatusCreated, r.Status, "body: %s", r.Body)
	var k mintedKey
	r.Decode(env.tb, &k)
	return k
}

// MustHold places a hold of amount cents (usd) on key through the store, as the proxy
// would, and settles it with outcome ("" leaves it held).
func (env *adminEnv) MustHold(keyID, idemKey string, amount int64, outcome vault.SettleOutcome) {
	env.tb.Helper()
	ctx := context.Background()
	res, err := env.store.Reserve(ctx, vault.ReserveRequest{
		KeyID:          keyID,
		IdempotencyKey: idemKey,
		Fingerprint:    "fp-" + idemKey,
		Request:        policy.Request{Operation: "charges.create", Amount: amount, Currency: "usd"},
		Metered:        true,
	})
	require.NoError(env.tb, err)
	require.Equal(env.tb, vault.ReserveClaimed, res.Outcome, "decision: %+v", res.Decision)
	if outcome == "" {
		return
	}
	req := vault.SettleRequest{KeyID: keyID, IdempotencyKey: idemKey, Outcome: outcome, Amount: amount, UpstreamStatus: http.StatusOK}
	switch outcome {
	case vault.SettleCommit, vault.SettleRelease:
		req.Response = &vault.StoredResponse{Status: http.StatusOK, Header: http.Header{}, Body: []byte(`{"id":"ch_1"}`)}
		req.StripeRequestID = "req_test_" + idemKey
		req.ObjectID = "ch_" + idemKey
	case vault.SettleUnknown:
		req.UpstreamStatus = 0
	}
	require.NoError(env.tb, env.store.Settle(ctx, req))
}

// usageWindow is one window of a usage answer.
type usageWindow struct {
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	Cap       *string   `json:"cap"`
	Committed string    `json:"committed"`
	Held      string    `json:"held"`
	Remaining *string   `json:"remaining"`
	ResetAt   time.Time `json:"reset_at"`
}

// usageAnswer is GET /api/v1/keys/{id}/usage.
type usageAnswer struct {
	Currency   string      `json:"currency"`
	Daily      usageWindow `json:"daily"`
	Period     usageWindow `json:"period"`
	PerRequest struct {
		Cap *string `json:"cap"`
	} `json:"per_request"`
}

// MustUsage reads a key's usage.
func (env *adminEnv) MustUsage(keyID string) usageAnswer {
	env.tb.Helper()
	r := env.Do(http.MethodGet, "/api/v1/keys/"+keyID+"/usage", env.adminToken, nil)
	require.Equal(env.tb, http.StatusOK, r.Status, "body: %s", r.Body)
	var u usageAnswer
	r.Decode(env.tb, &u)
	return u
}

// strp returns a pointer to s.
func strp(s string) *string { return &s }

// containsAny reports which of needles occur in hay.
func containsAny(hay string, needles map[string]string) []string {
	var found []string
	for name, n := range needles {
		if n != "" && strings.Contains(hay, n) {
			found = append(found, name)
		}
	}
	return found
}
