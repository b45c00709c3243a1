package vault

// Read-only summaries for the admin dashboard: several keys' usage at once, a key's
// spend per day over its billing period, and the overview an operator opens first.
// Each reads in one read transaction (the overview's walk of the hold index is
// chunked like CountHolds) and bounds how many ledger events it decodes, so that no
// read transaction grows with the size of the ledger.

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/policy"
)

// MaxKeysUsage is the most keys KeysUsage reads at once.
const MaxKeysUsage = 500

// MaxSpendDays is the most days DailySpend reports: the latest ones of a longer
// billing period.
const MaxSpendDays = 366

// Bounds on the ledger events one dashboard query decodes. They are variables so
// that tests can lower them.
var (
	// spendScanLimit bounds DailySpend's walk of one key's ledger.
	spendScanLimit = 200_000
	// refusalScanLimit bounds Overview's walk of every key's recent ledger.
	refusalScanLimit = 100_000
)

// KeyWindows is a key with its cap windows at the store clock and their counters.
type KeyWindows struct {
	Key     Key
	Windows []policy.Window
	Usage   policy.Usage
}

// KeysUsage returns each key of ids with its windows at the store clock and their
// counters, in the order of ids, all read in one read transaction. Errors:
// ErrInvalid (no id, or more than MaxKeysUsage), ErrNotFound (naming the first id
// that is no key).
func (s *Store) KeysUsage(ctx context.Context, ids []string) ([]KeyWindows, error) {
	if len(ids) == 0 || len(ids) > MaxKeysUsage {
		return nil, fmt.Errorf("keys usage: %d ids, want 1 to %d: %w", len(ids), MaxKeysUsage, ErrInvalid)
	}
	out := make([]KeyWindows, 0, len(ids))
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
		for _, id := range ids {
			key, windows, usage, err := keyUsageTx(tx, now, id)
			if err != nil {
				return err
			}
			out = append(out, KeyWindows{Key: key, Windows: windows, Usage: usage})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("keys usage: %w", err)
	}
	return out, nil
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

// DailySpend returns what keyID committed and holds on each day of its billing
// period, summed from the key's ledger (every event carries its deltas and the
// windows they apply to, so the sums equal the daily counters — which the reaper
// removes two days after their day, while the ledger is kept). One read
// transaction. Errors: ErrNotFound.
func (s *Store) DailySpend(ctx context.Context, keyID string) (SpendReport, error) {
	var rep SpendReport
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
		rec, err := getKey(tx, keyID)
		if err != nil {
			return err
		}
		rep = SpendReport{Key: rec.public()}
		rep.Days, err = spendDays(&rec.Policy, now)
		if err != nil || len(rep.Days) == 0 {
			return err
		}
		rep.Truncated, err = sumDailyDeltas(tx, keyID, rep.Days)
		return err
	})
	if err != nil {
		return SpendReport{}, fmt.Errorf("daily spend %s: %w", keyID, err)
	}
	return rep, nil
}

// spendDays lists the daily windows of p's billing period up to now, at most the
// latest MaxSpendDays, oldest first. A date that occurs in two stretches (clocks
// turned back across midnight) is one day, as it is one counter.
func spendDays(p *policy.Policy, now time.Time) ([]DaySpend, error) {
	if now.Before(p.PeriodStart) {
		return nil, nil
	}
	t := now
	if !p.ExpiresAt.IsZero() && !now.Before(p.ExpiresAt) {
		t = p.ExpiresAt.Add(-time.Nanosecond)
	}
	var days []DaySpend
	for {
		windows, err := p.Windows(t)
		if err != nil {
			return nil, err
		}
		w := windows[0] // daily
		date := strings.TrimPrefix(w.ID, "day:")
		if n := len(days); n > 0 && days[n-1].Date == date {
			days[n-1].Start = w.Start
		} else {
			if n == MaxSpendDays {
				break
			}
			days = append(days, DaySpend{Date: date, Start: w.Start, End: w.End})
		}
		if !w.Start.After(p.PeriodStart) {
			break
		}
		t = w.Start.Add(-time.Nanosecond)
	}
	slices.Reverse(days)
	return days, nil
}

