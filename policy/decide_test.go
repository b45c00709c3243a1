package policy

import (
	"slices"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// seedPolicy is the seed's legacy key: daily cap 99, period cap 110.
const seedPolicy = `{"vendor":"stripe","daily_usd_cap":99,"period_usd_cap":110,"expires_at":"2026-10-01T00:00:00Z"}`

// charge applies an allowed decision to usage the way the store does on commit.
func charge(tb testing.TB, p *Policy, usage Usage, amount int64, now time.Time) Decision {
	tb.Helper()
	d := Decide(p, usage, Request{Operation: "charges.create", Amount: amount, Currency: "usd"}, now)
	if d.Allowed {
		ws, err := p.Windows(now)
		require.NoError(tb, err)
		for _, w := range ws {
			c := usage[w.ID]
			c.Committed += amount
			usage[w.ID] = c
		}
	}
	return d
}

// TestSeedNumbers replays the seed: the caller expects an amount of 90 and allows 10 %
// on top (90 × 1.10 = 99.00 exactly), so the daily cap is 99 and the period cap 110.
func TestSeedNumbers(t *testing.T) {
	t.Parallel()
	p := MustPolicy(t, seedPolicy, mintTime)
	expected := decimal.RequireFromString("90").Mul(decimal.RequireFromString("1.10"))
	capMinor, err := ToMinor("usd", expected)
	require.NoError(t, err)
	require.Equal(t, int64(9900), capMinor, "90 × 1.10 is 99.00 exactly, no float")
	daily, err := ToMinor("usd", *p.DailyCap)
	require.NoError(t, err)
	require.Equal(t, capMinor, daily)

	usage := Usage{}
	day1 := MustTime(t, "2026-09-14T10:00:00Z")
	day2 := MustTime(t, "2026-09-15T10:00:00Z")

	d := charge(t, p, usage, 9900, day1)
	require.True(t, d.Allowed, d.Message)
	assert.False(t, d.WouldRefuse)
	assert.Equal(t, ReasonNone, d.Reason)
	assert.Equal(t, map[WindowKind]int64{WindowDaily: 0, WindowPeriod: 1100}, d.RemainingByWindow)

	d = charge(t, p, usage, 1, day1)
	require.False(t, d.Allowed)
	assert.Equal(t, ReasonCapExceeded, d.Reason)
	assert.Equal(t, WindowDaily, d.Cap)
	assert.Equal(t, int64(9900), d.Limit)
	assert.Equal(t, int64(9900), d.Committed)
	assert.Equal(t, int64(0), d.Held)
	assert.Equal(t, int64(1), d.Requested)
	assert.Equal(t, int64(0), d.Remaining)
	assert.True(t, d.ResetAt.Equal(MustTime(t, "2026-09-15T00:00:00Z")))
	assert.Equal(t, "daily cap of 99.00 usd would be exceeded: 99.00 committed, 0.00 held, 0.01 requested, 0.00 remaining; resets at 2026-09-15T00:00:00Z", d.Message)

	// A new day: the daily window is fresh, the period has 11.00 left.
	d = charge(t, p, usage, 1101, day2)
	require.False(t, d.Allowed)
	assert.Equal(t, WindowPeriod, d.Cap)
	assert.Equal(t, int64(11000), d.Limit)
	assert.Equal(t, int64(1100), d.Remaining)
	assert.Equal(t, "period cap of 110.00 usd would be exceeded: 99.00 committed, 0.00 held, 11.01 requested, 11.00 remaining; the period ends at 2026-10-01T00:00:00Z", d.Message)

	d = charge(t, p, usage, 1100, day2)
	require.True(t, d.Allowed, d.Message)
	assert.Equal(t, map[WindowKind]int64{WindowDaily: 8800, WindowPeriod: 0}, d.RemainingByWindow)

	d = charge(t, p, usage, 1, day2)
	require.False(t, d.Allowed)
	assert.Equal(t, WindowPeriod, d.Cap)

	assert.Equal(t, Usage{
		"day:2026-09-14": {Committed: 9900},
		"day:2026-09-15": {Committed: 1100},
		"period":         {Committed: 11000},
	}, usage)
}

func TestDecideCapMessage(t *testing.T) {
	t.Parallel()
	p := MustPolicy(t, seedPolicy, mintTime)
	now := MustTime(t, "2026-09-14T10:00:00Z")
	d := Decide(p, Usage{"day:2026-09-14": {Committed: 9500}}, Request{Operation: "charges.create", Amount: 500, Currency: "usd"}, now)
	require.False(t, d.Allowed)
	assert.Equal(t, "daily cap of 99.00 usd would be exceeded: 95.00 committed, 0.00 held, 5.00 requested, 4.00 remaining; resets at 2026-09-15T00:00:00Z", d.Message)

	t.Run("reset in the policy's zone", func(t *testing.T) {
		p := MustPolicy(t, `{"vendor":"stripe","currency":"jpy","daily_cap":1000,"timezone":"America/New_York","expires_at":"2026-10-01T00:00:00Z"}`, mintTime)
		d := Decide(p, Usage{"day:2026-09-14": {Committed: 600, Held: 300}}, Request{Operation: "charges.create", Amount: 101, Currency: "jpy"}, now)
		require.False(t, d.Allowed)
		assert.Equal(t, "daily cap of 1000 jpy would be exceeded: 600 committed, 300 held, 101 requested, 100 remaining; resets at 2026-09-15T00:00:00-04:00", d.Message)
		assert.Equal(t, int64(300), d.Held)
	})
	t.Run("per request", func(t *testing.T) {
		p := MustPolicy(t, `{"vendor":"stripe","per_request_cap":"50","expires_at":"2026-10-01T00:00:00Z"}`, mintTime)
		d := Decide(p, nil, Request{Operation: "charges.create", Amount: 5001, Currency: "usd"}, now)
		require.False(t, d.Allowed)
		assert.Equal(t, ReasonCapExceeded, d.Reason)
		assert.Equal(t, WindowPerRequest, d.Cap)
		assert.Equal(t, int64(5000), d.Limit)
		assert.Equal(t, int64(5001), d.Requested)
		assert.Equal(t, "per-request cap of 50.00 usd would be exceeded: 50.01 requested", d.Message)
		assert.True(t, Decide(p, nil, Request{Operation: "charges.create", Amount: 5000, Currency: "usd"}, now).Allowed)
	})
	t.Run("per request bounds the payment object, not the increment", func(t *testing.T) {
		p := MustPolicy(t, `{"vendor":"stripe","per_request_cap":"50","expires_at":"2026-10-01T00:00:00Z"}`, mintTime)
		raise := Request{Operation: "payment_intents.update", Amount: 1000, Currency: "usd", ObjectTotal: 6000}
		d := Decide(p, nil, raise, now)
		require.False(t, d.Allowed, "a 10.00 raise of a 50.00 payment to 60.00")
		assert.Equal(t, WindowPerRequest, d.Cap)
		assert.Equal(t, int64(6000), d.Requested)
		assert.Equal(t, "per-request cap of 50.00 usd would be exceeded: the payment would move 60.00 in all (10.00 more now)", d.Message)
		raise.ObjectTotal = 5000
		assert.True(t, Decide(p, nil, raise, now).Allowed)
		lowered := Request{Operation: "payment_intents.update", Currency: "usd", ObjectTotal: 7000}
		assert.False(t, Decide(p, nil, lowered, now).Allowed, "a total above the cap is refused even when nothing is added")
	})
}

func TestDecideBoundaries(t *testing.T) {
	t.Parallel()
	p := MustPolicy(t, `{"vendor":"stripe","daily_cap":"10.00","period_cap":"20.00","period_start":"2026-09-01T00:00:00Z","expires_at":"2026-10-01T00:00:00Z"}`, mintTime)
	now := MustTime(t, "2026-09-14T10:00:00Z")
	day := DayWindowID("2026-09-14")
	tests := map[string]struct {
		usage   Usage
		amount  int64
		allowed bool
		cap     WindowKind
	}{
		"exactly up to the daily cap":       {Usage{day: {Committed: 600, Held: 300}}, 100, true, ""},
		"one over the daily cap":            {Usage{day: {Committed: 600, Held: 300}}, 101, false, WindowDaily},
		"held counts like committed":        {Usage{day: {Held: 1000}}, 1, false, WindowDaily},
		"exactly up to the period cap":      {Usage{"period": {Committed: 1900}}, 100, true, ""},
		"one over the period cap":           {Usage{"period": {Committed: 1500, Held: 400}}, 101, false, WindowPeriod},
		"daily is checked before period":    {Usage{day: {Committed: 1000}, "period": {Committed: 2000}}, 1, false, WindowDaily},
		"other days do not count":           {Usage{"day:2026-09-13": {Committed: 1000}}, 1000, true, ""},
		"zero amount passes a full cap":     {Usage{day: {Committed: 1000}, "period": {Committed: 2000}}, 0, true, ""},
		"zero amount passes an overrun cap": {Usage{day: {Committed: 5000}}, 0, true, ""},
		"huge amount":                       {nil, 1 << 62, false, WindowDaily},
		"overflowing counters":              {Usage{day: {Committed: 1 << 62, Held: 1 << 62}}, 1, false, WindowDaily},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := Decide(p, tc.usage, Request{Operation: "charges.create", Amount: tc.amount, Currency: "usd"}, now)
			assert.Equal(t, tc.allowed, d.Allowed, d.Message)
			assert.Equal(t, tc.cap, d.Cap)
			if tc.allowed {
				assert.Equal(t, ReasonNone, d.Reason)
				for kind, left := range d.RemainingByWindow {
					assert.GreaterOrEqual(t, left, int64(0), kind)
				}
			} else {
				assert.Equal(t, ReasonCapExceeded, d.Reason)
				assert.GreaterOrEqual(t, d.Remaining, int64(0))
			}
		})
	}
}

