package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// settleTimeout bounds the Settle that follows an upstream answer. It does not
// share the upstream deadline: an answer that arrives just in time must still be
// recorded.
const settleTimeout = 30 * time.Second

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
	out := r.WithContext(withCall(ctx, c))
	out.Body = http.NoBody
	out.ContentLength = int64(len(c.body))
	p.rp.ServeHTTP(w, out)
	if c.record && !c.settled {
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
	if c.record && c.method == http.MethodPost {
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

// modifyResponse settles a recorded request with Stripe's answer and adds the
// remaining-budget headers. An error here sends the request to errorHandler,
// which settles it as outcome unknown.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	c := callFrom(resp.Request.Context())
	c.upstreamStatus = resp.StatusCode
	c.status = resp.StatusCode
	c.stripeRequestID = resp.Header.Get(headerRequestID)
	if isCredentialRefusal(resp.StatusCode) {
		return p.credentialRefused(resp.Request.Context(), c)
	}
	resp.Header.Del("Set-Cookie")
	if resp.Header.Get(headerIdempotencyKey) != "" {
		// Stripe echoes the key it saw: show the caller its own key, never the
		// derived upstream one.
		if c.idemKey != "" {
			resp.Header.Set(headerIdempotencyKey, c.idemKey)
		} else {
			resp.Header.Del(headerIdempotencyKey)
		}
	}
	ctx := resp.Request.Context()
	if !c.record {
		if err := p.observeUnrecorded(ctx, c, resp); err != nil {
			return err
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			p.setRemaining(ctx, resp.Header, c)
		}
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.maxResponse+1))
	_ = resp.Body.Close()
	if err != nil {
		return fmt.Errorf("read upstream answer: %w", err)
	}
	if int64(len(body)) > p.maxResponse {
		return fmt.Errorf("upstream answer larger than %d bytes", p.maxResponse)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.TransferEncoding = nil
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))

	stored := &vault.StoredResponse{Status: resp.StatusCode, Header: http.Header{}, Body: body}
	// The headers kept for replay: never Set-Cookie, never the upstream Idempotency-Key.
	for _, name := range [...]string{"Content-Type", headerRequestID, headerStripeVersion} {
		if v := resp.Header.Values(name); len(v) > 0 {
			stored.Header[name] = append([]string(nil), v...)
		}
	}
	sr := vault.SettleRequest{Response: stored}
	if orig := resp.Header.Get(headerOriginalRequest); orig != "" {
		// Stripe replayed an earlier execution (a resumed request): that is the
		// request the money moved in.
		sr.StripeRequestID = orig
	}
	code := resp.StatusCode
	switch {
	case code >= 200 && code < 300:
		sr.Outcome = vault.SettleCommit
		if c.metered {
			c.settleAnswer(&sr, stripeapi.DecodeObject(body))
		}
	case code == http.StatusConflict:
		// idempotency_key_in_use: Stripe is executing an earlier attempt under this
		// upstream key (a transport resend, a lapsed lease), which may move the
		// money. Whatever attempt it was, the hold stays until a retry or an
		// operator learns the outcome; the 409 itself is not the answer to keep.
		sr.Outcome, sr.Response = vault.SettleUnknown, nil
	case code == http.StatusTooManyRequests:
		// Rate limited before executing: nothing moved.
		sr.Outcome, sr.Response = vault.SettleAbandon, nil
	case code >= 400 && code < 500 && c.idemOutcome == idemResume && stripeapi.ErrorType(body) == TypeIdempotency:
		// Stripe knows the upstream key from an earlier attempt whose parameters it
		// judges different (e.g. another Stripe-Version): that attempt may have
		// moved the money, so this answer says nothing about it. The hold stays.
		sr.Outcome = vault.SettleUnknown
	case code >= 400 && code < 500:
		sr.Outcome = vault.SettleRelease
		// A 4xx whose body shows a money object the request created anyway (a
		// declined PaymentIntent) is not "nothing happened".
		c.keepCreatedObject(&sr, body)
	default:
		sr.Outcome = vault.SettleUnknown
	}
	p.settle(ctx, c, sr, "")
	if c.overrun > 0 {
		p.log.LogAttrs(ctx, slog.LevelWarn, "Stripe moved more than keybrake held: the object changed at Stripe between the lookup and the request",
			slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.String(logfield.Operation, c.cls.Operation),
			slog.String(logfield.ObjectID, sr.ObjectID), slog.Int64(logfield.Overrun, c.overrun))
	}
	if code >= 200 && code < 300 {
		if sr.Object == (vault.ObjectSettle{}) {
			p.observe(ctx, c, body)
		}
		p.setRemaining(ctx, resp.Header, c)
	}
	return nil
}

