// Package policy holds keybrake's pure domain rules: the Policy a vault key
// carries, money in Stripe's currency exponents, cap windows, and the Decide
// function that says whether a request may place a hold.
//
// Nothing here does I/O or reads a clock: every function that depends on time
// takes `now` as a parameter. (Loading an IANA zone reads tzdata; that is memoized,
// see loadZone. Binaries should import time/tzdata or ship tzdata.)
//
// Decisions the documentation (docs/) leaves to the code:
//
//   - JSON. Caps are decimal strings or JSON numbers, parsed from their literal text.
//     Exponents ("1e5"), a leading '+', bare '.' forms and literals over 64
//     characters are refused: they are ambiguous or hostile. Unknown, duplicated and
//     wrongly-cased keys are errors (encoding/json would match keys
//     case-insensitively and keep the last duplicate, which could silently change a
//     cap). Decode problems come back as *ValidationError, all at once. MarshalJSON
//     writes caps with exactly the currency's decimals, omits empty fields (so a merge
//     patch and Normalize can tell defaults from explicit values) and keeps each
//     time's own UTC offset. A cap with more decimals than its currency allows is
//     written with every digit, never rounded.
//   - Legacy form. daily_usd_cap, period_usd_cap and per_request_usd_cap set
//     currency "usd" and the matching canonical cap; they conflict with another
//     currency and with the canonical field for the same cap. In a merge patch a
//     legacy key replaces (or, with null, removes) its canonical cap.
//   - Validation judges empty fields by their defaults, so a policy validates the
//     same before and after Normalize. "At least one cap" is reported on daily_cap.
//     Decimals are judged by value: "99.000" usd is 99.00 and valid. Zone "Local" is
//     refused (it is a property of the host, not of the policy). Operation globs may
//     use digits too ([a-z0-9_] per segment) so that any Stripe resource can be named.
//     idempotency.fields are only allowed with mode "derive"; duplicate fields,
//     customers and accounts are errors.
//   - Currencies: Stripe's presentment list (SupportedCurrencies); codes stripe-go
//     still carries but Stripe no longer presents (eek, hrk, ltl, lvl, mro, sll, std,
//     vef) are refused.
//   - Daily window: the stretch around now during which the local date does not
//     change. Normally [local midnight, next local midnight), 23 or 25 hours on DST
//     days; in zones where midnight does not exist (America/Santiago, Asia/Beirut,
//     America/Havana) the day starts at the transition; where clocks turn back across
//     midnight (America/Goose_Bay 2009) a date can occur in two stretches, which share
//     one counter because they share the ID "day:YYYY-MM-DD". Start <= now < End
//     always holds and consecutive windows tile time.
//   - Period window: ID "period" for the key's whole life; changing period_start or
//     expires_at does not reset it (nor does changing a cap).
//   - Decide: a negative amount is refused with ReasonAmountUnknown (never relaxed);
//     an amount of 0 passes every cap; a cap that cannot be converted to minor units
//     refuses (fail closed, even in report mode). In report mode the first relaxable
//     refusal is reported and Message starts "allowed in report mode; would have been
//     refused: ". Times in messages are in the policy's zone. Remaining values are
//     never negative; RemainingByWindow covers the daily and period windows that have
//     a cap (per-request has nothing to remain).
package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shopspring/decimal"
)

// RenewalsMode says what keybrake does with a renewal of a subscription the
// key started that would exceed a cap (docs/renewals.md).
type RenewalsMode string