func TestDecideReasons(t *testing.T) {
	t.Parallel()
	const js = `{
		"vendor": "stripe", "currency": "usd", "daily_cap": "99.00", "period_cap": "110.00", "per_request_cap": "50.00",
		"period_start": "2026-09-01T00:00:00Z", "expires_at": "2026-10-01T00:00:00Z",
		"operations": ["charges.create", "*.read"], "customers": ["cus_1"], "stripe_accounts": ["acct_1"]
	}`
	now := MustTime(t, "2026-09-14T10:00:00Z")
	ok := Request{Operation: "charges.create", Amount: 1000, Currency: "usd", Customer: "cus_1"}
	full := Usage{"day:2026-09-14": {Committed: 9900}}
	with := func(f func(*Request)) Request { r := ok; f(&r); return r }
	tests := map[string]struct {
		req       Request
		usage     Usage
		now       time.Time
		reason    Reason
		relaxable bool
	}{
		"allowed":                 {ok, nil, now, ReasonNone, false},
		"allowed on connected":    {with(func(r *Request) { r.Account = "acct_1" }), nil, now, ReasonNone, false},
		"expired at expires_at":   {ok, nil, MustTime(t, "2026-10-01T00:00:00Z"), ReasonExpired, false},
		"expired after":           {ok, nil, MustTime(t, "2027-01-01T00:00:00Z"), ReasonExpired, false},
		"not yet valid":           {ok, nil, MustTime(t, "2026-08-31T23:59:59.999999999Z"), ReasonNotYetValid, false},
		"valid from period_start": {ok, nil, MustTime(t, "2026-09-01T00:00:00Z"), ReasonNone, false},
		"account":                 {with(func(r *Request) { r.Account = "acct_2" }), nil, now, ReasonAccountNotAllowed, false},
		"negative amount":         {with(func(r *Request) { r.Amount = -1 }), nil, now, ReasonAmountUnknown, false},
		"operation":               {with(func(r *Request) { r.Operation = "refunds.create" }), nil, now, ReasonOperationNotAllowed, true},
		"customer":                {with(func(r *Request) { r.Customer = "cus_2" }), nil, now, ReasonCustomerNotAllowed, true},
		"no customer":             {with(func(r *Request) { r.Customer = "" }), nil, now, ReasonCustomerNotAllowed, true},
		"currency":                {with(func(r *Request) { r.Currency = "eur" }), nil, now, ReasonCurrencyNotAllowed, true},
		"currency upper case":     {with(func(r *Request) { r.Currency = "USD" }), nil, now, ReasonCurrencyNotAllowed, true},
		"no currency is fine":     {with(func(r *Request) { r.Currency, r.Amount = "", 0 }), nil, now, ReasonNone, false},
		"per request cap":         {with(func(r *Request) { r.Amount = 5001 }), nil, now, ReasonCapExceeded, true},
		"daily cap":               {ok, full, now, ReasonCapExceeded, true},
		// Order: the first failing check wins.
		"expired beats everything": {
			Request{Operation: "refunds.create", Amount: -5, Currency: "eur", Account: "acct_9"}, full,
			MustTime(t, "2026-10-02T00:00:00Z"), ReasonExpired, false,
		},
		"account beats operation": {
			with(func(r *Request) { r.Account, r.Operation = "acct_9", "refunds.create" }), nil, now, ReasonAccountNotAllowed, false,
		},
		"operation beats customer": {
			with(func(r *Request) { r.Operation, r.Customer = "refunds.create", "cus_9" }), nil, now, ReasonOperationNotAllowed, true,
		},
		"customer beats currency": {
			with(func(r *Request) { r.Customer, r.Currency = "cus_9", "eur" }), nil, now, ReasonCustomerNotAllowed, true,
		},
		"currency beats caps": {
			with(func(r *Request) { r.Currency, r.Amount = "eur", 9999999 }), nil, now, ReasonCurrencyNotAllowed, true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			enforce := MustPolicy(t, js, mintTime)
			d := Decide(enforce, tc.usage, tc.req, tc.now)
			assert.Equal(t, tc.reason, d.Reason, d.Message)
			assert.Equal(t, tc.reason == ReasonNone, d.Allowed)
			assert.False(t, d.WouldRefuse)
			if tc.reason != ReasonNone {
				assert.NotEmpty(t, d.Message)
			}

			report := MustPolicy(t, js, mintTime)
			report.Mode = ModeReport
			r := Decide(report, tc.usage, tc.req, tc.now)
			assert.Equal(t, tc.reason, r.Reason, r.Message)
			switch {
			case tc.reason == ReasonNone:
				assert.True(t, r.Allowed)
				assert.False(t, r.WouldRefuse)
			case tc.relaxable:
				assert.True(t, r.Allowed, "report mode lets %s through", tc.reason)
				assert.True(t, r.WouldRefuse)
				assert.Contains(t, r.Message, d.Message)
				assert.Contains(t, r.Message, "report mode")
				assert.NotNil(t, r.RemainingByWindow)
			default:
				assert.False(t, r.Allowed, "report mode never relaxes %s", tc.reason)
				assert.False(t, r.WouldRefuse)
				assert.Equal(t, d.Message, r.Message)
			}
		})
	}
}

