package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ScopeKind names what a cap window belongs to: a vault key or a budget.
type ScopeKind string

// Scope kinds.
const (
	ScopeKey    ScopeKind = "key"
	ScopeBudget ScopeKind = "budget"
)

// Scope names one holder of cap windows: a key or a budget. A refusal names
// the scope whose window or velocity limit would be exceeded.
type Scope struct {
	Kind ScopeKind `json:"kind"`
	ID   string    `json:"id"`
	Name string    `json:"name"`
}

// MaxChainDepth bounds a chain of scopes, counting the key: a key, its budget
// and at most two ancestors of that budget.
const MaxChainDepth = 4

// Velocity is a count limit: at most Count holds placed in any interval of
// length Per, counting only the holds of Operations (every money-moving
// operation when empty). Per is written like "30s", "1m", "1h" or "7d".
type Velocity struct {
	Count      int      `json:"count"`
	Per        string   `json:"per"`
	Operations []string `json:"operations,omitempty"`
}

// Bounds of a velocity limit.
const (
	MinVelocityPer   = time.Second
	MaxVelocityPer   = 31 * 24 * time.Hour
	MaxVelocityCount = 10000
	MaxVelocities    = 8
)

// ParsePer reads a velocity interval: a Go duration ("90s", "1h30m") or a
// whole number of days ("7d").
func ParsePer(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 31 {
			return 0, fmt.Errorf("%q is not a number of days from 1d to 31d", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not an interval like \"1m\", \"1h\" or \"7d\"", s)
	}
	return d, nil
}

// Interval is Per as a duration; an invalid Per (Validate refuses it) is the
// longest interval, the strictest reading.
func (v Velocity) Interval() time.Duration {
	d, err := ParsePer(v.Per)
	if err != nil || d < MinVelocityPer || d > MaxVelocityPer {
		return MaxVelocityPer
	}
	return d
}

// Applies reports whether a hold of operation op counts against v.
func (v Velocity) Applies(op string) bool {
	if len(v.Operations) == 0 {
		return true
	}
	return slices.ContainsFunc(v.Operations, func(g string) bool { return matchGlob(g, op) })
}

// Key identifies v's stored timestamps: a changed limit starts a new count.
func (v Velocity) Key() string {
	return strconv.Itoa(v.Count) + "/" + v.Per + "/" + strings.Join(v.Operations, ",")
}

// ValidateVelocity adds a problem to v for each malformed limit of vs, under
// field (e.g. "velocity").
func validateVelocity(v *ValidationError, field string, vs []Velocity) {
	if len(vs) > MaxVelocities {
		v.add(field, "at most %d limits", MaxVelocities)
	}
	for i, l := range vs {
		f := fmt.Sprintf("%s[%d]", field, i)
		if l.Count < 1 || l.Count > MaxVelocityCount {
			v.add(f+".count", "must be from 1 to %d (it is %d)", MaxVelocityCount, l.Count)
		}
		if d, err := ParsePer(l.Per); err != nil {
			v.add(f+".per", "%v", err)
		} else if d < MinVelocityPer || d > MaxVelocityPer {
			v.add(f+".per", "must be from 1s to 31d (it is %s)", l.Per)
		}
		for j, op := range l.Operations {
			if msg := checkGlob(op); msg != "" {
				v.add(fmt.Sprintf("%s.operations[%d]", f, j), "%q: %s", op, msg)
			}
		}
	}
}

// ValidateVelocities is the velocity limits' part of a policy's validation,
// for a budget's limits: a *ValidationError or nil.
func ValidateVelocities(field string, vs []Velocity) error {
	var v ValidationError
	validateVelocity(&v, field, vs)
	return v.err()
}

