package proxy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"
	"github.com/stripe/stripe-go/v84/webhook"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/fakestripe"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
)

// Stripe's events, delivered by the fake as Stripe delivers them, to the
// proxy's events receiver behind a real HTTP server.

const whsec = "whsec_keybrake_test_events"

// MustEventsURL gives the env's upstream "default" the webhook secrets
// (whsec when none are given) and returns the URL of an endpoint that hands
// each delivery to the proxy, answering as the proxy listener does: 200, or
// 400/413 with the reason.
func (e *env) MustEventsURL(tb testing.TB, secrets ...string) string {
	tb.Helper()
	if len(secrets) == 0 {
		secrets = []string{whsec}
	}
	_, err := e.Store.SetUpstreamWebhookSecrets(context.Background(), "test", "default", secrets)
	require.NoError(tb, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		res, err := e.Proxy.ReceiveStripeEvent(r.Context(), r.PathValue("upstream"), r.Header.Get("Stripe-Signature"), body)
		var se *proxy.StripeEventError
		switch {
		case errors.As(err, &se):
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(se.Reason))
		case err != nil:
			w.WriteHeader(http.StatusInternalServerError)
		default:
			_, _ = w.Write([]byte(res.Outcome))
		}
	}))
	mux := http.NewServeMux()
	mux.Handle("POST /events/{upstream}", srv.Config.Handler)
	srv.Config.Handler = mux
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	srv.Listener = ln
	srv.Start()
	tb.Cleanup(srv.Close)
	return srv.URL + "/events/default"
}

// deliver sends ev and returns the status and what the endpoint answered.
func deliver(t *testing.T, e *env, url string, ev proxytest.Event) (int, string) {
	t.Helper()
	status, body, err := e.Fake.Deliver(url, whsec, ev)
	require.NoError(t, err)
	return status, string(body)
}

// createPI creates a PaymentIntent through keybrake with stripe-go, to be
// confirmed in a browser (no confirm).
func createPI(t *testing.T, e *env, tok string, amount int64, idem string) *stripe.PaymentIntent {
	t.Helper()
	params := &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd")}
	params.SetIdempotencyKey(idem)
	pi, err := e.Client(tok, 0).V1PaymentIntents.Create(context.Background(), params)
	require.NoError(t, err)
	return pi
}

