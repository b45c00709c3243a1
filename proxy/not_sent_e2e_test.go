package proxy_test

import (
	"bufio"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// front is a reverse proxy on 127.0.0.1 in front of the fake Stripe that can be
// taken down (connections to its address are then refused) and brought back on
// the same address. It keeps no connection alive, so keybrake never holds an
// idle connection to it.
type front struct {
	URL    string
	addr   string
	target *url.URL
	srv    *http.Server
}

// frontedEnv is an env whose upstream is a front before its fake Stripe.
func frontedEnv(t *testing.T) (*env, *front) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &front{URL: "http://" + ln.Addr().String(), addr: ln.Addr().String()}
	e := MustEnv(t, withUpstreamURL(f.URL, upstreamSecret))
	f.target, err = url.Parse(e.Fake.URL)
	require.NoError(t, err)
	f.serve(ln)
	t.Cleanup(f.Down)
	return e, f
}

func (f *front) serve(ln net.Listener) {
	srv := &http.Server{Handler: httputil.NewSingleHostReverseProxy(f.target), ErrorLog: log.New(io.Discard, "", 0)}
	srv.SetKeepAlivesEnabled(false)
	f.srv = srv
	go func() { _ = srv.Serve(ln) }() // not f.srv: Up replaces it while this one may not have started yet
}

// Down closes the listener: connecting to the address is refused from now on.
func (f *front) Down() { _ = f.srv.Close() }

// Up listens on the same address again.
func (f *front) Up(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", f.addr)
	require.NoError(t, err, "listen again on %s", f.addr)
	f.serve(ln)
}

// assertNotSent checks keybrake's answer to a request that never left it.
func assertNotSent(t *testing.T, r reply) {
	t.Helper()
	AssertRefusal(t, r, http.StatusBadGateway, "upstream_unavailable")
	assert.Equal(t, "true", r.Header.Get("Stripe-Should-Retry"))
	msg := r.ErrMessage()
	assert.Contains(t, msg, "not sent")
	assert.Contains(t, msg, "safe to retry")
	assert.NotContains(t, msg, "idempotency key", "any retry is safe: nothing was sent")
}

// A request that never left keybrake cannot have executed: connection refused,
// an unresolvable host, a TLS handshake that fails. The hold is released and the
// claim forgotten, so the caller's retry is a fresh request, and the answer says
// that it is safe to retry.
func TestRequestThatNeverLeftIsReleased(t *testing.T) {
	t.Parallel()
	var tlsHits atomic.Int64
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { tlsHits.Add(1) }))
	tlsLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tlsSrv.Listener = tlsLn
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0)
	tlsSrv.StartTLS() // a certificate keybrake does not trust: the handshake fails
	t.Cleanup(tlsSrv.Close)

	refused, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refusedURL := "http://" + refused.Addr().String()
	require.NoError(t, refused.Close())

	for name, upstream := range map[string]string{
		"connection refused":    refusedURL,
		"unresolvable host":     "http://keybrake-upstream.invalid", // RFC 6761: never resolves
		"TLS handshake failure": tlsSrv.URL,
	} {
		t.Run(name, func(t *testing.T) {
			e := MustEnv(t, withUpstreamURL(upstream, upstreamSecret))
			tok, key := e.MustKey(t, Policy("99.00"))
			charge := form("amount", "6000", "currency", "usd", "source", "tok_visa")
			assertNotSent(t, e.Post(t, "/v1/charges", tok, "k1", charge))
			assertNothingHeld(t, e, key.ID)
			assertNotSent(t, e.Post(t, "/v1/charges", tok, "k1", charge)) // a fresh attempt, not a resumed one
			assertNotSent(t, e.MustSend(t, http.MethodGet, "/v1/charges", tok, nil, ""))
			assert.Equal(t, 3.0, MetricValue(t, e.Metrics, "keybrake_upstream_request_duration_seconds", "kind", "forward", "status_class", "error"))
		})
	}
	assert.Zero(t, tlsHits.Load(), "nothing reached the TLS server")
}

// Once the upstream is back, the retry with the same idempotency key of a
// request that never left is forwarded as a new request and charges once.
func TestRetryAfterNeverLeftChargesOnce(t *testing.T) {
	t.Parallel()
	e, fr := frontedEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	charge := form("amount", "6000", "currency", "usd", "source", "tok_visa")

	fr.Down()
	assertNotSent(t, e.Post(t, "/v1/charges", tok, "k1", charge))
	fr.Up(t)
	r := e.Post(t, "/v1/charges", tok, "k1", charge)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	r = e.Post(t, "/v1/charges", tok, "k1", charge)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
	require.Len(t, e.Fake.Charges(), 1, "charged once")
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 6000, c)
	assert.Zero(t, h)
}

