package engine

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// raiseRec is a raise as a key (or a budget) stores it, in its own record:
// the transaction that reads the scope to place a hold reads its raises with
// it, so a raise is checked in the hold's transaction at no extra read.
type raiseRec struct {
	ID        string            `json:"id"`
	Window    policy.WindowKind `json:"window"`
	Amount    int64             `json:"amount"`
	Until     time.Time         `json:"until"`
	Reason    string            `json:"reason,omitempty"`
	CreatedBy string            `json:"created_by"`
	CreatedAt time.Time         `json:"created_at"`
	RequestID string            `json:"request_id,omitempty"`
	EndedAt   time.Time         `json:"ended_at,omitzero"`
	EndedBy   string            `json:"ended_by,omitempty"`
}

func (r *raiseRec) public(scope vault.RaiseScope, currency string) vault.Raise {
	return vault.Raise{
		ID: r.ID, Scope: scope, Window: r.Window, Amount: r.Amount, Currency: currency, Until: r.Until,
		Reason: r.Reason, CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt, RequestID: r.RequestID,
		EndedAt: r.EndedAt, EndedBy: r.EndedBy,
	}
}

// end is when the raise stops adding to its cap.
func (r *raiseRec) end() time.Time {
	if !r.EndedAt.IsZero() && r.EndedAt.Before(r.Until) {
		return r.EndedAt
	}
	return r.Until
}

// publicRaises is rs as the vault shows them.
func publicRaises(rs []raiseRec, scope vault.RaiseScope, currency string) []vault.Raise {
	if len(rs) == 0 {
		return nil
	}
	out := make([]vault.Raise, len(rs))
	for i := range rs {
		out[i] = rs[i].public(scope, currency)
	}
	return out
}

// capRaises is what the cap arithmetic needs of rs (policy.EffectiveCap).
func capRaises(rs []raiseRec) []policy.Raise {
	if len(rs) == 0 {
		return nil
	}
	out := make([]policy.Raise, len(rs))
	for i := range rs {
		out[i] = policy.Raise{Window: rs[i].Window, Amount: rs[i].Amount, Until: rs[i].end()}
	}
	return out
}

// decisionPolicy is the key's policy as the cap check judges it at now: the
// same, but for a per-request cap raised by the per-request raises active at
// now (the daily and period caps are raised in the windows, keyWindows).
func (r *keyRec) decisionPolicy(now time.Time) *policy.Policy {
	raised, ok := policy.RaisedPerRequestCap(&r.Policy, capRaises(r.Raises), now)
	if base, _ := r.Policy.PerRequestCapMinor(); !ok || raised == base {
		return &r.Policy
	}
	d, err := policy.FromMinor(r.Policy.EffectiveCurrency(), raised)
	if err != nil {
		return &r.Policy // fails closed: the cap as it was
	}
	p := r.Policy
	p.PerRequestCap = &d
	return &p
}

// pruneRaises drops the raises that ended more than vault.RaiseRetention
// before now, so that a scope's record stays small.
func pruneRaises(rs []raiseRec, now time.Time) []raiseRec {
	return slices.DeleteFunc(rs, func(r raiseRec) bool { return now.Sub(r.end()) > vault.RaiseRetention })
}

func raiseInvalid(field, msg string) error {
	return fmt.Errorf("%w: %w", vault.ErrInvalid, &policy.ValidationError{Errors: []policy.FieldError{{Field: field, Message: msg}}})
}

// checkNewRaise validates a raise asked for at now against a scope with policy
// p (its currency and caps).
func checkNewRaise(r vault.NewRaise, p *policy.Policy, now time.Time) error {
	var base bool
	switch r.Window {
	case policy.WindowDaily:
		base = p.DailyCap != nil
	case policy.WindowPeriod:
		base = p.PeriodCap != nil
	case policy.WindowPerRequest:
		base = p.PerRequestCap != nil
	default:
		return raiseInvalid("window", "must be daily, period or per_request")
	}
	switch {
	case r.Amount <= 0:
		return raiseInvalid("amount", "must be more than zero")
	case !r.Until.After(now):
		return raiseInvalid("until", "must be in the future")
	case r.Until.Sub(now) > policy.MaxRaiseSpan:
		return raiseInvalid("until", "must be at most 31 days ahead")
	case len(r.Reason) > vault.MaxRaiseReasonLen:
		return raiseInvalid("reason", fmt.Sprintf("must be at most %d bytes", vault.MaxRaiseReasonLen))
	case !base:
		return raiseInvalid("window", fmt.Sprintf("there is no %s cap to raise", r.Window))
	}
	return nil
}

// newRaiseID returns "raise_" + 26 random base32 characters.
func newRaiseID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("read random raise id: %w", err)
	}
	return "raise_" + lowerBase32.EncodeToString(b[:]), nil
}

// raiseView is what the audit shows of a raise.
type raiseView struct {
	Scope vault.RaiseScope `json:"scope"`
	Raise raiseRec         `json:"raise"`
}

// raiseHolder is a key or a budget as a raise changes it: read under its lock
// in a write transaction, written back by save.
type raiseHolder struct {
	raises   *[]raiseRec
	limits   *policy.Policy // the caps a raise may add to
	currency string
	revoked  bool
	save     func(now time.Time) error
}

