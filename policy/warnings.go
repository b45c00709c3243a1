package policy

import (
	"fmt"

	"github.com/shopspring/decimal"
)

// Warnings lists what a valid policy allows but probably does not mean: a cap
// that can never bind, because a lower cap always refuses first. The daily cap
// never binds above the period cap (every day lies in the period), and the
// per-request cap never binds above the lower of the daily and period caps (a
// larger request is refused by that cap). Each warning names the fields and
// amounts.
func (p *Policy) Warnings() []string {
	var out []string
	warn := func(field string, v decimal.Decimal, lowerField string, lower decimal.Decimal, why string) {
		out = append(out, fmt.Sprintf("%s (%s) is above %s (%s): %s, so %s can never be reached",
			field, exactString(v), lowerField, exactString(lower), why, field))
	}
	if p.DailyCap != nil && p.PeriodCap != nil && p.DailyCap.GreaterThan(*p.PeriodCap) {
		warn("daily_cap", *p.DailyCap, "period_cap", *p.PeriodCap, "every day lies in the period")
	}
	if p.PerRequestCap == nil {
		return out
	}
	lowerField, lower := "", (*decimal.Decimal)(nil)
	for _, c := range []struct {
		field string
		v     *decimal.Decimal
	}{{"daily_cap", p.DailyCap}, {"period_cap", p.PeriodCap}} {
		if c.v != nil && (lower == nil || c.v.LessThan(*lower)) {
			lowerField, lower = c.field, c.v
		}
	}
	if lower != nil && p.PerRequestCap.GreaterThan(*lower) {
		warn("per_request_cap", *p.PerRequestCap, lowerField, *lower, "a larger request is refused by "+lowerField)
	}
	return out
}