// A PaymentIntent confirmed in the browser is committed from Stripe's event,
// with no read through keybrake and no lookup at Stripe.
func TestStripeEventCommitsAPaymentConfirmedClientSide(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	url := e.MustEventsURL(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	pi := createPI(t, e, tok, 4000, "pi-1")
	c, h := usage(t, e, key.ID)
	require.Zero(t, c)
	require.EqualValues(t, 4000, h, "created: its amount is exposure")

	e.Fake.ConfirmClientSide(pi.ID)
	seen := e.Fake.Count()
	status, out := deliver(t, e, url, e.Fake.Event("payment_intent.succeeded", pi.ID))
	require.Equal(t, http.StatusOK, status, out)
	assert.Equal(t, "applied", out)
	c, h = usage(t, e, key.ID)
	assert.EqualValues(t, 4000, c, "committed from the event")
	assert.Zero(t, h)
	assert.Equal(t, seen, e.Fake.Count(), "nothing was asked of Stripe")

	events, _, err := e.Store.ListEvents(context.Background(), key.ID, 10, "")
	require.NoError(t, err)
	require.NotEmpty(t, events)
	assert.Equal(t, vault.OperationStripeEvent, events[0].Operation, "the ledger names the cause")
	assert.Equal(t, pi.ID, events[0].ObjectID)
	assert.Regexp(t, `^evt_`, events[0].StripeRequestID, "and the event")
	assert.EqualValues(t, 1, MetricValue(t, e.Metrics, "keybrake_stripe_events_total", "outcome", "applied"))
}

// An expired Checkout Session frees its budget when Stripe says so.
func TestStripeEventExpiredCheckoutSessionFreesItsBudget(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	url := e.MustEventsURL(t)
	tok, key := e.MustKey(t, Policy("50.00", everything))
	r := e.Post(t, "/v1/checkout/sessions", tok, "cs-1", form("mode", "payment",
		"success_url", "https://example.test/ok", "line_items[0][quantity]", "1",
		"line_items[0][price_data][currency]", "usd", "line_items[0][price_data][unit_amount]", "4000",
		"line_items[0][price_data][product_data][name]", "Order 42"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	id := r.Body["id"].(string)
	_, h := usage(t, e, key.ID)
	require.EqualValues(t, 4000, h)

	e.Fake.ExpireCheckoutSession(id)
	status, out := deliver(t, e, url, e.Fake.Event("checkout.session.expired", id))
	require.Equal(t, http.StatusOK, status, out)
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c)
	assert.Zero(t, h, "the expired session moves nothing: its budget is free")

	// Another session, paid in the browser: committed from checkout.session.completed.
	r = e.Post(t, "/v1/checkout/sessions", tok, "cs-2", form("mode", "payment",
		"success_url", "https://example.test/ok", "line_items[0][quantity]", "1",
		"line_items[0][price_data][currency]", "usd", "line_items[0][price_data][unit_amount]", "3000",
		"line_items[0][price_data][product_data][name]", "Order 43"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	id = r.Body["id"].(string)
	e.Fake.PayCheckoutSession(id)
	status, out = deliver(t, e, url, e.Fake.Event("checkout.session.completed", id))
	require.Equal(t, http.StatusOK, status, out)
	assert.Equal(t, "applied", out)
	c, h = usage(t, e, key.ID)
	assert.EqualValues(t, 3000, c, "the paid session is committed")
	assert.Zero(t, h)
}

// A delivery that is not Stripe's changes nothing: a bad or missing
// signature, another secret, an upstream that has no secret or does not
// exist, a body that is no event, and an old delivery replayed.
func TestStripeEventRejectionsChangeNothing(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	url := e.MustEventsURL(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	pi := createPI(t, e, tok, 4000, "pi-1")
	e.Fake.ConfirmClientSide(pi.ID)
	ev := e.Fake.Event("payment_intent.succeeded", pi.ID)
	payload := ev.JSON()
	valid := func(at time.Time) string {
		return stripeSignature(at, payload, whsec)
	}

	cases := map[string]struct {
		url, sig string
		payload  []byte
		reason   proxy.StripeEventRejection
	}{
		"no signature":      {sig: "", reason: proxy.EventSignatureMissing},
		"another secret":    {sig: stripeSignature(time.Now(), payload, "whsec_other"), reason: proxy.EventSignatureInvalid},
		"no v1":             {sig: "t=" + unix(time.Now()), reason: proxy.EventSignatureInvalid},
		"v0 only":           {sig: strings.Replace(valid(time.Now()), "v1=", "v0=", 1), reason: proxy.EventSignatureInvalid},
		"body changed":      {sig: valid(time.Now()), payload: append([]byte(" "), payload...), reason: proxy.EventSignatureInvalid},
		"timestamp changed": {sig: "t=" + unix(time.Now().Add(-time.Minute)) + valid(time.Now())[strings.IndexByte(valid(time.Now()), ','):], reason: proxy.EventSignatureInvalid},
		"replayed old":      {sig: valid(time.Now().Add(-10 * time.Minute)), reason: proxy.EventTooOld},
		"from the future":   {sig: valid(time.Now().Add(10 * time.Minute)), reason: proxy.EventTooOld},
		"unknown upstream":  {url: url[:len(url)-len("default")] + "nosuch", sig: valid(time.Now()), reason: proxy.EventUnknownUpstream},
	}
	for name, tc := range cases {
		u, p := url, payload
		if tc.url != "" {
			u = tc.url
		}
		if tc.payload != nil {
			p = tc.payload
		}
		status, body, err := fakestripe.Post(u, p, tc.sig)
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadRequest, status, name)
		assert.Equal(t, string(tc.reason), string(body), name)
	}
	for _, tc := range cases {
		assert.EqualValues(t, countReason(cases, tc.reason),
			MetricValue(t, e.Metrics, "keybrake_stripe_events_rejected_total", "reason", string(tc.reason)), "counted: %s", tc.reason)
	}
	notEvent := []byte(`{"id":"evt_1","object":"balance"}`)
	status, body, err := fakestripe.Post(url, notEvent, stripeSignature(time.Now(), notEvent, whsec))
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, string(proxy.EventMalformed), string(body))

	c, h := usage(t, e, key.ID)
	assert.Zero(t, c, "none of them committed anything")
	assert.EqualValues(t, 4000, h)

	// The same event, signed now, is applied: none of the rejections
	// recorded its id.
	status, out := deliver(t, e, url, ev)
	require.Equal(t, http.StatusOK, status, out)
	assert.Equal(t, "applied", out)

	_, err = e.Store.SetUpstreamWebhookSecrets(context.Background(), "test", "default", nil)
	require.NoError(t, err)
	status, out = deliver(t, e, url, e.Fake.Event("payment_intent.succeeded", pi.ID))
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, string(proxy.EventNoSecret), out)
}

func countReason(cases map[string]struct {
	url, sig string
	payload  []byte
	reason   proxy.StripeEventRejection
}, r proxy.StripeEventRejection) int {
	n := 0
	for _, c := range cases {
		if c.reason == r {
			n++
		}
	}
	return n
}

func unix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

// stripeSignature is a Stripe-Signature header made by stripe-go's webhook
// package, the reference for Stripe's scheme.
func stripeSignature(at time.Time, payload []byte, secret string) string {
	return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: secret, Timestamp: at}).Header
}