func TestDecideReportModeCaps(t *testing.T) {
	t.Parallel()
	p := MustPolicy(t, `{"vendor":"stripe","daily_cap":"10","period_cap":"100","mode":"report","expires_at":"2026-10-01T00:00:00Z"}`, mintTime)
	now := MustTime(t, "2026-09-14T10:00:00Z")
	d := Decide(p, Usage{"day:2026-09-14": {Committed: 900}}, Request{Operation: "charges.create", Amount: 500, Currency: "usd"}, now)
	require.True(t, d.Allowed)
	require.True(t, d.WouldRefuse)
	assert.Equal(t, ReasonCapExceeded, d.Reason)
	assert.Equal(t, WindowDaily, d.Cap)
	assert.Equal(t, int64(100), d.Remaining)
	assert.Equal(t, "allowed in report mode; would have been refused: daily cap of 10.00 usd would be exceeded: 9.00 committed, 0.00 held, 5.00 requested, 1.00 remaining; resets at 2026-09-15T00:00:00Z", d.Message)
	assert.Equal(t, map[WindowKind]int64{WindowDaily: 0, WindowPeriod: 9500}, d.RemainingByWindow, "never negative")

	t.Run("first reason is reported", func(t *testing.T) {
		d := Decide(p, Usage{"day:2026-09-14": {Committed: 900}}, Request{Operation: "refunds.create", Amount: 500, Currency: "usd"}, now)
		require.True(t, d.Allowed)
		assert.Equal(t, ReasonOperationNotAllowed, d.Reason)
	})
}

