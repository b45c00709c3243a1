package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// CheckInvariant verifies, in one read transaction, that the counters agree with
// the holds, the ledger and the caps (the rule is in docs/ARCHITECTURE.md, "The
// invariant and its exceptions"). It returns nil, or ErrInvariant joined with one
// error per violation.
func (s *Engine) CheckInvariant(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var problems error
	err := s.viewSettled(ctx, "", func(tx Tx, now time.Time) error {
		var err error
		problems, err = CheckInvariantTx(tx, now)
		return err
	})
	if err != nil {
		return fmt.Errorf("check invariant: %w", err)
	}
	return problems
}

// CheckInvariantTx is CheckInvariant in tx, at now: problems is nil, or
// ErrInvariant joined with one error per violation; err is a failure to read.
// A copy of a store checks its target with it before it commits.
func CheckInvariantTx(tx Tx, now time.Time) (problems, err error) {
	found, _, err := checkInvariantTx(tx, now)
	if err != nil || len(found) == 0 {
		return nil, err
	}
	return errors.Join(append([]error{vault.ErrInvariant}, found...)...), nil
}

type sums struct{ held, committed, allowance int64 }

// Check is vault.Store.Check on a store without a structural check of its
// own (PostgreSQL): the invariant check, in one read transaction after every
// queued settle.
func (s *Engine) Check(ctx context.Context) (vault.CheckReport, error) { return s.CheckWith(ctx, nil) }

// PageCheck is a backend's structural check in tx: how many pages it walked
// and what it found, one sentence each.
type PageCheck func(tx Tx) (pages int, problems []string, err error)

// CheckWith is Check with the backend's structural check pages (nil for
// none) run first in the same read transaction.
func (s *Engine) CheckWith(ctx context.Context, pages PageCheck) (vault.CheckReport, error) {
	if err := ctx.Err(); err != nil {
		return vault.CheckReport{}, err
	}
	var rep vault.CheckReport
	err := s.viewSettled(ctx, "", func(tx Tx, now time.Time) error {
		var err error
		rep, err = CheckTx(tx, now, pages)
		return err
	})
	if err != nil {
		return vault.CheckReport{}, fmt.Errorf("check: %w", err)
	}
	return rep, nil
}

// CheckTx runs pages (nil for none) and the invariant check in tx, at now.
// The invariant check runs only on pages that checked clean: a damaged page
// could fault the walk of the records.
func CheckTx(tx Tx, now time.Time, pages PageCheck) (vault.CheckReport, error) {
	var rep vault.CheckReport
	if pages != nil {
		n, problems, err := pages(tx)
		if err != nil {
			return rep, err
		}
		rep.Pages, rep.PageProblems = n, problems
		if len(problems) > 0 {
			return rep, nil
		}
	}
	found, records, err := checkInvariantTx(tx, now)
	if err != nil {
		// A record that does not decode is a finding, not a failure to read.
		rep.InvariantProblems = append(rep.InvariantProblems, err.Error())
		return rep, nil
	}
	rep.Records = records
	for _, p := range found {
		rep.InvariantProblems = append(rep.InvariantProblems, p.Error())
	}
	return rep, nil
}