// observeUnrecorded reads the answer to a request that keeps no record (a read, a
// deletion, a write without an idempotency key) when it may show a money object
// the key has exposure on, and applies it (see observe). The body is read into
// memory (at most the response limit) and handed on unchanged.
func (p *Proxy) observeUnrecorded(ctx context.Context, c *call, resp *http.Response) error {
	if resp.StatusCode < 200 || resp.StatusCode >= 300 || !observable(c) {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.maxResponse+1))
	_ = resp.Body.Close()
	if err != nil {
		return fmt.Errorf("read upstream answer: %w", err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if int64(len(body)) <= p.maxResponse {
		p.observe(ctx, c, body)
	}
	return nil
}

// isCredentialRefusal reports whether Stripe's status judges keybrake's own
// credential rather than the request: 401 (the secret is wrong or was rolled)
// or 403 (a restricted key without the permission, or no access to the
// connected account). Either way Stripe executed nothing and, as it does for
// authentication failures, saves nothing under the idempotency key.
func isCredentialRefusal(status int) bool {
	return status == http.StatusUnauthorized || status == http.StatusForbidden
}

// upstreamAuthError is Stripe's 401 or 403 to keybrake's own credential.
type upstreamAuthError struct{ status int }

// Error implements error. It never holds Stripe's body, which may echo the key.
func (e *upstreamAuthError) Error() string {
	return fmt.Sprintf("Stripe answered %d to the upstream secret", e.status)
}

// refusal is the caller's answer: 502 api_error, never 401, so that neither the
// caller nor its SDK takes it for a wrong vault key, and none of Stripe's body.
// pending says that an earlier attempt with the same idempotency key has an
// unknown outcome that this one did not settle.
func (e *upstreamAuthError) refusal(pending bool) *refusal {
	code, what := CodeUpstreamAuthFailed, "Stripe rejected the secret keybrake holds for this vault key's upstream (your vault key is fine)"
	if e.status == http.StatusForbidden {
		code, what = CodeUpstreamPermission, "Stripe did not permit this request with the secret keybrake holds for this vault key's upstream (your vault key is fine)"
	}
	next := "Nothing was executed. An operator must fix the upstream secret; then retry."
	if pending {
		next = "This attempt executed nothing, but the outcome of the first request with this idempotency key is still unknown. An operator must fix the upstream secret; then retry with the same idempotency key."
	}
	rf := refuse(code, "%s. %s", what, next)
	rf.cause = e
	return rf
}

// upstreamAuthFailed records Stripe's refusal of the upstream secret: counted
// for /metrics, logged at Error for the operator (never the secret, only its
// last four characters), and the cached secret dropped so that a fixed one is
// used at once.
func (p *Proxy) upstreamAuthFailed(c *call, kind string, status int, stripeRequestID string) *upstreamAuthError {
	p.metrics.observeUpstreamAuthFailure()
	p.secrets.forget(c.key.Upstream)
	last4 := c.secret[max(0, len(c.secret)-4):]
	p.log.LogAttrs(context.Background(), slog.LevelError,
		"Stripe rejected keybrake's upstream secret: register the right one (POST /api/v1/upstreams)",
		slog.String(logfield.Upstream, c.key.Upstream), slog.String(logfield.SecretLast4, last4), slog.String(logfield.Kind, kind),
		slog.Int(logfield.UpstreamStatus, status), slog.String(logfield.StripeRequestID, stripeRequestID),
		slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.String(logfield.Operation, c.cls.Operation))
	return &upstreamAuthError{status: status}
}

// credentialRefused handles Stripe's 401 or 403 to a forwarded request: nothing
// executed, so the attempt is abandoned (a fresh claim and its hold are
// forgotten, so a retry starts afresh; a resumed one goes back to unknown) and
// nothing is stored for replay. The error sends the request to errorHandler,
// which answers without any of Stripe's body.
func (p *Proxy) credentialRefused(ctx context.Context, c *call) error {
	err := p.upstreamAuthFailed(c, "forward", c.upstreamStatus, c.stripeRequestID)
	if c.record {
		p.settle(ctx, c, vault.SettleRequest{Outcome: vault.SettleAbandon}, "upstream secret refused")
	}
	return err
}

// errorHandler answers when Stripe gave no usable answer: timeout → 504, anything
// else → 502, both upstream_unavailable with Stripe-Should-Retry: true. When the
// transport never got a connection (refused, DNS or TLS handshake failure, a
// timeout before connecting), no byte of the request was written, so nothing
// executed: the attempt is abandoned like a 429. Otherwise the record's outcome
// is unknown: the money may have moved, the hold stays. Stripe's refusal of
// keybrake's secret (credentialRefused) is answered here too.
func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	c := callFrom(r.Context())
	if c == nil {
		// Only reachable if the ReverseProxy is misused; fail closed.
		writeStripeError(w, newRequestID(), internalError(err))
		return
	}
	var auth *upstreamAuthError
	if errors.As(err, &auth) {
		p.writeUpstreamFailure(w, c, auth.refusal(c.idemOutcome == idemResume))
		return
	}
	sent := c.connected.Load()
	if c.record && !c.settled {
		outcome := vault.SettleUnknown
		if !sent {
			outcome = vault.SettleAbandon
		}
		p.settle(r.Context(), c, vault.SettleRequest{Outcome: outcome}, "no answer from Stripe")
	}
	rf := noAnswerRefusal(c, err, sent)
	rf.cause = err
	p.writeUpstreamFailure(w, c, rf)
}

