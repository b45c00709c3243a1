package stripeapi_test

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// parseBody reads a body the way the pipeline does: JSON on /v2, a form on /v1.
func parseBody(path string, body []byte) (*stripeapi.Params, error) {
	if strings.HasPrefix(path, "/v2/") {
		return stripeapi.ParseJSON(body)
	}
	return stripeapi.ParseForm(body)
}

// classifyRaw parses and classifies one request.
func classifyRaw(method, path string, body []byte) (stripeapi.Classification, error) {
	p, err := parseBody(path, body)
	if err != nil {
		return stripeapi.Classification{}, err
	}
	return stripeapi.Classify(method, path, p)
}

// wantOf turns a Classification into the case file's shape for comparison.
func wantOf(c stripeapi.Classification) proxytest.CatalogueWant {
	w := proxytest.CatalogueWant{
		Operation:   c.Operation,
		Known:       c.Known,
		MovesMoney:  c.MovesMoney,
		Direction:   string(c.Direction),
		Amount:      c.Amount,
		Currency:    c.Currency,
		AmountKnown: c.AmountKnown,
		NewTotal:    c.NewTotal,
		Customer:    c.Customer,
		ObjectID:    c.ObjectID,
		Target:      c.Target,
		Creates:     c.Creates,
		MinVersion:  c.MinVersion,
	}
	if c.Lookup != nil {
		w.Lookup = &proxytest.CaseLookup{Path: c.Lookup.Path, Field: c.Lookup.Field, Factors: c.Lookup.Factors, Signed: c.Lookup.Signed}
	}
	for _, p := range c.Prices {
		w.Prices = append(w.Prices, proxytest.CasePrice{ID: p.ID, Quantity: p.Quantity, OneTime: p.OneTime})
	}
	return w
}

func TestClassifyCatalogueCases(t *testing.T) {
	t.Parallel()
	cases := proxytest.CatalogueCases(t)
	require.GreaterOrEqual(t, len(cases), 60)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			got, err := classifyRaw(c.Method, c.Path, []byte(c.Body))
			if c.Want.Error == "malformed" {
				require.Error(t, err)
				assert.ErrorIs(t, err, stripeapi.ErrMalformed)
				return
			}
			require.Empty(t, c.Want.Error, "unknown want.error")
			require.NoError(t, err)
			assert.Equal(t, c.Want, wantOf(got))
		})
	}
}

// TestClassificationInvariants checks the documented shape of every classification
// in the case file, so a new case cannot encode a contradiction.
func TestClassificationInvariants(t *testing.T) {
	t.Parallel()
	for _, c := range proxytest.CatalogueCases(t) {
		got, err := classifyRaw(c.Method, c.Path, []byte(c.Body))
		if err != nil {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			if !got.MovesMoney {
				assert.Empty(t, got.Direction)
				assert.Zero(t, got.Amount)
				assert.False(t, got.AmountKnown)
				assert.Nil(t, got.Lookup)
				return
			}
			assert.NotEmpty(t, got.Direction)
			assert.True(t, got.Known)
			assert.GreaterOrEqual(t, got.Amount, int64(0))
			if got.NewTotal {
				assert.True(t, got.AmountKnown)
				assert.NotNil(t, got.Lookup)
			}
			if got.AmountKnown && got.Lookup == nil && got.Prices == nil {
				assert.NotEmpty(t, got.Currency, "an exact amount needs a currency")
			}
			if got.Prices != nil {
				assert.True(t, got.AmountKnown, "stored prices add to a stated amount")
			}
			if !got.AmountKnown {
				assert.Zero(t, got.Amount)
			}
			if got.Lookup != nil {
				assert.True(t, strings.HasPrefix(got.Lookup.Path, "/v1/"))
				assert.NotEmpty(t, got.Lookup.Field)
			}
		})
	}
}

func TestEveryOperationHasACase(t *testing.T) {
	t.Parallel()
	covered := map[string]bool{}
	for _, c := range proxytest.CatalogueCases(t) {
		if c.Want.Error == "" {
			covered[c.Want.Operation] = true
		}
	}
	for _, rt := range stripeapi.Routes() {
		if !rt.MovesMoney {
			continue
		}
		op := rt.Operation
		assert.True(t, covered[op], "money-moving operation %s has no case", op)
	}
	assert.True(t, covered["charges.read"] && covered["customers.delete"] && covered["unknown.write"])
}

