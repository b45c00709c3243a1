package api_test

import (
	"bytes"
	"context"
	"encoding/base64"
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

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// agentEnv is the real proxy listener (metering proxy and agent endpoints) on
// 127.0.0.1 over a real bbolt store in a temp dir, in front of a fake Stripe. The
// store, the proxy and the agent endpoints share one settable clock.
type agentEnv struct {
	tb     testing.TB
	store  vault.Store
	clock  *adminTestClock
	fake   *proxytest.FakeStripe
	proxy  *proxy.Proxy
	srv    *httptest.Server
	logs   *adminLogBuffer
	router routers.Router
	tokens []string
	// registry holds the metrics of the store and the proxy, wired as serve
	// wires them.
	registry *prometheus.Registry
	metrics  *api.Metrics
}

// MustAgentEnv starts the proxy listener with the agent endpoints mounted. Every
// answer of a documented agent route is checked against the OpenAPI document, and
// the cleanup checks that no token or upstream secret reached the logs.
func MustAgentEnv(tb testing.TB) *agentEnv {
	tb.Helper()
	env := &agentEnv{tb: tb, clock: &adminTestClock{now: adminTestNow}, logs: &adminLogBuffer{}}
	logger := slog.New(slog.NewJSONHandler(env.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	env.registry = prometheus.NewRegistry()
	metrics, err := api.NewMetrics(env.registry, metricsTestVersion)
	require.NoError(tb, err)
	env.metrics = metrics
	store, err := bolt.Open(filepath.Join(tb.TempDir(), "keybrake.db"), bolt.Options{
		MasterKey: bytes.Repeat([]byte{0x24}, 32), Now: env.clock.Now, Logger: logger,
		CommitObserver: metrics.ObserveCommit,
	})
	require.NoError(tb, err)
	env.store = store
	require.NoError(tb, metrics.WatchStore(store, slog.Default()))
	tb.Cleanup(func() {
		assert.NoError(tb, store.CheckInvariant(context.Background()))
		assert.NoError(tb, store.Close())
	})

	env.fake = proxytest.NewFakeStripe(tb, testStripeSecret)
	_, _, err = store.PutUpstream(context.Background(), "tester", "default", "stripe", testStripeSecret)
	require.NoError(tb, err)
	upstream, err := url.Parse(env.fake.URL)
	require.NoError(tb, err)
	p, err := proxy.New(proxy.Config{
		Store: store, Upstream: upstream, UpstreamTimeout: 10 * time.Second, Now: env.clock.Now, Logger: logger,
		Registerer: env.registry,
	})
	require.NoError(tb, err)
	env.proxy = p

	h := api.NewProxyListener(api.ProxyConfig{Store: store, Logger: logger, Stripe: p, Now: env.clock.Now})
	env.srv = httptest.NewServer(h)
	tb.Cleanup(env.srv.Close)

	env.router = MustOpenAPIRouter(tb)

	tb.Cleanup(func() {
		logs := env.logs.String()
		assert.NotContains(tb, logs, testStripeSecret, "the upstream secret reached the logs")
		for _, tok := range env.tokens {
			assert.NotContains(tb, logs, tok, "a vault token reached the logs")
		}
	})
	return env
}

// MustKey mints a key on the default upstream with a policy in JSON (canonical or
// legacy form) and returns it with its token.
func (env *agentEnv) MustKey(name, policyJSON string, labels map[string]string) (vault.Key, string) {
	env.tb.Helper()
	var p policy.Policy
	require.NoError(env.tb, json.Unmarshal([]byte(policyJSON), &p))
	k, tok, err := env.store.MintKey(context.Background(), "tester", vault.MintRequest{
		Name: name, Upstream: "default", Labels: labels, Policy: p,
	})
	require.NoError(env.tb, err)
	env.tokens = append(env.tokens, tok)
	return k, tok
}

// Stripe is the real stripe-go client pointed at the proxy listener with token.
func (env *agentEnv) Stripe(token string) *stripe.Client {
	return stripe.NewClient(token, stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(env.srv.URL),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
}

// Do sends a request with the vault key as a bearer token ("" for none) and body
// (nil, a string sent as is, or a value encoded as JSON).
func (env *agentEnv) Do(method, path, token string, body any) adminResponse {
	env.tb.Helper()
	hdr := http.Header{}
	if token != "" {
		hdr.Set("Authorization", "Bearer "+token)
	}
	r, err := env.Try(method, path, hdr, body)
	require.NoError(env.tb, err)
	return r
}

// Try sends a request with exactly the given headers; it does not stop the test, so
// goroutines may call it.
func (env *agentEnv) Try(method, path string, hdr http.Header, body any) (adminResponse, error) {
	var raw []byte
	switch b := body.(type) {
	case nil:
	case string:
		raw = []byte(b)
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			return adminResponse{}, err
		}
	}
	var rd io.Reader
	if raw != nil {
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, env.srv.URL+path, rd)
	if err != nil {
		return adminResponse{}, err
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	if raw != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := env.srv.Client().Do(req)
	if err != nil {
		return adminResponse{}, err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return adminResponse{}, err
	}
	out := adminResponse{Status: resp.StatusCode, Header: resp.Header, Body: got}
	env.checkAgainstOpenAPI(req, raw, out)
	return out, nil
}

// checkAgainstOpenAPI validates an answer of a documented agent route against the
// document (status documented, body matching), and an accepted request too.
func (env *agentEnv) checkAgainstOpenAPI(req *http.Request, body []byte, resp adminResponse) {
	route, params, err := env.router.FindRoute(req)
	if err != nil {
		return // not a documented route (404/405 tests, keys with an escaped /)
	}
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}
	if resp.Status < 300 {
		in := &openapi3filter.RequestValidationInput{Request: req.Clone(context.Background()), PathParams: params, Route: route, Options: opts}
		in.Request.Body = io.NopCloser(bytes.NewReader(body))
		assert.NoError(env.tb, openapi3filter.ValidateRequest(context.Background(), in),
			"%s %s was accepted (%d) but does not match the OpenAPI document; body: %s", req.Method, req.URL.Path, resp.Status, truncate(body))
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts},
		Status:                 resp.Status,
		Header:                 resp.Header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(resp.Body)
	assert.NoError(env.tb, openapi3filter.ValidateResponse(context.Background(), in),
		"%s %s → %d does not match the OpenAPI document; body: %s", req.Method, req.URL.Path, resp.Status, truncate(resp.Body))
}

// claimAnswer is a claims API answer.
type claimAnswer struct {
	Status         string          `json:"status"`
	Key            string          `json:"key"`
	Fingerprint    string          `json:"fingerprint"`
	LeaseExpiresAt *time.Time      `json:"lease_expires_at"`
	FencingToken   *uint64         `json:"fencing_token"`
	Result         json.RawMessage `json:"result"`
	CreatedAt      *time.Time      `json:"created_at"`
	CompletedAt    *time.Time      `json:"completed_at"`
}

func (r adminResponse) Claim(tb testing.TB) claimAnswer {
	tb.Helper()
	var a claimAnswer
	r.Decode(tb, &a)
	return a
}

// claimPath is the URL path of a claim key.
func claimPath(key string, action ...string) string {
	p := "/keybrake/v1/claims/" + url.PathEscape(key)
	for _, a := range action {
		p += "/" + a
	}
	return p
}

// MustClaim claims key and requires 201; it returns the fencing token.
func (env *agentEnv) MustClaim(token, key, fingerprint string, leaseSeconds int) uint64 {
	env.tb.Helper()
	body := map[string]any{"key": key, "fingerprint": fingerprint}
	if leaseSeconds > 0 {
		body["lease_seconds"] = leaseSeconds
	}
	r := env.Do(http.MethodPost, "/keybrake/v1/claims", token, body)
	require.Equal(env.tb, http.StatusCreated, r.Status, "body: %s", r.Body)
	a := r.Claim(env.tb)
	require.Equal(env.tb, "claimed", a.Status)
	require.NotNil(env.tb, a.FencingToken)
	return *a.FencingToken
}

// seedPolicy is the seed's legacy policy (99 usd a day, 110 usd a period) valid at
// adminTestNow.
const seedPolicy = seedLegacyPolicy

func TestAgentAuthentication(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	_, tok := env.MustKey("auth", seedPolicy, nil)
	revoked, revokedTok := env.MustKey("revoked", seedPolicy, nil)
	_, err := env.store.RevokeKey(context.Background(), "tester", revoked.ID)
	require.NoError(t, err)
	_, unknownTok := env.MustKey("unknown", seedPolicy, nil)
	unknown, err := env.store.Authenticate(context.Background(), unknownTok)
	require.NoError(t, err)
	_, _, err = env.store.RotateKey(context.Background(), "tester", unknown.ID) // the old token is unknown now
	require.NoError(t, err)

	basic := func(user string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":")) }
	tests := map[string]struct {
		auth   []string
		status int
		detail string
	}{
		"bearer":                  {[]string{"Bearer " + tok}, http.StatusOK, ""},
		"basic user name":         {[]string{basic(tok)}, http.StatusOK, ""},
		"lower-case scheme":       {[]string{"bearer " + tok}, http.StatusOK, ""},
		"none":                    {nil, http.StatusUnauthorized, "missing Authorization"},
		"empty bearer":            {[]string{"Bearer "}, http.StatusUnauthorized, "the vault key is empty"},
		"basic without user":      {[]string{basic("")}, http.StatusUnauthorized, "the vault key is empty"},
		"other scheme":            {[]string{"Token " + tok}, http.StatusUnauthorized, "invalid Authorization"},
		"two headers":             {[]string{"Bearer " + tok, "Bearer " + tok}, http.StatusUnauthorized, "more than one"},
		"malformed token":         {[]string{"Bearer vk_nope"}, http.StatusUnauthorized, "it was cut short"},
		"jq's null":               {[]string{"Bearer null"}, http.StatusUnauthorized, `the vault key is the word "null"`},
		"unknown (rotated away)":  {[]string{"Bearer " + unknownTok}, http.StatusUnauthorized, "invalid vault key"},
		"revoked":                 {[]string{"Bearer " + revokedTok}, http.StatusUnauthorized, "revoked"},
		"an admin JWT":            {[]string{"Bearer eyJhbGciOiJIUzI1NiJ9.e30.x"}, http.StatusUnauthorized, "an admin API token"},
		"a Stripe secret key":     {[]string{"Bearer sk_live_51Hsecretsecret"}, http.StatusUnauthorized, "This is a Stripe secret key, not a vault key"},
		"a Stripe restricted key": {[]string{basic("rk_test_51Hsecretsecret")}, http.StatusUnauthorized, "This is a Stripe secret key, not a vault key"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for _, path := range []string{"/keybrake/v1/me", claimPath("job")} {
				r, err := env.Try(http.MethodGet, path, http.Header{"Authorization": tc.auth}, nil)
				require.NoError(t, err)
				if tc.status == http.StatusOK {
					if path == "/keybrake/v1/me" {
						assert.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
					} else {
						assert.Equal(t, http.StatusNotFound, r.Status, "authenticated, no such claim; body: %s", r.Body)
					}
					continue
				}
				assert.Equal(t, tc.status, r.Status, "body: %s", r.Body)
				p := r.Problem(t)
				assert.Equal(t, api.ProblemUnauthorized, p.Type)
				assert.Contains(t, p.Detail, tc.detail)
				assert.Equal(t, `Bearer realm="keybrake"`, r.Header.Get("WWW-Authenticate"))
				assert.Equal(t, "no-store", r.Header.Get("Cache-Control"))
			}
		})
	}

	logs := env.logs.String()
	assert.Contains(t, logs, `"level":"WARN","msg":"a Stripe secret key was sent instead of a vault key"`)
	assert.Contains(t, logs, `"stripe_key_kind":"rk_test"`)
	assert.NotContains(t, logs, "51Hsecretsecret", "never the key itself")

	t.Run("expired", func(t *testing.T) {
		env.clock.Set(time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC))
		t.Cleanup(func() { env.clock.Set(adminTestNow) })
		r := env.Do(http.MethodPost, "/keybrake/v1/claims", tok, map[string]any{"key": "k", "fingerprint": "f"})
		assert.Equal(t, http.StatusUnauthorized, r.Status)
		assert.Contains(t, r.Problem(t).Detail, "expired")
	})

	t.Run("revoked while owning a claim", func(t *testing.T) {
		other, otherTok := env.MustKey("racer", seedPolicy, nil)
		fencing := env.MustClaim(otherTok, "job", "fp", 0)
		_, err := env.store.RevokeKey(context.Background(), "tester", other.ID)
		require.NoError(t, err)
		r := env.Do(http.MethodPost, claimPath("job", "complete"), otherTok, map[string]any{"result": 1, "fencing_token": fencing})
		assert.Equal(t, http.StatusUnauthorized, r.Status)
	})
}