func TestDecideInvalidPolicyFailsClosed(t *testing.T) {
	t.Parallel()
	now := MustTime(t, "2026-09-14T10:00:00Z")
	p := &Policy{Vendor: "stripe", DailyCap: MustDecimal(t, "5.001"), Mode: ModeReport, ExpiresAt: MustTime(t, "2026-10-01T00:00:00Z")}
	d := Decide(p, nil, Request{Operation: "charges.create", Amount: 1, Currency: "usd"}, now)
	assert.False(t, d.Allowed, "a cap that cannot be evaluated refuses, even in report mode")
	assert.Equal(t, ReasonCapExceeded, d.Reason)

	p = &Policy{Vendor: "stripe", PerRequestCap: MustDecimal(t, "5.001"), ExpiresAt: MustTime(t, "2026-10-01T00:00:00Z")}
	capMinor, has := p.PerRequestCapMinor()
	assert.True(t, has)
	assert.Zero(t, capMinor)
	assert.False(t, Decide(p, nil, Request{Operation: "charges.create", Amount: 1, Currency: "usd"}, now).Allowed)
	assert.True(t, Decide(p, nil, Request{Operation: "charges.create", Amount: 0, Currency: "usd"}, now).Allowed)
}

func TestAllowsOperation(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		ops   []string
		op    string
		allow bool
	}{
		"default: read":                      {nil, "customers.read", true},
		"default: nested read":               {nil, "checkout.sessions.read", true},
		"default: charge":                    {nil, "charges.create", true},
		"default: capture":                   {nil, "charges.capture", true},
		"default: pi create":                 {nil, "payment_intents.create", true},
		"default: pi update":                 {nil, "payment_intents.update", true},
		"default: pi confirm":                {nil, "payment_intents.confirm", true},
		"default: pi capture":                {nil, "payment_intents.capture", true},
		"default: pi increment":              {nil, "payment_intents.increment_authorization", true},
		"default: invoice item":              {nil, "invoiceitems.create", true},
		"default: checkout session":          {nil, "checkout.sessions.create", true},
		"default: refund must be named":      {nil, "refunds.create", false},
		"default: transfer must be named":    {nil, "transfers.create", false},
		"default: payout must be named":      {nil, "payouts.create", false},
		"default: subscription":              {nil, "subscriptions.create", false},
		"default: customer write":            {nil, "customers.create", false},
		"default: unknown write":             {nil, "unknown.write", false},
		"default: unknown read":              {nil, "unknown.read", true},
		"empty list is the default":          {[]string{}, "charges.create", true},
		"exact":                              {[]string{"refunds.create"}, "refunds.create", true},
		"exact only":                         {[]string{"refunds.create"}, "charges.create", false},
		"star alone":                         {[]string{"*"}, "transfers.create", true},
		"star verb":                          {[]string{"charges.*"}, "charges.capture", true},
		"star verb other resource":           {[]string{"charges.*"}, "refunds.create", false},
		"star verb needs the whole resource": {[]string{"checkout.*"}, "checkout.sessions.create", false},
		"nested star verb":                   {[]string{"checkout.sessions.*"}, "checkout.sessions.expire", true},
		"star resource":                      {[]string{"*.read"}, "checkout.sessions.read", true},
		"star resource other verb":           {[]string{"*.read"}, "charges.create", false},
		"star star":                          {[]string{"*.*"}, "payouts.create", true},
		"no prefix matching":                 {[]string{"charges.create"}, "charges.create_extra", false},
		"case matters":                       {[]string{"charges.create"}, "Charges.create", false},
		"empty operation":                    {[]string{"*"}, "", false},
		"operation without verb":             {[]string{"*.read"}, "read", false},
		"one of several":                     {[]string{"refunds.create", "payouts.create"}, "payouts.create", true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &Policy{Operations: tc.ops}
			assert.Equal(t, tc.allow, p.AllowsOperation(tc.op))
		})
	}
}