// TestNamedWrites classifies every POST route of the catalogue with an empty body:
// each is known, and the money-moving ones never claim an exact amount they do
// not have.
func TestNamedWrites(t *testing.T) {
	t.Parallel()
	for _, rt := range stripeapi.Routes() {
		if rt.Method != "POST" {
			continue
		}
		path := strings.ReplaceAll(rt.Path, "{id}", "obj_123")
		t.Run(rt.Method+" "+rt.Path, func(t *testing.T) {
			got, err := stripeapi.Classify(rt.Method, path, MustParseForm(t, ""))
			require.NoError(t, err)
			assert.Equal(t, rt.Operation, got.Operation)
			assert.True(t, got.Known)
			if got.MovesMoney {
				assert.False(t, got.AmountKnown, "an empty body cannot say an amount")
			}
		})
	}
}

func TestClassifyMalformedCorpus(t *testing.T) {
	t.Parallel()
	cases := proxytest.MalformedCases(t)
	require.NotEmpty(t, cases)
	units := 0
	for _, c := range cases {
		if c.Unit == "" {
			continue
		}
		units++
		t.Run(c.Name, func(t *testing.T) {
			body, err := c.RawBody()
			require.NoError(t, err)
			path, _, _ := strings.Cut(c.Path, "?")
			got, err := classifyRaw(c.Method, path, body)
			switch c.Unit {
			case "malformed":
				require.Error(t, err, "classified as %+v", got)
				assert.ErrorIs(t, err, stripeapi.ErrMalformed)
				assert.Equal(t, "request_malformed", c.WantCode)
			case "amount_unknown":
				require.NoError(t, err)
				assert.True(t, got.MovesMoney)
				assert.False(t, got.AmountKnown)
				assert.Nil(t, got.Lookup)
				assert.Equal(t, "amount_unknown", c.WantCode)
			case "unknown_write":
				require.NoError(t, err)
				assert.Equal(t, "unknown.write", got.Operation)
				assert.False(t, got.Known)
			default:
				t.Fatalf("unknown unit %q", c.Unit)
			}
		})
	}
	assert.Greater(t, units, 50)
}

func TestClassifyPaths(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		method, path string
		wantOp       string // "" means malformed
	}{
		"charges create":              {"POST", "/v1/charges", "charges.create"},
		"id with upper case":          {"GET", "/v1/payment_intents/pi_3NxAbCdEf", "payment_intents.read"},
		"id with dash and dot":        {"GET", "/v1/products/gold-plan.v2", "products.read"},
		"literal wins over id":        {"POST", "/v1/invoices/create_preview", "invoices.create_preview"},
		"id that looks like a verb":   {"POST", "/v1/invoices/in_1", "invoices.update"},
		"namespaced read":             {"GET", "/v1/checkout/sessions", "checkout.sessions.read"},
		"unknown namespace member":    {"GET", "/v1/checkout/nothing", "unknown.read"},
		"unknown resource":            {"GET", "/v1/nothing", "unknown.read"},
		"unknown POST shape":          {"POST", "/v1/charges/ch_1/capture/extra", "unknown.write"},
		"head is not a read":          {"HEAD", "/v1/charges", "unknown.write"},
		"lower-case method":           {"get", "/v1/charges", "unknown.write"},
		"v2 read":                     {"GET", "/v2/core/accounts/acct_1/persons", "v2.core.accounts.persons.read"},
		"v2 root":                     {"GET", "/v2/123", "unknown.read"},
		"v2 upper-case resource":      {"GET", "/v2/Core/events", ""},
		"v2 delete":                   {"DELETE", "/v2/core/accounts/acct_1", "unknown.write"},
		"dot-dot":                     {"POST", "/v1/charges/../payouts", ""},
		"dot":                         {"GET", "/v1/./charges", ""},
		"triple dot":                  {"GET", "/v1/charges/...", ""},
		"double slash":                {"POST", "/v1//charges", ""},
		"trailing slash":              {"POST", "/v1/charges/", ""},
		"root":                        {"GET", "/", ""},
		"version only":                {"GET", "/v1", ""},
		"version and slash":           {"GET", "/v1/", ""},
		"no version":                  {"POST", "/charges", ""},
		"v3":                          {"POST", "/v3/charges", ""},
		"upper-case version":          {"POST", "/V1/charges", ""},
		"upper-case resource":         {"POST", "/v1/Charges", ""},
		"upper-case unknown resource": {"GET", "/v1/Nothing", ""},
		"upper-case verb":             {"POST", "/v1/charges/ch_1/Capture", ""},
		"upper-case namespace member": {"POST", "/v1/checkout/Sessions", ""},
		"percent-encoded slash":       {"POST", "/v1/charges%2Fch_1", ""},
		"percent-encoded letter":      {"POST", "/v1/%63harges", ""},
		"percent-encoded dot-dot":     {"POST", "/v1/charges/%2e%2e/payouts", ""},
		"semicolon":                   {"POST", "/v1/charges;x=1", ""},
		"query":                       {"POST", "/v1/charges?amount=1", ""},
		"fragment":                    {"GET", "/v1/charges#x", ""},
		"backslash":                   {"POST", "/v1/charges\\..\\payouts", ""},
		"space":                       {"GET", "/v1/charges/ch 1", ""},
		"plus":                        {"GET", "/v1/charges/ch+1", ""},
		"colon":                       {"GET", "/v1/charges/ch:1", ""},
		"non-ASCII":                   {"GET", "/v1/charges/ch_é", ""},
		"empty":                       {"GET", "", ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := stripeapi.Classify(tc.method, tc.path, nil)
			if tc.wantOp == "" {
				require.Error(t, err, "classified as %+v", got)
				assert.ErrorIs(t, err, stripeapi.ErrMalformed)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantOp, got.Operation)
		})
	}
}

