package policy

import (
	"fmt"
	"math"
	"strings"
	"time"
)

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
	ID     WindowID
	Start  time.Time // inclusive
	End    time.Time // exclusive; also the reset_at
	Cap    int64
	HasCap bool
}

// Windows returns the counted windows at now: always the daily window (the calendar
// day containing now in the policy's time zone, correct across DST: 23- and 25-hour
// days) and the period window [PeriodStart, ExpiresAt). Order: daily, period.
// It fails only if a cap cannot be converted to minor units (Validate prevents that).
//
// The daily window is the stretch of time around now during which the local date
// stays the date of now: normally [local midnight, next local midnight). Where a zone
// skips midnight it starts at the transition, and where a zone repeats part of a day
// (clocks turned back across midnight) each stretch is its own window with the same
// ID, so they share one counter. Start <= now < End always holds.
func (p *Policy) Windows(now time.Time) ([]Window, error) {
	cur := p.EffectiveCurrency()
	start, end, date := dayBounds(now, p.Location())
	daily := Window{Kind: WindowDaily, ID: DayWindowID(date), Start: start, End: end}
	period := Window{Kind: WindowPeriod, ID: PeriodWindowID, Start: p.PeriodStart, End: p.ExpiresAt}
	var err error
	if p.DailyCap != nil {
		daily.HasCap = true
		if daily.Cap, err = ToMinor(cur, *p.DailyCap); err != nil {
			return nil, fmt.Errorf("daily cap: %w", err)
		}
	}
	if p.PeriodCap != nil {
		period.HasCap = true
		if period.Cap, err = ToMinor(cur, *p.PeriodCap); err != nil {
			return nil, fmt.Errorf("period cap: %w", err)
		}
	}
	return []Window{daily, period}, nil
}

// maxZoneSteps bounds the walk over zone transitions in dayBounds. No zone changes
// its offset more than twice a day; the bound only guards against a broken tzdata.
const maxZoneSteps = 16

// dayBounds returns the stretch [start, end) around now during which the local date
// in loc equals the local date of now, and that date as YYYY-MM-DD.
//
// Within one zone period (constant UTC offset) the local date changes only at local
// midnight of that offset; across a transition it may change at the transition
// itself. So the walk computes midnight in the current offset and, when that falls
// outside the period, steps to the neighbouring period.
func dayBounds(now time.Time, loc *time.Location) (start, end time.Time, date string) {
	ln := now.In(loc)
	y, m, d := ln.Date()
	date = fmt.Sprintf("%04d-%02d-%02d", y, m, d)
	sameDay := func(t time.Time) bool {
		ty, tm, td := t.Date()
		return ty == y && tm == m && td == d
	}

	found := false
	for t, i := ln, 0; i < maxZoneSteps; i++ {
		_, off := t.Zone()
		mid := time.Date(y, m, d, 0, 0, 0, 0, time.FixedZone("", off))
		zs, _ := zoneBounds(t)
		if zs.IsZero() || mid.After(zs) {
			start, found = mid, true
			break
		}
		prev := zs.Add(-time.Nanosecond).In(loc)
		if !sameDay(prev) {
			start, found = zs, true
			break
		}
		t = prev
	}
	if !found || start.After(now) {
		start = now // unreachable with sane tzdata; keeps Start <= now
	}

	found = false
	for t, i := ln, 0; i < maxZoneSteps; i++ {
		_, off := t.Zone()
		next := time.Date(y, m, d+1, 0, 0, 0, 0, time.FixedZone("", off))
		_, ze := zoneBounds(t)
		if ze.IsZero() || next.Before(ze) {
			end, found = next, true
			break
		}
		t = ze.In(loc)
		if !sameDay(t) {
			end, found = ze, true
			break
		}
	}
	if !found || !end.After(now) {
		end = now.Add(time.Nanosecond) // unreachable with sane tzdata; keeps now < End
	}
	return start.In(loc), end.In(loc), date
}