func TestAgentMe(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	labels := map[string]string{"customer_id": "cust_123", "billing_period": "2026-09"}
	key, tok := env.MustKey("vault_key_cust_123_2026_09", `{
		"vendor": "stripe", "currency": "usd",
		"daily_cap": "99.00", "period_cap": "110.00", "per_request_cap": "80.00",
		"period_start": "2026-09-01T00:00:00Z", "expires_at": "2026-10-01T00:00:00Z",
		"timezone": "Europe/Berlin",
		"operations": ["charges.create", "*.read"]
	}`, labels)

	r := env.Do(http.MethodGet, "/keybrake/v1/me", tok, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var me struct {
		ID       string            `json:"id"`
		Name     string            `json:"name"`
		Labels   map[string]string `json:"labels"`
		Status   string            `json:"status"`
		Policy   map[string]any    `json:"policy"`
		Currency string            `json:"currency"`
		Windows  struct {
			Daily      usageWindow `json:"daily"`
			Period     usageWindow `json:"period"`
			PerRequest struct {
				Cap *string `json:"cap"`
			} `json:"per_request"`
		} `json:"windows"`
	}
	r.Decode(t, &me)
	assert.Equal(t, key.ID, me.ID)
	assert.Equal(t, "vault_key_cust_123_2026_09", me.Name)
	assert.Equal(t, labels, me.Labels)
	assert.Equal(t, "active", me.Status)
	assert.Equal(t, "usd", me.Currency)
	assert.Equal(t, "99.00", me.Policy["daily_cap"])
	assert.Equal(t, "Europe/Berlin", me.Policy["timezone"])
	assert.Equal(t, []any{"charges.create", "*.read"}, me.Policy["operations"])
	assert.Equal(t, strp("99.00"), me.Windows.Daily.Cap)
	assert.Equal(t, "0.00", me.Windows.Daily.Committed)
	assert.Equal(t, strp("99.00"), me.Windows.Daily.Remaining)
	berlinMidnight := time.Date(2026, 9, 15, 0, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	assert.True(t, berlinMidnight.Equal(me.Windows.Daily.ResetAt), "the day resets at midnight in Berlin: %s", me.Windows.Daily.ResetAt)
	assert.Equal(t, strp("110.00"), me.Windows.Period.Cap)
	assert.True(t, time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC).Equal(me.Windows.Period.ResetAt))
	assert.Equal(t, strp("80.00"), me.Windows.PerRequest.Cap)

	// The admin API's usage view and /me agree: one view, written once.
	admin := api.NewAdmin(api.AdminConfig{Store: env.store, JWTSecret: []byte("s"), Now: env.clock.Now, Logger: slog.New(slog.DiscardHandler)})
	adminTok, err := api.IssueToken([]byte("s"), "alice", api.RoleViewer, time.Hour, env.clock.Now())
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/api/v1/keys/"+key.ID+"/usage", nil)
	req.Header.Set("Authorization", "Bearer "+adminTok)
	admin.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	var usage map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &usage))
	var meRaw struct {
		Windows map[string]json.RawMessage `json:"windows"`
	}
	r.Decode(t, &meRaw)
	for _, w := range []string{"daily", "period", "per_request"} {
		assert.JSONEq(t, string(usage[w]), string(meRaw.Windows[w]), w)
	}

	// Never the token, its hash, or anything of the upstream secret.
	body := string(r.Body)
	for name, secret := range map[string]string{
		"token": tok, "token hash": key.TokenHash, "token prefix": key.TokenPrefix,
		"upstream secret": testStripeSecret, "secret's last 4": testStripeSecret[len(testStripeSecret)-4:],
	} {
		assert.NotContains(t, body, secret, name)
	}
	assert.NotContains(t, body, `"token`)
	assert.NotContains(t, body, `"upstream`)
}

