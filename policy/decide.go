package policy

import "time"

// WindowKind names a cap window.
type WindowKind string

// Window kinds.
const (
	WindowDaily      WindowKind = "daily"
	WindowPeriod     WindowKind = "period"
	WindowPerRequest WindowKind = "per_request"
)

// Window is one counted cap window of a key at a given instant. ID is what storage
// keys counters on: "day:2026-09-14" (the calendar date in the policy's time zone)
// or "period". Cap is in minor units; HasCap is false when the policy sets no cap
// for this window (usage is still counted).
type Window struct {
	Kind   WindowKind
	ID     string
	Start  time.Time // inclusive
	End    time.Time // exclusive; also the reset_at
	Cap    int64
	HasCap bool
}

// Windows returns the counted windows at now: always the daily window (the calendar
// day containing now in the policy's time zone, correct across DST: 23- and 25-hour
// days) and the period window [PeriodStart, ExpiresAt). Order: daily, period.
// It fails only if a cap cannot be converted to minor units (Validate prevents that).
func (p *Policy) Windows(now time.Time) ([]Window, error) { panic("unimplemented") }

// PerRequestCap returns the per-request cap in minor units and whether there is one.
func (p *Policy) PerRequestCapMinor() (int64, bool) { panic("unimplemented") }

// Counter is the usage of one window, in minor units.
type Counter struct {
	Committed int64 `json:"committed"`
	Held      int64 `json:"held"`
}

// Usage maps a Window.ID to its counter. A missing ID means zero.
type Usage map[string]Counter

// Request is what Decide needs to know about a request. Amount is in minor units of
// Currency; Currency is "" for requests that move no money. Account is the
// Stripe-Account / Stripe-Context value, "" for the platform.
type Request struct {
	Operation string
	Amount    int64
	Currency  string
	Customer  string
	Account   string
}

// Reason is a machine-readable refusal reason. The values are the proxy's error codes.
type Reason string

// Refusal reasons.
const (
	ReasonNone                Reason = ""
	ReasonExpired             Reason = "vault_key_expired"
	ReasonNotYetValid         Reason = "vault_key_not_yet_valid"
	ReasonOperationNotAllowed Reason = "operation_not_allowed"
	ReasonCustomerNotAllowed  Reason = "customer_not_allowed"
	ReasonAccountNotAllowed   Reason = "account_not_allowed"
	ReasonCurrencyNotAllowed  Reason = "currency_not_allowed"
	ReasonCapExceeded         Reason = "spend_cap_exceeded"
)

// Decision is the outcome of Decide.
//
// Allowed is true when the request may proceed (in report mode it is also true for a
// relaxable refusal; then WouldRefuse is true and Reason/Message say why).
// For ReasonCapExceeded, Cap names the window that would be exceeded and Limit,
// Committed, Held, Requested, Remaining (all minor units) and ResetAt describe it.
// For an allowed request, Remaining maps each capped window kind to what is left
// after this request's hold.
type Decision struct {
	Allowed     bool
	WouldRefuse bool
	Reason      Reason
	Message     string

	Cap       WindowKind
	Limit     int64
	Committed int64
	Held      int64
	Requested int64
	Remaining int64
	ResetAt   time.Time

	RemainingByWindow map[WindowKind]int64
}

// Decide says whether req may place a hold of req.Amount on every window of p at now,
// given the current usage. Checks, in order: expired (now ≥ ExpiresAt), not yet valid
// (now < PeriodStart), account, operation, customer, currency (when req.Currency != ""),
// per-request cap, daily cap, period cap — a cap is exceeded when
// committed + held + amount > cap. Report mode relaxes only operation, customer,
// currency and cap refusals (Allowed=true, WouldRefuse=true); expiry, not-yet-valid
// and account refusals are never relaxed.
func Decide(p *Policy, usage Usage, req Request, now time.Time) Decision { panic("unimplemented") }