// loadRaiseHolder reads scope's record, locking it (a Get of a key or a budget
// in a write transaction locks it).
func loadRaiseHolder(tx Tx, scope vault.RaiseScope) (*raiseHolder, error) {
	switch scope.Kind {
	case policy.ScopeKey:
		rec, err := getKey(tx, scope.ID)
		if err != nil {
			return nil, err
		}
		return &raiseHolder{raises: &rec.Raises, limits: &rec.Policy, currency: rec.Policy.EffectiveCurrency(),
			revoked: rec.Status == vault.KeyRevoked, save: func(now time.Time) error {
				rec.UpdatedAt = now
				return putKey(tx, rec)
			}}, nil
	case policy.ScopeBudget:
		if !policy.ValidBudgetID(scope.ID) {
			return nil, scopeNotFound(scope)
		}
		b, err := getBudget(tx, scope.ID)
		if err != nil {
			return nil, err
		}
		return &raiseHolder{raises: &b.Raises, limits: b.policy(), currency: b.Currency, save: func(now time.Time) error {
			b.Version, b.UpdatedAt = b.Version+1, now
			return putBudget(tx, b)
		}}, nil
	}
	return nil, scopeNotFound(scope)
}

// addRaiseTx adds a raise to scope under its lock; requestID names the raise
// request it comes from ("" for none).
func addRaiseTx(tx Tx, now time.Time, actor string, scope vault.RaiseScope, nr vault.NewRaise, requestID string) (vault.Raise, error) {
	h, err := loadRaiseHolder(tx, scope)
	if err != nil {
		return vault.Raise{}, err
	}
	if h.revoked {
		return vault.Raise{}, fmt.Errorf("%s %s is revoked: %w", scope.Kind, scope.ID, vault.ErrConflict)
	}
	if err := checkNewRaise(nr, h.limits, now); err != nil {
		return vault.Raise{}, err
	}
	*h.raises = pruneRaises(*h.raises, now)
	active := 0
	for i := range *h.raises {
		if now.Before((*h.raises)[i].end()) {
			active++
		}
	}
	if active >= vault.MaxActiveRaises {
		return vault.Raise{}, fmt.Errorf("%s %s has %d raises active, the most there may be: %w", scope.Kind, scope.ID, active, vault.ErrConflict)
	}
	rid, err := newRaiseID()
	if err != nil {
		return vault.Raise{}, err
	}
	r := raiseRec{ID: rid, Window: nr.Window, Amount: nr.Amount, Until: nr.Until.UTC(), Reason: nr.Reason,
		CreatedBy: actor, CreatedAt: now, RequestID: requestID}
	*h.raises = append(*h.raises, r)
	if err := h.save(now); err != nil {
		return vault.Raise{}, err
	}
	if err := putAudit(tx, now, actor, string(scope.Kind)+".raise", scope.ID, nil, raiseView{Scope: scope, Raise: r}); err != nil {
		return vault.Raise{}, err
	}
	return r.public(scope, h.currency), nil
}

func endRaiseTx(tx Tx, now time.Time, actor string, scope vault.RaiseScope, raiseID string) (vault.Raise, error) {
	h, err := loadRaiseHolder(tx, scope)
	if err != nil {
		return vault.Raise{}, err
	}
	i := slices.IndexFunc(*h.raises, func(r raiseRec) bool { return r.ID == raiseID })
	if i < 0 {
		return vault.Raise{}, fmt.Errorf("raise %s of %s %s: %w", raiseID, scope.Kind, scope.ID, vault.ErrNotFound)
	}
	r := &(*h.raises)[i]
	if !now.Before(r.end()) {
		return vault.Raise{}, fmt.Errorf("raise %s ended at %s: %w", raiseID, r.end().UTC().Format(time.RFC3339), vault.ErrConflict)
	}
	before := *r
	r.EndedAt, r.EndedBy = now, actor
	after := *r
	if err := h.save(now); err != nil {
		return vault.Raise{}, err
	}
	if err := putAudit(tx, now, actor, string(scope.Kind)+".raise_end", scope.ID,
		raiseView{Scope: scope, Raise: before}, raiseView{Scope: scope, Raise: after}); err != nil {
		return vault.Raise{}, err
	}
	return after.public(scope, h.currency), nil
}

// scopeNotFound is the error of a raise on a scope that is neither a key nor
// a budget.
func scopeNotFound(scope vault.RaiseScope) error {
	return fmt.Errorf("%s %s: %w", scope.Kind, scope.ID, vault.ErrNotFound)
}

// AddRaise adds a raise to one cap window of scope (see vault.Store.AddRaise).
func (s *Engine) AddRaise(ctx context.Context, actor string, scope vault.RaiseScope, nr vault.NewRaise) (vault.Raise, error) {
	var out vault.Raise
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		out, err = addRaiseTx(tx, now, actor, scope, nr, "")
		return err
	})
	if err != nil {
		return vault.Raise{}, fmt.Errorf("add raise: %w", err)
	}
	return out, nil
}

// ListRaises lists scope's raises (see vault.Store.ListRaises).
func (s *Engine) ListRaises(ctx context.Context, scope vault.RaiseScope) ([]vault.Raise, error) {
	var out []vault.Raise
	err := s.view(ctx, func(tx Tx, _ time.Time) error {
		h, err := loadRaiseHolder(tx, scope)
		if err != nil {
			return err
		}
		out = publicRaises(*h.raises, scope, h.currency)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list raises: %w", err)
	}
	return out, nil
}

// EndRaise ends one of scope's raises now (see vault.Store.EndRaise).
func (s *Engine) EndRaise(ctx context.Context, actor string, scope vault.RaiseScope, raiseID string) (vault.Raise, error) {
	var out vault.Raise
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		out, err = endRaiseTx(tx, now, actor, scope, raiseID)
		return err
	})
	if err != nil {
		return vault.Raise{}, fmt.Errorf("end raise: %w", err)
	}
	return out, nil
}
