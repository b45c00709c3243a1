package policy

import (
	"math"
	"time"
)

// MaxRaiseSpan is how far ahead a raise may end: a raise is a temporary
// allowance, and one that lasts longer is a change of the policy.
const MaxRaiseSpan = 31 * 24 * time.Hour

// Raise adds Amount (minor units of the scope's currency) to the cap of one
// window until Until, after which the cap is what it was, by itself.
type Raise struct {
	Window WindowKind
	Amount int64
	Until  time.Time
}

// ActiveAt reports whether r adds to its window's cap at now: until its end,
// exclusive.
func (r Raise) ActiveAt(now time.Time) bool { return now.Before(r.Until) }

// EffectiveCap is the cap of window kind at now: base plus the amounts of the
// raises of that window still active at now (saturating, never wrapping).
// Nothing else computes a raised cap: the cap check, usage and the invariant
// all take theirs from here.
func EffectiveCap(base int64, raises []Raise, kind WindowKind, now time.Time) int64 {
	c := base
	for _, r := range raises {
		if r.Window != kind || r.Amount <= 0 || !r.ActiveAt(now) {
			continue
		}
		if c > math.MaxInt64-r.Amount {
			return math.MaxInt64
		}
		c += r.Amount
	}
	return c
}

// RaiseWindows is windows with each capped window's cap raised by the raises
// active at now (EffectiveCap). A window without a cap stays without one: a
// raise adds to a cap, it does not create one. windows is not modified.
func RaiseWindows(windows []Window, raises []Raise, now time.Time) []Window {
	if len(raises) == 0 {
		return windows
	}
	out := make([]Window, len(windows))
	for i, w := range windows {
		if w.HasCap {
			w.Cap = EffectiveCap(w.Cap, raises, w.Kind, now)
		}
		out[i] = w
	}
	return out
}

// RaisedPerRequestCap is p's per-request cap raised by the per-request
// raises active at now, and whether p has one.
func RaisedPerRequestCap(p *Policy, raises []Raise, now time.Time) (int64, bool) {
	c, ok := p.PerRequestCapMinor()
	if !ok {
		return 0, false
	}
	return EffectiveCap(c, raises, WindowPerRequest, now), true
}