func TestAgentMeShowsUsageAfterACharge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := MustAgentEnv(t)
	_, tok := env.MustKey("charged", seedPolicy, nil)
	sc := env.Stripe(tok)

	ch, err := sc.V1Charges.Create(ctx, &stripe.ChargeCreateParams{
		Amount: stripe.Int64(6000), Currency: stripe.String("usd"),
		Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
	})
	require.NoError(t, err)
	require.NotEmpty(t, ch.ID)

	var me struct {
		Windows struct {
			Daily  usageWindow `json:"daily"`
			Period usageWindow `json:"period"`
		} `json:"windows"`
	}
	r := env.Do(http.MethodGet, "/keybrake/v1/me", tok, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	r.Decode(t, &me)
	assert.Equal(t, "60.00", me.Windows.Daily.Committed)
	assert.Equal(t, "0.00", me.Windows.Daily.Held)
	assert.Equal(t, strp("39.00"), me.Windows.Daily.Remaining)
	assert.Equal(t, "60.00", me.Windows.Period.Committed)
	assert.Equal(t, strp("50.00"), me.Windows.Period.Remaining)
	assert.Len(t, env.fake.Charges(), 1)
}

func TestClaimTwoCallersExactlyOneWins(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	_, tok := env.MustKey("race", seedPolicy, nil)
	for round := range 5 {
		key := fmt.Sprintf("job-%d", round)
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			got   [2]adminResponse
			errs  [2]error
		)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				got[i], errs[i] = env.Try(http.MethodPost, "/keybrake/v1/claims",
					http.Header{"Authorization": {"Bearer " + tok}}, map[string]any{"key": key, "fingerprint": "fp"})
			}()
		}
		close(start)
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		statuses := []int{got[0].Status, got[1].Status}
		assert.ElementsMatch(t, []int{http.StatusCreated, http.StatusConflict}, statuses, "exactly one claim wins")
		for _, r := range got {
			if r.Status == http.StatusConflict {
				p := r.Problem(t)
				assert.Equal(t, api.ProblemClaimInProgress, p.Type)
				assert.Equal(t, "60", r.Header.Get("Retry-After"), "the default lease is 60 s")
			}
		}
	}
}