// Each event id is applied once: a duplicate answers 200 and changes nothing;
// an older event that comes after a newer one undoes nothing.
func TestStripeEventDuplicatesAndOrder(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	url := e.MustEventsURL(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	pi := createPI(t, e, tok, 4000, "pi-1")
	created := e.Fake.Event("payment_intent.created", pi.ID) // before the payment
	e.Fake.ConfirmClientSide(pi.ID)
	succeeded := e.Fake.Event("payment_intent.succeeded", pi.ID)

	for i, want := range []string{"applied", "duplicate", "duplicate"} {
		status, out := deliver(t, e, url, succeeded)
		require.Equal(t, http.StatusOK, status)
		assert.Equal(t, want, out, "delivery %d", i)
	}
	status, out := deliver(t, e, url, created)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, "unchanged", out, "the older event shows nothing newer")
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 4000, c, "committed once")
	assert.Zero(t, h, "and the older event did not hold it again")
	assert.EqualValues(t, 2, MetricValue(t, e.Metrics, "keybrake_stripe_events_total", "outcome", "duplicate"))

	// An event about an object no key knows is acknowledged and dropped.
	other := e.Fake.AddPaymentIntent(9900, "usd", "")
	status, out = deliver(t, e, url, e.Fake.Event("payment_intent.created", other))
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, "dropped", out)
	assert.EqualValues(t, 1, MetricValue(t, e.Metrics, "keybrake_stripe_events_total", "outcome", "dropped"))
}

// A request whose outcome is unknown (Stripe created the PaymentIntent, then
// answered 500) is settled by the event that names its upstream idempotency
// key: what the object moved is committed, the rest stays its exposure.
func TestStripeEventSettlesAnUnknownHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t)
	url := e.MustEventsURL(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	e.Fake.FailNext(proxytest.FailAfterCreate500, 1)
	params := &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(4000), Currency: stripe.String("usd")}
	params.SetIdempotencyKey("pi-unknown")
	_, err := e.Client(tok, 0).V1PaymentIntents.Create(ctx, params)
	require.Error(t, err)
	holds, _, err := e.Store.ListHolds(ctx, vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	require.Len(t, holds, 1)
	pis := e.Fake.PaymentIntents()
	require.Len(t, pis, 1)
	require.Equal(t, vault.UpstreamKey(key.ID, "pi-unknown"), pis[0].IdempotencyKey, "Stripe saw keybrake's upstream key")

	ev := e.Fake.Event("payment_intent.created", pis[0].ID)
	ev.IdempotencyKey = pis[0].IdempotencyKey
	status, out := deliver(t, e, url, ev)
	require.Equal(t, http.StatusOK, status, out)
	assert.Equal(t, "applied", out)

	committed, _, err := e.Store.ListHolds(ctx, vault.HoldCommitted, 10, "")
	require.NoError(t, err)
	require.Len(t, committed, 1)
	assert.Equal(t, holds[0].ID, committed[0].ID, "resolved")
	holds, _, err = e.Store.ListHolds(ctx, vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	assert.Empty(t, holds)
	exp, ok, err := e.Store.ObjectExposure(ctx, key.ID, pis[0].ID)
	require.NoError(t, err)
	require.True(t, ok)
	assert.EqualValues(t, 4000, exp.Held, "created, not paid: its amount stays exposure")
	events, _, err := e.Store.ListEvents(ctx, key.ID, 10, "")
	require.NoError(t, err)
	assert.Equal(t, vault.DecisionResolved, events[0].Decision)
	assert.Equal(t, "stripe_event:"+ev.ID, events[0].Reason, "the ledger says who resolved it")

	// Paid later in the browser: its event commits it like any other.
	e.Fake.ConfirmClientSide(pis[0].ID)
	status, out = deliver(t, e, url, e.Fake.Event("payment_intent.succeeded", pis[0].ID))
	require.Equal(t, http.StatusOK, status, out)
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 4000, c)
	assert.Zero(t, h)
}

