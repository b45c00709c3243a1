package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	"github.com/keybrake/keybrake/policy/strictjson"
)

// JSON field names of a policy, canonical and legacy.
const (
	fieldVendor           = "vendor"
	fieldCurrency         = "currency"
	fieldDailyCap         = "daily_cap"
	fieldPeriodCap        = "period_cap"
	fieldPerRequestCap    = "per_request_cap"
	fieldPeriodStart      = "period_start"
	fieldExpiresAt        = "expires_at"
	fieldTimezone         = "timezone"
	fieldOperations       = "operations"
	fieldCustomers        = "customers"
	fieldStripeAccounts   = "stripe_accounts"
	fieldIdempotency      = "idempotency"
	fieldMode             = "mode"
	fieldBudget           = "budget"
	fieldVelocity         = "velocity"
	fieldRenewals         = "renewals"
	fieldLegacyDaily      = "daily_usd_cap"
	fieldLegacyPeriod     = "period_usd_cap"
	fieldLegacyPerRequest = "per_request_usd_cap"
	fieldIdemMode         = "mode"
	fieldIdemFields       = "fields"
	legacyCurrency        = "usd"
)

// policyFields lists every accepted top-level key; anything else is an error, so a
// typo can never silently drop a cap.
var policyFields = []string{
	fieldVendor, fieldCurrency, fieldDailyCap, fieldPeriodCap, fieldPerRequestCap,
	fieldPeriodStart, fieldExpiresAt, fieldTimezone, fieldOperations, fieldCustomers,
	fieldStripeAccounts, fieldIdempotency, fieldMode, fieldBudget, fieldVelocity, fieldApproval,
	fieldObjects, fieldRenewals, fieldLegacyDaily, fieldLegacyPeriod, fieldLegacyPerRequest,
}

var idempotencyFields = []string{fieldIdemMode, fieldIdemFields}

// legacyCaps pairs each legacy key with the canonical key it stands for.
var legacyCaps = [...]struct{ legacy, canonical string }{
	{fieldLegacyDaily, fieldDailyCap},
	{fieldLegacyPeriod, fieldPeriodCap},
	{fieldLegacyPerRequest, fieldPerRequestCap},
}

// wirePolicy is the canonical JSON shape; field order is the order MarshalJSON writes.
type wirePolicy struct {
	Vendor         string           `json:"vendor,omitempty"`
	Currency       string           `json:"currency,omitempty"`
	DailyCap       string           `json:"daily_cap,omitempty"`
	PeriodCap      string           `json:"period_cap,omitempty"`
	PerRequestCap  string           `json:"per_request_cap,omitempty"`
	PeriodStart    string           `json:"period_start,omitempty"`
	ExpiresAt      string           `json:"expires_at,omitempty"`
	Timezone       string           `json:"timezone,omitempty"`
	Operations     []string         `json:"operations,omitempty"`
	Customers      []string         `json:"customers,omitempty"`
	StripeAccounts []string         `json:"stripe_accounts,omitempty"`
	Idempotency    *wireIdempotency `json:"idempotency,omitempty"`
	Mode           Mode             `json:"mode,omitempty"`
	Budget         string           `json:"budget,omitempty"`
	Velocity       []Velocity       `json:"velocity,omitempty"`
	Approval       *wireApproval    `json:"approval,omitempty"`
	Objects        *wireObjects     `json:"objects,omitempty"`
	Renewals       RenewalsMode     `json:"renewals,omitempty"`
}

type wireIdempotency struct {
	Mode   IdempotencyMode `json:"mode,omitempty"`
	Fields []string        `json:"fields,omitempty"`
}