func TestClaimLapsedLeaseIsReclaimedByExactlyOne(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	_, tok := env.MustKey("reclaim", seedPolicy, nil)
	old := env.MustClaim(tok, "nightly-run", "fp", 5)

	env.clock.Set(adminTestNow.Add(3 * time.Second))
	r := env.Do(http.MethodPost, "/keybrake/v1/claims", tok, map[string]any{"key": "nightly-run", "fingerprint": "fp"})
	require.Equal(t, http.StatusConflict, r.Status)
	assert.Equal(t, "2", r.Header.Get("Retry-After"), "seconds until the lease lapses")

	env.clock.Set(adminTestNow.Add(5 * time.Second))
	const callers = 16
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		start   = make(chan struct{})
		winners []uint64
		busy    int
	)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := env.Try(http.MethodPost, "/keybrake/v1/claims", http.Header{"Authorization": {"Bearer " + tok}},
				map[string]any{"key": "nightly-run", "fingerprint": "fp", "lease_seconds": 30})
			if !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch r.Status {
			case http.StatusCreated:
				var a claimAnswer
				if assert.NoError(t, json.Unmarshal(r.Body, &a)) && assert.NotNil(t, a.FencingToken) {
					winners = append(winners, *a.FencingToken)
				}
			case http.StatusConflict:
				busy++
			default:
				t.Errorf("unexpected status %d: %s", r.Status, r.Body)
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Len(t, winners, 1, "exactly one caller takes the lapsed lease over")
	assert.Equal(t, callers-1, busy)
	owner := winners[0]
	assert.Greater(t, owner, old, "the new owner's fencing token is higher")

	stale := env.Do(http.MethodPost, claimPath("nightly-run", "complete"), tok, map[string]any{"result": "late", "fencing_token": old})
	assert.Equal(t, http.StatusConflict, stale.Status)
	assert.Equal(t, api.ProblemClaimNotOwner, stale.Problem(t).Type)
	stale = env.Do(http.MethodPost, claimPath("nightly-run", "release"), tok, map[string]any{"fencing_token": old})
	assert.Equal(t, http.StatusConflict, stale.Status, "the stale owner cannot release either")

	done := env.Do(http.MethodPost, claimPath("nightly-run", "complete"), tok,
		map[string]any{"result": map[string]any{"invoices": 12}, "fencing_token": owner})
	require.Equal(t, http.StatusOK, done.Status, "body: %s", done.Body)
	a := done.Claim(t)
	assert.Equal(t, "completed", a.Status)
	assert.JSONEq(t, `{"invoices":12}`, string(a.Result))
	assert.Nil(t, a.FencingToken)

	replay := env.Do(http.MethodPost, "/keybrake/v1/claims", tok, map[string]any{"key": "nightly-run", "fingerprint": "fp"})
	require.Equal(t, http.StatusOK, replay.Status)
	assert.JSONEq(t, `{"invoices":12}`, string(replay.Claim(t).Result))
}