func TestMoneyFields(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		amount string
		want   int64 // -1: malformed
	}{
		"zero":           {"0", 0},
		"one":            {"1", 1},
		"twelve digits":  {"999999999999", 999999999999},
		"thirteen":       {"1000000000000", -1},
		"twenty":         {"10000000000000000000", -1},
		"leading zero":   {"0100", -1},
		"double zero":    {"00", -1},
		"plus sign":      {"%2B100", -1},
		"minus sign":     {"-5", -1},
		"exponent":       {"1e5", -1},
		"decimal":        {"1.0", -1},
		"empty":          {"", -1},
		"space":          {"+100", -1},
		"hex":            {"0x10", -1},
		"underscore":     {"1_000", -1},
		"full-width one": {"%EF%BC%91", -1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for _, op := range []struct{ method, path, body string }{
				{"POST", "/v1/charges", "currency=usd&amount=" + tc.amount},
				{"POST", "/v1/payment_intents/pi_1/capture", "amount_to_capture=" + tc.amount},
				{"POST", "/v1/refunds", "charge=ch_1&amount=" + tc.amount},
				{"POST", "/v1/invoiceitems", "currency=usd&price_data[currency]=usd&price_data[product]=p&price_data[unit_amount]=1&quantity=" + tc.amount},
				{"POST", "/v1/checkout/sessions", "line_items[0][price_data][currency]=usd&line_items[0][price_data][unit_amount]=" + tc.amount},
			} {
				got, err := classifyRaw(op.method, op.path, []byte(op.body))
				if tc.want < 0 {
					require.Error(t, err, "%s %s: classified as %+v", op.path, op.body, got)
					assert.ErrorIs(t, err, stripeapi.ErrMalformed)
					continue
				}
				require.NoError(t, err, op.body)
				assert.True(t, got.AmountKnown, op.body)
				assert.Equal(t, tc.want, got.Amount, op.body)
			}
		})
	}
}

func TestCurrencies(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		currency string
		ok       bool
	}{
		"usd":         {"usd", true},
		"jpy":         {"jpy", true},
		"kwd":         {"kwd", true},
		"isk":         {"isk", true},
		"upper":       {"USD", false},
		"mixed":       {"uSd", false},
		"two":         {"us", false},
		"four":        {"usdd", false},
		"digits":      {"us1", false},
		"empty":       {"", false},
		"space":       {"us+", false},
		"non-ASCII":   {"%C3%BCsd", false},
		"dotless i":   {"%C4%B1sk", false},
		"array":       {"", false},
		"unsupported": {"xyz", true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			body := "amount=100&currency=" + tc.currency
			if name == "array" {
				body = "amount=100&currency[]=usd"
			}
			got, err := classifyRaw("POST", "/v1/charges", []byte(body))
			if !tc.ok {
				require.Error(t, err)
				assert.ErrorIs(t, err, stripeapi.ErrMalformed)
				// Also where the currency does not decide the amount.
				_, err = classifyRaw("POST", "/v1/customers/cus_1/balance_transactions", []byte(body))
				assert.ErrorIs(t, err, stripeapi.ErrMalformed)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.currency, got.Currency)
		})
	}
}