// A retry of an unknown outcome that cannot reach Stripe settles nothing: the
// first attempt may have moved the money, so its hold stays unknown and the
// caller is told to retry with the same key.
func TestResumedRequestThatNeverLeftStaysUnknown(t *testing.T) {
	t.Parallel()
	e, fr := frontedEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	charge := form("amount", "6000", "currency", "usd", "source", "tok_visa")
	e.Fake.FailNext(proxytest.FailAfterCreate500, 1)
	require.Equal(t, http.StatusInternalServerError, e.Post(t, "/v1/charges", tok, "k1", charge).Status)

	fr.Down()
	r := e.Post(t, "/v1/charges", tok, "k1", charge)
	AssertRefusal(t, r, http.StatusBadGateway, "upstream_unavailable")
	assert.Contains(t, r.ErrMessage(), "still unknown")
	assert.Contains(t, r.ErrMessage(), "same idempotency key")
	holds := unknownHolds(t, e)
	require.Len(t, holds, 1)
	assert.EqualValues(t, 6000, holds[0].Amount)
}

// A connection that breaks after the request was written may have reached
// Stripe: the outcome stays unknown and the hold stays.
func TestResetAfterTheRequestWasWrittenStaysUnknown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	var read atomic.Int64
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				// Read the whole request, as Stripe would before executing it, then
				// reset the connection without an answer.
				if req, err := http.ReadRequest(bufio.NewReader(conn)); err == nil {
					_, _ = io.Copy(io.Discard, req.Body)
					read.Add(1)
				}
				_ = conn.(*net.TCPConn).SetLinger(0)
				_ = conn.Close()
			}()
		}
	}()
	e := MustEnv(t, withUpstreamURL("http://"+ln.Addr().String(), upstreamSecret))
	tok, key := e.MustKey(t, Policy("99.00"))

	r := e.Post(t, "/v1/charges", tok, "k1", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	AssertRefusal(t, r, http.StatusBadGateway, "upstream_unavailable")
	assert.Contains(t, r.ErrMessage(), "outcome is unknown")
	assert.Contains(t, r.ErrMessage(), "same idempotency key")
	assert.EqualValues(t, 1, read.Load(), "the request reached the server once")
	_, h := usage(t, e, key.ID)
	assert.EqualValues(t, 6000, h, "the money may have moved: the hold stays")
	assert.Len(t, unknownHolds(t, e), 1)

	r = e.MustSend(t, http.MethodGet, "/v1/charges", tok, nil, "")
	AssertRefusal(t, r, http.StatusBadGateway, "upstream_unavailable")
	assert.NotContains(t, r.ErrMessage(), "idempotency key", "a read has no idempotency key to reuse")
}

// An amount lookup that Stripe does not answer (unreachable, 5xx) is an upstream
// failure, not an amount that cannot be known: 502 upstream_unavailable that an
// SDK may retry, and nothing was sent or held.
func TestLookupWithoutAnswerIsUpstreamUnavailable(t *testing.T) {
	t.Parallel()
	e, fr := frontedEnv(t)
	pi := e.Fake.AddPaymentIntent(7000, "usd", "")
	tok, key := e.MustKey(t, Policy("99.00"))
	confirm := form("payment_method", "pm_card_visa")

	fr.Down()
	assertNotSent(t, e.Post(t, "/v1/payment_intents/"+pi+"/confirm", tok, "c1", confirm))

	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"type":"api_error","message":"An unknown error occurred."}}`)
	}))
	t.Cleanup(failing.Close)
	e2 := MustEnv(t, withUpstreamURL(failing.URL, upstreamSecret))
	tok2, _ := e2.MustKey(t, Policy("99.00"))
	assertNotSent(t, e2.Post(t, "/v1/payment_intents/"+pi+"/confirm", tok2, "c1", confirm))

	fr.Up(t)
	r := e.Post(t, "/v1/payment_intents/"+pi+"/confirm", tok, "c1", confirm)
	require.Equal(t, http.StatusOK, r.Status, "the retry goes through: %s", r.Raw)
	c, _ := usage(t, e, key.ID)
	assert.EqualValues(t, 7000, c)
}