// noAnswerRefusal is upstream_unavailable for a forward that got no answer: 504
// for a timeout, else 502, with a message that says what the caller may do.
func noAnswerRefusal(c *call, err error, sent bool) *refusal {
	rf := refuse(CodeUpstreamUnavailable, "")
	what := "The connection to Stripe failed before an answer arrived"
	if isTimeout(err) {
		rf.Status, what = http.StatusGatewayTimeout, "Stripe did not answer in time"
	}
	resumed := c.idemOutcome == idemResume
	switch {
	case !sent && resumed:
		rf.Message = "keybrake could not reach Stripe: this attempt was not sent, and the outcome of the first request with this idempotency key is still unknown. Retry with the same idempotency key."
	case !sent:
		rf.Message = "keybrake could not reach Stripe: the request was not sent, so nothing was executed. It is safe to retry."
	case c.record:
		rf.Message = what + "; the outcome is unknown. Retry with the same idempotency key."
	case c.method == http.MethodGet:
		rf.Message = what + ". Retry the request."
	default:
		rf.Message = what + "; the outcome is unknown."
	}
	return rf
}

// writeUpstreamFailure writes keybrake's answer for a forwarded request that got
// no usable answer from Stripe.
func (p *Proxy) writeUpstreamFailure(w http.ResponseWriter, c *call, rf *refusal) {
	w.Header().Del(headerRemainingDaily)
	w.Header().Del(headerRemainingPeriod)
	writeStripeError(w, c.requestID, rf)
	c.status, c.reason, c.err = rf.Status, rf.Code, rf.cause
}