func TestCheckoutSums(t *testing.T) {
	t.Parallel()
	item := func(i int, unit, qty string) string {
		s := "&line_items[" + strconv.Itoa(i) + "][price_data][currency]=usd&line_items[" + strconv.Itoa(i) + "][price_data][product_data][name]=x&line_items[" + strconv.Itoa(i) + "][price_data][unit_amount]=" + unit
		if qty != "" {
			s += "&line_items[" + strconv.Itoa(i) + "][quantity]=" + qty
		}
		return s
	}
	tests := map[string]struct {
		body  string
		want  int64
		known bool
	}{
		"one item default quantity": {"mode=payment" + item(0, "1500", ""), 1500, true},
		"two items":                 {"mode=payment" + item(0, "1500", "2") + item(1, "250", "4"), 4000, true},
		"index order irrelevant":    {"mode=payment" + item(1, "250", "4") + item(0, "1500", "2"), 4000, true},
		"eleven items":              {"mode=payment" + item(0, "1", "1") + item(1, "1", "1") + item(2, "1", "1") + item(3, "1", "1") + item(4, "1", "1") + item(5, "1", "1") + item(6, "1", "1") + item(7, "1", "1") + item(8, "1", "1") + item(9, "1", "1") + item(10, "1", "1"), 11, true},
		"integral decimal":          {"mode=payment&line_items[0][price_data][currency]=usd&line_items[0][price_data][unit_amount_decimal]=100.00&line_items[0][quantity]=3", 300, true},
		"fractional decimal":        {"mode=payment&line_items[0][price_data][currency]=usd&line_items[0][price_data][unit_amount_decimal]=100.5&line_items[0][quantity]=3", 0, false},
		"unit and decimal both":     {"mode=payment" + item(0, "100", "1") + "&line_items[0][price_data][unit_amount_decimal]=100", 0, false},
		"tax rates":                 {"mode=payment" + item(0, "100", "1") + "&line_items[0][tax_rates][0]=txr_1", 0, false},
		"dynamic tax rates":         {"mode=payment" + item(0, "100", "1") + "&line_items[0][dynamic_tax_rates][0]=txr_1", 0, false},
		"optional items":            {"mode=payment" + item(0, "100", "1") + "&optional_items[0][price]=price_1&optional_items[0][quantity]=1", 0, false},
		"stored shipping rate":      {"mode=payment" + item(0, "100", "1") + "&shipping_options[0][shipping_rate]=shr_1", 0, false},
		"no line items":             {"mode=payment", 0, false},
		"unknown mode":              {"mode=donation" + item(0, "100", "1"), 0, false},
		"setup mode with items":     {"mode=setup" + item(0, "100", "1"), 0, false},
		"adjustable disabled":       {"mode=payment" + item(0, "100", "2") + "&line_items[0][adjustable_quantity][enabled]=false", 200, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := classifyRaw("POST", "/v1/checkout/sessions", []byte(tc.body))
			require.NoError(t, err)
			assert.True(t, got.MovesMoney)
			assert.Equal(t, tc.known, got.AmountKnown)
			assert.Equal(t, tc.want, got.Amount)
			assert.Nil(t, got.Lookup)
		})
	}

	refused := map[string]string{
		"line items not indexed": "mode=payment&line_items[a][price]=p",
		"line items as array":    "mode=payment&line_items[]=p",
		"line items scalar":      "mode=payment&line_items=p",
		"overflowing sum":        "mode=payment" + item(0, "999999999999", "999999") + item(1, "999999999999", "999999") + item(2, "999999999999", "999999") + item(3, "999999999999", "999999") + item(4, "999999999999", "999999") + item(5, "999999999999", "999999") + item(6, "999999999999", "999999") + item(7, "999999999999", "999999") + item(8, "999999999999", "999999") + item(9, "999999999999", "999999"),
		"shipping currency":      "mode=payment" + item(0, "100", "1") + "&shipping_options[0][shipping_rate_data][fixed_amount][amount]=5&shipping_options[0][shipping_rate_data][fixed_amount][currency]=eur",
		"top-level currency":     "currency=eur&mode=payment" + item(0, "100", "1"),
		"mode array":             "mode[]=payment" + item(0, "100", "1"),
	}
	for name, body := range refused {
		t.Run(name, func(t *testing.T) {
			_, err := classifyRaw("POST", "/v1/checkout/sessions", []byte(body))
			assert.ErrorIs(t, err, stripeapi.ErrMalformed)
		})
	}
}