func checkInvariantTx(tx Tx, now time.Time) ([]error, int, error) {
	var problems []error
	records := 0
	bad := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }

	// Live holds (held, unknown) and committed holds per counter; records and their
	// holds must agree on state.
	live := map[string]int64{}
	committedHolds := map[string]int64{}
	holdState := map[string]vault.HoldState{}
	// The records the in-flight and completions indexes must list.
	inflight, completions := map[string]bool{}, map[string]bool{}
	err := forEachRecord(tx, func(k []byte, r *recordRec) error {
		records++
		if r.seq != 0 {
			if at, err := tx.Get(BucketIdem, k); err != nil {
				return err
			} else if !bytes.Equal(at, u64(r.seq)) {
				bad("record %d of %s/%q is not where its key %x points", r.seq, r.KeyID, r.Idem, k)
			}
		}
		if r.State == vault.RecordInProgress {
			inflight[string(k)] = true
		}
		if reapable(r) {
			completions[string(completionKey(k, r))] = true
		}
		h := r.Hold
		if h == nil {
			return nil
		}
		holdState[h.ID] = h.State
		switch {
		case r.State == vault.RecordInProgress && h.State != vault.HoldHeld,
			r.State == vault.RecordUnknown && h.State != vault.HoldUnknown,
			r.State == vault.RecordCompleted && h.State != vault.HoldCommitted && h.State != vault.HoldReleased:
			bad("record of %s/%q is %s but its hold %s is %s", r.KeyID, r.Idem, r.State, h.ID, h.State)
		}
		if h.Amount < 0 {
			bad("hold %s has negative amount %d", h.ID, h.Amount)
		}
		for _, w := range h.WindowIDs {
			ck := string(counterKey(h.KeyID, w))
			switch h.State {
			case vault.HoldHeld, vault.HoldUnknown:
				live[ck] += h.Amount
			case vault.HoldCommitted:
				committedHolds[ck] += h.Amount
			}
		}
		return nil
	})
	if err != nil {
		return nil, records, err
	}

	// Live exposure of money objects is held on its windows like a hold.
	err = forEach(tx, BucketObjects, func(k, v []byte) error {
		keyID, objectID, _ := splitNul(k)
		o, err := decodeObject(k, v)
		if err != nil {
			return err
		}
		if o.Amount < 0 {
			bad("object %s of %s has negative committed amount %d", objectID, keyID, o.Amount)
		}
		for _, p := range o.Parts {
			if p.Amount <= 0 {
				bad("object %s of %s has an exposure part of %d", objectID, keyID, p.Amount)
			}
			for _, w := range p.WindowIDs {
				live[string(counterKey(keyID, w))] += p.Amount
			}
		}
		return nil
	})
	if err != nil {
		return nil, records, err
	}

	// Every idem entry that points at an appended record points at one.
	err = forEach(tx, BucketIdem, func(k, v []byte) error {
		if len(v) != seqLen {
			return nil
		}
		if at, err := tx.Get(BucketRecords, v); err != nil {
			return err
		} else if at == nil {
			bad("idem entry %x points at record %x, which is missing", k, v)
		}
		return nil
	})
	if err != nil {
		return nil, records, err
	}

	// The in-flight and completions indexes list exactly their records.
	for _, ix := range []struct {
		b    Bucket
		want map[string]bool
	}{{BucketInflight, inflight}, {BucketCompletions, completions}} {
		n := 0
		err = forEach(tx, ix.b, func(k, _ []byte) error {
			n++
			if !ix.want[string(k)] {
				bad("index %s lists %x, which is no such record", ix.b.Name(), k)
			}
			return nil
		})
		if err != nil {
			return nil, records, err
		}
		if n != len(ix.want) {
			bad("index %s has %d entries for %d records", ix.b.Name(), n, len(ix.want))
		}
	}

	// The hold index lists every hold once, with its state.
	indexed := 0
	err = forEach(tx, BucketHoldIndex, func(k, v []byte) error {
		indexed++
		id := string(k[8:])
		if st, ok := holdState[id]; !ok || string(v) != string(st) {
			bad("hold index says %s is %q; its record says %q", id, v, st)
		}
		return nil
	})
	if err != nil {
		return nil, records, err
	}
	if indexed != len(holdState) {
		bad("hold index has %d entries for %d holds", indexed, len(holdState))
	}

	// The ledger, summed per counter.
	ledger := map[string]sums{}
	err = forEach(tx, BucketEvents, func(k, v []byte) error {
		e, err := decodeEvent(k, v)
		if err != nil {
			return err
		}
		if e.AllowanceDeltas != nil && len(e.AllowanceDeltas) != len(e.WindowIDs) {
			bad("event %s has %d allowance deltas for %d windows", e.ID, len(e.AllowanceDeltas), len(e.WindowIDs))
		}
		for i, w := range e.WindowIDs {
			ck := string(counterKey(e.KeyID, w))
			sm := ledger[ck]
			sm.held += e.HeldDelta
			sm.committed += e.CommittedDelta
			if i < len(e.AllowanceDeltas) {
				sm.allowance += e.AllowanceDeltas[i]
			}
			ledger[ck] = sm
		}
		return nil
	})
	if err != nil {
		return nil, records, err
	}

	// The removed events, by their roll-ups (retention.go).
	err = forEach(tx, BucketRollups, func(k, v []byte) error {
		r, err := decodeRollup(k, v)
		if err != nil {
			return err
		}
		sm := ledger[string(k)]
		sm.held += r.Held
		sm.committed += r.Committed
		sm.allowance += r.Allowance
		ledger[string(k)] = sm
		return nil
	})
	if err != nil {
		return nil, records, err
	}

	// Each scope's windows at now: a key's, or a budget's (every budget
	// window is checked as a key's is).
	scopes := map[string][]policy.Window{}
	seen := map[string]bool{}
	err = forEach(tx, BucketCounters, func(k, v []byte) error {
		ck := string(k)
		seen[ck] = true
		c, err := decodeCounter(v)
		if err != nil {
			return err
		}
		if c.Held < 0 || c.Committed < 0 {
			bad("counter %s is negative: committed %d held %d", ck, c.Committed, c.Held)
		}
		if c.Held != live[ck] {
			bad("counter %s: held %d but live holds sum to %d", ck, c.Held, live[ck])
		}
		if l := ledger[ck]; c.Held != l.held || c.Committed != l.committed {
			bad("counter %s: committed %d held %d but the ledger sums to committed %d held %d", ck, c.Committed, c.Held, l.committed, l.held)
		}
		// Allowance only ever comes from report-mode holds past a cap and overrun
		// commits, each recorded in the ledger.
		if l := ledger[ck]; c.Allowance != l.allowance {
			bad("counter %s: allowance %d but the ledger excuses %d", ck, c.Allowance, l.allowance)
		}
		// Committed holds are reaped with their records, so they can only sum lower.
		if c.Committed < committedHolds[ck] {
			bad("counter %s: committed %d but committed holds sum to %d", ck, c.Committed, committedHolds[ck])
		}
		scopeID, windowID, _ := splitCounterKey([]byte(ck))
		ws, ok := scopes[scopeID]
		if !ok {
			if ws, err = scopeWindowsAt(tx, scopeID, now); err != nil {
				return err
			}
			scopes[scopeID] = ws
		}
		limit, capped := capFor(ws, windowID)
		if c.Uncapped {
			return nil
		}
		limit = max(limit, c.CapPeak)
		if !capped && c.CapPeak == 0 {
			return nil
		}
		if c.Committed+c.Held > limit+c.Allowance {
			bad("counter %s: committed %d + held %d exceeds cap %d (+ allowance %d)", ck, c.Committed, c.Held, limit, c.Allowance)
		}
		return nil
	})
	if err != nil {
		return nil, records, err
	}
	// A window with live holds must have a counter (reaped counters had none).
	var missing []string
	for ck, amount := range live {
		if !seen[ck] && amount != 0 {
			missing = append(missing, ck)
		}
	}
	sort.Strings(missing)
	for _, ck := range missing {
		bad("live holds on %s (%d) but no counter", ck, live[ck])
	}
	return problems, records, nil
}

// scopeWindowsAt is the windows at now of the key or budget id; a budget
// that was deleted has none (its counters are judged by their CapPeak).
func scopeWindowsAt(tx Tx, id string, now time.Time) ([]policy.Window, error) {
	if strings.HasPrefix(id, policy.BudgetIDPrefix) {
		b, err := getBudget(tx, id)
		if errors.Is(err, vault.ErrNotFound) {
			return nil, nil
		} else if err != nil {
			return nil, err
		}
		return budgetWindows(tx, b, now)
	}
	kr, err := getKey(tx, id)
	if err != nil {
		return nil, err
	}
	return keyWindows(tx, kr, now)
}

// capFor is the current cap of a scope's window, by the window id's kind.
func capFor(windows []policy.Window, windowID policy.WindowID) (int64, bool) {
	kind := windowID.Kind()
	for _, w := range windows {
		if w.Kind == kind {
			return w.Cap, w.HasCap
		}
	}
	return 0, false
}