// PerRequestCapMinor returns the per-request cap in minor units and whether there is
// one. A cap that cannot be converted (Validate prevents that) fails closed: it is
// reported as a cap of 0, so only requests that move no money pass.
func (p *Policy) PerRequestCapMinor() (int64, bool) {
	if p.PerRequestCap == nil {
		return 0, false
	}
	v, err := ToMinor(p.EffectiveCurrency(), *p.PerRequestCap)
	if err != nil {
		return 0, true
	}
	return v, true
}

// Remaining returns what is left of window w's cap after the usage c: cap minus
// committed minus held, never negative. For a window without a cap (w.HasCap false)
// it returns 0; callers report such a window's cap and remaining as null.
func Remaining(w Window, c Counter) int64 {
	if !w.HasCap {
		return 0
	}
	used := satAdd(max(c.Committed, 0), max(c.Held, 0))
	if used >= w.Cap {
		return 0
	}
	return w.Cap - used
}

// satAdd adds two non-negative counters, saturating at MaxInt64 instead of wrapping.
func satAdd(a, b int64) int64 {
	s := a + b
	if a > 0 && b > 0 && s < 0 {
		return math.MaxInt64
	}
	return s
}

// Counter is the usage of one window, in minor units.
type Counter struct {
	Committed int64 `json:"committed"`
	Held      int64 `json:"held"`
}

// Usage maps a Window.ID to its counter. A missing ID means zero.
type Usage map[WindowID]Counter

// Request is what Decide needs to know about a request. Amount is in minor units of
// Currency; Currency is "" for requests that move no money. Account is the
// Stripe-Account / Stripe-Context value, "" for the platform.
//
// ObjectTotal is what the money object the request creates or acts on can move in
// all once the request is done (a PaymentIntent's new total after a raise, every
// capture of one authorisation through the key): the per-request cap bounds what
// one money object can move, so it is checked against max(Amount, ObjectTotal).
// The daily and period caps are checked against Amount, the money the request adds.
type Request struct {
	Operation   string
	Amount      int64
	Currency    string
	Customer    string
	Account     string
	ObjectTotal int64
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
	// ReasonAmountUnknown refuses a request whose amount is negative: amounts come
	// from ^[0-9]+$ on the wire, so a negative one means a caller bug; fail closed.
	ReasonAmountUnknown Reason = "amount_unknown"
	// ReasonVelocityExceeded refuses a hold that would put more than a
	// velocity limit's count of holds into one interval of its length.
	ReasonVelocityExceeded Reason = "velocity_exceeded"
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

	// Scope is who the refusal is about (the key, or one of its budgets); for
	// an allowed request, the key.
	Scope Scope
	// Velocity and RetryAt describe a ReasonVelocityExceeded refusal: the
	// limit, and when one more hold would fit.
	Velocity Velocity
	RetryAt  time.Time
	// Now is the instant the decision was made at (for a Retry-After).
	Now time.Time
}

// VelocityRefusal is the refusal of a hold that limit v of scope does not
// let through before retryAt.
func VelocityRefusal(scope Scope, v Velocity, retryAt, now time.Time) Decision {
	owner := "this key"
	if scope.Kind == ScopeBudget {
		owner = fmt.Sprintf("budget %q", scope.Name)
	}
	what := "money-moving requests"
	if len(v.Operations) > 0 {
		what = strings.Join(v.Operations, ", ")
	}
	d := refuse(ReasonVelocityExceeded, fmt.Sprintf("velocity limit of %s: at most %d %s per %s; retry at %s",
		owner, v.Count, what, v.Per, retryAt.UTC().Format(time.RFC3339)))
	d.Scope, d.Velocity, d.RetryAt, d.Now = scope, v, retryAt, now
	return d
}

