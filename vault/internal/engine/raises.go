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

// windows is the key's cap windows at now with the caps its raises give them
// at now: every cap check, usage report and invariant check of a key takes its
// windows from here.
func (r *keyRec) windows(now time.Time) ([]policy.Window, error) {
	w, err := r.Policy.Windows(now)
	if err != nil {
		return nil, fmt.Errorf("key %s windows: %w", r.ID, err)
	}
	return policy.RaiseWindows(w, capRaises(r.Raises), now), nil
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

// keyRaiseView is what the audit shows of a raise on a key.
type keyRaiseView struct {
	KeyID string   `json:"key_id"`
	Raise raiseRec `json:"raise"`
}

// addKeyRaiseTx adds a raise to key id, under the key's lock (the Get of the
// key locks it).
func addKeyRaiseTx(tx Tx, now time.Time, actor, id string, nr vault.NewRaise, requestID string) (vault.Raise, error) {
	rec, err := getKey(tx, id)
	if err != nil {
		return vault.Raise{}, err
	}
	if rec.Status == vault.KeyRevoked {
		return vault.Raise{}, fmt.Errorf("key %s is revoked: %w", id, vault.ErrConflict)
	}
	if err := checkNewRaise(nr, &rec.Policy, now); err != nil {
		return vault.Raise{}, err
	}
	rec.Raises = pruneRaises(rec.Raises, now)
	active := 0
	for i := range rec.Raises {
		if now.Before(rec.Raises[i].end()) {
			active++
		}
	}
	if active >= vault.MaxActiveRaises {
		return vault.Raise{}, fmt.Errorf("key %s has %d raises active, the most there may be: %w", id, active, vault.ErrConflict)
	}
	rid, err := newRaiseID()
	if err != nil {
		return vault.Raise{}, err
	}
	r := raiseRec{ID: rid, Window: nr.Window, Amount: nr.Amount, Until: nr.Until.UTC(), Reason: nr.Reason,
		CreatedBy: actor, CreatedAt: now, RequestID: requestID}
	rec.Raises = append(rec.Raises, r)
	rec.UpdatedAt = now
	if err := putKey(tx, rec); err != nil {
		return vault.Raise{}, err
	}
	if err := putAudit(tx, now, actor, "key.raise", id, nil, keyRaiseView{KeyID: id, Raise: r}); err != nil {
		return vault.Raise{}, err
	}
	return r.public(vault.RaiseScope{Kind: vault.RaiseOnKey, ID: id}, rec.Policy.EffectiveCurrency()), nil
}

func endKeyRaiseTx(tx Tx, now time.Time, actor, id, raiseID string) (vault.Raise, error) {
	rec, err := getKey(tx, id)
	if err != nil {
		return vault.Raise{}, err
	}
	i := slices.IndexFunc(rec.Raises, func(r raiseRec) bool { return r.ID == raiseID })
	if i < 0 {
		return vault.Raise{}, fmt.Errorf("raise %s of key %s: %w", raiseID, id, vault.ErrNotFound)
	}
	r := &rec.Raises[i]
	if !now.Before(r.end()) {
		return vault.Raise{}, fmt.Errorf("raise %s ended at %s: %w", raiseID, r.end().UTC().Format(time.RFC3339), vault.ErrConflict)
	}
	before := *r
	r.EndedAt, r.EndedBy = now, actor
	after := *r
	rec.UpdatedAt = now
	if err := putKey(tx, rec); err != nil {
		return vault.Raise{}, err
	}
	if err := putAudit(tx, now, actor, "key.raise_end", id, keyRaiseView{KeyID: id, Raise: before}, keyRaiseView{KeyID: id, Raise: after}); err != nil {
		return vault.Raise{}, err
	}
	return after.public(vault.RaiseScope{Kind: vault.RaiseOnKey, ID: id}, rec.Policy.EffectiveCurrency()), nil
}

// scopeNotFound is the error of a raise on a scope kind this store does not
// have.
func scopeNotFound(scope vault.RaiseScope) error {
	return fmt.Errorf("%s %s: %w", scope.Kind, scope.ID, vault.ErrNotFound)
}

// AddRaise adds a raise to one cap window of scope (see vault.Store.AddRaise).
func (s *Engine) AddRaise(ctx context.Context, actor string, scope vault.RaiseScope, nr vault.NewRaise) (vault.Raise, error) {
	if scope.Kind != vault.RaiseOnKey {
		return vault.Raise{}, fmt.Errorf("add raise: %w", scopeNotFound(scope))
	}
	var out vault.Raise
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		out, err = addKeyRaiseTx(tx, now, actor, scope.ID, nr, "")
		return err
	})
	if err != nil {
		return vault.Raise{}, fmt.Errorf("add raise: %w", err)
	}
	return out, nil
}

// ListRaises lists scope's raises (see vault.Store.ListRaises).
func (s *Engine) ListRaises(ctx context.Context, scope vault.RaiseScope) ([]vault.Raise, error) {
	if scope.Kind != vault.RaiseOnKey {
		return nil, fmt.Errorf("list raises: %w", scopeNotFound(scope))
	}
	var out []vault.Raise
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		rec, err := s.keys.get(tx, scope.ID)
		if err != nil {
			return err
		}
		out = publicRaises(rec.Raises, scope, rec.Policy.EffectiveCurrency())
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list raises: %w", err)
	}
	return out, nil
}

// EndRaise ends one of scope's raises now (see vault.Store.EndRaise).
func (s *Engine) EndRaise(ctx context.Context, actor string, scope vault.RaiseScope, raiseID string) (vault.Raise, error) {
	if scope.Kind != vault.RaiseOnKey {
		return vault.Raise{}, fmt.Errorf("end raise: %w", scopeNotFound(scope))
	}
	var out vault.Raise
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		out, err = endKeyRaiseTx(tx, now, actor, scope.ID, raiseID)
		return err
	})
	if err != nil {
		return vault.Raise{}, fmt.Errorf("end raise: %w", err)
	}
	return out, nil
}
