package main

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// fakeStripe is the Stripe both proxies forward to: POST /v1/charges creates a
// charge, and a second request with the same Idempotency-Key gets the first
// answer again, as Stripe does. It keeps a tally per secret, so that the bare
// proxy and keybrake (each with its own secret) share one upstream but are
// accounted apart. It is cheap on purpose: its cost falls on both targets alike.
type fakeStripe struct {
	latency time.Duration
	pad     string
	tallies map[string]*upstreamTally // by "Bearer <secret>"; fixed at construction
}

// upstreamTally is what the fake executed for one secret.
type upstreamTally struct {
	charges atomic.Int64
	amount  atomic.Int64

	mu      sync.Mutex
	answers map[string]chargeRef // Idempotency-Key → the charge it created
}

// chargeRef is enough to answer a replay with the very same body.
type chargeRef struct{ n, amount int64 }

// newFakeStripe returns a fake that accepts the given secrets, adds latency to
// every charge and pads each charge's JSON to about responseBytes.
func newFakeStripe(latency time.Duration, responseBytes int, secrets ...string) *fakeStripe {
	f := &fakeStripe{latency: latency, tallies: map[string]*upstreamTally{}}
	if n := responseBytes - len(chargeJSON(1, chargeAmount, "")); n > 0 {
		f.pad = strings.Repeat("x", n)
	}
	for _, s := range secrets {
		f.tallies["Bearer "+s] = &upstreamTally{answers: map[string]chargeRef{}}
	}
	return f
}

// tally returns the tally of secret.
func (f *fakeStripe) tally(secret string) *upstreamTally { return f.tallies["Bearer "+secret] }

// forget drops the remembered idempotency keys: every run uses keys of its own,
// so a replay can only come within one run, and memory stays bounded.
func (f *fakeStripe) forget() {
	for _, t := range f.tallies {
		t.mu.Lock()
		clear(t.answers)
		t.mu.Unlock()
	}
}

// ServeHTTP implements http.Handler.
func (f *fakeStripe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Request-Id", "req_bench_"+strconv.FormatInt(time.Now().UnixNano(), 36))
	t := f.tallies[r.Header.Get("Authorization")]
	switch {
	case t == nil:
		writeStripeError(w, http.StatusUnauthorized, "Invalid API Key provided.")
	case r.Method != http.MethodPost || r.URL.Path != "/v1/charges":
		writeStripeError(w, http.StatusNotFound, "Unrecognized request URL.")
	default:
		f.charge(w, r, t)
	}
}

// charge creates a charge, or replays the one created under its Idempotency-Key.
func (f *fakeStripe) charge(w http.ResponseWriter, r *http.Request, t *upstreamTally) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		writeStripeError(w, http.StatusBadRequest, "Malformed body.")
		return
	}
	amount, err := strconv.ParseInt(r.PostForm.Get("amount"), 10, 64)
	if err != nil || amount < 1 || r.PostForm.Get("currency") != "usd" {
		writeStripeError(w, http.StatusBadRequest, "Missing or invalid amount or currency.")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	t.mu.Lock()
	ref, replay := t.answers[key]
	if !replay {
		ref = chargeRef{n: t.charges.Add(1), amount: amount}
		t.amount.Add(amount)
		if key != "" {
			t.answers[key] = ref
		}
	}
	t.mu.Unlock()
	if f.latency > 0 {
		time.Sleep(f.latency)
	}
	if replay {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	_, _ = w.Write([]byte(chargeJSON(ref.n, ref.amount, f.pad)))
}

// chargeJSON is the charge n, as Stripe answers it (the fields keybrake reads and
// a few more), with pad in its description.
func chargeJSON(n, amount int64, pad string) string {
	a := strconv.FormatInt(amount, 10)
	return `{"id":"ch_bench` + strconv.FormatInt(n, 10) + `","object":"charge","amount":` + a +
		`,"amount_captured":` + a + `,"amount_refunded":0,"captured":true,"currency":"usd","description":"` + pad +
		`","livemode":false,"paid":true,"refunded":false,"status":"succeeded"}`
}

func writeStripeError(w http.ResponseWriter, status int, msg string) {
	w.WriteHeader(status)
	_, _ = w.Write([]byte(`{"error":{"type":"invalid_request_error","message":` + strconv.Quote(msg) + `}}`))
}