// sumDailyDeltas adds the deltas of keyID's ledger events to the days they apply
// to, back to the first event a day older than the first day (a hold settles on
// the window it was placed on, even the next day; the margin covers a change of
// time zone), at most spendScanLimit events.
func sumDailyDeltas(tx *bolt.Tx, keyID string, days []DaySpend) (truncated bool, err error) {
	index := make(map[string]int, len(days))
	for i, d := range days {
		index["day:"+d.Date] = i
	}
	_, truncated, err = recentEvents(tx, keyID, days[0].Start.Add(-24*time.Hour), spendScanLimit, func(e Event) {
		for _, w := range e.WindowIDs {
			if i, ok := index[w]; ok {
				days[i].Committed += e.CommittedDelta
				days[i].Held += e.HeldDelta
			}
		}
	})
	return truncated, err
}

// recentEvents calls fn with keyID's ledger events at or after since, newest
// first, at most limit of them. It returns how many it passed to fn, and whether
// it stopped at limit with such events left.
func recentEvents(tx *bolt.Tx, keyID string, since time.Time, limit int, fn func(Event)) (n int, truncated bool, err error) {
	prefix := append([]byte(keyID), 0)
	err = pageBackward(tx.Bucket(bucketEvents), prefix, append([]byte(keyID), 1), func(k, v []byte) (bool, error) {
		e, err := decodeEvent(k, v)
		switch {
		case err != nil:
			return false, err
		case e.Time.Before(since):
			return false, nil
		case n == limit:
			truncated = true
			return false, nil
		}
		n++
		fn(e)
		return true, nil
	})
	return n, truncated, err
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
}

func (o *OverviewOptions) defaults() {
	if o.NearCapPercent <= 0 {
		o.NearCapPercent = 80
	}
	if o.NearCapLimit <= 0 {
		o.NearCapLimit = 50
	}
	if o.RefusalWindow <= 0 {
		o.RefusalWindow = time.Hour
	}
	if o.OldestUnknown <= 0 {
		o.OldestUnknown = 10
	}
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

// refusalKey groups refusals by decision and reason.
type refusalKey struct {
	decision Decision
	reason   string
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
}

// Overview summarizes the vault at the store clock: keys by status, what each
// currency's keys committed and hold today and this period, the active keys' windows
// near their caps, the ledger's refusals of the last RefusalWindow by reason, and
// the holds whose outcome is unknown, oldest first. Keys, counters and the ledger
// are read in one read transaction; the unknown holds are then counted by a walk
// of the hold index in bounded read transactions (see CountHolds), so they are
// not one snapshot with the rest. Refusals are those the store records: a request
// refused before it reached the store (unknown or revoked vault key, malformed
// request) leaves no ledger event.
func (s *Store) Overview(ctx context.Context, opts OverviewOptions) (Overview, error) {
	opts.defaults()
	var ov Overview
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
		ov = Overview{Time: now, RefusalsSince: now.Add(-opts.RefusalWindow)}
		return overviewKeysTx(tx, now, &ov, opts)
	})
	if err != nil {
		return Overview{}, fmt.Errorf("overview: %w", err)
	}
	ov.OldestUnknown, ov.UnknownHolds, err = s.oldestUnknownHolds(ctx, opts.OldestUnknown)
	if err != nil {
		return Overview{}, fmt.Errorf("overview: %w", err)
	}
	return ov, nil
}

