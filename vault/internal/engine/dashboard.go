package engine

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
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// Bounds on the ledger events one dashboard query decodes. They are variables so
// that tests can lower them.
var (
	// SpendScanLimit bounds DailySpend's walk of one key's ledger.
	SpendScanLimit = 200_000
	// RefusalScanLimit bounds Overview's walk of every key's recent ledger.
	RefusalScanLimit = 100_000
)

// KeysUsage returns each key of ids with its windows at the store clock and their
// counters, in the order of ids, all read in one read transaction. Errors:
// ErrInvalid (no id, or more than MaxKeysUsage), ErrNotFound (naming the first id
// that is no key).
func (s *Engine) KeysUsage(ctx context.Context, ids []string) ([]vault.KeyWindows, error) {
	if len(ids) == 0 || len(ids) > vault.MaxKeysUsage {
		return nil, fmt.Errorf("keys usage: %d ids, want 1 to %d: %w", len(ids), vault.MaxKeysUsage, vault.ErrInvalid)
	}
	out := make([]vault.KeyWindows, 0, len(ids))
	err := s.viewSettled(ctx, "", func(tx Tx, now time.Time) error {
		for _, id := range ids {
			key, windows, usage, err := s.keyUsageTx(tx, now, id)
			if err != nil {
				return err
			}
			out = append(out, vault.KeyWindows{Key: key, Windows: windows, Usage: usage})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("keys usage: %w", err)
	}
	return out, nil
}

// DailySpend returns what keyID committed and holds on each day of its billing
// period, summed from the key's ledger (every event carries its deltas and the
// windows they apply to, so the sums equal the daily counters — which the reaper
// removes two days after their day, while the ledger is kept) and the roll-ups
// of the events the retention removed. One read transaction. Errors:
// ErrNotFound.
func (s *Engine) DailySpend(ctx context.Context, keyID string) (vault.SpendReport, error) {
	var rep vault.SpendReport
	err := s.viewSettled(ctx, keyID, func(tx Tx, now time.Time) error {
		rec, err := getKey(tx, keyID)
		if err != nil {
			return err
		}
		rep = vault.SpendReport{Key: rec.public()}
		rep.Days, err = spendDays(&rec.Policy, now)
		if err != nil || len(rep.Days) == 0 {
			return err
		}
		rep.Truncated, err = sumDailyDeltas(tx, keyID, rep.Days)
		return err
	})
	if err != nil {
		return vault.SpendReport{}, fmt.Errorf("daily spend %s: %w", keyID, err)
	}
	return rep, nil
}

// spendDays lists the daily windows of p's billing period up to now, at most the
// latest MaxSpendDays, oldest first. A date that occurs in two stretches (clocks
// turned back across midnight) is one day, as it is one counter.
func spendDays(p *policy.Policy, now time.Time) ([]vault.DaySpend, error) {
	if now.Before(p.PeriodStart) {
		return nil, nil
	}
	t := now
	if !p.ExpiresAt.IsZero() && !now.Before(p.ExpiresAt) {
		t = p.ExpiresAt.Add(-time.Nanosecond)
	}
	var days []vault.DaySpend
	for {
		windows, err := p.Windows(t)
		if err != nil {
			return nil, err
		}
		w := windows[0] // daily
		date, _ := w.ID.Date()
		if n := len(days); n > 0 && days[n-1].Date == date {
			days[n-1].Start = w.Start
		} else {
			if n == vault.MaxSpendDays {
				break
			}
			days = append(days, vault.DaySpend{Date: date, Start: w.Start, End: w.End})
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
// time zone), at most SpendScanLimit events.
func sumDailyDeltas(tx Tx, keyID string, days []vault.DaySpend) (truncated bool, err error) {
	index := make(map[policy.WindowID]int, len(days))
	for i, d := range days {
		index[policy.DayWindowID(d.Date)] = i
	}
	_, truncated, err = recentEvents(tx, keyID, days[0].Start.Add(-24*time.Hour), SpendScanLimit, func(e vault.Event) {
		for _, w := range e.WindowIDs {
			if i, ok := index[w]; ok {
				days[i].Committed += e.CommittedDelta
				days[i].Held += e.HeldDelta
			}
		}
	})
	if err != nil {
		return false, err
	}
	keys := make([][]byte, len(days))
	for i, d := range days {
		keys[i] = counterKey(keyID, policy.DayWindowID(d.Date))
	}
	rollups, err := tx.GetMany(BucketRollups, keys)
	if err != nil {
		return false, err
	}
	for i, v := range rollups {
		if v == nil {
			continue
		}
		r, err := decodeRollup(keys[i], v)
		if err != nil {
			return false, err
		}
		days[i].Committed += r.Committed
		days[i].Held += r.Held
	}
	return truncated, nil
}

// recentEvents calls fn with keyID's ledger events at or after since, newest
// first, at most limit of them. It returns how many it passed to fn, and whether
// it stopped at limit with such events left.
func recentEvents(tx Tx, keyID string, since time.Time, limit int, fn func(vault.Event)) (n int, truncated bool, err error) {
	prefix := append([]byte(keyID), 0)
	err = pageBackward(tx, BucketEvents, prefix, append([]byte(keyID), 1), func(k, v []byte) (bool, error) {
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

func overviewDefaults(o *vault.OverviewOptions) {
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
	if o.RefusedKeysWindow <= 0 {
		o.RefusedKeysWindow = 24 * time.Hour
	}
	if o.RefusedKeysLimit <= 0 {
		o.RefusedKeysLimit = 10
	}
}

// refusalKey groups refusals by decision and reason.
type refusalKey struct {
	decision vault.Decision
	reason   string
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
func (s *Engine) Overview(ctx context.Context, opts vault.OverviewOptions) (vault.Overview, error) {
	overviewDefaults(&opts)
	var ov vault.Overview
	err := s.viewSettled(ctx, "", func(tx Tx, now time.Time) error {
		ov = vault.Overview{Time: now, RefusalsSince: now.Add(-opts.RefusalWindow), RefusedKeysSince: now.Add(-opts.RefusedKeysWindow)}
		return overviewKeysTx(tx, now, &ov, opts)
	})
	if err != nil {
		return vault.Overview{}, fmt.Errorf("overview: %w", err)
	}
	ov.OldestUnknown, ov.UnknownHolds, err = s.oldestUnknownHolds(ctx, opts.OldestUnknown)
	if err != nil {
		return vault.Overview{}, fmt.Errorf("overview: %w", err)
	}
	return ov, nil
}

// overviewKeysTx fills ov's key counts, spend, near-cap windows and refusals.
func overviewKeysTx(tx Tx, now time.Time, ov *vault.Overview, opts vault.OverviewOptions) error {
	spend := map[string]*vault.CurrencySpend{}
	refusals := map[refusalKey]int{}
	scanned := 0
	err := forEach(tx, BucketKeys, func(k, v []byte) error {
		var rec keyRec
		if err := decodeJSON(k, v, &rec); err != nil {
			return err
		}
		key := rec.public()
		status := key.StatusAt(now)
		if key.Refused.Count > 0 && !key.Refused.Last.Before(ov.RefusedKeysSince) {
			ov.RefusedKeys = append(ov.RefusedKeys, key)
		}
		switch status {
		case vault.KeyActive:
			ov.Keys.Active++
		case vault.KeyRevoked:
			ov.Keys.Revoked++
		case vault.KeyExpired:
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
			cs = &vault.CurrencySpend{Currency: cur}
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
			if status != vault.KeyActive || !w.HasCap {
				continue
			}
			if pct := usedPercent(c.Committed+c.Held, w.Cap); pct >= opts.NearCapPercent {
				ov.NearCap = append(ov.NearCap, vault.NearCap{Key: key, Window: w, Counter: c, Percent: pct})
			}
		}
		n, truncated, err := recentEvents(tx, key.ID, ov.RefusalsSince, RefusalScanLimit-scanned, func(e vault.Event) {
			if e.Decision == vault.DecisionRefused || e.Decision == vault.DecisionWouldRefuse {
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
	slices.SortStableFunc(ov.NearCap, func(a, b vault.NearCap) int {
		return cmp.Or(cmp.Compare(b.Percent, a.Percent), cmp.Compare(a.Key.Name, b.Key.Name))
	})
	ov.NearCapTotal = len(ov.NearCap)
	ov.NearCap = ov.NearCap[:min(len(ov.NearCap), opts.NearCapLimit)]
	slices.SortStableFunc(ov.RefusedKeys, func(a, b vault.Key) int {
		return cmp.Or(b.Refused.Last.Compare(a.Refused.Last), cmp.Compare(a.ID, b.ID))
	})
	ov.RefusedKeysTotal = len(ov.RefusedKeys)
	ov.RefusedKeys = ov.RefusedKeys[:min(len(ov.RefusedKeys), opts.RefusedKeysLimit)]
	for rk, n := range refusals {
		ov.Refusals = append(ov.Refusals, vault.RefusalCount{Decision: rk.decision, Reason: rk.reason, Count: n})
	}
	slices.SortFunc(ov.Refusals, func(a, b vault.RefusalCount) int {
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
func (s *Engine) oldestUnknownHolds(ctx context.Context, limit int) ([]vault.Hold, int, error) {
	want := []byte(vault.HoldUnknown)
	holds := []vault.Hold{}
	total := 0
	err := s.walkInChunks(ctx, BucketHoldIndex, func(tx Tx, _ time.Time, k, v []byte) error {
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
