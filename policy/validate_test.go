package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// validBase is a valid policy that each case below breaks in one way.
func validBase(tb testing.TB) Policy {
	tb.Helper()
	return Policy{
		Vendor:      VendorStripe,
		Currency:    "usd",
		DailyCap:    MustDecimal(tb, "99.00"),
		PeriodStart: MustTime(tb, "2026-09-01T00:00:00Z"),
		ExpiresAt:   MustTime(tb, "2026-10-01T00:00:00Z"),
	}
}

func TestValidateOneProblem(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		mutate  func(p *Policy)
		field   string
		message string // substring
	}{
		"vendor missing":         {func(p *Policy) { p.Vendor = "" }, "vendor", "is required"},
		"vendor unknown":         {func(p *Policy) { p.Vendor = "paypal" }, "vendor", `unknown vendor "paypal"`},
		"vendor case":            {func(p *Policy) { p.Vendor = "Stripe" }, "vendor", "unknown vendor"},
		"currency upper":         {func(p *Policy) { p.Currency = "USD" }, "currency", "malformed"},
		"currency long":          {func(p *Policy) { p.Currency = "usdollar" }, "currency", "malformed"},
		"currency unknown":       {func(p *Policy) { p.Currency = "xyz" }, "currency", "not supported by Stripe"},
		"currency retired":       {func(p *Policy) { p.Currency = "ltl" }, "currency", "not supported by Stripe"},
		"cap negative":           {func(p *Policy) { p.DailyCap = MustDecimal(t, "-1") }, "daily_cap", "must be positive"},
		"cap zero":               {func(p *Policy) { p.DailyCap = MustDecimal(t, "0.00") }, "daily_cap", "must be positive"},
		"period cap zero":        {func(p *Policy) { p.PeriodCap = MustDecimal(t, "0") }, "period_cap", "must be positive"},
		"per request negative":   {func(p *Policy) { p.PerRequestCap = MustDecimal(t, "-0.01") }, "per_request_cap", "must be positive"},
		"usd three decimals":     {func(p *Policy) { p.DailyCap = MustDecimal(t, "5.001") }, "daily_cap", "more decimals than usd allows (2)"},
		"jpy fraction":           {func(p *Policy) { p.Currency, p.DailyCap = "jpy", MustDecimal(t, "1.5") }, "daily_cap", "more decimals than jpy allows (0)"},
		"kwd four decimals":      {func(p *Policy) { p.Currency, p.DailyCap = "kwd", MustDecimal(t, "1.0005") }, "daily_cap", "allows (3)"},
		"overflow":               {func(p *Policy) { p.PeriodCap = MustDecimal(t, "92233720368547758.08") }, "period_cap", "too large"},
		"no cap":                 {func(p *Policy) { p.DailyCap = nil }, "daily_cap", "at least one cap"},
		"expires missing":        {func(p *Policy) { p.ExpiresAt = time.Time{} }, "expires_at", "is required"},
		"expires equal start":    {func(p *Policy) { p.ExpiresAt = p.PeriodStart }, "expires_at", "must be after period_start"},
		"expires before start":   {func(p *Policy) { p.ExpiresAt = p.PeriodStart.Add(-time.Second) }, "expires_at", "must be after period_start"},
		"zone unknown":           {func(p *Policy) { p.Timezone = "Mars/Base" }, "timezone", "unknown IANA time zone"},
		"zone local":             {func(p *Policy) { p.Timezone = "Local" }, "timezone", "unknown IANA time zone"},
		"zone path":              {func(p *Policy) { p.Timezone = "../../etc/passwd" }, "timezone", "unknown IANA time zone"},
		"zone lower case":        {func(p *Policy) { p.Timezone = "utc" }, "timezone", "unknown IANA time zone"},
		"op no dot":              {func(p *Policy) { p.Operations = []string{"charges"} }, "operations[0]", "resource.verb"},
		"op upper":               {func(p *Policy) { p.Operations = []string{"*.read", "Charges.create"} }, "operations[1]", "resource"},
		"op empty verb":          {func(p *Policy) { p.Operations = []string{"charges."} }, "operations[0]", "verb"},
		"op empty resource":      {func(p *Policy) { p.Operations = []string{".create"} }, "operations[0]", "resource"},
		"op double dot":          {func(p *Policy) { p.Operations = []string{"checkout..create"} }, "operations[0]", "resource"},
		"op partial glob":        {func(p *Policy) { p.Operations = []string{"charges.cre*"} }, "operations[0]", "verb"},
		"op partial resource":    {func(p *Policy) { p.Operations = []string{"charge*.create"} }, "operations[0]", "resource"},
		"op star in nested":      {func(p *Policy) { p.Operations = []string{"checkout.*.create"} }, "operations[0]", "resource"},
		"op space":               {func(p *Policy) { p.Operations = []string{"charges.create "} }, "operations[0]", "verb"},
		"op empty":               {func(p *Policy) { p.Operations = []string{""} }, "operations[0]", "resource.verb"},
		"customer empty":         {func(p *Policy) { p.Customers = []string{"cus_1", ""} }, "customers[1]", "must not be empty"},
		"customer blank":         {func(p *Policy) { p.Customers = []string{"  "} }, "customers[0]", "must not be empty"},
		"customer duplicate":     {func(p *Policy) { p.Customers = []string{"cus_1", "cus_2", "cus_1"} }, "customers[2]", "duplicates customers[0]"},
		"account empty":          {func(p *Policy) { p.StripeAccounts = []string{""} }, "stripe_accounts[0]", "must not be empty"},
		"account duplicate":      {func(p *Policy) { p.StripeAccounts = []string{"acct_1", "acct_1"} }, "stripe_accounts[1]", "duplicates"},
		"idem mode unknown":      {func(p *Policy) { p.Idempotency.Mode = "optional" }, "idempotency.mode", `unknown mode "optional"`},
		"derive without fields":  {func(p *Policy) { p.Idempotency.Mode = IdempotencyDerive }, "idempotency.fields", "needs at least one field"},
		"fields without derive":  {func(p *Policy) { p.Idempotency.Fields = []string{"customer"} }, "idempotency.fields", "only allowed with mode"},
		"derive bad path":        {func(p *Policy) { p.Idempotency = Idempotency{IdempotencyDerive, []string{"customer", "metadata[]"}} }, "idempotency.fields[1]", "form parameter path"},
		"derive unclosed":        {func(p *Policy) { p.Idempotency = Idempotency{IdempotencyDerive, []string{"metadata[a"}} }, "idempotency.fields[0]", "form parameter path"},
		"derive upper name":      {func(p *Policy) { p.Idempotency = Idempotency{IdempotencyDerive, []string{"Customer"}} }, "idempotency.fields[0]", "form parameter path"},
		"derive duplicate field": {func(p *Policy) { p.Idempotency = Idempotency{IdempotencyDerive, []string{"customer", "customer"}} }, "idempotency.fields[1]", "duplicates"},
		"mode unknown":           {func(p *Policy) { p.Mode = "audit" }, "mode", `unknown mode "audit"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := validBase(t)
			require.NoError(t, p.Validate(), "the base is valid")
			tc.mutate(&p)
			err := p.Validate()
			require.Error(t, err)
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Len(t, ve.Errors, 1, "%v", ve.Errors)
			assert.Equal(t, tc.field, ve.Errors[0].Field)
			assert.Contains(t, ve.Errors[0].Message, tc.message)
			assert.Contains(t, err.Error(), tc.field+": ")
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	t.Parallel()
	tests := map[string]func(p *Policy){
		"defaults left empty":  func(p *Policy) { p.Currency, p.Timezone, p.Mode, p.PeriodStart = "", "", "", time.Time{} },
		"trailing zeros":       func(p *Policy) { p.DailyCap = MustDecimal(t, "99.000000") },
		"jpy whole":            func(p *Policy) { p.Currency, p.DailyCap = "jpy", MustDecimal(t, "15000") },
		"kwd three decimals":   func(p *Policy) { p.Currency, p.DailyCap = "kwd", MustDecimal(t, "1.005") },
		"isk two decimals":     func(p *Policy) { p.Currency, p.DailyCap = "isk", MustDecimal(t, "100.50") },
		"largest usd cap":      func(p *Policy) { p.DailyCap = MustDecimal(t, "92233720368547758.07") },
		"period cap only":      func(p *Policy) { p.DailyCap, p.PeriodCap = nil, MustDecimal(t, "1") },
		"per request cap only": func(p *Policy) { p.DailyCap, p.PerRequestCap = nil, MustDecimal(t, "1") },
		"new york":             func(p *Policy) { p.Timezone = "America/New_York" },
		"utc":                  func(p *Policy) { p.Timezone = "UTC" },
		"globs": func(p *Policy) {
			p.Operations = []string{"*", "*.*", "*.read", "charges.*", "checkout.sessions.create", "v2_core.events.read", "a.b.c.d"}
		},
		"derive": func(p *Policy) {
			p.Idempotency = Idempotency{IdempotencyDerive, []string{"customer", "metadata[billing_period]", "line_items[0][price]"}}
		},
		"explicit enforce require": func(p *Policy) { p.Mode, p.Idempotency.Mode = ModeEnforce, IdempotencyRequire },
		"report":                   func(p *Policy) { p.Mode = ModeReport },
		"lists":                    func(p *Policy) { p.Customers, p.StripeAccounts = []string{"cus_1", "cus_2"}, []string{"acct_1"} },
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			p := validBase(t)
			mutate(&p)
			assert.NoError(t, p.Validate())
		})
	}
}

// TestValidateEverythingAtOnce: one policy with every kind of problem reports all of
// them, in field order, never just the first.
func TestValidateEverythingAtOnce(t *testing.T) {
	t.Parallel()
	p := Policy{
		Vendor:         "paypal",
		Currency:       "usd",
		DailyCap:       MustDecimal(t, "-5"),
		PeriodCap:      MustDecimal(t, "5.001"),
		PerRequestCap:  MustDecimal(t, "99999999999999999999"),
		PeriodStart:    MustTime(t, "2026-10-01T00:00:00Z"),
		ExpiresAt:      MustTime(t, "2026-09-01T00:00:00Z"),
		Timezone:       "Nowhere/Land",
		Operations:     []string{"charges.create", "charges"},
		Customers:      []string{"", "cus_1", "cus_1"},
		StripeAccounts: []string{"acct_1", "acct_1"},
		Idempotency:    Idempotency{Mode: "sometimes"},
		Mode:           "dry-run",
	}
	err := p.Validate()
	require.Error(t, err)
	assert.Equal(t, []string{
		"vendor", "daily_cap", "period_cap", "per_request_cap", "expires_at", "timezone",
		"operations[1]", "customers[0]", "customers[2]", "stripe_accounts[1]", "idempotency.mode", "mode",
	}, fieldsOf(t, err))
	assert.Equal(t, 11, strings.Count(err.Error(), "; "), err.Error())

	t.Run("currency problems are reported with the rest", func(t *testing.T) {
		p := Policy{Vendor: "", Currency: "EUR", DailyCap: MustDecimal(t, "0")}
		assert.Equal(t, []string{"vendor", "currency", "daily_cap", "expires_at"}, fieldsOf(t, p.Validate()))
	})
}

func TestValidateNew(t *testing.T) {
	t.Parallel()
	p := validBase(t)
	now := MustTime(t, "2026-09-14T00:00:00Z")
	require.NoError(t, p.ValidateNew(now))
	assert.Equal(t, []string{"expires_at"}, fieldsOf(t, p.ValidateNew(p.ExpiresAt)), "expires_at == now is not in the future")
	assert.Equal(t, []string{"expires_at"}, fieldsOf(t, p.ValidateNew(MustTime(t, "2027-01-01T00:00:00Z"))))

	p.Vendor = ""
	assert.Equal(t, []string{"vendor", "expires_at"}, fieldsOf(t, p.ValidateNew(MustTime(t, "2027-01-01T00:00:00Z"))), "plus every Validate problem")
}

func TestNormalize(t *testing.T) {
	t.Parallel()
	now := time.Now() // carries a monotonic reading, which Normalize drops
	var p Policy
	p.Normalize(now)
	assert.Equal(t, "usd", p.Currency)
	assert.Equal(t, "UTC", p.Timezone)
	assert.Equal(t, ModeEnforce, p.Mode)
	assert.Equal(t, IdempotencyRequire, p.Idempotency.Mode)
	assert.True(t, p.PeriodStart.Equal(now))
	assert.Equal(t, now.Round(0), p.PeriodStart)

	q := Policy{Currency: "EUR", Timezone: "Europe/Berlin", Mode: ModeReport, Idempotency: Idempotency{Mode: IdempotencyDerive}, PeriodStart: mintTime}
	q.Normalize(now)
	assert.Equal(t, "EUR", q.Currency, "case is not changed: validation refuses it")
	assert.Equal(t, "Europe/Berlin", q.Timezone)
	assert.Equal(t, ModeReport, q.Mode)
	assert.Equal(t, IdempotencyDerive, q.Idempotency.Mode)
	assert.Equal(t, mintTime, q.PeriodStart)
}

func TestLocation(t *testing.T) {
	t.Parallel()
	assert.Equal(t, time.UTC, (&Policy{}).Location())
	assert.Equal(t, time.UTC, (&Policy{Timezone: "UTC"}).Location())
	assert.Equal(t, "America/New_York", (&Policy{Timezone: "America/New_York"}).Location().String())
	assert.Equal(t, time.UTC, (&Policy{Timezone: "Mars/Base"}).Location(), "an invalid zone falls back to UTC")
}