// Decide says whether req may place a hold of req.Amount on every window of p at now,
// given the current usage. Checks, in order: expired (now ≥ ExpiresAt), not yet valid
// (now < PeriodStart), account, operation, customer, currency (when req.Currency != ""),
// per-request cap (against max(Amount, ObjectTotal)), daily cap, period cap — a
// window cap is exceeded when committed + held + amount > cap. Report mode relaxes only operation, customer,
// currency and cap refusals (Allowed=true, WouldRefuse=true); expiry, not-yet-valid
// and account refusals are never relaxed.
//
// A request with Amount 0 passes every cap check; a negative Amount is refused
// (ReasonAmountUnknown, checked right after account, never relaxed); a cap that
// cannot be converted to minor units refuses with ReasonCapExceeded, never relaxed.
// In report mode the first relaxable refusal is the one reported. Messages are sentences for humans, e.g.
// "daily cap of 99.00 usd would be exceeded: 95.00 committed, 0.00 held, 5.00
// requested, 4.00 remaining; resets at 2026-09-15T00:00:00Z"; times are written in
// the policy's time zone. Remaining values are never negative.
func Decide(p *Policy, usage Usage, req Request, now time.Time) Decision {
	windows, err := p.Windows(now)
	return decide(p, windows, err, usage, req, now)
}

// DecideIn is Decide for a caller that has computed p.Windows(now) already
// (without an error): the store's Reserve reads the counters of those windows
// and decides in its single committer, where every microsecond counts.
func DecideIn(p *Policy, windows []Window, usage Usage, req Request, now time.Time) Decision {
	return decide(p, windows, nil, usage, req, now)
}

// decide is Decide with p.Windows(now) and its error.
func decide(p *Policy, windows []Window, windowsErr error, usage Usage, req Request, now time.Time) Decision {
	loc := p.Location()
	stamp := func(t time.Time) string { return t.In(loc).Format(time.RFC3339) }

	// Never relaxed, not even in report mode.
	if !p.ExpiresAt.IsZero() && !now.Before(p.ExpiresAt) {
		return refuse(ReasonExpired, "vault key expired at "+stamp(p.ExpiresAt))
	}
	if now.Before(p.PeriodStart) {
		return refuse(ReasonNotYetValid, "vault key is not valid before "+stamp(p.PeriodStart))
	}
	if !p.AllowsAccount(req.Account) {
		return refuse(ReasonAccountNotAllowed, fmt.Sprintf("connected account %q is not allowed by this key's policy", req.Account))
	}
	if req.Amount < 0 {
		return refuse(ReasonAmountUnknown, fmt.Sprintf("amount %d is negative", req.Amount))
	}
	if windowsErr != nil {
		return refuse(ReasonCapExceeded, "the policy's caps cannot be evaluated: "+windowsErr.Error())
	}

	report := p.EffectiveMode() == ModeReport
	var first *Decision // first relaxable refusal, in check order
	note := func(d Decision) bool {
		if first == nil {
			first = &d
		}
		return !report // stop at the first refusal unless only reporting
	}

	cur := p.EffectiveCurrency()
	if !p.AllowsOperation(req.Operation) {
		if note(refuse(ReasonOperationNotAllowed, fmt.Sprintf("operation %q is not allowed by this key's policy", req.Operation))) {
			return *first
		}
	}
	if !p.AllowsCustomer(req.Customer) {
		msg := fmt.Sprintf("customer %q is not allowed by this key's policy", req.Customer)
		if req.Customer == "" {
			msg = "this key's policy allows only listed customers and the request names none"
		}
		if note(refuse(ReasonCustomerNotAllowed, msg)) {
			return *first
		}
	}
	if req.Currency != "" && req.Currency != cur {
		if note(refuse(ReasonCurrencyNotAllowed, fmt.Sprintf("currency %q is not allowed: this key's policy is in %s", req.Currency, cur))) {
			return *first
		}
	}

	if perObject := max(req.Amount, req.ObjectTotal); perObject > 0 {
		if capMinor, ok := p.PerRequestCapMinor(); ok && perObject > capMinor {
			msg := fmt.Sprintf("per-request cap of %s %s would be exceeded: %s requested",
				FormatMinor(cur, capMinor), cur, FormatMinor(cur, perObject))
			if perObject > req.Amount {
				msg = fmt.Sprintf("per-request cap of %s %s would be exceeded: the payment would move %s in all (%s more now)",
					FormatMinor(cur, capMinor), cur, FormatMinor(cur, perObject), FormatMinor(cur, req.Amount))
			}
			d := refuse(ReasonCapExceeded, msg)
			d.Cap, d.Limit, d.Requested, d.Remaining = WindowPerRequest, capMinor, perObject, capMinor
			if note(d) {
				return *first
			}
		}
	}
	if req.Amount > 0 {
		if d, over := capRefusal(Scope{}, cur, loc, windows, usage, req.Amount); over {
			if note(d) {
				return *first
			}
		}
	}

	out := Decision{Allowed: true, RemainingByWindow: make(map[WindowKind]int64, len(windows))}
	for _, w := range windows {
		if w.HasCap {
			left := Remaining(w, usage[w.ID]) - req.Amount
			if left < 0 {
				left = 0
			}
			out.RemainingByWindow[w.Kind] = left
		}
	}
	if first != nil { // report mode: let it through, say what enforcing would have done
		rem := out.RemainingByWindow
		out = *first
		out.Allowed, out.WouldRefuse, out.RemainingByWindow = true, true, rem
		out.Message = "allowed in report mode; would have been refused: " + out.Message
	}
	return out
}

