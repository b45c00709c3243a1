package vault

import (
	"time"

	"github.com/shopspring/decimal"

	"github.com/keybrake/keybrake/policy"
)

// Budget is a set of cap windows that several vault keys draw from (a
// team's, an organisation's). Budgets form a tree through Parent; a key names
// at most one (policy.Budget). A money request holds on its key's windows and
// on every ancestor budget's, in one transaction, or is refused.
type Budget struct {
	ID     string
	Name   string
	Parent string // "" at the root
	// Currency is what every amount of the budget, and of the keys and
	// budgets under it, is in.
	Currency    string
	DailyCap    *decimal.Decimal
	PeriodCap   *decimal.Decimal
	PeriodStart time.Time
	ExpiresAt   time.Time // zero: the period never ends
	Timezone    string
	Velocity    []policy.Velocity
	Labels      map[string]string
	// Children and Keys count the budgets and keys that name this one.
	Children, Keys int
	// Version counts the budget's changes (If-Match on a patch).
	Version   uint64
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Limits is the budget as a policy: what its windows are computed from.
func (b *Budget) Limits() policy.Policy {
	return policy.Policy{
		Vendor: policy.VendorStripe, Currency: b.Currency, DailyCap: b.DailyCap, PeriodCap: b.PeriodCap,
		PeriodStart: b.PeriodStart, ExpiresAt: b.ExpiresAt, Timezone: b.Timezone,
	}
}

// Scope is the budget as the scope a refusal names.
func (b *Budget) Scope() policy.Scope {
	return policy.Scope{Kind: policy.ScopeBudget, ID: b.ID, Name: b.Name}
}

// BudgetSpec is what a budget is created from, or changed to.
type BudgetSpec struct {
	Name        string
	Parent      string
	Currency    string
	DailyCap    *decimal.Decimal
	PeriodCap   *decimal.Decimal
	PeriodStart time.Time
	ExpiresAt   time.Time
	Timezone    string
	Velocity    []policy.Velocity
	Labels      map[string]string
}

// Spec is the budget's changeable fields, what a BudgetChange starts from.
func (b *Budget) Spec() BudgetSpec {
	return BudgetSpec{
		Name: b.Name, Parent: b.Parent, Currency: b.Currency, DailyCap: b.DailyCap, PeriodCap: b.PeriodCap,
		PeriodStart: b.PeriodStart, ExpiresAt: b.ExpiresAt, Timezone: b.Timezone, Velocity: b.Velocity, Labels: b.Labels,
	}
}

// BudgetChange is a change of a budget computed from the budget as it is,
// inside the transaction that writes it (see Store.PatchBudget).
type BudgetChange struct {
	// IfVersion, when not 0, is the version the budget must be at.
	IfVersion uint64
	// Apply returns the budget's new fields, or an error that refuses the
	// change (returned as it is, nothing written).
	Apply func(b Budget, now time.Time) (BudgetSpec, error)
}

// BudgetFilter selects budgets: by parent ("" any; RootParent for the roots),
// name prefix and labels, a page at a time.
type BudgetFilter struct {
	Parent     string
	NamePrefix string
	Labels     map[string]string
	Limit      int
	Cursor     string
}

// RootParent, as BudgetFilter.Parent, selects the budgets without a parent.
const RootParent = "-"

// BudgetState is a budget with its windows at the store clock and their
// counters (window ids as a key's: "day:…", "period").
type BudgetState struct {
	Budget  Budget
	Windows []policy.Window
	Usage   policy.Usage
}