// Renewals modes.
const (
	// RenewalsPauseOverCap sets auto_advance=false on the renewal's draft
	// invoice at Stripe and holds nothing (default).
	RenewalsPauseOverCap RenewalsMode = "pause_over_cap"
	// RenewalsCount holds the renewal even over the cap (the excess booked
	// as an allowance) and alerts; the invoice is never touched.
	RenewalsCount RenewalsMode = "count"
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
	// Budget is the id of the budget the key draws on too ("bud_…"), or "".
	Budget string `json:"budget,omitempty"`
	// Velocity limits how often the key may place a hold.
	Velocity []Velocity `json:"velocity,omitempty"`
	// Approval, when set, makes a person decide on the money requests it
	// names before they are forwarded (see NeedsApproval).
	Approval *Approval `json:"approval,omitempty"`
	// Objects says what keybrake does about the money objects the key created
	// after the request (see Objects).
	Objects *Objects `json:"objects,omitempty"`
	// Renewals says what an over-cap renewal does ("" is pause_over_cap).
	Renewals RenewalsMode `json:"renewals,omitempty"`
}

// DefaultCurrency, DefaultTimezone are what Normalize fills in when a policy names none.
const (
	DefaultCurrency = "usd"
	DefaultTimezone = "UTC"
)

// defaultOperations is the operation set of a policy that names no operations
// (docs/idempotency-and-caps.md, "Operations"): every read, plus the operations that bring
// money in with an amount keybrake can know. Money going out and every other write
// must be named explicitly.
var defaultOperations = [...]string{
	"*.read",
	"charges.create",
	"charges.capture",
	"payment_intents.create",
	"payment_intents.update",
	"payment_intents.confirm",
	"payment_intents.capture",
	"payment_intents.increment_authorization",
	"invoiceitems.create",
	"checkout.sessions.create",
}

// DefaultOperations lists the operations allowed when a policy names none: every
// read ("*.read") plus charges.create, charges.capture, payment_intents.create,
// .update, .confirm, .capture, .increment_authorization, invoiceitems.create and
// checkout.sessions.create. It is a copy for display and documentation; changing it
// does not change what AllowsOperation allows.
var DefaultOperations = slices.Clone(defaultOperations[:])

// FieldError is one validation problem, named by its JSON field path
// ("daily_cap", "operations[2]", "idempotency.fields").
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// String renders the error as "field: message".
func (f FieldError) String() string {
	if f.Field == "" {
		return f.Message
	}
	return f.Field + ": " + f.Message
}

// ValidationError carries every problem found, never just the first.
type ValidationError struct {
	Errors []FieldError
}

// Error joins every field error: "daily_cap: must be positive; currency: ...".
func (e *ValidationError) Error() string {
	if e == nil || len(e.Errors) == 0 {
		return "invalid policy"
	}
	var b strings.Builder
	b.WriteString("invalid policy: ")
	for i, f := range e.Errors {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f.String())
	}
	return b.String()
}

