package proxy

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// call is the state of one request through the pipeline (see prepare). It
// travels from ServeHTTP to Rewrite, ModifyResponse and ErrorHandler in the
// request context; ReverseProxy runs those in the ServeHTTP goroutine, so no
// lock is needed. Its fields are grouped by the step that writes them: a step
// reads what earlier steps wrote and writes only its own group, except the
// outcome, which every step that decides the answer writes.
type call struct {
	// Written by ServeHTTP, before the first step.
	start     time.Time // p.now(): the clock the policy and the log line use
	began     time.Time // time.Now(), monotonic: the duration histogram's start
	requestID string
	method    string
	tool      string // the MCP tool that made the request ("" for none)

	// Step 1, authenticate (authenticate.go): the vault key, also an expired
	// one (the log line names it). keyRefused is set when the step refused
	// the key, so the log line names it and the caller's address (remoteAddr).
	key        vault.Key
	keyRefused bool
	remoteAddr string
	// asked is set when an operator's ask (askstripe.go) sends a kept
	// request again: the key is the hold's, checked there, not a token's.
	asked bool
	// remembered is the request whose key came from what this replica
	// remembered (vault.KeyRememberer), until a Reserve or confirmKey has
	// read the key as the store has it now; keyCheck is confirmKey's answer:
	// errKeyChanged, or the refusal of the key as it is now.
	remembered *http.Request
	keyCheck   error

	// Step 2, readRequest (request.go): the request exactly as Stripe reads it.
	path          string // exact escaped path the client sent
	rawQuery      string // GET only
	body          []byte
	contentType   string
	stripeVersion string
	account       string // validated Stripe-Account
	stripeContext string // validated Stripe-Context
	params        *stripeapi.Params
	cls           stripeapi.Classification

	// Steps 4 to 7 (decide), in a group that undecide forgets whole.
	decided

	// Step 9, forward (forward.go). connected is set when the transport got a
	// connection for the forward: from then on bytes of the request may have
	// reached Stripe. upstreamWait is the time spent waiting for Stripe's
	// answers, the amount lookups of step 6 included (timedTransport).
	connected    atomic.Bool
	upstreamWait time.Duration

	// Step 10, settle (settle.go): Stripe's answer, and whether the one Settle
	// of the record has been made.
	upstreamStatus  int
	stripeRequestID string
	settled         bool
	settleOutcome   vault.SettleOutcome

	// The outcome, for the log line and the metrics: written by authorise
	// (report mode), reserve, settle and the answers (answer.go).
	decision decision
	reason   ErrorCode
	status   int
	err      error
}

// decided is what steps 4 to 7 of a call write (see prepare).
type decided struct {
	// Step 4, the upstream secret (secrets.go): what rewrite and fetch send
	// to Stripe.
	secret string

	// Step 5, idempotency (reserve.go): the effective key, the caller's or
	// derived; "" when nothing is recorded. idemOutcome below is "derived"
	// until Reserve.
	idemKey string
	// ask describes the request to an approver, for a money request under a
	// policy that asks for approval (approval.go); approvalWait is how long the
	// caller waits for a decision (Keybrake-Approval-Wait).
	ask          *vault.ApprovalAsk
	approvalWait time.Duration

	// Step 6, resolveAmount (amount.go), for a request that moves money.
	amount      int64 // the hold (minor units); Reserve sets the hold it placed
	currency    string
	objectTotal int64                   // what the money object can move in all (per-request cap)
	exposure    vault.Exposure          // the key's exposure on cls.Target before the request
	looked      *stripeapi.LookupResult // the lookup made before forwarding, if any

	// Step 7, reserve (reserve.go): Store.Reserve's outcome.
	idemOutcome idemOutcome
	upstreamKey string                   // the idempotency key Stripe sees (keepsRecord only)
	replay      *vault.IdempotencyRecord // a completed record to answer with
	// windows and usage are the key's windows and counters as Reserve left
	// them, corrected by the request's own settle (freeOwnHold: the
	// remaining-budget headers); nil for a request that keeps no record.
	windows []policy.Window
	usage   policy.Usage
	// holdWindows are the windows the request's hold is on.
	holdWindows []policy.WindowID
}

// undecide forgets what steps 3 to 7 wrote, for prepare to decide the request
// again with the key as it is now (errKeyChanged).
func (c *call) undecide() {
	c.decided = decided{}
	c.decision, c.reason, c.keyCheck = "", "", nil
}

// metered reports whether the request can move money: its amount is held and
// settled on the key's windows.
func (c *call) metered() bool { return c.cls.MovesMoney }

// keepsRecord reports whether Reserve claimed the request's idempotency key
// (fresh or resumed): the forward is settled in one Store.Settle.
func (c *call) keepsRecord() bool { return c.idemOutcome == idemClaimed || c.idemOutcome == idemResume }

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
// line's idempotency field. It is the word of Store.Reserve's outcome
// (idemOutcomeOf), or "derived" while a derive-mode key has not reached
// Reserve yet.
type idemOutcome string

// Idempotency outcomes.
const (
	idemDerived  idemOutcome = "derived"
	idemClaimed  idemOutcome = "claimed"
	idemResume   idemOutcome = "resume"
	idemReplay   idemOutcome = "replay"
	idemInFlight idemOutcome = "in_flight"
	idemMismatch idemOutcome = "mismatch"
	idemStale    idemOutcome = "stale"
	idemRefused  idemOutcome = "refused"
	idemApproval idemOutcome = "approval"
)

// idemOutcomeOf is the word of a Store.Reserve outcome ("" for none of them).
func idemOutcomeOf(o vault.ReserveOutcome) idemOutcome {
	switch o {
	case vault.ReserveClaimed:
		return idemClaimed
	case vault.ReserveResume:
		return idemResume
	case vault.ReserveReplay:
		return idemReplay
	case vault.ReserveInFlight:
		return idemInFlight
	case vault.ReserveMismatch:
		return idemMismatch
	case vault.ReserveStale:
		return idemStale
	case vault.ReserveRefused:
		return idemRefused
	case vault.ReserveApproval:
		return idemApproval
	}
	return ""
}