func TestClaimCompletedReplaysAndMismatchIs422(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	_, tok := env.MustKey("replay", seedPolicy, nil)

	fencing := env.MustClaim(tok, "invoice-42", "sha256:aaa", 0)
	r := env.Do(http.MethodPost, "/keybrake/v1/claims", tok, map[string]any{"key": "invoice-42", "fingerprint": "sha256:bbb"})
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status, "in progress, other fingerprint")
	assert.Equal(t, api.ProblemClaimFingerprintMismatch, r.Problem(t).Type)

	got := env.Do(http.MethodGet, claimPath("invoice-42"), tok, nil)
	require.Equal(t, http.StatusOK, got.Status)
	g := got.Claim(t)
	assert.Equal(t, "in_progress", g.Status)
	assert.Equal(t, "sha256:aaa", g.Fingerprint)
	require.NotNil(t, g.LeaseExpiresAt)
	assert.True(t, adminTestNow.Add(api.DefaultClaimLease).Equal(*g.LeaseExpiresAt))
	assert.Nil(t, g.FencingToken, "the token is only ever shown to its owner")

	done := env.Do(http.MethodPost, claimPath("invoice-42", "complete"), tok, map[string]any{"result": nil, "fencing_token": fencing})
	require.Equal(t, http.StatusOK, done.Status, "a null result is a result; body: %s", done.Body)
	again := env.Do(http.MethodPost, claimPath("invoice-42", "complete"), tok, map[string]any{"result": nil, "fencing_token": fencing})
	assert.Equal(t, http.StatusOK, again.Status, "the owner's retry is harmless")
	other := env.Do(http.MethodPost, claimPath("invoice-42", "complete"), tok, map[string]any{"result": 7, "fencing_token": fencing})
	assert.Equal(t, http.StatusConflict, other.Status, "a completed claim keeps its result")

	replay := env.Do(http.MethodPost, "/keybrake/v1/claims", tok, map[string]any{"key": "invoice-42", "fingerprint": "sha256:aaa"})
	require.Equal(t, http.StatusOK, replay.Status)
	a := replay.Claim(t)
	assert.Equal(t, "completed", a.Status)
	assert.JSONEq(t, `null`, string(a.Result))
	assert.Contains(t, string(replay.Body), `"result":null`)
	require.NotNil(t, a.CompletedAt)

	r = env.Do(http.MethodPost, "/keybrake/v1/claims", tok, map[string]any{"key": "invoice-42", "fingerprint": "sha256:bbb"})
	assert.Equal(t, http.StatusUnprocessableEntity, r.Status, "completed, other fingerprint")
	assert.Equal(t, api.ProblemClaimFingerprintMismatch, r.Problem(t).Type)

	rel := env.Do(http.MethodPost, claimPath("invoice-42", "release"), tok, map[string]any{"fencing_token": fencing})
	assert.Equal(t, http.StatusConflict, rel.Status, "a completed claim cannot be released")
}

func TestClaimRelease(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	_, tok := env.MustKey("release", seedPolicy, nil)
	first := env.MustClaim(tok, "flaky", "fp", 0)

	r := env.Do(http.MethodPost, claimPath("flaky", "release"), tok, map[string]any{"fencing_token": first})
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	assert.Equal(t, claimAnswer{Status: "released", Key: "flaky"}, r.Claim(t))
	assert.Equal(t, http.StatusNotFound, env.Do(http.MethodGet, claimPath("flaky"), tok, nil).Status)
	assert.Equal(t, http.StatusNotFound,
		env.Do(http.MethodPost, claimPath("flaky", "release"), tok, map[string]any{"fencing_token": first}).Status)

	second := env.MustClaim(tok, "flaky", "fp", 0)
	assert.Greater(t, second, first, "released work is claimed again at once, under a new token")
	r = env.Do(http.MethodPost, claimPath("flaky", "complete"), tok, map[string]any{"result": "x", "fencing_token": first})
	assert.Equal(t, http.StatusConflict, r.Status, "the released owner is a stale owner")
}

