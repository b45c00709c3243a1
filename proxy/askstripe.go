package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// Ask Stripe: an operator's way out of an unknown outcome without guessing.
// The request an unknown hold was forwarded with is kept with it (sealed; see
// vault.SettleRequest.Request); AskStripe sends it again under the same
// upstream idempotency key, exactly as the caller's own retry would be sent —
// the same pipeline, Reserve resuming the hold, the same settle decision
// (settle_decision.go) — so Stripe either replays what it did the first time
// (Idempotent-Replayed: true) or executes it now, and the hold is settled from
// that answer, once. See docs/idempotency-and-caps.md, "Asking Stripe".

// ToolAskStripe is the tool the ledger's settle event of an ask names: the
// hold was resolved by asking Stripe.
const ToolAskStripe = "ask_stripe"

// AskResult is what asking Stripe about an unknown hold found.
type AskResult struct {
	HoldID string
	KeyID  string
	// Replayed is true when Stripe answered with what it did the first time
	// (the request had executed); false when it executed it now.
	Replayed bool
	// Outcome is how the hold was settled: commit, release, or unknown
	// (Stripe's answer still left it unknown: a 5xx, no answer).
	Outcome vault.SettleOutcome
	// Status and StripeRequestID are Stripe's answer's.
	Status          int
	StripeRequestID string
}

// AskError is why AskStripe sent nothing, or could not use the answer, in
// words for the operator; Status is the admin API's status for it.
type AskError struct {
	Status  int
	Message string
	cause   error
}

// Error implements error.
func (e *AskError) Error() string { return e.Message }

// Unwrap returns the cause.
func (e *AskError) Unwrap() error { return e.cause }

// AskStripe sends the stored request of the unknown hold holdID again under
// its upstream idempotency key and settles the hold from Stripe's answer
// (see the top of this file). Errors: vault.ErrNotFound (no such hold),
// *AskError with 409 (the hold is not unknown, its request was not kept, its
// key can no longer spend, or the retry was refused as the caller's would be
// — too old for Stripe's idempotency, say) or 502 (Stripe could not be
// reached: the hold stays unknown), and the store's.
func (p *Proxy) AskStripe(ctx context.Context, holdID string) (AskResult, error) {
	rec, stored, err := p.store.UnknownRequest(ctx, holdID)
	if errors.Is(err, vault.ErrConflict) {
		return AskResult{}, &AskError{Status: http.StatusConflict, cause: err,
			Message: "keybrake cannot ask Stripe about this hold: " + conflictDetail(err)}
	}
	if err != nil {
		return AskResult{}, fmt.Errorf("ask stripe: %w", err)
	}
	key, err := p.store.GetKey(ctx, rec.KeyID)
	if err != nil {
		return AskResult{}, fmt.Errorf("ask stripe: %w", err)
	}
	now := p.store.Now()
	if key.Status != vault.KeyActive || !key.Policy.ExpiresAt.IsZero() && !now.Before(key.Policy.ExpiresAt) {
		return AskResult{}, &AskError{Status: http.StatusConflict,
			Message: fmt.Sprintf("key %s is revoked or expired: if Stripe never executed the request, sending it now would move money under a key "+
				"that may no longer spend. Check the request in the Stripe Dashboard and resolve the hold by hand", key.ID)}
	}
	r, err := http.NewRequestWithContext(ctx, stored.Method, "http://keybrake.internal"+stored.Target, bytes.NewReader(stored.Body))
	if err != nil {
		return AskResult{}, fmt.Errorf("ask stripe: the stored request: %w", err)
	}
	r.Header = stored.Header.Clone()
	if r.Header == nil {
		r.Header = http.Header{}
	}
	r.Header.Set(headerIdempotencyKey, rec.IdempotencyKey)
	r.RemoteAddr = "ask-stripe"

	c := &call{start: p.now(), began: time.Now(), requestID: newRequestID(), method: r.Method, tool: ToolAskStripe,
		key: key, asked: true}
	defer p.logCall(c)
	r = r.WithContext(withCall(r.Context(), c))
	w := &askRecorder{header: http.Header{}}
	if err := p.prepare(r.Context(), w, r, c); err != nil {
		p.writeRefusal(w, c, err)
		return AskResult{}, &AskError{Status: http.StatusConflict, cause: err,
			Message: "keybrake refused to send the request again, as it would refuse the caller's retry: " + refusalMessage(err)}
	}
	if c.replay != nil || c.idemOutcome != idemResume {
		return AskResult{}, &AskError{Status: http.StatusConflict,
			Message: "the hold was settled meanwhile (by the caller's retry, an event or an operator); nothing was sent"}
	}
	p.forward(w, r, c)
	out := AskResult{HoldID: holdID, KeyID: key.ID, Replayed: w.header.Get("Idempotent-Replayed") == "true",
		Outcome: c.settleOutcome, Status: c.upstreamStatus, StripeRequestID: c.stripeRequestID}
	if c.upstreamStatus == 0 {
		return out, &AskError{Status: http.StatusBadGateway,
			Message: "keybrake could not get Stripe's answer; the hold stays unknown. Try again"}
	}
	return out, nil
}

// conflictDetail is the store's reason for a conflict, without its wrapping.
func conflictDetail(err error) string {
	msg := err.Error()
	for _, prefix := range []string{"unknown request: "} {
		if len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
			msg = msg[len(prefix):]
		}
	}
	if i := len(msg) - len(": "+vault.ErrConflict.Error()); i > 0 && msg[i:] == ": "+vault.ErrConflict.Error() {
		msg = msg[:i]
	}
	return msg
}

// refusalMessage is a pipeline refusal's message for the operator.
func refusalMessage(err error) string {
	var rf *refusal
	if errors.As(err, &rf) {
		return rf.Message
	}
	return "an internal error"
}

// storedRequest is the request as it is forwarded, kept with an unknown
// outcome.
func (c *call) storedRequest() *vault.StoredRequest {
	target := c.path
	if c.rawQuery != "" {
		target += "?" + c.rawQuery
	}
	h := http.Header{}
	for name, v := range map[string]string{"Content-Type": c.contentType, headerStripeAccount: c.account,
		headerStripeContext: c.stripeContext, headerStripeVersion: c.stripeVersion} {
		if v != "" {
			h.Set(name, v)
		}
	}
	return &vault.StoredRequest{Method: c.method, Target: target, Header: h, Body: c.body}
}

// askRecorder is the answer an ask writes to nobody: its headers tell whether
// Stripe replayed; the body was stored by the settle, for the caller's retry.
type askRecorder struct {
	header http.Header
	status int
}

func (w *askRecorder) Header() http.Header { return w.header }

func (w *askRecorder) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *askRecorder) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(b), nil
}