// Two secrets during a rotation: a delivery signed by either (or both) is
// accepted.
func TestStripeEventSecretRotation(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	url := e.MustEventsURL(t, "whsec_new_secret", whsec)
	tok, _ := e.MustKey(t, Policy("99.00"))
	pi := createPI(t, e, tok, 1000, "pi-1")
	for name, secrets := range map[string][]string{"old": {whsec}, "new": {"whsec_new_secret"}, "both": {"whsec_other", "whsec_new_secret"}} {
		ev := e.Fake.Event("payment_intent.processing", pi.ID)
		status, body, err := fakestripe.DeliverAt(url, ev.JSON(), time.Now(), secrets...)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, status, "%s: %s", name, body)
	}
}

// BenchmarkStripeEvents measures deliveries of Stripe's events through the
// events endpoint from parallel senders: HTTP, the signature, the event read,
// and one durable write transaction that records the id and commits what the
// object moved from its exposure. Run it with
// go test -run '^$' -bench BenchmarkStripeEvents ./proxy/
func BenchmarkStripeEvents(b *testing.B) {
	ctx := context.Background()
	e := MustEnv(b)
	url := e.MustEventsURL(b)
	_, key := e.MustKey(b, Policy("100000000.00"))
	const objects = 64
	for i := range objects {
		idem := fmt.Sprintf("seed-%d", i)
		res, err := e.Store.Reserve(ctx, vault.ReserveRequest{KeyID: key.ID, IdempotencyKey: idem, Fingerprint: idem, Metered: true,
			Request: policy.Request{Operation: "payment_intents.create", Amount: 1_000_000, Currency: "usd"}})
		require.NoError(b, err)
		require.Equal(b, vault.ReserveClaimed, res.Outcome)
		require.NoError(b, e.Store.Settle(ctx, vault.SettleRequest{KeyID: key.ID, IdempotencyKey: idem, Outcome: vault.SettleCommit,
			ObjectID: fmt.Sprintf("pi_bench%d", i), Object: vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true},
			Response: &vault.StoredResponse{Status: 200}}))
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var n, applied atomic.Int64
	b.SetParallelism(8)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			payload := fmt.Appendf(nil, `{"id":"evt_bench%d","object":"event","type":"payment_intent.amount_capturable_updated",`+
				`"data":{"object":{"id":"pi_bench%d","object":"payment_intent","amount":1000000,"amount_received":%d,"currency":"usd","status":"processing"}},"request":null}`,
				i, i%objects, i/objects+1)
			req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(payload))
			require.NoError(b, err)
			req.Header.Set("Stripe-Signature", stripeSignature(time.Now(), payload, whsec))
			r := MustDo(b, client, req)
			if r.Status != http.StatusOK {
				b.Fatalf("status %d: %s", r.Status, r.Raw)
			}
			if string(r.Raw) == "applied" {
				applied.Add(1)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(n.Load())/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(applied.Load())/float64(max(1, n.Load())), "applied/event")
}
