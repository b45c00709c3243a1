package policy

import (
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
)

func TestWarnings(t *testing.T) {
	t.Parallel()
	d := func(s string) *decimal.Decimal {
		v := decimal.RequireFromString(s)
		return &v
	}
	tests := map[string]struct {
		daily, period, perRequest *decimal.Decimal
		want                      []string
	}{
		"all binding":             {d("99.00"), d("110.00"), d("50.00"), nil},
		"equal caps bind at once": {d("110.00"), d("110.00"), d("110.00"), nil},
		"only one cap":            {d("99"), nil, nil, nil},
		"daily above period": {d("150.00"), d("110.00"), nil, []string{
			"daily_cap (150.00) is above period_cap (110.00): every day lies in the period, so daily_cap can never be reached"}},
		"per request above daily": {d("99.00"), d("110.00"), d("100.00"), []string{
			"per_request_cap (100.00) is above daily_cap (99.00): a larger request is refused by daily_cap, so per_request_cap can never be reached"}},
		"per request above period, no daily": {nil, d("10"), d("20"), []string{
			"per_request_cap (20) is above period_cap (10): a larger request is refused by period_cap, so per_request_cap can never be reached"}},
		"both, the lower cap named": {d("300"), d("200"), d("250"), []string{
			"daily_cap (300) is above period_cap (200): every day lies in the period, so daily_cap can never be reached",
			"per_request_cap (250) is above period_cap (200): a larger request is refused by period_cap, so per_request_cap can never be reached"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := Policy{DailyCap: tc.daily, PeriodCap: tc.period, PerRequestCap: tc.perRequest}
			assert.Equal(t, tc.want, p.Warnings())
		})
	}
}
