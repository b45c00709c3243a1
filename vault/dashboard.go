package vault

import (
	"time"

	"github.com/keybrake/keybrake/policy"
)

// MaxKeysUsage is the most keys KeysUsage reads at once.
const MaxKeysUsage = 500

// MaxSpendDays is the most days DailySpend reports: the latest ones of a longer
// billing period.
const MaxSpendDays = 366

// KeyWindows is a key with its cap windows at the store clock and their counters.
type KeyWindows struct {
	Key     Key
	Windows []policy.Window
	Usage   policy.Usage
}

// DaySpend is what a key's ledger moved on one calendar day of the key's time zone
// (its daily window "day:" + Date), in minor units of the key's currency.
type DaySpend struct {
	Date      string // YYYY-MM-DD
	Start     time.Time
	End       time.Time
	Committed int64
	Held      int64
}

// SpendReport is a key's spend per day over its billing period.
type SpendReport struct {
	Key Key
	// Days runs from the day period_start falls on (or, for a period longer than
	// MaxSpendDays, the first of its latest MaxSpendDays days) to today, or to the
	// period's last day once it has ended; oldest first. It is empty before the
	// period starts.
	Days []DaySpend
	// Truncated is set when the ledger held more events for these days than one
	// query decodes: the oldest days may then show less than they moved.
	Truncated bool
}

// OverviewOptions tune Overview; zero values take the defaults.
type OverviewOptions struct {
	// NearCapPercent: a window whose committed + held is at least this share of
	// its cap is near it (default 80).
	NearCapPercent int
	// NearCapLimit is the most near-cap windows listed (default 50).
	NearCapLimit int
	// RefusalWindow is how far back refusals are counted (default 1 hour).
	RefusalWindow time.Duration
	// OldestUnknown is the most outcome-unknown holds listed (default 10).
	OldestUnknown int
	// RefusedKeysWindow is how far back a revoked or expired key's last
	// refused request lists it (default 24 hours).
	RefusedKeysWindow time.Duration
	// RefusedKeysLimit is the most such keys listed (default 10).
	RefusedKeysLimit int
}

// KeyCounts counts keys by status at the store clock.
type KeyCounts struct {
	Active  int
	Revoked int
	Expired int
}

// CurrencySpend totals, in minor units of Currency, the current windows of the keys
// in that currency. Today is each key's current day in its own time zone. Keys
// counts the keys whose billing period contains now — revoked ones too, since what
// they moved still counts — and Period totals their period windows.
type CurrencySpend struct {
	Currency        string
	Keys            int
	TodayCommitted  int64
	TodayHeld       int64
	PeriodCommitted int64
	PeriodHeld      int64
}

// NearCap is an active key's window whose committed + held is at least
// NearCapPercent of its cap.
type NearCap struct {
	Key     Key
	Window  policy.Window
	Counter policy.Counter
	// Percent is (committed + held) × 100 / cap, rounded down; 100 or more is at
	// the cap (more when money moved past it, e.g. a capture above its hold).
	Percent int
}

// RefusalCount counts the ledger's refused (or, in report mode, would_refuse)
// events with one reason.
type RefusalCount struct {
	Decision Decision
	Reason   string
	Count    int
}

// Overview is what an operator looks at first.
type Overview struct {
	Time    time.Time
	Keys    KeyCounts
	Spend   []CurrencySpend // by currency
	NearCap []NearCap       // fullest first, at most NearCapLimit
	// NearCapTotal counts every near-cap window, listed or not.
	NearCapTotal  int
	RefusalsSince time.Time
	Refusals      []RefusalCount // most frequent first
	// RefusalsTruncated is set when more ledger events fell in the refusal
	// window than one query decodes: the counts are then lower bounds.
	RefusalsTruncated bool
	UnknownHolds      int
	OldestUnknown     []Hold // oldest first, at most OldestUnknown
	// RefusedKeys are the revoked or expired keys a request used within
	// RefusedKeysWindow of Time, the most recent first, at most RefusedKeysLimit;
	// RefusedKeysTotal counts them all.
	RefusedKeys      []Key
	RefusedKeysTotal int
	RefusedKeysSince time.Time
}