func TestClaimsOfTwoVaultKeysNeverMeet(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	_, tokA := env.MustKey("a", seedPolicy, nil)
	_, tokB := env.MustKey("b", seedPolicy, nil)

	fa := env.MustClaim(tokA, "shared-job", "fp-a", 0)
	fb := env.MustClaim(tokB, "shared-job", "fp-b", 0)

	r := env.Do(http.MethodPost, claimPath("shared-job", "complete"), tokB, map[string]any{"result": "a's", "fencing_token": fa})
	assert.Equal(t, http.StatusConflict, r.Status, "A's token does not complete B's claim")
	r = env.Do(http.MethodPost, claimPath("shared-job", "complete"), tokA, map[string]any{"result": "a's", "fencing_token": fa})
	require.Equal(t, http.StatusOK, r.Status)

	b := env.Do(http.MethodGet, claimPath("shared-job"), tokB, nil).Claim(t)
	assert.Equal(t, "in_progress", b.Status, "B's claim is untouched")
	assert.Equal(t, "fp-b", b.Fingerprint)
	a := env.Do(http.MethodGet, claimPath("shared-job"), tokA, nil).Claim(t)
	assert.Equal(t, "completed", a.Status)

	only := env.Do(http.MethodGet, claimPath("only-a"), tokB, nil)
	env.MustClaim(tokA, "only-a", "fp", 0)
	assert.Equal(t, http.StatusNotFound, only.Status)
	assert.Equal(t, http.StatusNotFound, env.Do(http.MethodGet, claimPath("only-a"), tokB, nil).Status,
		"B does not see A's claims")
	assert.NotEqual(t, fa, fb, "each claim has its own owner token")
}

func TestClaimKeysInThePath(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	_, tok := env.MustKey("paths", seedPolicy, nil)
	for name, key := range map[string]string{
		"slash and spaces": "billing/2026-09/cus 123",
		"percent":          "100% done",
		"plus and query":   "a+b?c=d#e",
		"unicode":          "счёт/2026-09 ✓",
		"dots":             "../..",
		"255 characters":   strings.Repeat("x", 255),
	} {
		t.Run(name, func(t *testing.T) {
			r := env.Do(http.MethodPost, "/keybrake/v1/claims", tok, map[string]any{"key": key, "fingerprint": "fp"})
			require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
			a := r.Claim(t)
			assert.Equal(t, key, a.Key)
			assert.Equal(t, claimPath(key), r.Header.Get("Location"))

			got := env.Do(http.MethodGet, claimPath(key), tok, nil)
			require.Equal(t, http.StatusOK, got.Status, "body: %s", got.Body)
			assert.Equal(t, key, got.Claim(t).Key)
			done := env.Do(http.MethodPost, claimPath(key, "complete"), tok, map[string]any{"result": key, "fencing_token": *a.FencingToken})
			require.Equal(t, http.StatusOK, done.Status, "body: %s", done.Body)
			assert.JSONEq(t, fmt.Sprintf("%q", key), string(done.Claim(t).Result))
		})
	}

	t.Run("an unescaped slash is another path", func(t *testing.T) {
		env.MustClaim(tok, "a/b", "fp", 0)
		r := env.Do(http.MethodGet, "/keybrake/v1/claims/a/b", tok, nil)
		assert.Equal(t, http.StatusNotFound, r.Status)
		r.Problem(t)
	})
	t.Run("badly escaped", func(t *testing.T) {
		resp := MustRawRequest(t, env.srv.Listener.Addr().String(), "GET /keybrake/v1/claims/a%2Fb%zz HTTP/1.1",
			map[string]string{"Authorization": "Bearer " + tok}, "")
		// net/http refuses the request line itself; the handler's own check is a
		// second line of defence.
		assert.Equal(t, http.StatusBadRequest, resp.Status, resp.Body)
	})
	t.Run("raw request with %2F", func(t *testing.T) {
		resp := MustRawRequest(t, env.srv.Listener.Addr().String(), "GET /keybrake/v1/claims/a%2Fb HTTP/1.1",
			map[string]string{"Authorization": "Bearer " + tok}, "")
		require.Equal(t, http.StatusOK, resp.Status, resp.Body)
		assert.Contains(t, resp.Body, `"key":"a/b"`)
	})
}