// add records one problem.
func (e *ValidationError) add(field, format string, args ...any) {
	e.Errors = append(e.Errors, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// err returns e as an error, or nil when no problem was recorded.
func (e *ValidationError) err() error {
	if len(e.Errors) == 0 {
		return nil
	}
	return e
}

// Normalize fills defaults: Currency "usd" when empty, Timezone "UTC",
// Mode enforce, Idempotency.Mode require, PeriodStart = now when zero.
// Currency and operation names are not changed in case (validation refuses upper case).
func (p *Policy) Normalize(now time.Time) {
	if p.Currency == "" {
		p.Currency = DefaultCurrency
	}
	if p.Timezone == "" {
		p.Timezone = DefaultTimezone
	}
	if p.Mode == "" {
		p.Mode = ModeEnforce
	}
	if p.Idempotency.Mode == "" {
		p.Idempotency.Mode = IdempotencyRequire
	}
	if p.PeriodStart.IsZero() {
		p.PeriodStart = now.Round(0) // drop the monotonic reading: this is a stored wall time
	}
}

// EffectiveCurrency returns the policy's currency, or the default ("usd") when it
// names none. Every amount of the policy is in this currency.
func (p *Policy) EffectiveCurrency() string {
	if p.Currency == "" {
		return DefaultCurrency
	}
	return p.Currency
}

// EffectiveRenewals returns the policy's renewals mode, or pause_over_cap
// when it names none.
func (p *Policy) EffectiveRenewals() RenewalsMode {
	if p.Renewals == "" {
		return RenewalsPauseOverCap
	}
	return p.Renewals
}

// EffectiveMode returns the policy's mode, or enforce when it names none.
func (p *Policy) EffectiveMode() Mode {
	if p.Mode == "" {
		return ModeEnforce
	}
	return p.Mode
}

// Validate returns a *ValidationError listing every problem, or nil:
// unknown vendor, unknown or malformed currency, a cap with more decimals than the
// currency has, a negative or zero cap, no cap at all, expires_at zero or not after
// period_start, unknown IANA time zone, malformed operation globs, bad modes,
// derive mode without fields. It does not check expires_at against the clock
// (minting does: see ValidateNew).
//
// Fields left empty are judged by the default Normalize would fill in, so a policy
// validates the same before and after Normalize.
func (p *Policy) Validate() error {
	var v ValidationError
	p.validate(&v)
	return v.err()
}

// ValidateNew is Validate plus the checks that only apply when a key is minted
// or changed: expires_at must be after now.
func (p *Policy) ValidateNew(now time.Time) error {
	var v ValidationError
	p.validate(&v)
	if !p.ExpiresAt.IsZero() && !p.ExpiresAt.After(now) {
		v.add("expires_at", "must be in the future (it is %s)", p.ExpiresAt.Format(time.RFC3339))
	}
	return v.err()
}

func (p *Policy) validate(v *ValidationError) {
	switch p.Vendor {
	case VendorStripe:
	case "":
		v.add("vendor", "is required (%q)", VendorStripe)
	default:
		v.add("vendor", "unknown vendor %q: must be %q", p.Vendor, VendorStripe)
	}

	cur := p.EffectiveCurrency()
	exp, curOK := Exponent(cur)
	if !curOK {
		if !isLowerAlpha3(cur) {
			v.add("currency", "malformed currency %q: must be a lower-case three-letter code like \"usd\"", cur)
		} else {
			v.add("currency", "currency %q is not supported by Stripe", cur)
		}
	}

	caps := []struct {
		field string
		cap   *decimal.Decimal
	}{
		{"daily_cap", p.DailyCap},
		{"period_cap", p.PeriodCap},
		{"per_request_cap", p.PerRequestCap},
	}
	anyCap := false
	for _, c := range caps {
		if c.cap == nil {
			continue
		}
		anyCap = true
		if c.cap.Sign() <= 0 {
			v.add(c.field, "must be positive (it is %s)", exactString(*c.cap))
			continue
		}
		if !curOK {
			continue // the currency error says it all; decimals cannot be judged
		}
		if _, err := toMinorExp(exp, cur, *c.cap); err != nil {
			switch {
			case errors.Is(err, ErrPrecision):
				v.add(c.field, "%s has more decimals than %s allows (%d)", exactString(*c.cap), cur, exp)
			case errors.Is(err, ErrOverflow):
				v.add(c.field, "%s is too large", exactString(*c.cap))
			default:
				v.add(c.field, "%s is not a valid amount: %v", exactString(*c.cap), err)
			}
		}
	}
	if !anyCap {
		v.add("daily_cap", "at least one cap is required (daily_cap, period_cap or per_request_cap)")
	}

	if p.ExpiresAt.IsZero() {
		v.add("expires_at", "is required")
	} else if !p.PeriodStart.IsZero() && !p.ExpiresAt.After(p.PeriodStart) {
		v.add("expires_at", "must be after period_start (%s is not after %s)",
			p.ExpiresAt.Format(time.RFC3339), p.PeriodStart.Format(time.RFC3339))
	}

	if p.Timezone != "" {
		if _, err := loadZone(p.Timezone); err != nil {
			v.add("timezone", "unknown IANA time zone %q", p.Timezone)
		}
	}

	for i, op := range p.Operations {
		if msg := checkGlob(op); msg != "" {
			v.add(fmt.Sprintf("operations[%d]", i), "%q: %s", op, msg)
		}
	}
	checkIDList(v, "customers", p.Customers)
	checkIDList(v, "stripe_accounts", p.StripeAccounts)

	switch p.Idempotency.Mode {
	case "", IdempotencyRequire:
		if len(p.Idempotency.Fields) > 0 {
			v.add("idempotency.fields", "only allowed with mode %q", IdempotencyDerive)
		}
	case IdempotencyDerive:
		if len(p.Idempotency.Fields) == 0 {
			v.add("idempotency.fields", "mode %q needs at least one field (e.g. \"customer\", \"metadata[billing_period]\")", IdempotencyDerive)
		}
		seen := make(map[string]int, len(p.Idempotency.Fields))
		for i, f := range p.Idempotency.Fields {
			field := fmt.Sprintf("idempotency.fields[%d]", i)
			if !isFormPath(f) {
				v.add(field, "%q is not a form parameter path like \"customer\" or \"metadata[billing_period]\"", f)
				continue
			}
			if j, dup := seen[f]; dup {
				v.add(field, "%q duplicates idempotency.fields[%d]", f, j)
				continue
			}
			seen[f] = i
		}
	default:
		v.add("idempotency.mode", "unknown mode %q: must be %q or %q", p.Idempotency.Mode, IdempotencyRequire, IdempotencyDerive)
	}

	if p.Budget != "" && !ValidBudgetID(p.Budget) {
		v.add("budget", "%q is not a budget id (\"bud_\" followed by letters and digits)", p.Budget)
	}
	validateVelocity(v, "velocity", p.Velocity)
	p.validateApproval(v)
	p.validateObjects(v)

	switch p.Renewals {
	case "", RenewalsPauseOverCap, RenewalsCount:
	default:
		v.add("renewals", "unknown mode %q: must be %q or %q", p.Renewals, RenewalsPauseOverCap, RenewalsCount)
	}

	switch p.Mode {
	case "", ModeEnforce, ModeReport:
	default:
		v.add("mode", "unknown mode %q: must be %q or %q", p.Mode, ModeEnforce, ModeReport)
	}
}

// checkIDList reports empty and duplicated entries of an allow list.
func checkIDList(v *ValidationError, name string, ids []string) {
	seen := make(map[string]int, len(ids))
	for i, id := range ids {
		field := fmt.Sprintf("%s[%d]", name, i)
		if strings.TrimSpace(id) == "" {
			v.add(field, "must not be empty")
			continue
		}
		if j, dup := seen[id]; dup {
			v.add(field, "%q duplicates %s[%d]", id, name, j)
			continue
		}
		seen[id] = i
	}
}

func isLowerAlpha3(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < 'a' || s[i] > 'z' {
			return false
		}
	}
	return true
}

// isFormPath reports whether s names a form parameter the way Stripe's Rack-style
// bodies do: a lower-case name, then zero or more non-empty bracketed keys
// ("customer", "metadata[billing_period]", "line_items[0][price]").
func isFormPath(s string) bool {
	i := 0
	for i < len(s) && isNameByte(s[i]) {
		i++
	}
	if i == 0 {
		return false
	}
	for i < len(s) {
		if s[i] != '[' {
			return false
		}
		i++
		start := i
		for i < len(s) && s[i] != ']' {
			if s[i] == '[' || s[i] < 0x21 || s[i] == 0x7f {
				return false
			}
			i++
		}
		if i == len(s) || i == start {
			return false
		}
		i++ // ']'
	}
	return true
}

func isNameByte(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'
}

// checkGlob returns "" for a well-formed operation glob, else what is wrong with it.
// Valid: "*", or "resource.verb" where resource is "*" or dot-separated segments
// ("checkout.sessions") and verb is "*" or one segment; segments are [a-z0-9_]+.
func checkGlob(g string) string {
	if g == "*" {
		return ""
	}
	dot := strings.LastIndexByte(g, '.')
	if dot < 0 {
		return "must be \"resource.verb\" (e.g. \"charges.create\", \"*.read\") or \"*\""
	}
	resource, verb := g[:dot], g[dot+1:]
	if verb != "*" && !isSegment(verb) {
		return "verb must be \"*\" or lower-case letters, digits and '_'"
	}
	if resource == "*" {
		return ""
	}
	for _, seg := range strings.Split(resource, ".") {
		if !isSegment(seg) {
			return "resource must be \"*\" or dot-separated lower-case names (e.g. \"checkout.sessions\")"
		}
	}
	return ""
}

func isSegment(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isNameByte(s[i]) {
			return false
		}
	}
	return true
}