// settle is the one Settle of a forwarded request. It is queued
// (Store.SettleQueued): the caller gets Stripe's answer without waiting for
// the settle's commit, and a retry of the same idempotency key, queued after
// it, finds the record settled. A failure is logged at Error and otherwise
// ignored: the record stays in_progress until it is recovered as unknown
// (fail closed), as after a crash before the commit.
func (p *Proxy) settle(ctx context.Context, c *call, sr vault.SettleRequest, note string) {
	c.settled = true
	sr.KeyID, sr.IdempotencyKey = c.key.ID, c.idemKey
	sr.UpstreamStatus, sr.Tool = c.upstreamStatus, c.tool
	if sr.StripeRequestID == "" {
		sr.StripeRequestID = c.stripeRequestID
	}
	c.freeOwnHold(&sr)
	// The failure is logged from the committer's callback, after this request
	// may have ended: it names the request by values copied now (the log
	// attributes themselves are built only on a failure).
	requestID, keyID, operation, outcome, status := c.requestID, c.key.ID, c.cls.Operation, sr.Outcome, c.upstreamStatus
	failed := func(err error) {
		p.log.LogAttrs(context.Background(), slog.LevelError, "settle failed; the record stays in progress until recovered as unknown",
			slog.String(logfield.RequestID, requestID), slog.String(logfield.KeyID, keyID),
			slog.String(logfield.Operation, operation), slog.String(logfield.Outcome, string(outcome)),
			slog.Int(logfield.UpstreamStatus, status), slog.String(logfield.Note, note), slog.Any(logfield.Error, err))
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	err := p.store.SettleQueued(sctx, sr, func(err error) {
		if err != nil {
			go failed(err) // never on the committer: a log write may block
		}
	})
	if err != nil {
		failed(err)
	}
}

// ---- lookups ----

// lookup GETs the object at Stripe with the real secret and the call's account
// headers and reads the integer field l.Field, "currency" and l.Factors. When
// Stripe refuses keybrake's secret or gives no answer (none, 429, 5xx), the error
// is the *refusal to answer with; any other error means the amount cannot be
// known.
func (p *Proxy) lookup(ctx context.Context, c *call, l stripeapi.Lookup) (stripeapi.LookupResult, error) {
	var query url.Values
	if expand := stripeapi.LookupExpand(l.Accounts); len(expand) > 0 {
		query = url.Values{"expand[]": expand}
	}
	body, err := p.fetch(ctx, c, l.Path, query)
	if err != nil {
		return stripeapi.LookupResult{}, err
	}
	return stripeapi.ReadLookup(body, l)
}

// fetch GETs path at Stripe with the real secret and the call's Stripe-Account,
// Stripe-Context and Stripe-Version, with query (expansions, a list's filter),
// and returns the body of a 200.
func (p *Proxy) fetch(ctx context.Context, c *call, path string, query url.Values) ([]byte, error) {
	if !strings.HasPrefix(path, "/v1/") || strings.ContainsAny(path, "?#%") || strings.Contains(path, "..") {
		return nil, fmt.Errorf("lookup path %q refused", path)
	}
	u := *p.upstream
	u.Path = strings.TrimSuffix(p.upstream.Path, "/") + path
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	if len(query) > 0 {
		u.RawQuery = query.Encode()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("lookup request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.secret)
	if c.account != "" {
		req.Header.Set(headerStripeAccount, c.account)
	}
	if c.stripeContext != "" {
		req.Header.Set(headerStripeContext, c.stripeContext)
	}
	if c.stripeVersion != "" {
		req.Header.Set(headerStripeVersion, c.stripeVersion)
	}
	resp, err := p.lookups.Do(req)
	if err != nil {
		return nil, lookupUnavailable(c, fmt.Errorf("lookup %s: %w", path, err))
	}
	defer resp.Body.Close()
	switch {
	case isCredentialRefusal(resp.StatusCode):
		return nil, p.upstreamAuthFailed(c, "lookup", resp.StatusCode, resp.Header.Get(headerRequestID)).refusal(false)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return nil, lookupUnavailable(c, fmt.Errorf("lookup %s: status %d", path, resp.StatusCode))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.maxResponse))
	if err != nil {
		return nil, lookupUnavailable(c, fmt.Errorf("lookup %s: read: %w", path, err))
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &lookupStatusError{path: path, status: resp.StatusCode}
	}
	return body, nil
}

// lookupStatusError is Stripe's answer to a lookup when it is neither 200 nor
// one fetch turns into a refusal (401, 403, 429, 5xx): a 404, a 400.
type lookupStatusError struct {
	path   string
	status int
}

// Error implements error.
func (e *lookupStatusError) Error() string {
	return fmt.Sprintf("lookup %s: status %d", e.path, e.status)
}

// lookupUnavailable is the refusal of a request whose amount lookup Stripe did
// not answer (no answer, 429, 5xx): an upstream failure rather than an amount
// that cannot be known, and the request itself was never sent.
func lookupUnavailable(c *call, cause error) *refusal {
	rf := refuse(CodeUpstreamUnavailable,
		"keybrake could not read the amount of this %s request from Stripe: the request was not sent, so nothing was executed. It is safe to retry.",
		c.cls.Operation)
	if isTimeout(cause) {
		rf.Status = http.StatusGatewayTimeout
	}
	rf.cause = cause
	return rf
}

// isTimeout reports whether err is the upstream deadline or a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// upstreamSecret returns the upstream's real secret, cached for a few seconds.
func (p *Proxy) upstreamSecret(ctx context.Context, name string) (string, error) {
	sc := &p.secrets
	now := p.now()
	if sc.ttl > 0 {
		sc.mu.Lock()
		e, ok := sc.entries[name]
		sc.mu.Unlock()
		if ok && now.Sub(e.fetched) < sc.ttl && !now.Before(e.fetched) {
			return e.secret, nil
		}
	}
	secret, err := p.store.UpstreamSecret(ctx, name)
	if err != nil {
		return "", err
	}
	if sc.ttl > 0 {
		sc.mu.Lock()
		sc.entries[name] = cachedSecret{secret: secret, fetched: now}
		sc.mu.Unlock()
	}
	return secret, nil
}

// forget drops the cached secret of upstream name.
func (sc *secretCache) forget(name string) {
	sc.mu.Lock()
	delete(sc.entries, name)
	sc.mu.Unlock()
}

// freeOwnHold corrects the usage Reserve reported (c.usage) by what the settle
// sr frees of the request's own hold, for the remaining-budget headers of the
// answer: all of it on a release, what it did not commit on a commit of money
// that moved at once. A commit against a money object keeps what it does not
// commit as exposure, or frees it in ways only the store works out: the usage
// stays as Reserve left it, which is never more than is left.
func (c *call) freeOwnHold(sr *vault.SettleRequest) {
	var freed int64
	switch {
	case sr.Outcome == vault.SettleRelease, sr.Outcome == vault.SettleAbandon && c.idemOutcome == idemClaimed:
		freed = c.amount
	case sr.Outcome == vault.SettleCommit && sr.Object == (vault.ObjectSettle{}):
		freed = max(0, c.amount-sr.Amount)
	}
	if freed == 0 || !c.metered {
		return
	}
	usage := maps.Clone(c.usage)
	for _, id := range c.holdWindows {
		if cnt, ok := usage[id]; ok {
			cnt.Held = max(0, cnt.Held-freed)
			usage[id] = cnt
		}
	}
	c.usage = usage
}