func TestClaimValidation(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	_, tok := env.MustKey("validation", seedPolicy, nil)
	fencing := env.MustClaim(tok, "job", "fp", 0)

	tests := map[string]struct {
		method, path string
		body         any
		contentType  string
		status       int
		problemType  string
		field        string
	}{
		"missing key":             {"POST", "/keybrake/v1/claims", map[string]any{"fingerprint": "fp"}, "", 400, api.ProblemMalformed, ""},
		"empty key":               {"POST", "/keybrake/v1/claims", map[string]any{"key": "", "fingerprint": "fp"}, "", 400, api.ProblemMalformed, ""},
		"key too long":            {"POST", "/keybrake/v1/claims", map[string]any{"key": strings.Repeat("k", 256), "fingerprint": "fp"}, "", 400, api.ProblemMalformed, ""},
		"key with a newline":      {"POST", "/keybrake/v1/claims", map[string]any{"key": "a\nb", "fingerprint": "fp"}, "", 400, api.ProblemMalformed, ""},
		"null key":                {"POST", "/keybrake/v1/claims", `{"key":null,"fingerprint":"fp"}`, "", 400, api.ProblemMalformed, ""},
		"missing fingerprint":     {"POST", "/keybrake/v1/claims", map[string]any{"key": "k"}, "", 422, api.ProblemValidation, "fingerprint"},
		"fingerprint too long":    {"POST", "/keybrake/v1/claims", map[string]any{"key": "k", "fingerprint": strings.Repeat("f", 1025)}, "", 422, api.ProblemValidation, "fingerprint"},
		"lease 0":                 {"POST", "/keybrake/v1/claims", map[string]any{"key": "k", "fingerprint": "f", "lease_seconds": 0}, "", 422, api.ProblemValidation, "lease_seconds"},
		"lease over an hour":      {"POST", "/keybrake/v1/claims", map[string]any{"key": "k", "fingerprint": "f", "lease_seconds": 3601}, "", 422, api.ProblemValidation, "lease_seconds"},
		"fractional lease":        {"POST", "/keybrake/v1/claims", `{"key":"k","fingerprint":"f","lease_seconds":1.5}`, "", 422, api.ProblemValidation, "lease_seconds"},
		"unknown field":           {"POST", "/keybrake/v1/claims", map[string]any{"key": "k", "fingerprint": "f", "lease": 5}, "", 422, api.ProblemValidation, "lease"},
		"case-folded field":       {"POST", "/keybrake/v1/claims", `{"Key":"k","fingerprint":"f"}`, "", 422, api.ProblemValidation, "Key"},
		"duplicate field":         {"POST", "/keybrake/v1/claims", `{"key":"k","key":"j","fingerprint":"f"}`, "", 422, api.ProblemValidation, "key"},
		"wrong type":              {"POST", "/keybrake/v1/claims", `{"key":7,"fingerprint":"f"}`, "", 422, api.ProblemValidation, "key"},
		"not JSON":                {"POST", "/keybrake/v1/claims", `{"key":`, "", 400, api.ProblemMalformed, ""},
		"empty body":              {"POST", "/keybrake/v1/claims", "", "", 400, api.ProblemMalformed, ""},
		"form body":               {"POST", "/keybrake/v1/claims", "key=k&fingerprint=f", "application/x-www-form-urlencoded", 415, api.ProblemUnsupportedMedia, ""},
		"body too large":          {"POST", "/keybrake/v1/claims", `{"key":"k","fingerprint":"` + strings.Repeat("f", api.DefaultMaxBodyBytes) + `"}`, "", 413, api.ProblemTooLarge, ""},
		"complete without token":  {"POST", claimPath("job", "complete"), map[string]any{"result": 1}, "", 422, api.ProblemValidation, "fencing_token"},
		"complete without result": {"POST", claimPath("job", "complete"), map[string]any{"fencing_token": fencing}, "", 422, api.ProblemValidation, "result"},
		"negative token":          {"POST", claimPath("job", "complete"), map[string]any{"result": 1, "fencing_token": -1}, "", 422, api.ProblemValidation, "fencing_token"},
		"token as a string":       {"POST", claimPath("job", "release"), map[string]any{"fencing_token": fmt.Sprint(fencing)}, "", 422, api.ProblemValidation, "fencing_token"},
		"release without token":   {"POST", claimPath("job", "release"), map[string]any{}, "", 422, api.ProblemValidation, "fencing_token"},
		"complete unknown claim":  {"POST", claimPath("nope", "complete"), map[string]any{"result": 1, "fencing_token": fencing}, "", 404, api.ProblemNotFound, ""},
		"release unknown claim":   {"POST", claimPath("nope", "release"), map[string]any{"fencing_token": fencing}, "", 404, api.ProblemNotFound, ""},
		"get unknown claim":       {"GET", claimPath("nope"), nil, "", 404, api.ProblemNotFound, ""},
		"path key too long":       {"GET", claimPath(strings.Repeat("k", 256)), nil, "", 400, api.ProblemMalformed, ""},
		"path key control char":   {"GET", "/keybrake/v1/claims/a%2Fb%0A", nil, "", 400, api.ProblemMalformed, ""},
		"unknown agent path":      {"GET", "/keybrake/v1/claimz", nil, "", 404, api.ProblemNotFound, ""},
		"wrong method":            {"DELETE", claimPath("job"), nil, "", 405, api.ProblemMethodNotAllowed, ""},
		"me is read-only":         {"POST", "/keybrake/v1/me", map[string]any{}, "", 405, api.ProblemMethodNotAllowed, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			hdr := http.Header{"Authorization": {"Bearer " + tok}}
			if tc.contentType != "" {
				hdr.Set("Content-Type", tc.contentType)
			}
			if s, ok := tc.body.(string); ok && s == "" && tc.method == http.MethodPost {
				tc.body = nil
			}
			r, err := env.Try(tc.method, tc.path, hdr, tc.body)
			require.NoError(t, err)
			assert.Equal(t, tc.status, r.Status, "body: %s", r.Body)
			p := r.Problem(t)
			assert.Equal(t, tc.problemType, p.Type)
			assert.Equal(t, "no-store", r.Header.Get("Cache-Control"))
			if tc.field != "" {
				var fields []string
				for _, fe := range p.Errors {
					fields = append(fields, fe.Field)
				}
				assert.Contains(t, fields, tc.field)
			}
		})
	}

	// Nothing above changed the claim.
	got := env.Do(http.MethodGet, claimPath("job"), tok, nil).Claim(t)
	assert.Equal(t, "in_progress", got.Status)
}