// matchGlob reports whether the operation op matches the glob g (see checkGlob).
// The verb is what follows the last '.', so "*.read" matches "checkout.sessions.read".
func matchGlob(g, op string) bool {
	if g == "*" {
		return op != ""
	}
	gd := strings.LastIndexByte(g, '.')
	od := strings.LastIndexByte(op, '.')
	if gd < 0 || od < 0 {
		return false
	}
	gr, gv := g[:gd], g[gd+1:]
	or, ov := op[:od], op[od+1:]
	return (gr == "*" || gr == or) && (gv == "*" || gv == ov) && or != "" && ov != ""
}

// zoneCache memoizes time.LoadLocation, which reads and parses a tzdata file on every
// call (about 8 µs and several KiB of garbage) — too much for Decide on every
// request. It is the package's only process-wide state and is deliberately so: it
// holds immutable *time.Location values of a deterministic function, only for names
// that loaded (bounded by the tzdata's few hundred zones), and changes nothing any
// caller can observe.
var zoneCache sync.Map // zone name -> *time.Location

// loadZone loads an IANA zone. "Local" is refused: it means whatever the host is
// set to, which is not a property of the policy.
func loadZone(name string) (*time.Location, error) {
	switch name {
	case "", "UTC":
		return time.UTC, nil
	case "Local":
		return nil, fmt.Errorf("load time zone %q: host-dependent zone not allowed", name)
	}
	if loc, ok := zoneCache.Load(name); ok {
		return loc.(*time.Location), nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("load time zone %q: %w", name, err)
	}
	zoneCache.Store(name, loc)
	return loc, nil
}

