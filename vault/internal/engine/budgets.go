package engine

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shopspring/decimal"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// budgetRec is a budget as stored (JSON in the budgets bucket).
type budgetRec struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Parent      string            `json:"parent,omitempty"`
	Currency    string            `json:"currency"`
	DailyCap    *decimal.Decimal  `json:"daily_cap,omitempty"`
	PeriodCap   *decimal.Decimal  `json:"period_cap,omitempty"`
	PeriodStart time.Time         `json:"period_start"`
	ExpiresAt   time.Time         `json:"expires_at,omitzero"`
	Timezone    string            `json:"timezone"`
	Velocity    []policy.Velocity `json:"velocity,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Children    int               `json:"children"`
	Keys        int               `json:"keys"`
	Version     uint64            `json:"version"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
	// Raises are the budget's raises, oldest first (raises.go).
	Raises []raiseRec     `json:"raises,omitempty"`
	limits *policy.Policy // memo of Limits, per transaction
}

func (r *budgetRec) public() vault.Budget {
	return vault.Budget{
		ID: r.ID, Name: r.Name, Parent: r.Parent, Currency: r.Currency, DailyCap: r.DailyCap, PeriodCap: r.PeriodCap,
		PeriodStart: r.PeriodStart, ExpiresAt: r.ExpiresAt, Timezone: r.Timezone, Velocity: slices.Clone(r.Velocity),
		Labels: maps.Clone(r.Labels), Children: r.Children, Keys: r.Keys, Version: r.Version,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
		Raises: publicRaises(r.Raises, vault.RaiseScope{Kind: policy.ScopeBudget, ID: r.ID}, r.Currency),
	}
}

func (r *budgetRec) policy() *policy.Policy {
	if r.limits == nil {
		b := r.public()
		p := b.Limits()
		r.limits = &p
	}
	return r.limits
}

func (r *budgetRec) scope() policy.Scope {
	return policy.Scope{Kind: policy.ScopeBudget, ID: r.ID, Name: r.Name}
}

