package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// Step 10 of the pipeline (see prepare): settling the hold of a forwarded
// request with Stripe's answer (modifyResponse) or without one (errorHandler),
// in one Store.Settle; what a money object's answer commits is settleAnswer's
// (objects.go). What the answer means for the hold is decideSettle's
// (settle_decision.go).

// settleTimeout bounds the Settle that follows an upstream answer. It does not
// share the upstream deadline: an answer that arrives just in time must still be
// recorded.
const settleTimeout = 30 * time.Second

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
	if !c.keepsRecord() && resp.StatusCode >= 400 {
		// An error of a request keybrake does not record: read it (bounded)
		// to scrub it, as every error body is.
		body, err := io.ReadAll(io.LimitReader(resp.Body, p.maxResponse+1))
		_ = resp.Body.Close()
		if err != nil {
			return fmt.Errorf("read upstream answer: %w", err)
		}
		body = ScrubSecrets(body)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.TransferEncoding = nil
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	if !c.keepsRecord() {
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
	if resp.StatusCode >= 400 {
		body = ScrubSecrets(body) // before it is stored for replay too
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
	shape, created := c.bodyShapeOf(resp.StatusCode, body)
	d := decideSettle(answerFacts{status: resp.StatusCode, sent: true, idem: c.idemOutcome, body: shape})
	sr := vault.SettleRequest{Outcome: d.outcome()}
	if d.keepsAnswer() {
		sr.Response = stored
	}
	if orig := resp.Header.Get(headerOriginalRequest); orig != "" {
		// Stripe replayed an earlier execution (a resumed request): that is the
		// request the money moved in.
		sr.StripeRequestID = orig
	}
	var overrun int64
	switch {
	case d == settleCommit && c.metered():
		o := stripeapi.DecodeObject(body)
		overrun = c.settleAnswer(&sr, o)
		sr.Link = c.createdLink(o) // renewals.go
	case d == settleKeepCreated:
		overrun = c.settleAnswer(&sr, created)
	}
	p.settle(ctx, c, sr, "")
	if overrun > 0 {
		p.log.LogAttrs(ctx, slog.LevelWarn, "Stripe moved more than keybrake held: the object changed at Stripe between the lookup and the request",
			slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.String(logfield.Operation, c.cls.Operation),
			slog.String(logfield.ObjectID, sr.ObjectID), slog.Int64(logfield.Overrun, overrun))
	}
	if d == settleCommit {
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

// credentialRefused handles Stripe's 401 or 403 to a forwarded request: nothing
// executed, so the attempt is abandoned (a fresh claim and its hold are
// forgotten, so a retry starts afresh; a resumed one goes back to unknown) and
// nothing is stored for replay. The error sends the request to errorHandler,
// which answers without any of Stripe's body.
func (p *Proxy) credentialRefused(ctx context.Context, c *call) error {
	err := p.upstreamAuthFailed(c, "forward", c.upstreamStatus, c.stripeRequestID)
	if d := decideSettle(answerFacts{status: c.upstreamStatus, sent: true, idem: c.idemOutcome}); d != settleNone {
		p.settle(ctx, c, vault.SettleRequest{Outcome: d.outcome()}, "upstream secret refused")
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
	if d := decideSettle(answerFacts{sent: sent, idem: c.idemOutcome}); d != settleNone && !c.settled {
		p.settle(r.Context(), c, vault.SettleRequest{Outcome: d.outcome()}, "no answer from Stripe")
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
	case c.keepsRecord():
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
	c.settled, c.settleOutcome = true, sr.Outcome
	sr.KeyID, sr.IdempotencyKey = c.key.ID, c.idemKey
	if sr.Outcome == vault.SettleUnknown {
		sr.Request = c.storedRequest() // what an operator's ask sends again (askstripe.go)
	}
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
	if freed == 0 || !c.metered() {
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
