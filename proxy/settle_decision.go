package proxy

import (
	"net/http"

	"github.com/keybrake/keybrake/vault"
)

// What Stripe's answer to a forwarded request, or its absence, means for the
// request's hold: the most money-critical table of the proxy, as a pure
// function of the answer's facts (decideSettle) so that its table test
// (TestDecideSettle) holds every row. settle.go applies the decision.

// settleDecision is what an answer means for the hold of a request that keeps a
// record. Each decision is one vault.SettleOutcome and says whether Stripe's
// answer is stored for replay.
type settleDecision int

// Settle decisions.
const (
	// settleNone: the request keeps no record (a read, a deletion, a write
	// without an idempotency key): there is no hold to settle.
	settleNone settleDecision = iota
	// settleCommit: Stripe executed the request (2xx). The hold is committed
	// (settleAnswer works out how much, and on which money object) and the
	// answer kept for replay.
	settleCommit
	// settleKeepCreated: Stripe refused the request (4xx) but its body shows a
	// money object the request created anyway (a declined PaymentIntent in
	// error.payment_intent, still confirmable). Committed as that object's
	// exposure, and the answer kept for replay.
	settleKeepCreated
	// settleRelease: Stripe refused the request (a definitive 4xx): nothing
	// moved, the hold is released and the answer kept for replay.
	settleRelease
	// settleUnknownKept: the money may have moved and Stripe's answer is the
	// one to replay (a 5xx, which Stripe replays too; a resumed request's
	// idempotency_error, which says nothing about the earlier attempt): the hold
	// stays and the record is unknown.
	settleUnknownKept
	// settleUnknown: the money may have moved and there is no answer to keep
	// (Stripe's 409 for an attempt still executing under the upstream key; no
	// answer after bytes of the request may have reached Stripe): the hold
	// stays and the record is unknown.
	settleUnknown
	// settleAbandon: Stripe executed nothing and saved nothing under the
	// upstream key (429; 401 or 403 to keybrake's own secret; no connection,
	// so nothing was sent): the attempt is forgotten — a fresh claim and its
	// hold go, a resumed one goes back to unknown.
	settleAbandon
)

// String names the decision (tests, failures).
func (d settleDecision) String() string {
	switch d {
	case settleNone:
		return "none"
	case settleCommit:
		return "commit"
	case settleKeepCreated:
		return "keep_created"
	case settleRelease:
		return "release"
	case settleUnknownKept:
		return "unknown_kept"
	case settleUnknown:
		return "unknown"
	case settleAbandon:
		return "abandon"
	}
	return "invalid"
}

// outcome is the Store.Settle outcome of the decision ("" for settleNone).
func (d settleDecision) outcome() vault.SettleOutcome {
	switch d {
	case settleCommit, settleKeepCreated:
		return vault.SettleCommit
	case settleRelease:
		return vault.SettleRelease
	case settleUnknownKept, settleUnknown:
		return vault.SettleUnknown
	case settleAbandon:
		return vault.SettleAbandon
	}
	return ""
}

// keepsAnswer reports whether Stripe's answer is stored with the settle, for
// a retry with the same idempotency key to replay.
func (d settleDecision) keepsAnswer() bool {
	switch d {
	case settleCommit, settleKeepCreated, settleRelease, settleUnknownKept:
		return true
	}
	return false
}

// bodyShape is what an error answer's body shows, as far as the settle
// decision cares; only a 4xx's body is read for it (bodyShapeOf).
type bodyShape uint8

// Body shapes: flags, since a body may show both.
const (
	// bodyIdempotencyError: the error's type is idempotency_error.
	bodyIdempotencyError bodyShape = 1 << iota
	// bodyCreatedObject: the error carries a money object that the (metered,
	// creating) request created anyway (stripeapi.MoneyObjectInError).
	bodyCreatedObject
)

// answerFacts are the facts of Stripe's answer that decide the settle.
type answerFacts struct {
	// status is Stripe's status; 0 when no usable answer arrived (none, or
	// one that could not be read in full).
	status int
	// sent, for status 0, says that the transport got a connection: bytes of
	// the request may have reached Stripe.
	sent bool
	// idem is the request's idempotency outcome: only claimed and resume keep
	// a record, and so a hold to settle.
	idem idemOutcome
	// body is what a 4xx's body shows.
	body bodyShape
}

// decideSettle is what the answer means for the hold. Rows, in the order they
// are checked (the first that matches decides):
//
//	no record                                → none
//	no answer, nothing sent                  → abandon
//	no answer, bytes may have reached Stripe → unknown
//	2xx                                      → commit
//	401, 403 (keybrake's own secret)         → abandon
//	409 (an attempt still executing)         → unknown
//	429 (rate limited before executing)      → abandon
//	4xx idempotency_error to a resumed call  → unknown, answer kept
//	4xx showing a money object it created    → keep created
//	other 4xx                                → release
//	anything else (5xx, 1xx, 3xx)            → unknown, answer kept
func decideSettle(a answerFacts) settleDecision {
	code := a.status
	switch {
	case a.idem != idemClaimed && a.idem != idemResume:
		return settleNone
	case code == 0 && !a.sent:
		return settleAbandon
	case code == 0:
		return settleUnknown
	case code >= 200 && code < 300:
		return settleCommit
	case isCredentialRefusal(code):
		return settleAbandon
	case code == http.StatusConflict:
		// idempotency_key_in_use: Stripe is executing an earlier attempt under
		// this upstream key (a transport resend, a lapsed lease), which may move
		// the money. Whatever attempt it was, the hold stays until a retry or an
		// operator learns the outcome; the 409 itself is not the answer to keep.
		return settleUnknown
	case code == http.StatusTooManyRequests:
		return settleAbandon
	case code >= 400 && code < 500 && a.idem == idemResume && a.body&bodyIdempotencyError != 0:
		// Stripe knows the upstream key from an earlier attempt whose parameters
		// it judges different (e.g. another Stripe-Version): that attempt may
		// have moved the money, so this answer says nothing about it.
		return settleUnknownKept
	case code >= 400 && code < 500 && a.body&bodyCreatedObject != 0:
		// A 4xx whose body shows a money object the request created anyway is
		// not "nothing happened".
		return settleKeepCreated
	case code >= 400 && code < 500:
		return settleRelease
	default:
		return settleUnknownKept
	}
}