// MarshalJSON writes the canonical form: caps as decimal strings with exactly the
// currency's decimals ("99.00" usd, "500" jpy), times in RFC 3339 (with their own
// offset, fractional seconds only when present). Empty fields are left out, so
// defaults stay distinguishable from explicit values. A cap that has more decimals
// than its currency allows (an invalid policy) is written with all its digits rather
// than rounded.
//
// It has a value receiver so that a Policy embedded by value in another struct is
// still written in the canonical form.
func (p Policy) MarshalJSON() ([]byte, error) {
	cur := p.EffectiveCurrency()
	w := wirePolicy{
		Vendor:         p.Vendor,
		Currency:       p.Currency,
		Timezone:       p.Timezone,
		Operations:     p.Operations,
		Customers:      p.Customers,
		StripeAccounts: p.StripeAccounts,
		Mode:           p.Mode,
		Budget:         p.Budget,
		Velocity:       p.Velocity,
		Approval:       p.Approval.wire(cur),
		Objects:        p.Objects.wire(),
		Renewals:       p.Renewals,
	}
	if p.DailyCap != nil {
		w.DailyCap = formatMajor(cur, *p.DailyCap)
	}
	if p.PeriodCap != nil {
		w.PeriodCap = formatMajor(cur, *p.PeriodCap)
	}
	if p.PerRequestCap != nil {
		w.PerRequestCap = formatMajor(cur, *p.PerRequestCap)
	}
	var err error
	if w.PeriodStart, err = formatTime(fieldPeriodStart, p.PeriodStart); err != nil {
		return nil, err
	}
	if w.ExpiresAt, err = formatTime(fieldExpiresAt, p.ExpiresAt); err != nil {
		return nil, err
	}
	if p.Idempotency.Mode != "" || len(p.Idempotency.Fields) > 0 {
		w.Idempotency = &wireIdempotency{Mode: p.Idempotency.Mode, Fields: p.Idempotency.Fields}
	}
	out, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("marshal policy: %w", err)
	}
	return out, nil
}

func formatTime(field string, t time.Time) (string, error) {
	if t.IsZero() {
		return "", nil
	}
	if y := t.Year(); y < 0 || y > 9999 {
		return "", fmt.Errorf("marshal policy: %s: year %d outside 0000-9999", field, y)
	}
	return t.Format(time.RFC3339Nano), nil
}

// UnmarshalJSON reads the canonical form and the legacy form
// ({"vendor":"stripe","daily_usd_cap":99,"period_usd_cap":110,"expires_at":"..."}).
//
// Caps may be decimal strings or JSON numbers; both are parsed from their literal
// text, never through float64, and exponents ("1e5") are refused. Legacy *_usd_cap
// fields imply currency usd: combined with another currency, or with the canonical
// field for the same cap, they are an error. Unknown fields (compared exactly, not
// case-insensitively as encoding/json would), duplicated fields and values of the
// wrong type are errors. Every such problem is reported at once in a
// *ValidationError naming the field; on error p is left unchanged. JSON null is a
// no-op. Defaults are not applied (see Normalize).
func (p *Policy) UnmarshalJSON(data []byte) error {
	trimmed := bytes.TrimSpace(data)
	if bytes.Equal(trimmed, []byte("null")) {
		return nil
	}
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return &ValidationError{Errors: []FieldError{{Message: "policy must be a JSON object"}}}
	}
	var v ValidationError
	if err := checkDuplicateKeys(trimmed, &v); err != nil {
		return fmt.Errorf("decode policy: %w", err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &fields); err != nil {
		return fmt.Errorf("decode policy: %w", err)
	}
	checkKnownKeys(&v, "", fields, policyFields)

	var out Policy
	str := func(name string, dst *string) {
		if raw, ok := present(fields, name); ok {
			if err := json.Unmarshal(raw, dst); err != nil {
				v.add(name, "must be a string")
			}
		}
	}
	str(fieldVendor, &out.Vendor)
	str(fieldCurrency, &out.Currency)
	str(fieldTimezone, &out.Timezone)
	var mode string
	str(fieldMode, &mode)
	out.Mode = Mode(mode)
	str(fieldBudget, &out.Budget)
	var renewals string
	str(fieldRenewals, &renewals)
	out.Renewals = RenewalsMode(renewals)
	if raw, ok := present(fields, fieldVelocity); ok {
		out.Velocity = DecodeVelocity(&v, fieldVelocity, raw)
	}

	strs := func(name string, dst *[]string) {
		if raw, ok := present(fields, name); ok {
			if err := json.Unmarshal(raw, dst); err != nil {
				v.add(name, "must be an array of strings")
			}
		}
	}
	strs(fieldOperations, &out.Operations)
	strs(fieldCustomers, &out.Customers)
	strs(fieldStripeAccounts, &out.StripeAccounts)

	tm := func(name string, dst *time.Time) {
		if raw, ok := present(fields, name); ok {
			if err := json.Unmarshal(raw, dst); err != nil {
				v.add(name, "must be an RFC 3339 time like \"2026-10-01T00:00:00Z\"")
			}
		}
	}
	tm(fieldPeriodStart, &out.PeriodStart)
	tm(fieldExpiresAt, &out.ExpiresAt)

	capField := func(name string) *decimal.Decimal {
		raw, ok := present(fields, name)
		if !ok {
			return nil
		}
		d, err := parseCapJSON(raw)
		if err != nil {
			v.add(name, "%v", err)
			return nil
		}
		return &d
	}
	out.DailyCap = capField(fieldDailyCap)
	out.PeriodCap = capField(fieldPeriodCap)
	out.PerRequestCap = capField(fieldPerRequestCap)

	for _, lc := range legacyCaps {
		raw, ok := present(fields, lc.legacy)
		if !ok {
			continue
		}
		if _, both := present(fields, lc.canonical); both {
			v.add(lc.legacy, "conflicts with %s: give only one of them", lc.canonical)
			continue
		}
		if out.Currency != "" && out.Currency != legacyCurrency {
			v.add(lc.legacy, "implies currency %q, but currency is %q", legacyCurrency, out.Currency)
			continue
		}
		d, err := parseCapJSON(raw)
		if err != nil {
			v.add(lc.legacy, "%v", err)
			continue
		}
		switch lc.canonical {
		case fieldDailyCap:
			out.DailyCap = &d
		case fieldPeriodCap:
			out.PeriodCap = &d
		case fieldPerRequestCap:
			out.PerRequestCap = &d
		}
		out.Currency = legacyCurrency
	}

	if raw, ok := present(fields, fieldIdempotency); ok {
		var idem map[string]json.RawMessage
		if err := json.Unmarshal(raw, &idem); err != nil {
			v.add(fieldIdempotency, "must be an object like {\"mode\": \"require\"}")
		} else {
			checkKnownKeys(&v, fieldIdempotency+".", idem, idempotencyFields)
			if r, ok := present(idem, fieldIdemMode); ok {
				var m string
				if err := json.Unmarshal(r, &m); err != nil {
					v.add(fieldIdempotency+"."+fieldIdemMode, "must be a string")
				}
				out.Idempotency.Mode = IdempotencyMode(m)
			}
			if r, ok := present(idem, fieldIdemFields); ok {
				if err := json.Unmarshal(r, &out.Idempotency.Fields); err != nil {
					v.add(fieldIdempotency+"."+fieldIdemFields, "must be an array of strings")
				}
			}
		}
	}

	if raw, ok := present(fields, fieldApproval); ok {
		parseApproval(&v, raw, &out)
	}
	if raw, ok := present(fields, fieldObjects); ok {
		parseObjects(&v, raw, &out)
	}

	if err := v.err(); err != nil {
		return err
	}
	*p = out
	return nil
}