// Location returns the policy's time zone (UTC when empty). Validate guarantees it
// loads; for a zone that does not load it returns UTC.
func (p *Policy) Location() *time.Location {
	loc, err := loadZone(p.Timezone)
	if err != nil {
		return time.UTC
	}
	return loc
}

// AllowsOperation reports whether the operation (e.g. "charges.create") is allowed.
// With no Operations listed, the default set applies (every read plus the
// money-in operations whose amount keybrake can know). Globs: "*" for either part
// ("*.read", "charges.*", "*").
func (p *Policy) AllowsOperation(op string) bool {
	globs := p.Operations
	if len(globs) == 0 {
		globs = defaultOperations[:]
	}
	for _, g := range globs {
		if matchGlob(g, op) {
			return true
		}
	}
	return false
}

// AllowsCustomer reports whether the customer id is allowed ("" — no customer in the
// request — is allowed only when the policy lists no customers).
func (p *Policy) AllowsCustomer(customer string) bool {
	if len(p.Customers) == 0 {
		return true
	}
	return customer != "" && slices.Contains(p.Customers, customer)
}

// AllowsAccount reports whether a Stripe-Account / Stripe-Context value is allowed
// ("" is always allowed: the platform account itself).
func (p *Policy) AllowsAccount(account string) bool {
	return account == "" || slices.Contains(p.StripeAccounts, account)
}

// BudgetIDPrefix starts every budget id.
const BudgetIDPrefix = "bud_"

// ValidBudgetID reports whether id has the shape of a budget id: "bud_"
// followed by 1-64 lower-case letters and digits.
func ValidBudgetID(id string) bool {
	rest, ok := strings.CutPrefix(id, BudgetIDPrefix)
	if !ok || rest == "" || len(rest) > 64 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
