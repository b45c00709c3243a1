package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// Step 11 of the pipeline (see prepare): the answers keybrake writes itself —
// refusals and replays — and the canonical log line of every request.

// writeRefusal answers with the refusal err (writeStripeError) and notes it for
// the log line.
func (p *Proxy) writeRefusal(w http.ResponseWriter, c *call, err error) {
	rf := writeStripeError(w, c.requestID, err)
	c.status, c.reason = rf.Status, rf.Code
	if c.decision != decisionReplayed {
		c.decision = decisionRefused
	}
	if rf.Status >= 500 {
		c.err = err
	} else if rf.cause != nil {
		c.err = rf.cause
	}
}

// writeReplay answers with the stored response of a completed record.
func (p *Proxy) writeReplay(ctx context.Context, w http.ResponseWriter, c *call) {
	resp := c.replay.Response
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = append([]string(nil), vs...)
	}
	h.Set(headerRequestID, c.requestID)
	h.Set(headerIdempotentReplayed, "true")
	if c.replay.RequestID != "" {
		h.Set(headerOriginalRequest, c.replay.RequestID)
	}
	if c.idemKey != "" {
		h.Set(headerIdempotencyKey, c.idemKey)
	}
	if resp.Status >= 200 && resp.Status < 300 {
		p.setRemaining(ctx, h, c)
	}
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	c.status, c.stripeRequestID = resp.Status, c.replay.RequestID
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// remainingHeaders names the header of each window kind setRemaining reports.
var remainingHeaders = [...]struct {
	kind   policy.WindowKind
	header string
}{{policy.WindowDaily, headerRemainingDaily}, {policy.WindowPeriod, headerRemainingPeriod}}

// setRemaining sets Keybrake-Remaining-Daily / -Period: what is left of each
// capped window after every commit and hold, and for a key under a budget the
// tightest of the key's and every budget's of its chain, per window kind: the
// most the next request of that kind could move. A request that kept a record
// reports the counters its Reserve read, with its own hold, corrected by its
// settle (c.usage): no other read. Any other request (a read), and one whose
// Reserve read no budget (it moved no money), reads the current usage.
func (p *Proxy) setRemaining(ctx context.Context, h http.Header, c *call) {
	windows, usage := c.windows, c.usage
	if windows == nil {
		var err error
		if _, windows, usage, err = p.store.KeyUsage(ctx, c.key.ID); err != nil {
			p.log.LogAttrs(ctx, slog.LevelWarn, "remaining budget unavailable",
				slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.Any(logfield.Error, err))
			return
		}
	}
	// What is left per kind of remainingHeaders, and whether a window of
	// that kind has a cap (a fixed array: no map per request).
	var rem [len(remainingHeaders)]struct {
		left   int64
		capped bool
	}
	note := func(win policy.Window, cnt policy.Counter) {
		if !win.HasCap {
			return
		}
		for i, kh := range remainingHeaders {
			if kh.kind != win.Kind {
				continue
			}
			left := max(0, win.Cap-cnt.Committed-cnt.Held)
			if r := &rem[i]; !r.capped || left < r.left {
				r.left, r.capped = left, true
			}
		}
	}
	budgetRead := false
	for _, win := range windows {
		note(win, usage[win.ID])
		budgetRead = budgetRead || strings.HasPrefix(string(win.ID), policy.BudgetIDPrefix)
	}
	if b := c.key.Policy.Budget; b != "" && !budgetRead {
		chain, err := p.store.BudgetChain(ctx, b)
		if err != nil {
			p.log.LogAttrs(ctx, slog.LevelWarn, "remaining budget unavailable",
				slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.Any(logfield.Error, err))
			return
		}
		for _, st := range chain {
			for _, win := range st.Windows {
				note(win, st.Usage[win.ID])
			}
		}
	}
	for i, kh := range remainingHeaders {
		if rem[i].capped {
			h.Set(kh.header, policy.FormatMinor(c.key.Policy.Currency, rem[i].left))
		}
	}
}

// logCall writes the canonical line: 5xx at Error, 4xx at Warn, else Info. It
// never logs the token, the secret, the idempotency key or a body. It also counts
// the request for /metrics, so every request is counted exactly once.
func (p *Proxy) logCall(c *call) {
	p.metrics.observeRequest(c, time.Since(c.began))
	level := slog.LevelInfo
	switch {
	case c.status >= 500 || c.status == 0:
		level = slog.LevelError
	case c.status >= 400:
		level = slog.LevelWarn
	}
	// Room for every attribute at once: the line's 13, and up to 4 more.
	attrs := append(make([]slog.Attr, 0, 17),
		slog.String(logfield.RequestID, c.requestID),
		slog.String(logfield.Method, c.method),
		slog.String(logfield.Path, stripeapi.Clip(c.path)),
		slog.String(logfield.KeyID, c.key.ID),
		slog.String(logfield.Operation, c.cls.Operation),
		slog.Int64(logfield.Amount, c.amount),
		slog.String(logfield.Currency, c.currency),
		slog.String(logfield.Decision, string(c.decision)),
		slog.String(logfield.Reason, string(c.reason)),
		slog.String(logfield.Idempotency, string(c.idemOutcome)),
		slog.Int(logfield.UpstreamStatus, c.upstreamStatus),
		slog.Int(logfield.Status, c.status),
		logfield.Duration(p.now().Sub(c.start)),
	)
	if c.stripeRequestID != "" {
		attrs = append(attrs, slog.String(logfield.StripeRequestID, c.stripeRequestID))
	}
	if c.keyRefused {
		attrs = append(attrs, slog.String(logfield.KeyName, c.key.Name), slog.String(logfield.RemoteAddr, c.remoteAddr))
	}
	if c.tool != "" {
		attrs = append(attrs, slog.String(logfield.Tool, c.tool))
	}
	if c.err != nil {
		attrs = append(attrs, slog.String(logfield.Error, c.err.Error()))
	}
	p.log.LogAttrs(context.Background(), level, "stripe request", attrs...)
}

// errText is the text of a parse error without the stripeapi.ErrMalformed suffix.
func errText(err error) string {
	return strings.TrimSuffix(err.Error(), ": "+stripeapi.ErrMalformed.Error())
}
