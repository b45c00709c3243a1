package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// decision is what the proxy did with a request: the canonical log line's
// decision and the outcome label of keybrake_proxy_requests_total. Where a ledger
// event records the same thing, it is the ledger's word (vault.Decision).
type decision string

// Decisions of the canonical log line.
const (
	decisionAllowed     = decision(vault.DecisionAllowed)
	decisionWouldRefuse = decision(vault.DecisionWouldRefuse)
	decisionRefused     = decision(vault.DecisionRefused)
	decisionReplayed    = decision("replayed") // a completed record's answer, written again
	decisionResumed     = decision("resumed")  // an unknown outcome, forwarded again under the same upstream key
)

// idemOutcome is what became of a request's idempotency key: the canonical
// line's idempotency field. It is the outcome of Store.Reserve, or "derived"
// while a derive-mode key has not reached Reserve yet.
type idemOutcome string

// Idempotency outcomes.
const (
	idemDerived  idemOutcome = "derived"
	idemClaimed  idemOutcome = "claimed"   // vault.ReserveClaimed
	idemResume   idemOutcome = "resume"    // vault.ReserveResume
	idemReplay   idemOutcome = "replay"    // vault.ReserveReplay
	idemInFlight idemOutcome = "in_flight" // vault.ReserveInFlight
	idemMismatch idemOutcome = "mismatch"  // vault.ReserveMismatch
	idemStale    idemOutcome = "stale"     // vault.ReserveStale
	idemRefused  idemOutcome = "refused"   // vault.ReserveRefused
)

// call is the state of one request through the pipeline. It travels from
// ServeHTTP to Rewrite, ModifyResponse and ErrorHandler in the request context;
// ReverseProxy runs those in the ServeHTTP goroutine, so no lock is needed.
type call struct {
	start     time.Time // p.now(): the clock the policy and the log line use
	began     time.Time // time.Now(), monotonic: the duration histogram's start
	requestID string
	method    string
	tool      string // the MCP tool that made the request ("" for none)

	// read from the request
	path          string // exact escaped path the client sent
	rawQuery      string // GET only
	body          []byte
	contentType   string
	stripeVersion string
	account       string // validated Stripe-Account
	stripeContext string // validated Stripe-Context
	params        *stripeapi.Params
	cls           stripeapi.Classification

	key    vault.Key
	secret string
	// windows and usage are the key's windows and counters as Reserve left
	// them, corrected by the request's own settle (the remaining-budget
	// headers); nil for a request that keeps no record.
	windows []policy.Window
	usage   policy.Usage
	// holdWindows are the windows the request's hold is on.
	holdWindows []string

	// metering
	metered     bool
	amount      int64 // the hold (minor units)
	currency    string
	objectTotal int64                   // what the money object can move in all (per-request cap)
	exposure    vault.Exposure          // the key's exposure on cls.Target before the request
	looked      *stripeapi.LookupResult // the lookup made before forwarding, if any
	overrun     int64                   // what Stripe reported moved beyond hold + exposure

	// idempotency
	idemKey     string // effective key (caller's or derived); "" when nothing is recorded
	record      bool   // a record is claimed: Settle after forwarding
	upstreamKey string
	idemOutcome idemOutcome
	replay      *vault.IdempotencyRecord
	settled     bool
	// connected is set when the transport got a connection for the forward:
	// from then on bytes of the request may have reached Stripe.
	connected atomic.Bool

	// outcome, for the log line
	decision        decision
	reason          string
	status          int
	upstreamStatus  int
	stripeRequestID string
	err             error

	// upstreamWait is the time spent waiting for Stripe's answers (timedTransport).
	upstreamWait time.Duration
}

type callKey struct{}

// withCall returns ctx carrying c, for the ReverseProxy's callbacks and the
// transport.
func withCall(ctx context.Context, c *call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

// callFrom returns the call of withCall, nil for none.
func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// prepare runs the steps before forwarding, in this order:
//
//  1. authenticate the vault key (authenticate.go);
//  2. read the request exactly as Stripe would (request.go);
//  3. authorise it against the policy, amount aside (authorise.go);
//  4. read, demand or derive the idempotency key (reserve.go), before any amount
//     lookup, so that a request refused for its key costs Stripe nothing;
//  5. work out the amount of a request that can move money (amount.go);
//  6. one Store.Reserve: the claim and the hold, or a replay or refusal
//     (reserve.go).
//
// It returns a refusal, or leaves c ready to forward (or with c.replay set).
// Forwarding and settling (7, 8) are in forward.go and settle.go, the answers keybrake
// writes and the canonical log line (9) in answer.go.
func (p *Proxy) prepare(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call) error {
	if err := p.authenticate(ctx, r, c); err != nil {
		return err
	}
	if err := p.readRequest(w, r, c); err != nil {
		return err
	}
	if err := p.authorise(c); err != nil {
		return err
	}
	secret, err := p.upstreamSecret(ctx, c.key.Upstream)
	if err != nil {
		return internalError(fmt.Errorf("upstream secret %q: %w", c.key.Upstream, err))
	}
	c.secret = secret
	c.metered = c.cls.MovesMoney
	// The idempotency key is checked before any amount lookup, so that a request
	// refused for its key costs Stripe nothing.
	if err := p.idempotency(r, c); err != nil {
		return err
	}
	if c.metered {
		if err := p.resolveAmount(ctx, c); err != nil {
			return err
		}
	}
	if c.idemKey == "" {
		if c.decision == "" {
			c.decision = decisionAllowed
		}
	} else if err := p.reserve(ctx, c); err != nil {
		return err
	}
	p.recordUnmeteredWouldRefuse(ctx, c)
	return nil
}

// recordUnmeteredWouldRefuse puts a request that moves no money, and that report
// mode lets through although the policy would refuse it, in the key's ledger
// (metered requests get their event from Store.Reserve). Losing this entry moves
// no money, so a store error is logged rather than failing the request.
func (p *Proxy) recordUnmeteredWouldRefuse(ctx context.Context, c *call) {
	if c.metered || c.decision != decisionWouldRefuse {
		return
	}
	err := p.store.RecordEvent(ctx, vault.Event{
		KeyID: c.key.ID, Operation: c.cls.Operation, Decision: vault.DecisionWouldRefuse, Reason: c.reason,
		ObjectID: c.cls.ObjectID, Tool: c.tool,
	})
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelError, "report-mode event not recorded",
			slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.Any(logfield.Error, err))
	}
}