// zoneSearchSpan bounds how far zoneBounds looks for a transition by itself; a day
// is at most about 27 hours long, so a transition further away does not matter.
const zoneSearchSpan = 72 * time.Hour

// zoneSearchStep is the stride of that search. Two transitions that cancel out
// within one stride would be missed; no zone has any.
const zoneSearchStep = 3 * time.Hour

// zoneBounds is t.ZoneBounds() (t in its location) checked for sanity: the period
// must contain t and have t's offset at both ends. Go's ZoneBounds is wrong for some
// instants computed from a zone's rule string (beyond the tzdata's explicit
// transitions): on 31 December of leap years it returns an end that is not after t.
// Where the check fails, the bound is found by searching the offsets instead. A
// zero bound means no transition within zoneSearchSpan (or ever).
func zoneBounds(t time.Time) (start, end time.Time) {
	start, end = t.ZoneBounds()
	_, off := t.Zone()
	if !end.IsZero() && (!end.After(t) || offsetAt(end.Add(-time.Nanosecond), t.Location()) != off) {
		end = searchOffsetChange(t, off, zoneSearchStep)
	}
	if !start.IsZero() && (start.After(t) || offsetAt(start, t.Location()) != off) {
		if last := searchOffsetChange(t, off, -zoneSearchStep); !last.IsZero() {
			start = last.Add(time.Nanosecond)
		} else {
			start = time.Time{}
		}
	}
	return start, end
}

func offsetAt(t time.Time, loc *time.Location) int {
	_, off := t.In(loc).Zone()
	return off
}

// searchOffsetChange looks from t in steps of step (forward when positive) for the
// nearest instant whose offset differs from off, within zoneSearchSpan. Forward it
// returns the first instant with a different offset; backward, the last one.
func searchOffsetChange(t time.Time, off int, step time.Duration) time.Time {
	loc := t.Location()
	for moved := time.Duration(0); moved < zoneSearchSpan; moved += step.Abs() {
		a, b := t.Add(moved*sign(step)), t.Add((moved+step.Abs())*sign(step))
		if offsetAt(b, loc) == off {
			continue
		}
		// offset(a) == off, offset(b) != off: bisect to the nanosecond.
		for a.Sub(b).Abs() > time.Nanosecond {
			mid := a.Add(b.Sub(a) / 2)
			if offsetAt(mid, loc) == off {
				a = mid
			} else {
				b = mid
			}
		}
		return b
	}
	return time.Time{}
}

func sign(d time.Duration) time.Duration {
	if d < 0 {
		return -1
	}
	return 1
}

// refuse builds a refusal.
func refuse(r Reason, msg string) Decision {
	return Decision{Reason: r, Message: msg}
}
