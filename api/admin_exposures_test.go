package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// exposure is one object of GET /api/v1/keys/{id}/exposures.
type exposure struct {
	ObjectID  string `json:"object_id"`
	Kind      string `json:"kind"`
	Currency  string `json:"currency"`
	Exposure  string `json:"exposure"`
	Committed string `json:"committed"`
	Windows   []struct {
		ID       string `json:"id"`
		Exposure string `json:"exposure"`
	} `json:"windows"`
	Closed        bool      `json:"closed"`
	StripeAccount string    `json:"stripe_account"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// exposureChange is the answer of a refresh or a release.
type exposureChange struct {
	Changed   bool     `json:"changed"`
	Committed string   `json:"committed"`
	Released  string   `json:"released"`
	Before    exposure `json:"before"`
	After     exposure `json:"after"`
}

// stripeAt is a stripe-go client with secret (a vault key or the real one) at
// base, the proxy or the fake Stripe itself.
func stripeAt(base, secret string) *stripe.Client {
	return stripe.NewClient(secret, stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(base),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
}

// exposureKey mints a usd key (daily 99.00, period 110.00) on the default
// upstream, and returns it with a stripe-go client that spends through the proxy.
func (env *adminEnv) exposureKey(policyJSON string) (mintedKey, *stripe.Client) {
	env.tb.Helper()
	env.MustUpstream("default")
	if policyJSON == "" {
		policyJSON = `{"vendor":"stripe","currency":"usd","daily_cap":"99.00","period_cap":"110.00","expires_at":"2026-10-01T00:00:00Z"}`
	}
	k := env.MustMint(fmt.Sprintf("exposures-%d", time.Now().UnixNano()), "", nil, policyJSON)
	return k, stripeAt(env.proxyURL, k.Token)
}

// MustPaymentIntent creates a PaymentIntent of cents usd through keybrake.
func MustPaymentIntent(tb testing.TB, sc *stripe.Client, cents int64) string {
	tb.Helper()
	pi, err := sc.V1PaymentIntents.Create(context.Background(), &stripe.PaymentIntentCreateParams{
		Amount: stripe.Int64(cents), Currency: stripe.String("usd")})
	require.NoError(tb, err)
	return pi.ID
}

// MustExposures lists all of a key's exposures.
func (env *adminEnv) MustExposures(keyID string) []exposure {
	env.tb.Helper()
	r := env.Do(http.MethodGet, "/api/v1/keys/"+keyID+"/exposures", env.viewerToken, nil)
	require.Equal(env.tb, http.StatusOK, r.Status, "body: %s", r.Body)
	var page struct {
		Exposures []exposure `json:"exposures"`
	}
	r.Decode(env.tb, &page)
	return page.Exposures
}

// refresh asks for a refresh of objectID with token.
func (env *adminEnv) refresh(keyID, objectID, token string) adminResponse {
	env.tb.Helper()
	return env.Do(http.MethodPost, "/api/v1/keys/"+keyID+"/exposures/"+url.PathEscape(objectID)+"/refresh", token, nil)
}

// auditOf lists the audit log's entries of action, newest first.
func (env *adminEnv) auditOf(action string) []map[string]any {
	env.tb.Helper()
	r := env.Do(http.MethodGet, "/api/v1/audit?limit=500", env.viewerToken, nil)
	require.Equal(env.tb, http.StatusOK, r.Status)
	var page struct {
		Entries []map[string]any `json:"entries"`
	}
	r.Decode(env.tb, &page)
	var out []map[string]any
	for _, e := range page.Entries {
		if e["action"] == action {
			out = append(out, e)
		}
	}
	return out
}

// A key's PaymentIntents hold its budget until Stripe's answer frees them; an
// admin sees them and has keybrake ask Stripe about one that was cancelled or
// confirmed behind keybrake's back.
func TestExposuresListedAndRefreshedFromStripe(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	ctx := context.Background()
	key, sc := env.exposureKey("")
	cancelled := MustPaymentIntent(t, sc, 2000)
	confirmed := MustPaymentIntent(t, sc, 3000)
	live := MustPaymentIntent(t, sc, 1500)
	u := env.MustUsage(key.ID)
	assert.Equal(t, "65.00", u.Period.Held, "three PaymentIntents created, none confirmed")

	// A viewer sees every object, with its windows and kind, by object id.
	list := env.MustExposures(key.ID)
	require.Len(t, list, 3)
	byID := map[string]exposure{}
	for i, e := range list {
		byID[e.ObjectID] = e
		if i > 0 {
			assert.Less(t, list[i-1].ObjectID, e.ObjectID, "by object id")
		}
	}
	c := byID[cancelled]
	assert.Equal(t, "payment_intent", c.Kind)
	assert.Equal(t, "usd", c.Currency)
	assert.Equal(t, "20.00", c.Exposure)
	assert.Equal(t, "0.00", c.Committed)
	assert.False(t, c.Closed)
	require.Len(t, c.Windows, 2)
	assert.Equal(t, "day:2026-09-14", c.Windows[0].ID)
	assert.Equal(t, "20.00", c.Windows[0].Exposure)
	assert.Equal(t, "period", c.Windows[1].ID)
	assert.Equal(t, adminTestNow, c.CreatedAt)
	assert.Equal(t, adminTestNow, c.UpdatedAt)

	// Pages of two.
	r := env.Do(http.MethodGet, "/api/v1/keys/"+key.ID+"/exposures?limit=2", env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	var page struct {
		Exposures  []exposure `json:"exposures"`
		NextCursor string     `json:"next_cursor"`
	}
	r.Decode(t, &page)
	require.Len(t, page.Exposures, 2)
	require.NotEmpty(t, page.NextCursor)
	r = env.Do(http.MethodGet, "/api/v1/keys/"+key.ID+"/exposures?limit=2&cursor="+page.NextCursor, env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	page.NextCursor = ""
	r.Decode(t, &page)
	require.Len(t, page.Exposures, 1)
	assert.Equal(t, list[2].ObjectID, page.Exposures[0].ObjectID)
	assert.Empty(t, page.NextCursor)

	// Behind keybrake's back: one cancelled in the Dashboard, one confirmed in a browser.
	direct := stripeAt(env.fake.URL, testStripeSecret)
	_, err := direct.V1PaymentIntents.Cancel(ctx, cancelled, &stripe.PaymentIntentCancelParams{})
	require.NoError(t, err)
	_, err = direct.V1PaymentIntents.Confirm(ctx, confirmed, &stripe.PaymentIntentConfirmParams{PaymentMethod: stripe.String("pm_card_visa")})
	require.NoError(t, err)
	assert.Equal(t, "65.00", env.MustUsage(key.ID).Period.Held, "keybrake saw neither")

	// A viewer may not refresh.
	r = env.refresh(key.ID, cancelled, env.viewerToken)
	assert.Equal(t, http.StatusForbidden, r.Status)
	assert.Equal(t, api.ProblemForbidden, r.Problem(t).Type)

	// The cancelled one: released.
	lookups := env.fake.Count()
	r = env.refresh(key.ID, cancelled, env.adminToken)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var ch exposureChange
	r.Decode(t, &ch)
	assert.True(t, ch.Changed)
	assert.Equal(t, "20.00", ch.Released)
	assert.Equal(t, "0.00", ch.Committed)
	assert.Equal(t, "20.00", ch.Before.Exposure)
	assert.Equal(t, "0.00", ch.After.Exposure)
	assert.True(t, ch.After.Closed)
	assert.Empty(t, ch.After.Windows)
	assert.Equal(t, lookups+1, env.fake.Count(), "one GET at Stripe")
	last := env.fake.Requests()[lookups]
	assert.Equal(t, http.MethodGet, last.Method)
	assert.Equal(t, "/v1/payment_intents/"+cancelled, last.Path)
	assert.True(t, last.Authorized, "with the upstream's real secret")
	u = env.MustUsage(key.ID)
	assert.Equal(t, "45.00", u.Period.Held)
	assert.Equal(t, "45.00", u.Daily.Held)
	assert.Equal(t, "0.00", u.Period.Committed)

	// The confirmed one: committed, once.
	r = env.refresh(key.ID, confirmed, env.adminToken)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	r.Decode(t, &ch)
	assert.True(t, ch.Changed)
	assert.Equal(t, "30.00", ch.Committed)
	assert.Equal(t, "0.00", ch.Released)
	assert.Equal(t, "30.00", ch.After.Committed)
	u = env.MustUsage(key.ID)
	assert.Equal(t, "15.00", u.Period.Held)
	assert.Equal(t, "30.00", u.Period.Committed)

	// The live one, and the cancelled one again: nothing changes.
	for _, id := range []string{live, cancelled} {
		r = env.refresh(key.ID, id, env.adminToken)
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		ch = exposureChange{}
		r.Decode(t, &ch)
		assert.False(t, ch.Changed, id)
		assert.Equal(t, ch.Before, ch.After, id)
	}
	left := env.MustExposures(key.ID)
	require.Len(t, left, 1)
	assert.Equal(t, live, left[0].ObjectID)

	// The audit log has every refresh under the admin's name, on the key.
	entries := env.auditOf("exposure.refresh")
	require.Len(t, entries, 4)
	e := entries[len(entries)-1] // the first: the cancelled one
	assert.Equal(t, "alice@example.com", e["actor"])
	assert.Equal(t, key.ID, e["target"])
	assert.Equal(t, map[string]any{"object_id": cancelled, "currency": "usd", "held": 2000.0, "committed": 0.0}, e["before"])
	assert.Equal(t, true, e["after"].(map[string]any)["closed"])

	// The ledger says what the refreshes did, under the operation exposure.refresh.
	r = env.Do(http.MethodGet, "/api/v1/keys/"+key.ID+"/events", env.viewerToken, nil)
	require.Equal(t, http.StatusOK, r.Status)
	var events struct {
		Events []map[string]any `json:"events"`
	}
	r.Decode(t, &events)
	var seen []string
	for _, ev := range events.Events {
		if ev["operation"] == "exposure.refresh" {
			seen = append(seen, fmt.Sprintf("%s %s %s %s", ev["decision"], ev["reason"], ev["object_id"], ev["amount"]))
		}
	}
	assert.Equal(t, []string{"exposure commit " + confirmed + " 30.00", "exposure release " + cancelled + " 20.00"}, seen)
	require.NoError(t, env.store.CheckInvariant(ctx))
}

// Each way of failing to get or use Stripe's answer has its status and problem
// type, and changes nothing.
func TestExposureRefreshFailures(t *testing.T) {
	t.Parallel()
	const piBody = `{"id":"pi_1","object":"payment_intent","amount":2000,"amount_received":0,"currency":"usd","status":"canceled"}`
	cases := map[string]struct {
		upstream http.HandlerFunc
		timeout  time.Duration
		status   int
		problem  string
		detail   string
	}{
		"unreachable": {status: http.StatusBadGateway, problem: api.ProblemUpstreamUnavailable, detail: "Try again"},
		"500": {upstream: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"type":"api_error"}}`, http.StatusInternalServerError)
		}, status: http.StatusBadGateway, problem: api.ProblemUpstreamUnavailable},
		"429": {upstream: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"type":"invalid_request_error","code":"rate_limit"}}`, http.StatusTooManyRequests)
		}, status: http.StatusBadGateway, problem: api.ProblemUpstreamUnavailable},
		"timeout": {upstream: func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		}, timeout: 200 * time.Millisecond, status: http.StatusGatewayTimeout, problem: api.ProblemUpstreamUnavailable, detail: "in time"},
		"secret rejected": {upstream: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"message":"Invalid API Key provided: `+testStripeSecret+`"}}`, http.StatusUnauthorized)
		}, status: http.StatusBadGateway, problem: api.ProblemUpstreamAuthFailed, detail: "Register the right secret"},
		"permission denied": {upstream: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"message":"no permission"}}`, http.StatusForbidden)
		}, status: http.StatusBadGateway, problem: api.ProblemUpstreamPermission},
		"no such object at Stripe": {upstream: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"type":"invalid_request_error","code":"resource_missing"}}`, http.StatusNotFound)
		}, status: http.StatusConflict, problem: api.ProblemStripeObjectNotFound, detail: "keeps its exposure"},
		"400": {upstream: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"type":"invalid_request_error"}}`, http.StatusBadRequest)
		}, status: http.StatusBadGateway, problem: api.ProblemStripeAnswerUnusable, detail: "Stripe answered 400"},
		"another currency": {upstream: func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(strings.Replace(piBody, "usd", "eur", 1)))
		}, status: http.StatusBadGateway, problem: api.ProblemStripeAnswerUnusable},
		"another object": {upstream: func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(strings.Replace(piBody, `"pi_1"`, `"pi_2"`, 1)))
		}, status: http.StatusBadGateway, problem: api.ProblemStripeAnswerUnusable},
		"not JSON": {upstream: func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte("<html>"))
		}, status: http.StatusBadGateway, problem: api.ProblemStripeAnswerUnusable},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each case has its own store, servers and logs
			up := http.Handler(tc.upstream)
			if tc.upstream == nil {
				up = http.NotFoundHandler() // replaced by a closed port below
			}
			env := MustAdminEnv(t, adminEnvOptions{upstream: up, upstreamTimeout: tc.timeout})
			key, _ := env.exposureKey("")
			env.MustExposure(key.ID, "pi_1", 2000)
			if tc.upstream == nil {
				env.closeUpstream()
			}
			before := env.MustUsage(key.ID)

			r := env.refresh(key.ID, "pi_1", env.adminToken)
			require.Equal(t, tc.status, r.Status, "body: %s", r.Body)
			p := r.Problem(t)
			assert.Equal(t, tc.problem, p.Type)
			assert.Contains(t, p.Detail, tc.detail)
			assert.NotContains(t, string(r.Body), testStripeSecret, "never Stripe's body")
			assert.Equal(t, before, env.MustUsage(key.ID), "nothing changed")
			assert.Empty(t, env.auditOf("exposure.refresh"), "nothing to audit")
			assert.Contains(t, env.logs.String(), "refreshing a money object at Stripe failed")
			assert.NotContains(t, env.logs.String(), testStripeSecret)
			require.NoError(t, env.store.CheckInvariant(context.Background()))
		})
	}
}

// MustExposure puts exposure of cents usd on objectID for key, as the proxy
// would after Stripe answered the object's creation.
func (env *adminEnv) MustExposure(keyID, objectID string, cents int64) {
	env.tb.Helper()
	ctx := context.Background()
	res, err := env.store.Reserve(ctx, vault.ReserveRequest{KeyID: keyID, IdempotencyKey: "create-" + objectID,
		Fingerprint: "fp-" + objectID, Metered: true,
		Request: policy.Request{Operation: "payment_intents.create", Amount: cents, Currency: "usd"}})
	require.NoError(env.tb, err)
	require.Equal(env.tb, vault.ReserveClaimed, res.Outcome)
	require.NoError(env.tb, env.store.Settle(ctx, vault.SettleRequest{KeyID: keyID, IdempotencyKey: "create-" + objectID,
		Outcome: vault.SettleCommit, ObjectID: objectID, Object: vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true},
		Response: &vault.StoredResponse{Status: http.StatusOK, Body: []byte(`{}`)}, UpstreamStatus: http.StatusOK}))
}

// The refresh's other refusals: the key or the object unknown, an object
// keybrake cannot look up, an upstream that is gone.
func TestExposureRefreshRefusals(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	key, _ := env.exposureKey("")
	env.MustExposure(key.ID, "pi_known", 1000)
	env.MustExposure(key.ID, "sub_odd", 500)

	r := env.refresh("key_nope", "pi_known", env.adminToken)
	assert.Equal(t, http.StatusNotFound, r.Status)
	r = env.refresh(key.ID, "pi_never", env.adminToken)
	assert.Equal(t, http.StatusNotFound, r.Status)
	assert.Contains(t, r.Problem(t).Detail, "pi_never")
	assert.Zero(t, env.fake.Count(), "nothing asked of Stripe")

	r = env.refresh(key.ID, "sub_odd", env.adminToken)
	assert.Equal(t, http.StatusBadGateway, r.Status)
	assert.Equal(t, api.ProblemStripeAnswerUnusable, r.Problem(t).Type)
	assert.Contains(t, r.Problem(t).Detail, "cannot tell what kind")
	assert.Zero(t, env.fake.Count())

	// The key's upstream is gone (it may be deleted once the key is revoked).
	assert.Equal(t, http.StatusOK, env.Do(http.MethodPost, "/api/v1/keys/"+key.ID+"/revoke", env.adminToken, nil).Status)
	assert.Equal(t, http.StatusNoContent, env.Do(http.MethodDelete, "/api/v1/upstreams/default", env.adminToken, nil).Status)
	r = env.refresh(key.ID, "pi_known", env.adminToken)
	assert.Equal(t, http.StatusConflict, r.Status)
	assert.Equal(t, api.ProblemConflict, r.Problem(t).Type)
	assert.Contains(t, r.Problem(t).Detail, `upstream "default" is not registered`)

	// Listing: the key must exist, the query be known.
	for path, status := range map[string]int{
		"/api/v1/keys/key_nope/exposures":                     http.StatusNotFound,
		"/api/v1/keys/" + key.ID + "/exposures?limit=0":       http.StatusUnprocessableEntity,
		"/api/v1/keys/" + key.ID + "/exposures?cursor=":       http.StatusOK,
		"/api/v1/keys/" + key.ID + "/exposures?cursor=%21bad": http.StatusUnprocessableEntity,
		"/api/v1/keys/" + key.ID + "/exposures?state=live":    http.StatusUnprocessableEntity,
	} {
		assert.Equal(t, status, env.Do(http.MethodGet, path, env.viewerToken, nil).Status, path)
	}
	assert.Equal(t, http.StatusUnauthorized, env.Do(http.MethodGet, "/api/v1/keys/"+key.ID+"/exposures", "", nil).Status)
}

// A refresh looks the object up under the connected account Stripe answered
// for it under.
func TestExposureRefreshUsesTheObjectsAccount(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	acct := env.fake.AddConnectedAccount("usd", 0)
	key, sc := env.exposureKey(`{"vendor":"stripe","currency":"usd","daily_cap":"99.00","expires_at":"2026-10-01T00:00:00Z","stripe_accounts":["` + acct + `"]}`)
	params := &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(1200), Currency: stripe.String("usd")}
	params.SetStripeAccount(acct)
	pi, err := sc.V1PaymentIntents.Create(context.Background(), params)
	require.NoError(t, err)

	list := env.MustExposures(key.ID)
	require.Len(t, list, 1)
	assert.Equal(t, acct, list[0].StripeAccount)
	n := env.fake.Count()
	r := env.refresh(key.ID, pi.ID, env.adminToken)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	got := env.fake.Requests()[n]
	assert.Equal(t, "/v1/payment_intents/"+pi.ID, got.Path)
	assert.Equal(t, acct, got.Header.Get("Stripe-Account"))
}

// Without Stripe's word, an admin may release an exposure: recorded in the
// ledger and the audit log as the operator's decision.
func TestExposureReleasedByAnOperator(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	key, _ := env.exposureKey("")
	env.MustExposure(key.ID, "pi_gone", 2500)
	require.Equal(t, "25.00", env.MustUsage(key.ID).Period.Held)

	// Stripe has no such object: the refresh keeps it, and says how to release it.
	r := env.refresh(key.ID, "pi_gone", env.adminToken)
	require.Equal(t, http.StatusConflict, r.Status)
	p := r.Problem(t)
	assert.Equal(t, api.ProblemStripeObjectNotFound, p.Type)
	assert.Contains(t, p.Detail, "/api/v1/keys/"+key.ID+"/exposures/pi_gone/release")
	assert.Equal(t, "25.00", env.MustUsage(key.ID).Period.Held)

	release := "/api/v1/keys/" + key.ID + "/exposures/pi_gone/release"
	assert.Equal(t, http.StatusForbidden, env.Do(http.MethodPost, release, env.viewerToken, nil).Status)
	r = env.Do(http.MethodPost, release, env.adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	var ch exposureChange
	r.Decode(t, &ch)
	assert.True(t, ch.Changed)
	assert.Equal(t, "25.00", ch.Released)
	assert.Equal(t, "0.00", ch.After.Exposure)
	assert.False(t, ch.After.Closed, "Stripe never said so")
	assert.Equal(t, "0.00", env.MustUsage(key.ID).Period.Held)
	assert.Empty(t, env.MustExposures(key.ID))

	entries := env.auditOf("exposure.release")
	require.Len(t, entries, 1)
	assert.Equal(t, "alice@example.com", entries[0]["actor"])
	r = env.Do(http.MethodGet, "/api/v1/keys/"+key.ID+"/events?limit=1", env.viewerToken, nil)
	var events struct {
		Events []map[string]any `json:"events"`
	}
	r.Decode(t, &events)
	require.Len(t, events.Events, 1)
	assert.Equal(t, "resolved", events.Events[0]["decision"])
	assert.Equal(t, "operator:released", events.Events[0]["reason"])
	assert.Equal(t, "pi_gone", events.Events[0]["object_id"])

	r = env.Do(http.MethodPost, release, env.adminToken, nil)
	assert.Equal(t, http.StatusConflict, r.Status, "nothing left")
	assert.Equal(t, http.StatusNotFound, env.Do(http.MethodPost, "/api/v1/keys/"+key.ID+"/exposures/pi_x/release", env.adminToken, nil).Status)
	require.NoError(t, env.store.CheckInvariant(context.Background()))
	data, err := json.Marshal(entries[0])
	require.NoError(t, err)
	assert.Contains(t, string(data), `"held":2500`)
}
