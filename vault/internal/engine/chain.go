package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// chainPlan is what a metered Reserve read of the key's budget chain: the
// links Decide checks, the budgets' windows and counters (scoped ids) the
// hold goes on, and the velocity limits of every scope.
type chainPlan struct {
	links    []policy.ChainLink
	windows  []policy.Window
	counters []counter
	// budgets is the chain read, closest first.
	budgets []*budgetRec
	// refusal is set when the chain itself refuses (a budget that is gone).
	refusal *policy.Decision
	// scopes with velocity limits, closest first.
	velocity []velocityScope
	// velocityWrites, after checkVelocity allowed the hold: each applicable
	// limit's hold times with this one's added.
	velocityWrites []velocityWrite
}

type velocityScope struct {
	scope  policy.Scope
	limits []policy.Velocity
}

type velocityWrite struct {
	key    []byte
	stamps []time.Time
}

func (r *keyRec) scope() policy.Scope {
	return policy.Scope{Kind: policy.ScopeKey, ID: r.ID, Name: r.Name}
}

// planChain reads key's budgets, closest first, each locked (after the key),
// and their counters.
func planChain(tx Tx, key *keyRec, now time.Time) (*chainPlan, error) {
	cp := &chainPlan{}
	if len(key.Policy.Velocity) > 0 {
		cp.velocity = append(cp.velocity, velocityScope{scope: key.scope(), limits: key.Policy.Velocity})
	}
	if key.Policy.Budget == "" {
		return cp, nil
	}
	chain, err := budgetChain(tx, key.Policy.Budget)
	if errors.Is(err, vault.ErrNotFound) || errors.Is(err, vault.ErrInvalid) {
		// Fail closed: money the key's budget cannot meter does not move.
		d := policy.Decision{Reason: policy.ReasonCapExceeded, Cap: policy.WindowPeriod,
			Scope:   policy.Scope{Kind: policy.ScopeBudget, ID: key.Policy.Budget},
			Message: fmt.Sprintf("the key's budget %s cannot be checked: %v", key.Policy.Budget, err)}
		cp.refusal = &d
		return cp, nil
	} else if err != nil {
		return nil, err
	}
	cp.budgets = chain
	if cp.links, cp.windows, cp.counters, err = chainLinks(tx, chain, now); err != nil {
		return nil, err
	}
	for _, b := range chain {
		if len(b.Velocity) > 0 {
			cp.velocity = append(cp.velocity, velocityScope{scope: b.scope(), limits: b.Velocity})
		}
	}
	return cp, nil
}

// velocityKey is the velocity bucket key of one limit of a scope.
func velocityKey(scopeID string, v policy.Velocity) []byte {
	return []byte(scopeID + "\x00" + v.Key())
}

// checkVelocity says whether one more hold of operation op at now fits every
// velocity limit of the chain. When one does not, it returns the refusal of
// the closest scope that refuses, with the latest instant at which every
// refusing limit has a slot again; otherwise it records the writes that
// count the hold.
func (cp *chainPlan) checkVelocity(tx Tx, op string, now time.Time) (*policy.Decision, error) {
	var refusal *policy.Decision
	for _, vs := range cp.velocity {
		for _, l := range vs.limits {
			if !l.Applies(op) {
				continue
			}
			k := velocityKey(vs.scope.ID, l)
			raw, err := tx.Get(BucketVelocity, k)
			if err != nil {
				return nil, err
			}
			stamps, err := decodeStamps(k, raw)
			if err != nil {
				return nil, err
			}
			retryAt, ok := policy.VelocityRetryAt(l, stamps, now)
			if !ok {
				if refusal == nil {
					d := policy.VelocityRefusal(vs.scope, l, retryAt, now)
					refusal = &d
				} else if retryAt.After(refusal.RetryAt) {
					refusal.RetryAt = retryAt
				}
				continue
			}
			cp.velocityWrites = append(cp.velocityWrites, velocityWrite{key: k, stamps: keepStamps(stamps, now, l)})
		}
	}
	if refusal != nil {
		cp.velocityWrites = nil
		d := policy.VelocityRefusal(refusal.Scope, refusal.Velocity, refusal.RetryAt, now)
		return &d, nil
	}
	return nil, nil
}

// keepStamps is stamps with now added, keeping only what the limit needs:
// the last Count, and none older than its interval.
func keepStamps(stamps []time.Time, now time.Time, l policy.Velocity) []time.Time {
	cut := now.Add(-l.Interval())
	out := make([]time.Time, 0, min(len(stamps)+1, l.Count))
	for _, s := range stamps {
		if s.After(cut) {
			out = append(out, s)
		}
	}
	out = append(out, now)
	if len(out) > l.Count {
		out = out[len(out)-l.Count:]
	}
	return out
}

func encodeStamps(stamps []time.Time) []byte {
	b := make([]byte, 8*len(stamps))
	for i, s := range stamps {
		binary.BigEndian.PutUint64(b[8*i:], uint64(s.UnixNano()))
	}
	return b
}

func decodeStamps(k, b []byte) ([]time.Time, error) {
	if len(b)%8 != 0 {
		return nil, fmt.Errorf("velocity %q is %d bytes: %w", k, len(b), vault.ErrStorage)
	}
	out := make([]time.Time, len(b)/8)
	for i := range out {
		out[i] = time.Unix(0, int64(binary.BigEndian.Uint64(b[8*i:]))).UTC()
	}
	return out, nil
}

// lockBudgetsOf locks, in order, each budget whose windows windowIDs name, so
// that its counters are read after every write made under its lock.
func lockBudgetsOf(tx Tx, windowIDs []policy.WindowID) error {
	var done []string
	for _, w := range windowIDs {
		id, _, ok := strings.Cut(string(w), "/")
		if !ok || !strings.HasPrefix(id, policy.BudgetIDPrefix) || slices.Contains(done, id) {
			continue
		}
		done = append(done, id)
		if _, err := tx.Get(BucketBudgets, []byte(id)); err != nil {
			return err
		}
	}
	return nil
}