func TestAllowsCustomerAndAccount(t *testing.T) {
	t.Parallel()
	open := &Policy{}
	assert.True(t, open.AllowsCustomer("cus_1"))
	assert.True(t, open.AllowsCustomer(""))
	assert.True(t, open.AllowsAccount(""))
	assert.False(t, open.AllowsAccount("acct_1"), "connected accounts must be listed")

	p := &Policy{Customers: []string{"cus_1", "cus_2"}, StripeAccounts: []string{"acct_1"}}
	assert.True(t, p.AllowsCustomer("cus_2"))
	assert.False(t, p.AllowsCustomer("cus_3"))
	assert.False(t, p.AllowsCustomer(""), "a customer list requires a customer")
	assert.False(t, p.AllowsCustomer("CUS_1"))
	assert.True(t, p.AllowsAccount("acct_1"))
	assert.True(t, p.AllowsAccount(""))
	assert.False(t, p.AllowsAccount("acct_2"))
}

func BenchmarkDecide(b *testing.B) {
	for _, zone := range []string{"UTC", "America/New_York"} {
		b.Run(zone, func(b *testing.B) {
			p := MustPolicy(b, `{"vendor":"stripe","daily_cap":"99","period_cap":"110","per_request_cap":"50","expires_at":"2026-10-01T00:00:00Z","timezone":"`+zone+`"}`, mintTime)
			now := MustTime(b, "2026-09-14T10:00:00Z")
			usage := Usage{"day:2026-09-14": {Committed: 100}, "period": {Committed: 200, Held: 50}}
			req := Request{Operation: "charges.create", Amount: 1000, Currency: "usd"}
			b.ReportAllocs()
			for b.Loop() {
				if !Decide(p, usage, req, now).Allowed {
					b.Fatal("refused")
				}
			}
		})
	}
}

func TestDefaultOperations(t *testing.T) {
	t.Parallel()
	assert.Equal(t, []string{
		"*.read", "charges.create", "charges.capture", "payment_intents.create", "payment_intents.update",
		"payment_intents.confirm", "payment_intents.capture", "payment_intents.increment_authorization",
		"invoiceitems.create", "checkout.sessions.create",
	}, DefaultOperations)
	for _, op := range DefaultOperations {
		assert.Empty(t, checkGlob(op), op)
	}

	// The exported list is a copy: scribbling on it changes nothing.
	saved := slices.Clone(DefaultOperations)
	t.Cleanup(func() { copy(DefaultOperations, saved) })
	DefaultOperations[1] = "refunds.create"
	p := &Policy{}
	assert.True(t, p.AllowsOperation("charges.create"))
	assert.False(t, p.AllowsOperation("refunds.create"))
}
