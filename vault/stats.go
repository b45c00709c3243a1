package vault

import "github.com/keybrake/keybrake/policy"

// CurrencyWindow names one total of a UsageSummary: a currency and a window kind.
type CurrencyWindow struct {
	Currency string
	Window   policy.WindowKind
}

// UsageSummary is the money in the current windows of the active keys, summed per
// currency and window kind, and how many keys are close to a cap. It names no
// key, so it can be exposed as metrics of bounded cardinality.
type UsageSummary struct {
	// ActiveKeys counts the keys that are neither revoked nor expired.
	ActiveKeys int
	// Totals sums each active key's counters of its current daily window (today
	// in its time zone) and of its period window, in minor units of the currency.
	Totals map[CurrencyWindow]policy.Counter
	// NearCap counts, per window kind, the active keys whose committed + held in
	// that window has reached the given percentage of its cap.
	NearCap map[policy.WindowKind]int
}