// budgetView is what audit entries show of a budget.
type budgetView struct {
	Name      string            `json:"name"`
	Parent    string            `json:"parent,omitempty"`
	Currency  string            `json:"currency"`
	DailyCap  *decimal.Decimal  `json:"daily_cap,omitempty"`
	PeriodCap *decimal.Decimal  `json:"period_cap,omitempty"`
	ExpiresAt time.Time         `json:"expires_at,omitzero"`
	Timezone  string            `json:"timezone"`
	Velocity  []policy.Velocity `json:"velocity,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

func (r *budgetRec) view() budgetView {
	return budgetView{Name: r.Name, Parent: r.Parent, Currency: r.Currency, DailyCap: r.DailyCap, PeriodCap: r.PeriodCap,
		ExpiresAt: r.ExpiresAt, Timezone: r.Timezone, Velocity: r.Velocity, Labels: r.Labels}
}

// getBudget reads the budget id; in a write transaction the read locks it.
// The result is the caller's own copy, to change and put. Errors:
// ErrNotFound.
func getBudget(tx Tx, id string) (*budgetRec, error) {
	raw, err := tx.Get(BucketBudgets, []byte(id))
	if err != nil {
		return nil, err
	}
	if raw == nil {
		return nil, fmt.Errorf("budget %s: %w", id, vault.ErrNotFound)
	}
	return budgetDecodes.decode(id, raw)
}

// budgetDecodes memoises the decoding of budget records by their bytes. A
// budget that a fleet of keys draws from is read by every money request of
// every one of them, and decoding its JSON each time was a large share of
// what a shared budget cost bbolt's single committer. An entry serves only
// the very bytes it was decoded from, so it is never stale, whichever store
// or transaction read them.
var budgetDecodes budgetDecodeCache

type budgetDecodeCache struct {
	mu sync.Mutex
	m  map[string]cachedBudget
}

type cachedBudget struct {
	raw []byte
	rec *budgetRec // never modified once cached: decode hands out copies
}

const budgetCacheMax = 10000

// decode returns a copy of the record raw encodes, decoding it only when the
// cache holds no decoding of these bytes for id.
func (c *budgetDecodeCache) decode(id string, raw []byte) (*budgetRec, error) {
	c.mu.Lock()
	e, ok := c.m[id]
	c.mu.Unlock()
	if !ok || !bytes.Equal(e.raw, raw) {
		rec := &budgetRec{}
		if err := decodeJSON([]byte(id), raw, rec); err != nil {
			return nil, err
		}
		e = cachedBudget{raw: bytes.Clone(raw), rec: rec}
		c.mu.Lock()
		if c.m == nil || len(c.m) >= budgetCacheMax {
			c.m = make(map[string]cachedBudget)
		}
		c.m[id] = e
		c.mu.Unlock()
	}
	// The caller's copy: what it changes (counts, raises appended, labels)
	// is its own.
	r := *e.rec
	r.Velocity, r.Labels, r.Raises, r.limits = slices.Clone(r.Velocity), maps.Clone(r.Labels), slices.Clone(r.Raises), nil
	return &r, nil
}

func putBudget(tx Tx, r *budgetRec) error { return putJSON(tx, BucketBudgets, []byte(r.ID), r) }

// budgetChain reads the budget id and its ancestors, closest first, each read
// locking it in a write transaction: a key's lock, then its budgets' from the
// closest up, is the one order every transaction takes them in. A chain
// longer than policy.MaxChainDepth-1 (a store changed by hand) or a cycle is
// ErrInvalid.
func budgetChain(tx Tx, id string) ([]*budgetRec, error) {
	var chain []*budgetRec
	for id != "" {
		if len(chain) == policy.MaxChainDepth-1 {
			return nil, fmt.Errorf("budget chain above %s is deeper than %d: %w", chain[0].ID, policy.MaxChainDepth, vault.ErrInvalid)
		}
		b, err := getBudget(tx, id)
		if err != nil {
			return nil, err
		}
		chain = append(chain, b)
		id = b.Parent
	}
	return chain, nil
}

// budgetWindows is a budget's windows at now, their caps as in force: with
// keyWindows, the one place a scope's caps come from.
func budgetWindows(tx Tx, b *budgetRec, now time.Time) ([]policy.Window, error) {
	w, err := b.policy().Windows(now)
	if err != nil {
		return nil, fmt.Errorf("budget %s windows: %w", b.ID, err)
	}
	return effectiveCaps(w, b.Raises, now), nil
}

// keyWindows is a key's windows at now, their caps as in force.
func keyWindows(tx Tx, k *keyRec, now time.Time) ([]policy.Window, error) {
	w, err := k.Policy.Windows(now)
	if err != nil {
		return nil, fmt.Errorf("key %s windows: %w", k.ID, err)
	}
	return effectiveCaps(w, k.Raises, now), nil
}

// effectiveCaps is where anything that changes a scope's caps for a while
// applies to its windows at now: the scope's raises, kept in its own record,
// through policy.EffectiveCap (raises.go).
func effectiveCaps(windows []policy.Window, raises []raiseRec, now time.Time) []policy.Window {
	return policy.RaiseWindows(windows, capRaises(raises), now)
}

// budgetOpen reports whether now is within the budget's life.
func budgetOpen(b *budgetRec, now time.Time) bool {
	return !now.Before(b.PeriodStart) && (b.ExpiresAt.IsZero() || now.Before(b.ExpiresAt))
}

// chainLinks reads each budget's counters and makes the chain Decide checks;
// windows and counters are returned with the budgets' scoped window ids, in
// chain order, for the hold to be placed on.
func chainLinks(tx Tx, chain []*budgetRec, now time.Time) ([]policy.ChainLink, []policy.Window, []counter, error) {
	links := make([]policy.ChainLink, 0, len(chain))
	var windows []policy.Window
	var counters []counter
	for _, b := range chain {
		ws, err := budgetWindows(tx, b, now)
		if err != nil {
			return nil, nil, nil, err
		}
		scoped := make([]policy.Window, len(ws))
		for i, w := range ws {
			w.ID = scopedWindowID(b.ID, w.ID)
			scoped[i] = w
		}
		cs, err := getCounters(tx, "", windowIDs(scoped))
		if err != nil {
			return nil, nil, nil, err
		}
		links = append(links, policy.ChainLink{
			Scope: b.scope(), Currency: b.Currency, Location: b.policy().Location(), Windows: scoped,
			Usage: usageOf(scoped, cs), Open: budgetOpen(b, now), PeriodStart: b.PeriodStart, ExpiresAt: b.ExpiresAt,
		})
		windows = append(windows, scoped...)
		counters = append(counters, cs...)
	}
	return links, windows, counters, nil
}

// budgetInvalid is ErrInvalid with one field's problem.
func budgetInvalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %w", vault.ErrInvalid, &policy.ValidationError{Errors: []policy.FieldError{
		{Field: field, Message: fmt.Sprintf(format, args...)},
	}})
}

// checkBudgetSpec normalizes spec and validates it as a budget's fields.
func checkBudgetSpec(spec *vault.BudgetSpec, now time.Time) error {
	if spec.Currency == "" {
		spec.Currency = policy.DefaultCurrency
	}
	if spec.Timezone == "" {
		spec.Timezone = policy.DefaultTimezone
	}
	if spec.PeriodStart.IsZero() {
		spec.PeriodStart = now.Round(0)
	}
	var v policy.ValidationError
	if !validName(spec.Name) {
		v.Errors = append(v.Errors, policy.FieldError{Field: "name", Message: "must be 1-200 printable bytes"})
	}
	if spec.DailyCap == nil && spec.PeriodCap == nil && len(spec.Velocity) == 0 {
		v.Errors = append(v.Errors, policy.FieldError{Field: "daily_cap", Message: "a budget needs a cap or a velocity limit (daily_cap, period_cap or velocity)"})
	}
	if spec.Parent != "" && !policy.ValidBudgetID(spec.Parent) {
		v.Errors = append(v.Errors, policy.FieldError{Field: "parent", Message: fmt.Sprintf("%q is not a budget id", spec.Parent)})
	}
	// The caps, currency, zone and period as a policy's (a budget expires
	// only when it says so: a policy needs expires_at, a budget does not).
	p := policy.Policy{Vendor: policy.VendorStripe, Currency: spec.Currency, DailyCap: spec.DailyCap, PeriodCap: spec.PeriodCap,
		PeriodStart: spec.PeriodStart, ExpiresAt: spec.ExpiresAt, Timezone: spec.Timezone, Velocity: spec.Velocity}
	if p.ExpiresAt.IsZero() {
		p.ExpiresAt = spec.PeriodStart.Add(time.Hour) // stands in for "no end"
	}
	var pv *policy.ValidationError
	if err := p.Validate(); errors.As(err, &pv) {
		for _, fe := range pv.Errors {
			if fe.Field == "daily_cap" && strings.HasPrefix(fe.Message, "at least one cap") {
				continue // a budget may have only velocity limits
			}
			v.Errors = append(v.Errors, fe)
		}
	}
	if len(v.Errors) > 0 {
		return fmt.Errorf("%w: %w", vault.ErrInvalid, &v)
	}
	return checkLabels(spec.Labels)
}

// placeInTree checks that a budget (or key, asKey) under parent fits the tree:
// parent exists (ErrNotFound), is in currency, and the chain from a key
// through it stays within policy.MaxChainDepth. below is how many levels the
// thing placed has under it already (0 for a key or a new budget). It
// returns the parent, locked.
func placeInTree(tx Tx, parentID, currency string, field string, levels int) (*budgetRec, error) {
	chain, err := budgetChain(tx, parentID)
	if err != nil {
		if errors.Is(err, vault.ErrNotFound) {
			return nil, fmt.Errorf("%s %s: %w", field, parentID, vault.ErrNotFound)
		}
		return nil, err
	}
	if chain[0].Currency != currency {
		return nil, budgetInvalid(field, "budget %s is in %s; this is in %s", parentID, chain[0].Currency, currency)
	}
	if len(chain)+levels > policy.MaxChainDepth {
		return nil, budgetInvalid(field, "the chain from a key through budget %s would be %d deep; at most %d, counting the key",
			parentID, len(chain)+levels, policy.MaxChainDepth)
	}
	return chain[0], nil
}

func (s *Engine) createBudgetTx(tx Tx, now time.Time, actor string, spec vault.BudgetSpec) (vault.Budget, error) {
	if err := checkBudgetSpec(&spec, now); err != nil {
		return vault.Budget{}, err
	}
	if spec.Parent != "" {
		// A key under a new budget is one level, the budget another.
		parent, err := placeInTree(tx, spec.Parent, spec.Currency, "parent", 2)
		if err != nil {
			return vault.Budget{}, err
		}
		parent.Children++
		if err := putBudget(tx, parent); err != nil {
			return vault.Budget{}, err
		}
	}
	seq, err := tx.NextSequence(BucketBudgets)
	if err != nil {
		return vault.Budget{}, err
	}
	r := &budgetRec{
		ID: seqID(policy.BudgetIDPrefix, seq), Name: spec.Name, Parent: spec.Parent, Currency: spec.Currency,
		DailyCap: spec.DailyCap, PeriodCap: spec.PeriodCap, PeriodStart: spec.PeriodStart, ExpiresAt: spec.ExpiresAt,
		Timezone: spec.Timezone, Velocity: spec.Velocity, Labels: maps.Clone(spec.Labels), Version: 1,
		CreatedAt: now, UpdatedAt: now,
	}
	if err := insertJSON(tx, BucketBudgets, []byte(r.ID), r); err != nil {
		return vault.Budget{}, err
	}
	if err := claimBudgetName(tx, r.Parent, r.Name, r.ID); err != nil {
		return vault.Budget{}, err
	}
	if err := putAudit(tx, now, actor, "budget.create", r.ID, nil, r.view()); err != nil {
		return vault.Budget{}, err
	}
	return r.public(), nil
}

func (s *Engine) patchBudgetTx(tx Tx, now time.Time, actor, id string, change vault.BudgetChange) (vault.Budget, error, error) {
	r, err := getBudget(tx, id)
	if err != nil {
		return vault.Budget{}, nil, err
	}
	if change.IfVersion != 0 && change.IfVersion != r.Version {
		return vault.Budget{}, nil, fmt.Errorf("budget %s is at version %d, not %d: %w", id, r.Version, change.IfVersion, vault.ErrPrecondition)
	}
	spec, refused := change.Apply(r.public(), now)
	if refused != nil {
		return vault.Budget{}, refused, nil
	}
	if err := checkBudgetSpec(&spec, now); err != nil {
		return vault.Budget{}, nil, err
	}
	switch {
	case spec.Currency != r.Currency:
		return vault.Budget{}, nil, budgetInvalid("currency", "cannot be changed (the budget meters %s)", r.Currency)
	case spec.Parent != r.Parent:
		return vault.Budget{}, nil, budgetInvalid("parent", "cannot be changed: create a budget under the new parent and move the keys")
	}
	next := *r
	next.Name, next.DailyCap, next.PeriodCap, next.PeriodStart, next.ExpiresAt = spec.Name, spec.DailyCap, spec.PeriodCap, spec.PeriodStart, spec.ExpiresAt
	next.Timezone, next.Velocity, next.Labels, next.limits = spec.Timezone, spec.Velocity, maps.Clone(spec.Labels), nil
	next.Version, next.UpdatedAt = r.Version+1, now
	if err := carryDay(tx, now, r.ID, r.policy(), next.policy(), r.Currency, func(w policy.WindowID) policy.WindowID { return scopedWindowID(r.ID, w) }); err != nil {
		return vault.Budget{}, nil, err
	}
	if err := putBudget(tx, &next); err != nil {
		return vault.Budget{}, nil, err
	}
	if next.Name != r.Name {
		if err := releaseBudgetName(tx, r.Parent, r.Name, r.ID); err != nil {
			return vault.Budget{}, nil, err
		}
		if err := claimBudgetName(tx, r.Parent, next.Name, r.ID); err != nil {
			return vault.Budget{}, nil, err
		}
	}
	if err := putAudit(tx, now, actor, "budget.update", r.ID, r.view(), next.view()); err != nil {
		return vault.Budget{}, nil, err
	}
	return next.public(), nil, nil
}

func deleteBudgetTx(tx Tx, now time.Time, actor, id string) error {
	r, err := getBudget(tx, id)
	if err != nil {
		return err
	}
	if r.Keys > 0 || r.Children > 0 {
		return fmt.Errorf("budget %s is named by %d keys and %d budgets: %w", id, r.Keys, r.Children, vault.ErrConflict)
	}
	if r.Parent != "" {
		parent, err := getBudget(tx, r.Parent)
		if err != nil && !errors.Is(err, vault.ErrNotFound) {
			return err
		}
		if parent != nil {
			parent.Children--
			if err := putBudget(tx, parent); err != nil {
				return err
			}
		}
	}
	if err := tx.Delete(BucketBudgets, []byte(id)); err != nil {
		return fmt.Errorf("delete budget %s: %w", id, err)
	}
	if err := releaseBudgetName(tx, r.Parent, r.Name, r.ID); err != nil {
		return err
	}
	return putAudit(tx, now, actor, "budget.delete", id, r.view(), nil)
}

// budgetNameKey is the key_names entry of a budget's name among the budgets
// of parent ("" for the roots): a name is unique among siblings, so a
// refusal's or the dashboard's "team-a" under one organisation is one budget,
// while two organisations may each have a "team-a".
func budgetNameKey(parent, name string) []byte {
	return []byte("\x00budget\x00" + parent + "\x00" + name)
}

// claimBudgetName takes name among parent's budgets for budget id, or
// refuses with ErrConflict when a sibling has it. The entry is an insert: two
// transactions that both found it free cannot both commit (on PostgreSQL the
// loser runs again and finds it taken).
func claimBudgetName(tx Tx, parent, name, id string) error {
	k := budgetNameKey(parent, name)
	taken, err := tx.Get(BucketNames, k)
	switch {
	case err != nil:
		return err
	case taken != nil && string(taken) == id:
		return nil
	case taken != nil:
		where := "among the root budgets"
		if parent != "" {
			where = "under budget " + parent
		}
		return fmt.Errorf("budget name %q is taken %s (by %s): %w", name, where, taken, vault.ErrConflict)
	}
	if err := tx.Insert(BucketNames, k, []byte(id)); err != nil {
		return fmt.Errorf("index budget name: %w", err)
	}
	return nil
}

// releaseBudgetName drops budget id's entry for name, if it is id's.
func releaseBudgetName(tx Tx, parent, name, id string) error {
	k := budgetNameKey(parent, name)
	v, err := tx.Get(BucketNames, k)
	if err != nil || string(v) != id {
		return err
	}
	return tx.Delete(BucketNames, k)
}

// moveKeyBudget keeps the budgets' key counts right when a key's budget
// changes from old to p.Budget, and checks the new one: it exists, is in the
// key's currency and leaves the chain within policy.MaxChainDepth.
func moveKeyBudget(tx Tx, old string, p *policy.Policy) error {
	if old == p.Budget {
		return nil
	}
	if p.Budget != "" {
		b, err := placeInTree(tx, p.Budget, p.EffectiveCurrency(), "budget", 1)
		if err != nil {
			if errors.Is(err, vault.ErrNotFound) {
				return budgetInvalid("budget", "no budget %s", p.Budget)
			}
			return err
		}
		b.Keys++
		if err := putBudget(tx, b); err != nil {
			return err
		}
	}
	if old != "" {
		b, err := getBudget(tx, old)
		if errors.Is(err, vault.ErrNotFound) {
			return nil
		} else if err != nil {
			return err
		}
		b.Keys--
		return putBudget(tx, b)
	}
	return nil
}

func listBudgetsTx(tx Tx, f vault.BudgetFilter) ([]vault.Budget, string, error) {
	after, err := decodeCursor(f.Cursor)
	if err != nil {
		return nil, "", err
	}
	limit := clampLimit(f.Limit)
	out := []vault.Budget{}
	c := tx.Cursor(BucketBudgets)
	for k, v := firstAfter(c, after); k != nil; k, v = c.Next() {
		var r budgetRec
		if err := decodeJSON(k, v, &r); err != nil {
			return nil, "", err
		}
		if !budgetMatches(&r, f) {
			continue
		}
		if len(out) == limit {
			return out, encodeCursor(out[len(out)-1].ID), nil
		}
		out = append(out, r.public())
	}
	return out, "", nil
}

func budgetMatches(r *budgetRec, f vault.BudgetFilter) bool {
	switch {
	case f.Parent == vault.RootParent && r.Parent != "":
		return false
	case f.Parent != "" && f.Parent != vault.RootParent && r.Parent != f.Parent:
		return false
	case f.NamePrefix != "" && !strings.HasPrefix(r.Name, f.NamePrefix):
		return false
	}
	for lk, lv := range f.Labels {
		if got, ok := r.Labels[lk]; !ok || got != lv {
			return false
		}
	}
	return true
}

// budgetChainTx is BudgetChain in tx: each budget of the chain from id with
// its windows (unscoped ids) and usage.
func budgetChainTx(tx Tx, now time.Time, id string) ([]vault.BudgetState, error) {
	chain, err := budgetChain(tx, id)
	if err != nil {
		return nil, err
	}
	out := make([]vault.BudgetState, 0, len(chain))
	for _, b := range chain {
		ws, err := budgetWindows(tx, b, now)
		if err != nil {
			return nil, err
		}
		usage, err := readUsage(tx, b.ID, ws)
		if err != nil {
			return nil, err
		}
		out = append(out, vault.BudgetState{Budget: b.public(), Windows: ws, Usage: usage})
	}
	return out, nil
}
