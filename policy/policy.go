// Package policy holds keybrake's pure domain rules: the Policy a vault key
// carries, money in Stripe's currency exponents, cap windows, and the Decide
// function that says whether a request may place a hold.
//
// Nothing here does I/O or reads a clock: every function that depends on time
// takes `now` as a parameter.
package policy

import (
	"time"

	"github.com/shopspring/decimal"
)

// Vendor names accepted in a policy.
const VendorStripe = "stripe"

// Mode says whether a policy's refusals are enforced or only reported.
type Mode string

// Policy modes.
const (
	ModeEnforce Mode = "enforce" // refusals are enforced (default)
	ModeReport  Mode = "report"  // cap/operation/customer/currency refusals are logged, not enforced
)

// IdempotencyMode says how a vault key's requests get their idempotency key.
type IdempotencyMode string

// Idempotency modes.
const (
	// IdempotencyRequire requires the caller's Idempotency-Key on money-moving POSTs (default).
	IdempotencyRequire IdempotencyMode = "require"
	// IdempotencyDerive computes the key from Fields of the request and ignores the caller's.
	IdempotencyDerive IdempotencyMode = "derive"
)

// Idempotency is the idempotency part of a policy.
type Idempotency struct {
	Mode   IdempotencyMode `json:"mode"`
	Fields []string        `json:"fields,omitempty"`
}

// Policy is what a vault key may do. Caps are amounts in the major unit of
// Currency (dollars for usd); a nil cap means "no cap on that window".
//
// JSON: MarshalJSON writes the canonical form (caps as decimal strings).
// UnmarshalJSON accepts the canonical form and the legacy form
// {"vendor":"stripe","daily_usd_cap":99,"period_usd_cap":110,"expires_at":"..."};
// numbers are parsed without going through float64; unknown fields are an error.
// Defaults (currency usd, timezone UTC, mode enforce, idempotency require) are
// applied by Normalize, not by UnmarshalJSON, so a merge patch can tell what was set.
type Policy struct {
	Vendor         string           `json:"vendor"`
	Currency       string           `json:"currency"`
	DailyCap       *decimal.Decimal `json:"daily_cap,omitempty"`
	PeriodCap      *decimal.Decimal `json:"period_cap,omitempty"`
	PerRequestCap  *decimal.Decimal `json:"per_request_cap,omitempty"`
	PeriodStart    time.Time        `json:"period_start"`
	ExpiresAt      time.Time        `json:"expires_at"`
	Timezone       string           `json:"timezone"`
	Operations     []string         `json:"operations,omitempty"`
	Customers      []string         `json:"customers,omitempty"`
	StripeAccounts []string         `json:"stripe_accounts,omitempty"`
	Idempotency    Idempotency      `json:"idempotency"`
	Mode           Mode             `json:"mode"`
}

// FieldError is one validation problem, named by its JSON field path
// ("daily_cap", "operations[2]", "idempotency.fields").
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// ValidationError carries every problem found, never just the first.
type ValidationError struct {
	Errors []FieldError
}

func (e *ValidationError) Error() string { panic("unimplemented") }

// Normalize fills defaults: Currency "usd" when empty, Timezone "UTC",
// Mode enforce, Idempotency.Mode require, PeriodStart = now when zero.
// Currency and operation names are not changed in case (validation refuses upper case).
func (p *Policy) Normalize(now time.Time) { panic("unimplemented") }

// Validate returns a *ValidationError listing every problem, or nil:
// unknown vendor, unknown or malformed currency, a cap with more decimals than the
// currency has, a negative or zero cap, no cap at all, expires_at zero or not after
// period_start, unknown IANA time zone, malformed operation globs, bad modes,
// derive mode without fields. It does not check expires_at against the clock
// (minting does: see ValidateNew).
func (p *Policy) Validate() error { panic("unimplemented") }

// ValidateNew is Validate plus the checks that only apply when a key is minted
// or changed: expires_at must be after now.
func (p *Policy) ValidateNew(now time.Time) error { panic("unimplemented") }

// Location returns the policy's time zone (UTC when empty). Validate guarantees it loads.
func (p *Policy) Location() *time.Location { panic("unimplemented") }

// AllowsOperation reports whether the operation (e.g. "charges.create") is allowed.
// With no Operations listed, the default set applies (DESIGN.md: every read plus the
// money-in operations whose amount keybrake can know). Globs: "*" for either part
// ("*.read", "charges.*", "*").
func (p *Policy) AllowsOperation(op string) bool { panic("unimplemented") }

// AllowsCustomer reports whether the customer id is allowed ("" — no customer in the
// request — is allowed only when the policy lists no customers).
func (p *Policy) AllowsCustomer(customer string) bool { panic("unimplemented") }

// AllowsAccount reports whether a Stripe-Account / Stripe-Context value is allowed
// ("" is always allowed: the platform account itself).
func (p *Policy) AllowsAccount(account string) bool { panic("unimplemented") }