// TestSeedPatternThroughKeybrake is the seed's pre-flight table as a service: a
// billing job claims its unit of work, charges through the proxy with stripe-go,
// and completes the claim with the charge. A re-run of the same job (a scheduler
// re-run, a second replica) gets the completed claim and charges nothing. And when
// the first run dies between charging and completing, the re-run takes the lapsed
// claim over; with the claim key as the charge's idempotency key, its charge is a
// replay, so the customer is still billed once.
func TestSeedPatternThroughKeybrake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := MustAgentEnv(t)
	_, tok := env.MustKey("vault_key_cust_123_2026_09", seedPolicy, nil)
	sc := env.Stripe(tok)

	type outcome struct {
		charge  string
		charged bool
	}
	// job is the billing job: claim, charge, complete. crash stops it after the
	// charge, before the complete. idemFromClaim uses the claim key as the charge's
	// Idempotency-Key (else stripe-go makes a fresh one per call).
	job := func(claimKey string, crash, idemFromClaim bool) outcome {
		t.Helper()
		r := env.Do(http.MethodPost, "/keybrake/v1/claims", tok,
			map[string]any{"key": claimKey, "fingerprint": "cus_123|2026-09|4000", "lease_seconds": 300})
		switch r.Status {
		case http.StatusOK:
			var a struct {
				Status string `json:"status"`
				Result struct {
					Charge string `json:"charge"`
				} `json:"result"`
			}
			r.Decode(t, &a)
			require.Equal(t, "completed", a.Status)
			return outcome{charge: a.Result.Charge}
		case http.StatusCreated:
		default:
			require.Failf(t, "unexpected claim answer", "%d %s", r.Status, r.Body)
		}
		fencing := *r.Claim(t).FencingToken
		params := &stripe.ChargeCreateParams{
			Amount: stripe.Int64(4000), Currency: stripe.String("usd"),
			Source:   &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
			Metadata: map[string]string{"billing_period": "2026-09"},
		}
		if idemFromClaim {
			params.SetIdempotencyKey(claimKey)
		}
		ch, err := sc.V1Charges.Create(ctx, params)
		require.NoError(t, err)
		if crash {
			return outcome{charge: ch.ID, charged: true}
		}
		done := env.Do(http.MethodPost, claimPath(claimKey, "complete"), tok,
			map[string]any{"result": map[string]any{"charge": ch.ID}, "fencing_token": fencing})
		require.Equal(t, http.StatusOK, done.Status, "body: %s", done.Body)
		return outcome{charge: ch.ID, charged: true}
	}

	first := job("billing/cus_123/2026-09", false, false)
	require.True(t, first.charged)
	rerun := job("billing/cus_123/2026-09", false, false)
	assert.False(t, rerun.charged, "the re-run does not charge again")
	assert.Equal(t, first.charge, rerun.charge, "the re-run gets the first run's result")
	require.Len(t, env.fake.Charges(), 1, "one charge reached Stripe")

	crashed := job("billing/cus_456/2026-09", true, true)
	require.True(t, crashed.charged)
	require.Len(t, env.fake.Charges(), 2)
	env.clock.Set(adminTestNow.Add(301 * time.Second)) // the dead run's lease lapses
	takeover := job("billing/cus_456/2026-09", false, true)
	assert.True(t, takeover.charged, "the re-run took the lapsed claim over and ran the job")
	assert.Equal(t, crashed.charge, takeover.charge, "its charge was a replay of the dead run's")
	assert.Len(t, env.fake.Charges(), 2, "no second charge reached Stripe")
	again := job("billing/cus_456/2026-09", false, true)
	assert.False(t, again.charged)

	var me struct {
		Windows struct {
			Daily usageWindow `json:"daily"`
		} `json:"windows"`
	}
	env.Do(http.MethodGet, "/keybrake/v1/me", tok, nil).Decode(t, &me)
	assert.Equal(t, "80.00", me.Windows.Daily.Committed, "two customers billed once each")
}

func TestAgentRoutesLeaveTheProxyAlone(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	_, tok := env.MustKey("neighbours", seedPolicy, nil)
	// Stripe paths still get Stripe-shaped answers; /keybrake/ paths problem+json.
	r := env.Do(http.MethodGet, "/v1/nothing-here/x", tok, nil)
	assert.NotEqual(t, api.ContentTypeProblem, r.Header.Get("Content-Type"))
	var stripeErr struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	r.Decode(t, &stripeErr)
	assert.NotEmpty(t, stripeErr.Error.Type)

	r = env.Do(http.MethodGet, "/keybrake", tok, nil)
	assert.Equal(t, http.StatusNotFound, r.Status)
	r.Decode(t, &stripeErr)
	assert.Equal(t, "invalid_request_error", stripeErr.Error.Type, "only /keybrake/ paths are the agent's")

	r = env.Do(http.MethodGet, "/keybrake/v2/me", tok, nil)
	assert.Equal(t, http.StatusNotFound, r.Status)
	assert.Equal(t, api.ProblemNotFound, r.Problem(t).Type)

	// One log line per agent request, with the key id and the route, never the claim key.
	env.MustClaim(tok, "secret-claim-key-do-not-log", "fp", 0)
	logs := env.logs.String()
	assert.Contains(t, logs, `"msg":"agent request"`)
	assert.Contains(t, logs, `"route":"/keybrake/v1/claims"`)
	assert.NotContains(t, logs, "secret-claim-key-do-not-log")
}