// overviewKeysTx fills ov's key counts, spend, near-cap windows and refusals.
func overviewKeysTx(tx *bolt.Tx, now time.Time, ov *Overview, opts OverviewOptions) error {
	spend := map[string]*CurrencySpend{}
	refusals := map[refusalKey]int{}
	scanned := 0
	err := tx.Bucket(bucketKeys).ForEach(func(k, v []byte) error {
		var rec keyRec
		if err := decodeJSON(k, v, &rec); err != nil {
			return err
		}
		key := rec.public()
		status := key.StatusAt(now)
		switch status {
		case KeyActive:
			ov.Keys.Active++
		case KeyRevoked:
			ov.Keys.Revoked++
		case KeyExpired:
			ov.Keys.Expired++
		}
		windows, err := key.Policy.Windows(now)
		if err != nil {
			return fmt.Errorf("key %s windows: %w", key.ID, err)
		}
		usage, err := readUsage(tx, key.ID, windows)
		if err != nil {
			return err
		}
		cur := key.Policy.EffectiveCurrency()
		cs := spend[cur]
		if cs == nil {
			cs = &CurrencySpend{Currency: cur}
			spend[cur] = cs
		}
		for _, w := range windows {
			c := usage[w.ID]
			switch {
			case w.Kind == policy.WindowDaily:
				cs.TodayCommitted += c.Committed
				cs.TodayHeld += c.Held
			case !now.Before(w.Start) && now.Before(w.End):
				cs.Keys++
				cs.PeriodCommitted += c.Committed
				cs.PeriodHeld += c.Held
			}
			if status != KeyActive || !w.HasCap {
				continue
			}
			if pct := usedPercent(c.Committed+c.Held, w.Cap); pct >= opts.NearCapPercent {
				ov.NearCap = append(ov.NearCap, NearCap{Key: key, Window: w, Counter: c, Percent: pct})
			}
		}
		n, truncated, err := recentEvents(tx, key.ID, ov.RefusalsSince, refusalScanLimit-scanned, func(e Event) {
			if e.Decision == DecisionRefused || e.Decision == DecisionWouldRefuse {
				refusals[refusalKey{e.Decision, e.Reason}]++
			}
		})
		scanned += n
		ov.RefusalsTruncated = ov.RefusalsTruncated || truncated
		return err
	})
	if err != nil {
		return err
	}

	for _, cur := range slices.Sorted(maps.Keys(spend)) {
		if cs := spend[cur]; cs.Keys > 0 || cs.TodayCommitted != 0 || cs.TodayHeld != 0 {
			ov.Spend = append(ov.Spend, *cs)
		}
	}
	slices.SortStableFunc(ov.NearCap, func(a, b NearCap) int {
		return cmp.Or(cmp.Compare(b.Percent, a.Percent), cmp.Compare(a.Key.Name, b.Key.Name))
	})
	ov.NearCapTotal = len(ov.NearCap)
	ov.NearCap = ov.NearCap[:min(len(ov.NearCap), opts.NearCapLimit)]
	for rk, n := range refusals {
		ov.Refusals = append(ov.Refusals, RefusalCount{Decision: rk.decision, Reason: rk.reason, Count: n})
	}
	slices.SortFunc(ov.Refusals, func(a, b RefusalCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Decision, b.Decision), cmp.Compare(a.Reason, b.Reason))
	})
	return nil
}

// usedPercent is used × 100 / cap rounded down, without overflow; a cap of 0 or
// less is full.
func usedPercent(used, capMinor int64) int {
	if capMinor <= 0 {
		return 100
	}
	p := new(big.Int).Mul(big.NewInt(max(used, 0)), big.NewInt(100))
	p.Quo(p, big.NewInt(capMinor))
	if !p.IsInt64() || p.Int64() > 1<<30 {
		return 1 << 30
	}
	return int(p.Int64())
}

// oldestUnknownHolds walks the hold index (ordered by creation) in bounded read
// transactions (see CountHolds), counting the unknown holds and returning the
// first limit of them, oldest first.
func (s *Store) oldestUnknownHolds(ctx context.Context, limit int) ([]Hold, int, error) {
	want := []byte(HoldUnknown)
	holds := []Hold{}
	total := 0
	err := s.walkInChunks(ctx, bucketHoldIndex, func(tx *bolt.Tx, _ time.Time, k, v []byte) error {
		if !bytes.Equal(v, want) {
			return nil
		}
		total++
		if len(holds) == limit {
			return nil
		}
		rec, err := getRecordByHold(tx, string(k[8:]))
		if err != nil {
			return fmt.Errorf("hold index: %w", err)
		}
		holds = append(holds, rec.Hold.public())
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("unknown holds: %w", err)
	}
	return holds, total, nil
}