// VelocityRetryAt says whether one more hold at now fits the limit v, given
// the times of the holds already counted against it (oldest first; only the
// last v.Count are needed). When it does not, retryAt is the first instant at
// which it would: the interval then no longer holds Count of them.
func VelocityRetryAt(v Velocity, stamps []time.Time, now time.Time) (retryAt time.Time, ok bool) {
	per := v.Interval()
	in := 0
	for _, s := range stamps {
		if s.After(now.Add(-per)) {
			in++
		}
	}
	if in < v.Count {
		return time.Time{}, true
	}
	// The stamps inside the interval are the newest; the (in-Count+1)-th
	// oldest of them must leave it.
	first := len(stamps) - in
	return stamps[first+in-v.Count].Add(per), false
}

// ChainLink is one budget of a key's chain as Decide sees it: its scope,
// currency, zone, windows at now and usage. Open is false when now is outside
// the budget's period (before period_start, at or after expires_at).
type ChainLink struct {
	Scope    Scope
	Currency string
	Location *time.Location
	Windows  []Window
	Usage    Usage
	Open     bool
	// PeriodStart and ExpiresAt bound the budget's life (ExpiresAt zero: open-ended).
	PeriodStart, ExpiresAt time.Time
}

// DecideChain is DecideIn for a key whose money also draws on budgets: the
// key's own decision first (scope key), then each budget's windows, closest
// first, with the same comparison as the key's caps. A budget's caps are
// enforced whatever the key's mode: a dry-run key must not draw a shared
// budget past its cap. The first scope that would be exceeded is the one
// named.
func DecideChain(p *Policy, key Scope, windows []Window, usage Usage, req Request, now time.Time, chain []ChainLink) Decision {
	d := decide(p, windows, nil, usage, req, now)
	d.Scope = key
	if !d.Allowed || req.Amount <= 0 {
		return d
	}
	for _, l := range chain {
		if !l.Open {
			r := refuse(ReasonCapExceeded, fmt.Sprintf("budget %q is not open now: its period runs from %s to %s",
				l.Scope.Name, l.PeriodStart.In(l.Location).Format(time.RFC3339), stampOrOpen(l.ExpiresAt, l.Location)))
			r.Scope, r.Cap, r.Requested, r.ResetAt = l.Scope, WindowPeriod, req.Amount, l.ExpiresAt
			return r
		}
		if r, over := capRefusal(l.Scope, l.Currency, l.Location, l.Windows, l.Usage, req.Amount); over {
			return r
		}
	}
	return d
}

func stampOrOpen(t time.Time, loc *time.Location) string {
	if t.IsZero() {
		return "no end"
	}
	return t.In(loc).Format(time.RFC3339)
}

// capRefusal is the cap comparison of every scope: the first capped window of
// windows that cannot take amount on top of its usage (committed + held +
// amount > cap), as a refusal naming scope. over is false when every window
// can.
func capRefusal(scope Scope, cur string, loc *time.Location, windows []Window, usage Usage, amount int64) (d Decision, over bool) {
	for _, w := range windows {
		if !w.HasCap {
			continue
		}
		c := usage[w.ID]
		left := Remaining(w, c)
		if amount <= left {
			continue
		}
		what := "resets at"
		if w.Kind == WindowPeriod {
			what = "the period ends at"
		}
		owner := ""
		if scope.Kind == ScopeBudget {
			owner = fmt.Sprintf("budget %q: ", scope.Name)
		}
		d := refuse(ReasonCapExceeded, fmt.Sprintf("%s%s cap of %s %s would be exceeded: %s committed, %s held, %s requested, %s remaining; %s %s",
			owner, w.Kind, FormatMinor(cur, w.Cap), cur, FormatMinor(cur, c.Committed), FormatMinor(cur, c.Held),
			FormatMinor(cur, amount), FormatMinor(cur, left), what, stampOrOpen(w.End, loc)))
		d.Scope = scope
		d.Cap, d.Limit, d.Committed, d.Held, d.Requested, d.Remaining, d.ResetAt =
			w.Kind, w.Cap, c.Committed, c.Held, amount, left, w.End
		return d, true
	}
	return Decision{}, false
}
