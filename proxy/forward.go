package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// Step 9 of the pipeline (see prepare): forwarding the prepared request to
// Stripe with httputil.ReverseProxy — the transport, and rewrite, which builds
// the upstream request from the call alone. Stripe's answer, or its absence, is
// settled in settle.go.

// newTransport clones http.DefaultTransport with explicit timeouts and a large idle
// pool: every request goes to the same Stripe host.
func newTransport(upstreamTimeout time.Duration) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = 10 * time.Second
	t.ResponseHeaderTimeout = upstreamTimeout
	t.ExpectContinueTimeout = time.Second
	t.IdleConnTimeout = 90 * time.Second
	t.MaxIdleConns = 512
	t.MaxIdleConnsPerHost = 256
	return t
}

// bufferPool is the ReverseProxy's pool of copy buffers.
type bufferPool struct{ pool sync.Pool }

// newBufferPool returns a pool of 32 KiB buffers.
func newBufferPool() *bufferPool {
	return &bufferPool{pool: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
}

// Get implements httputil.BufferPool.
func (b *bufferPool) Get() []byte { return *(b.pool.Get().(*[]byte)) }

// Put implements httputil.BufferPool.
func (b *bufferPool) Put(buf []byte) { b.pool.Put(&buf) }

var _ httputil.BufferPool = (*bufferPool)(nil)

// forward sends the prepared request to Stripe and lets ModifyResponse /
// ErrorHandler settle it.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, c *call) {
	// Detached from the caller: if the caller goes away, Stripe's answer is still
	// read and recorded, so a retry replays it instead of finding "unknown".
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), p.timeout)
	defer cancel()
	// GotConn fires before the transport writes the first byte of a request on a
	// connection: until then, nothing can have reached Stripe (errorHandler).
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { c.connected.Store(true) },
	})
	out := r.WithContext(ctx) // still carrying c: WithoutCancel keeps r's values
	out.Body = http.NoBody
	out.ContentLength = int64(len(c.body))
	p.rp.ServeHTTP(w, out)
	if c.keepsRecord() && !c.settled {
		// Neither ModifyResponse nor ErrorHandler settled (cannot happen with
		// ReverseProxy today); leave nothing claimed in flight by mistake.
		p.settle(ctx, c, vault.SettleRequest{Outcome: vault.SettleUnknown}, "unsettled after forwarding")
	}
}

// strippedHeaders are removed from every upstream request (rewrite sets its
// own where it needs one). They are written canonically (TestStrippedHeaders),
// as the server's header map holds them.
var strippedHeaders = [...]string{"Authorization", "Proxy-Authorization", headerStripeAccount, headerStripeContext,
	headerIdempotencyKey, "X-Idempotency-Key", "Cookie", "Forwarded", "X-Real-Ip", "Accept-Encoding",
	"Content-Encoding", "Content-Length", "Transfer-Encoding", "Expect", "Content-Type", headerStripeVersion}

// rewrite builds the upstream request. The ReverseProxy has already removed
// hop-by-hop headers, Forwarded and X-Forwarded-*.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	c := callFrom(pr.In.Context())
	out := pr.Out
	u := *p.upstream
	base := strings.TrimSuffix(p.upstream.EscapedPath(), "/")
	raw := base + c.path
	decoded, err := url.PathUnescape(raw)
	if err != nil {
		decoded = raw // stripeapi.Classify refuses percent-encoding; never reached
	}
	u.Path, u.RawPath = decoded, ""
	if u.EscapedPath() != raw {
		u.RawPath = raw
	}
	u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = c.rawQuery, false, "", ""
	out.URL = &u
	out.Host = ""

	h := out.Header
	for name := range h {
		if strings.HasPrefix(name, "X-Forwarded-") || strings.HasPrefix(name, "Keybrake-") {
			delete(h, name)
		}
	}
	for _, name := range strippedHeaders {
		delete(h, name) // h.Del without canonicalising names that are canonical already
	}
	out.Trailer = nil
	h.Set("Authorization", "Bearer "+c.secret)
	if c.account != "" {
		h.Set(headerStripeAccount, c.account)
	}
	if c.stripeContext != "" {
		h.Set(headerStripeContext, c.stripeContext)
	}
	if c.stripeVersion != "" {
		h.Set(headerStripeVersion, c.stripeVersion)
	}
	if c.keepsRecord() && c.method == http.MethodPost {
		// Written under a lower-case map key on purpose: http.Transport treats a
		// request whose header map has "Idempotency-Key" as replayable and resends
		// it on a reused connection that breaks after the request was written. If
		// Stripe is still executing the first write, the resend is answered 409
		// (in use), which settles a fresh claim as abandoned and releases its hold
		// while the money moves. Without the canonical key each attempt reaches
		// Stripe at most once (a request nothing of which was written is still
		// retried, through GetBody). Header names are case-insensitive on the wire.
		h[strings.ToLower(headerIdempotencyKey)] = []string{c.upstreamKey}
	}
	if c.contentType != "" {
		h.Set("Content-Type", c.contentType)
	}
	body := c.body
	out.TransferEncoding = nil
	out.ContentLength = int64(len(body))
	if len(body) == 0 {
		out.Body, out.GetBody = nil, nil
	} else {
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
}

// isTimeout reports whether err is the upstream deadline or a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