// present returns the raw value of key when it is there and not null.
func present(fields map[string]json.RawMessage, key string) (json.RawMessage, bool) {
	raw, ok := fields[key]
	if !ok {
		return nil, false
	}
	raw = bytes.TrimSpace(raw)
	if bytes.Equal(raw, []byte("null")) {
		return nil, false
	}
	return raw, true
}

// parseCapJSON parses a cap given as a JSON string or a JSON number, from its
// literal text.
func parseCapJSON(raw json.RawMessage) (decimal.Decimal, error) {
	switch {
	case len(raw) > 0 && raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return decimal.Decimal{}, errAmountSyntax
		}
		return ParseAmount(s)
	case len(raw) > 0 && (raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9')):
		return ParseAmount(string(raw))
	default:
		return decimal.Decimal{}, errors.New("must be a decimal string like \"99.00\" or a number")
	}
}

// checkKnownKeys reports every key of fields that is not one of known, exactly.
func checkKnownKeys(v *ValidationError, prefix string, fields map[string]json.RawMessage, known []string) {
	var unknown []string
	for k := range fields {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	for _, k := range unknown {
		hint := ""
		for _, kn := range known {
			if strings.EqualFold(kn, k) {
				hint = fmt.Sprintf(" (did you mean %q?)", kn)
				break
			}
		}
		v.add(prefix+k, "unknown field%s", hint)
	}
}

// checkDuplicateKeys reports every object key that appears twice in the same object,
// at any depth: encoding/json would silently keep the last one.
func checkDuplicateKeys(data []byte, v *ValidationError) error {
	dups, err := strictjson.Duplicates(data, 0)
	if err != nil {
		return fmt.Errorf("scan json: %w", err)
	}
	for _, d := range dups {
		v.add(d.Path, "appears more than once")
	}
	return nil
}

// MergePatch applies an RFC 7386 JSON merge patch to the canonical JSON of p and
// decodes the result strictly (as UnmarshalJSON does): null deletes a field (e.g.
// removes a cap), objects merge, arrays and scalars replace. A legacy *_usd_cap key
// in the patch stands for its canonical cap: a value replaces that cap, null removes
// it. The result is not validated (callers run Validate or ValidateNew) and p is not
// changed. Problems with the patch's content come back as a *ValidationError.
func (p *Policy) MergePatch(patch []byte) (Policy, error) {
	base, err := p.MarshalJSON()
	if err != nil {
		return Policy{}, fmt.Errorf("merge patch: %w", err)
	}
	var target map[string]any
	if err := decodeNumbers(base, &target); err != nil {
		return Policy{}, fmt.Errorf("merge patch: decode policy: %w", err)
	}
	var pv ValidationError
	if err := checkDuplicateKeys(bytes.TrimSpace(patch), &pv); err != nil {
		return Policy{}, fmt.Errorf("merge patch: %w", err)
	}
	if err := pv.err(); err != nil {
		return Policy{}, err
	}
	var raw any
	if err := decodeNumbers(patch, &raw); err != nil {
		return Policy{}, fmt.Errorf("merge patch: %w", err)
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		return Policy{}, &ValidationError{Errors: []FieldError{{Message: "merge patch must be a JSON object"}}}
	}
	for _, lc := range legacyCaps {
		val, ok := obj[lc.legacy]
		if !ok {
			continue
		}
		if _, both := obj[lc.canonical]; both {
			continue // left for the decoder to report the conflict
		}
		if val == nil {
			delete(obj, lc.legacy)
			obj[lc.canonical] = nil
		} else {
			delete(target, lc.canonical)
		}
	}
	merged, err := json.Marshal(mergeValue(target, obj))
	if err != nil {
		return Policy{}, fmt.Errorf("merge patch: %w", err)
	}
	var out Policy
	if err := out.UnmarshalJSON(merged); err != nil {
		return Policy{}, err
	}
	return out, nil
}

// MergeValue is RFC 7386 MergePatch(target, patch) over decoded JSON values
// (maps, slices, scalars), for documents other than a policy.
func MergeValue(target, patch any) any { return mergeValue(target, patch) }

// mergeValue is RFC 7386 MergePatch(target, patch).
func mergeValue(target, patch any) any {
	pobj, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	tobj, ok := target.(map[string]any)
	if !ok {
		tobj = make(map[string]any, len(pobj))
	}
	for k, pv := range pobj {
		if pv == nil {
			delete(tobj, k)
			continue
		}
		tobj[k] = mergeValue(tobj[k], pv)
	}
	return tobj
}

// decodeNumbers decodes JSON keeping numbers as their literal text (json.Number).
func decodeNumbers(data []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(dst); err != nil {
		return fmt.Errorf("decode json: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("decode json: trailing data")
	}
	return nil
}

var velocityFields = []string{"count", "per", "operations"}

// DecodeVelocity reads a JSON array of velocity limits strictly (unknown keys
// and values of the wrong type are problems added to v under field).
func DecodeVelocity(v *ValidationError, field string, raw json.RawMessage) []Velocity {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		v.add(field, "must be an array of limits like {\"count\": 20, \"per\": \"1m\"}")
		return nil
	}
	out := make([]Velocity, 0, len(items))
	for i, item := range items {
		f := fmt.Sprintf("%s[%d]", field, i)
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(item, &obj); err != nil {
			v.add(f, "must be an object like {\"count\": 20, \"per\": \"1m\"}")
			continue
		}
		checkKnownKeys(v, f+".", obj, velocityFields)
		var l Velocity
		if r, ok := present(obj, "count"); ok {
			if err := json.Unmarshal(r, &l.Count); err != nil {
				v.add(f+".count", "must be a whole number")
			}
		} else {
			v.add(f+".count", "is required")
		}
		if r, ok := present(obj, "per"); ok {
			if err := json.Unmarshal(r, &l.Per); err != nil {
				v.add(f+".per", "must be a string like \"1m\"")
			}
		} else {
			v.add(f+".per", "is required")
		}
		if r, ok := present(obj, "operations"); ok {
			if err := json.Unmarshal(r, &l.Operations); err != nil {
				v.add(f+".operations", "must be an array of strings")
			}
		}
		out = append(out, l)
	}
	return out
}