var moneyText = regexp.MustCompile(`^(0|[1-9][0-9]{0,11})$`)

// FuzzClassify checks that parsing and classifying never panic, that refusals wrap
// ErrMalformed, and that an accepted amount is exactly the integer its text says.
func FuzzClassify(f *testing.F) {
	methods := []string{"GET", "POST", "DELETE", "PUT"}
	for _, c := range proxytest.CatalogueCases(f) {
		f.Add(uint8(indexOf(methods, c.Method)), c.Path, []byte(c.Body))
	}
	for _, c := range proxytest.MalformedCases(f) {
		if b, err := c.RawBody(); err == nil && len(b) < 4096 {
			f.Add(uint8(indexOf(methods, c.Method)), c.Path, b)
		}
	}
	simple := map[string]string{
		"charges.create": "amount", "payment_intents.create": "amount", "transfers.create": "amount",
		"payouts.create": "amount", "topups.create": "amount",
		"payment_intents.increment_authorization": "amount", "payment_intents.update": "amount",
	}
	f.Fuzz(func(t *testing.T, m uint8, path string, body []byte) {
		method := methods[int(m)%len(methods)]
		c, err := classifyRaw(method, path, body)
		if err != nil {
			if !errors.Is(err, stripeapi.ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		if c.Operation == "" {
			t.Fatalf("no operation")
		}
		if c.Amount < 0 || (!c.AmountKnown && c.Amount != 0) {
			t.Fatalf("bad amount %+v", c)
		}
		if c.Currency != "" && !regexp.MustCompile(`^[a-z]{3}$`).MatchString(c.Currency) {
			t.Fatalf("bad currency %q", c.Currency)
		}
		p, _ := parseBody(path, body)
		if field, ok := simple[c.Operation]; ok && c.AmountKnown {
			text, _ := p.Get(field)
			if !moneyText.MatchString(text) {
				t.Fatalf("amount %q accepted", text)
			}
			if n, _ := strconv.ParseInt(text, 10, 64); n != c.Amount {
				t.Fatalf("amount text %q classified as %d", text, c.Amount)
			}
		}
		if cur, ok := p.Get("currency"); ok && !regexp.MustCompile(`^[a-z]{3}$`).MatchString(cur) {
			t.Fatalf("currency %q accepted", cur)
		}
	})
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return 0
}

func BenchmarkClassify(b *testing.B) {
	for _, bc := range []struct{ name, method, path, body string }{
		{"charge create", "POST", "/v1/charges", "amount=2000&currency=usd&customer=cus_123"},
		{"capture", "POST", "/v1/payment_intents/pi_3NxAbC/capture", "amount_to_capture=700"},
		{"checkout", "POST", "/v1/checkout/sessions", checkoutBody},
		{"read", "GET", "/v1/customers/cus_123", ""},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := MustParseForm(b, bc.body)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := stripeapi.Classify(bc.method, bc.path, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestVersionAtLeast(t *testing.T) {
	t.Parallel()
	for version, want := range map[string]bool{
		"2022-08-01":        true,
		"2026-08-26.dahlia": true,
		"2024-06-20":        true,
		"2022-07-31":        false,
		"2020-08-27":        false,
		"":                  false, // the account's default: unknown
		"2022-8-1":          false,
		"latest":            false,
		"9999-99-99x":       true,
		"2023-01-0a":        false,
		"2023/01/01":        false,
	} {
		assert.Equal(t, want, stripeapi.VersionAtLeast(version, "2022-08-01"), "%q", version)
	}
}
