package policy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const fixtures = "../testdata/policies"

var mintTime = time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)

func TestLegacyJSONVerbatim(t *testing.T) {
	t.Parallel()
	const legacy = `{"vendor":"stripe","daily_usd_cap":99,"period_usd_cap":110,"expires_at":"2026-10-01T00:00:00Z"}`
	var p Policy
	require.NoError(t, json.Unmarshal([]byte(legacy), &p))
	assert.Equal(t, "stripe", p.Vendor)
	assert.Equal(t, "usd", p.Currency, "legacy *_usd_cap fields imply usd")
	require.NotNil(t, p.DailyCap)
	require.NotNil(t, p.PeriodCap)
	assert.Nil(t, p.PerRequestCap)
	assert.Equal(t, "99", p.DailyCap.String())
	assert.Equal(t, "110", p.PeriodCap.String())
	assert.True(t, p.ExpiresAt.Equal(MustTime(t, "2026-10-01T00:00:00Z")))
	assert.True(t, p.PeriodStart.IsZero(), "period_start defaults at Normalize, not at decode")

	out, err := json.Marshal(p)
	require.NoError(t, err)
	assert.JSONEq(t, `{"vendor":"stripe","currency":"usd","daily_cap":"99.00","period_cap":"110.00","expires_at":"2026-10-01T00:00:00Z"}`, string(out))
	assert.Equal(t, `{"vendor":"stripe","currency":"usd","daily_cap":"99.00","period_cap":"110.00","expires_at":"2026-10-01T00:00:00Z"}`, string(out), "canonical key order")

	p.Normalize(mintTime)
	require.NoError(t, p.ValidateNew(mintTime))
	assert.Equal(t, "UTC", p.Timezone)
	assert.Equal(t, ModeEnforce, p.Mode)
	assert.Equal(t, IdempotencyRequire, p.Idempotency.Mode)
	assert.True(t, p.PeriodStart.Equal(mintTime))

	t.Run("per_request_usd_cap", func(t *testing.T) {
		var p Policy
		require.NoError(t, json.Unmarshal([]byte(`{"vendor":"stripe","per_request_usd_cap":"12.5","currency":"usd","expires_at":"2026-10-01T00:00:00Z"}`), &p))
		require.NotNil(t, p.PerRequestCap)
		assert.Equal(t, "12.5", p.PerRequestCap.String())
	})
	t.Run("legacy with null is absent", func(t *testing.T) {
		var p Policy
		require.NoError(t, json.Unmarshal([]byte(`{"vendor":"stripe","daily_usd_cap":null,"currency":"eur","daily_cap":"5"}`), &p))
		assert.Equal(t, "eur", p.Currency)
		assert.Equal(t, "5", p.DailyCap.String())
	})
}

// TestNumbersAndStrings: a cap given as a JSON number and as a decimal string decode
// to the same value, exactly, with no float64 on the way.
func TestNumbersAndStrings(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		number, str string
		currency    string
		canonical   string
	}{
		"integer":              {`99`, `"99"`, "usd", `"99.00"`},
		"one decimal":          {`99.5`, `"99.5"`, "usd", `"99.50"`},
		"two decimals":         {`0.10`, `"0.10"`, "usd", `"0.10"`},
		"float trap 0.1+0.2":   {`0.30`, `"0.3"`, "usd", `"0.30"`},
		"beyond float53":       {`9007199254740993`, `"9007199254740993"`, "jpy", `"9007199254740993"`},
		"beyond float53 cents": {`90071992547409.93`, `"90071992547409.93"`, "usd", `"90071992547409.93"`},
		"kwd":                  {`1.25`, `"1.250"`, "kwd", `"1.250"`},
		"jpy":                  {`500`, `"500"`, "jpy", `"500"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var a, b Policy
			require.NoError(t, json.Unmarshal([]byte(`{"currency":"`+tc.currency+`","daily_cap":`+tc.number+`}`), &a))
			require.NoError(t, json.Unmarshal([]byte(`{"currency":"`+tc.currency+`","daily_cap":`+tc.str+`}`), &b))
			require.NotNil(t, a.DailyCap)
			require.NotNil(t, b.DailyCap)
			assert.True(t, a.DailyCap.Equal(*b.DailyCap), "%s vs %s", a.DailyCap, b.DailyCap)
			ma, err := json.Marshal(a)
			require.NoError(t, err)
			mb, err := json.Marshal(b)
			require.NoError(t, err)
			assert.Equal(t, string(ma), string(mb))
			assert.Contains(t, string(ma), `"daily_cap":`+tc.canonical)
		})
	}
}

func TestMalformedAmounts(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"letters":        `"abc"`,
		"exponent":       `1e5`,
		"exponent str":   `"1e5"`,
		"upper exponent": `1E2`,
		"plus":           `"+5"`,
		"bool":           `true`,
		"object":         `{"amount":5}`,
		"array":          `[5]`,
		"empty string":   `""`,
		"spaces":         `" 5 "`,
		"comma":          `"5,00"`,
	}
	for name, lit := range tests {
		for _, field := range []string{"daily_cap", "period_cap", "per_request_cap", "daily_usd_cap", "per_request_usd_cap"} {
			t.Run(name+"/"+field, func(t *testing.T) {
				var p Policy
				err := json.Unmarshal([]byte(`{"vendor":"stripe","`+field+`":`+lit+`}`), &p)
				require.Error(t, err)
				assert.Equal(t, []string{field}, fieldsOf(t, err))
				assert.Contains(t, err.Error(), field+": ")
			})
		}
	}
}

func TestUnmarshalStrictness(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		in     string
		fields []string
	}{
		"unknown field":          {`{"vendor":"stripe","daly_cap":"5"}`, []string{"daly_cap"}},
		"case variant":           {`{"VENDOR":"stripe"}`, []string{"VENDOR"}},
		"legacy case variant":    {`{"Daily_USD_Cap":5}`, []string{"Daily_USD_Cap"}},
		"nested unknown":         {`{"idempotency":{"mode":"require","feilds":[]}}`, []string{"idempotency.feilds"}},
		"nested case variant":    {`{"idempotency":{"Mode":"derive"}}`, []string{"idempotency.Mode"}},
		"duplicate":              {`{"daily_cap":"5","daily_cap":"500"}`, []string{"daily_cap"}},
		"nested duplicate":       {`{"idempotency":{"mode":"require","mode":"derive"}}`, []string{"idempotency.mode"}},
		"wrong type vendor":      {`{"vendor":5}`, []string{"vendor"}},
		"wrong type operations":  {`{"operations":"charges.create"}`, []string{"operations"}},
		"wrong type customers":   {`{"customers":[1,2]}`, []string{"customers"}},
		"wrong type idempotency": {`{"idempotency":"require"}`, []string{"idempotency"}},
		"wrong type idem fields": {`{"idempotency":{"mode":"derive","fields":"customer"}}`, []string{"idempotency.fields"}},
		"bad time":               {`{"expires_at":"2026-10-01"}`, []string{"expires_at"}},
		"empty time":             {`{"period_start":""}`, []string{"period_start"}},
		"numeric time":           {`{"expires_at":1790000000}`, []string{"expires_at"}},
		"several at once": {
			`{"vendor":1,"daly_cap":"5","daily_cap":"x","expires_at":"soon","mode":true}`,
			[]string{"daly_cap", "vendor", "mode", "expires_at", "daily_cap"},
		},
		"not an object": {`["vendor"]`, []string{""}},
		"string":        {`"stripe"`, []string{""}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := Policy{Vendor: "untouched"}
			err := json.Unmarshal([]byte(tc.in), &p)
			require.Error(t, err)
			assert.ElementsMatch(t, tc.fields, fieldsOf(t, err))
			assert.Equal(t, "untouched", p.Vendor, "a failed decode leaves the policy unchanged")
		})
	}
	t.Run("null is a no-op", func(t *testing.T) {
		p := Policy{Vendor: "stripe"}
		require.NoError(t, json.Unmarshal([]byte(`null`), &p))
		assert.Equal(t, "stripe", p.Vendor)
	})
	t.Run("case hint", func(t *testing.T) {
		var p Policy
		err := json.Unmarshal([]byte(`{"Daily_Cap":"5"}`), &p)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `did you mean "daily_cap"`)
	})
	t.Run("direct call with trailing data", func(t *testing.T) {
		var p Policy
		assert.Error(t, p.UnmarshalJSON([]byte(`{} {}`)))
		assert.Error(t, p.UnmarshalJSON([]byte(`{"vendor":`)))
		assert.Error(t, p.UnmarshalJSON([]byte(``)))
	})
}

// TestEmbeddedByValue: a Policy inside another struct, by value, is still written in
// the canonical form (MarshalJSON has a value receiver).
func TestEmbeddedByValue(t *testing.T) {
	t.Parallel()
	type key struct {
		ID     string `json:"id"`
		Policy Policy `json:"policy"`
	}
	k := key{ID: "k1", Policy: Policy{Vendor: "stripe", Currency: "jpy", DailyCap: MustDecimal(t, "500")}}
	out, err := json.Marshal(k)
	require.NoError(t, err)
	assert.Equal(t, `{"id":"k1","policy":{"vendor":"stripe","currency":"jpy","daily_cap":"500"}}`, string(out))
	var back key
	require.NoError(t, json.Unmarshal(out, &back))
	assert.Equal(t, "500", back.Policy.DailyCap.String())

	out, err = json.Marshal(&k)
	require.NoError(t, err)
	assert.Equal(t, `{"id":"k1","policy":{"vendor":"stripe","currency":"jpy","daily_cap":"500"}}`, string(out))
}

func TestMarshalCanonical(t *testing.T) {
	t.Parallel()
	ny := MustLocation(t, "America/New_York")
	tests := map[string]struct {
		p    Policy
		want string
	}{
		"empty": {Policy{}, `{}`},
		"default currency uses usd decimals": {
			Policy{DailyCap: MustDecimal(t, "5")}, `{"daily_cap":"5.00"}`,
		},
		"kwd three decimals": {
			Policy{Currency: "kwd", PeriodCap: MustDecimal(t, "1.5")}, `{"currency":"kwd","period_cap":"1.500"}`,
		},
		"jpy no decimals": {
			Policy{Currency: "jpy", PerRequestCap: MustDecimal(t, "1000.00")}, `{"currency":"jpy","per_request_cap":"1000"}`,
		},
		"invalid precision is kept, not rounded": {
			Policy{Currency: "usd", DailyCap: MustDecimal(t, "5.001")}, `{"currency":"usd","daily_cap":"5.001"}`,
		},
		"unknown currency keeps digits": {
			Policy{Currency: "zzz", DailyCap: MustDecimal(t, "5.1")}, `{"currency":"zzz","daily_cap":"5.1"}`,
		},
		"time keeps its offset and fraction": {
			Policy{PeriodStart: time.Date(2026, 3, 8, 0, 0, 0, 500, ny)}, `{"period_start":"2026-03-08T00:00:00.0000005-05:00"}`,
		},
		"full": {
			Policy{
				Vendor: "stripe", Currency: "usd", DailyCap: MustDecimal(t, "99"), PeriodCap: MustDecimal(t, "110"),
				PerRequestCap: MustDecimal(t, "99"), PeriodStart: MustTime(t, "2026-09-01T00:00:00Z"),
				ExpiresAt: MustTime(t, "2026-10-01T00:00:00Z"), Timezone: "UTC",
				Operations: []string{"charges.create"}, Customers: []string{"cus_1"}, StripeAccounts: []string{"acct_1"},
				Idempotency: Idempotency{Mode: IdempotencyDerive, Fields: []string{"customer"}}, Mode: ModeReport,
			},
			`{"vendor":"stripe","currency":"usd","daily_cap":"99.00","period_cap":"110.00","per_request_cap":"99.00",` +
				`"period_start":"2026-09-01T00:00:00Z","expires_at":"2026-10-01T00:00:00Z","timezone":"UTC",` +
				`"operations":["charges.create"],"customers":["cus_1"],"stripe_accounts":["acct_1"],` +
				`"idempotency":{"mode":"derive","fields":["customer"]},"mode":"report"}`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := json.Marshal(tc.p)
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(out))
			assertRoundTrip(t, out)
		})
	}
	t.Run("year out of range", func(t *testing.T) {
		_, err := json.Marshal(Policy{ExpiresAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
		assert.Error(t, err)
	})
}

// assertRoundTrip checks that canonical JSON decodes and re-encodes byte for byte.
func assertRoundTrip(tb testing.TB, canonical []byte) {
	tb.Helper()
	var p Policy
	require.NoError(tb, json.Unmarshal(canonical, &p), string(canonical))
	again, err := json.Marshal(p)
	require.NoError(tb, err)
	require.Equal(tb, string(canonical), string(again))
}

func TestFixturesValid(t *testing.T) {
	t.Parallel()
	paths, err := filepath.Glob(filepath.Join(fixtures, "valid", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			var p Policy
			require.NoError(t, json.Unmarshal(MustReadFile(t, path), &p))
			p.Normalize(mintTime)
			require.NoError(t, p.Validate())
			out, err := json.Marshal(p)
			require.NoError(t, err)
			assertRoundTrip(t, out)
			_, err = p.Windows(mintTime)
			require.NoError(t, err)
		})
	}
}

func TestFixturesInvalid(t *testing.T) {
	t.Parallel()
	want := map[string][]string{
		"everything-wrong.json": {
			"vendor", "currency", "daily_cap", "period_cap", "per_request_cap", "expires_at", "timezone",
			"operations[1]", "operations[2]", "operations[3]", "operations[4]", "operations[5]",
			"customers[1]", "customers[2]", "stripe_accounts[1]", "stripe_accounts[2]",
			"idempotency.fields", "mode",
		},
		"unknown-field.json":             {"daly_cap"},
		"wrong-case-field.json":          {"Daily_Cap"},
		"legacy-other-currency.json":     {"daily_usd_cap"},
		"legacy-and-canonical.json":      {"daily_usd_cap"},
		"malformed-amounts.json":         {"daily_cap", "period_cap"},
		"duplicate-field.json":           {"daily_cap"},
		"jpy-decimals.json":              {"daily_cap"},
		"usd-decimals.json":              {"daily_cap", "per_request_cap"},
		"no-cap.json":                    {"daily_cap"},
		"overflow.json":                  {"daily_cap"},
		"bad-time-and-nested-field.json": {"expires_at", "idempotency.feilds"},
	}
	paths, err := filepath.Glob(filepath.Join(fixtures, "invalid", "*.json"))
	require.NoError(t, err)
	require.Len(t, paths, len(want), "every invalid fixture has expectations here")
	for _, path := range paths {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			fields, ok := want[name]
			require.True(t, ok, "no expectation for %s", name)
			var p Policy
			err := json.Unmarshal(MustReadFile(t, path), &p)
			if err == nil {
				p.Normalize(mintTime)
				err = p.Validate()
			}
			require.Error(t, err)
			assert.ElementsMatch(t, fields, fieldsOf(t, err))
		})
	}
}

func TestMergePatch(t *testing.T) {
	t.Parallel()
	base := MustPolicy(t, string(MustReadFile(t, fixtures, "valid", "canonical.json")), mintTime)
	tests := map[string]struct {
		patch string
		check func(t *testing.T, p Policy)
		err   []string // fields of the expected error
	}{
		"raise a cap": {
			patch: `{"daily_cap":"150.00"}`,
			check: func(t *testing.T, p Policy) { assert.Equal(t, "150", p.DailyCap.String()) },
		},
		"cap as number": {
			patch: `{"period_cap":120.5}`,
			check: func(t *testing.T, p Policy) { assert.Equal(t, "120.5", p.PeriodCap.String()) },
		},
		"null removes a cap": {
			patch: `{"per_request_cap":null}`,
			check: func(t *testing.T, p Policy) {
				assert.Nil(t, p.PerRequestCap)
				assert.NotNil(t, p.DailyCap)
			},
		},
		"arrays replace": {
			patch: `{"operations":["refunds.create"]}`,
			check: func(t *testing.T, p Policy) { assert.Equal(t, []string{"refunds.create"}, p.Operations) },
		},
		"objects merge": {
			patch: `{"idempotency":{"fields":["customer"]}}`,
			check: func(t *testing.T, p Policy) {
				assert.Equal(t, IdempotencyRequire, p.Idempotency.Mode, "mode kept")
				assert.Equal(t, []string{"customer"}, p.Idempotency.Fields)
				assert.Error(t, p.Validate(), "fields with require mode: the caller validates")
			},
		},
		"null in nested object deletes": {
			patch: `{"idempotency":{"mode":null}}`,
			check: func(t *testing.T, p Policy) { assert.Equal(t, IdempotencyMode(""), p.Idempotency.Mode) },
		},
		"empty patch keeps everything": {
			patch: `{}`,
			check: func(t *testing.T, p Policy) {
				a, _ := json.Marshal(base)
				b, _ := json.Marshal(p)
				assert.Equal(t, string(a), string(b))
			},
		},
		"legacy key replaces canonical cap": {
			patch: `{"daily_usd_cap":50}`,
			check: func(t *testing.T, p Policy) { assert.Equal(t, "50", p.DailyCap.String()) },
		},
		"legacy null removes canonical cap": {
			patch: `{"daily_usd_cap":null}`,
			check: func(t *testing.T, p Policy) { assert.Nil(t, p.DailyCap) },
		},
		"unknown field":              {patch: `{"daly_cap":"5"}`, err: []string{"daly_cap"}},
		"bad amount":                 {patch: `{"daily_cap":"five"}`, err: []string{"daily_cap"}},
		"legacy with other currency": {patch: `{"currency":"eur","daily_usd_cap":5}`, err: []string{"daily_usd_cap"}},
		"legacy and canonical":       {patch: `{"daily_cap":"5","daily_usd_cap":5}`, err: []string{"daily_usd_cap"}},
		"duplicate key":              {patch: `{"daily_cap":"5","daily_cap":"5000"}`, err: []string{"daily_cap"}},
		"not an object":              {patch: `["daily_cap"]`, err: []string{""}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before, err := json.Marshal(base)
			require.NoError(t, err)
			got, err := base.MergePatch([]byte(tc.patch))
			after, _ := json.Marshal(base)
			assert.Equal(t, string(before), string(after), "MergePatch must not change its receiver")
			if tc.err != nil {
				require.Error(t, err)
				assert.ElementsMatch(t, tc.err, fieldsOf(t, err))
				return
			}
			require.NoError(t, err)
			tc.check(t, got)
		})
	}
	t.Run("malformed json", func(t *testing.T) {
		_, err := base.MergePatch([]byte(`{"daily_cap":`))
		assert.Error(t, err)
	})
	t.Run("vendor removal is caught by validation", func(t *testing.T) {
		got, err := base.MergePatch([]byte(`{"vendor":null,"timezone":null}`))
		require.NoError(t, err)
		assert.Equal(t, []string{"vendor"}, fieldsOf(t, got.Validate()))
		assert.Equal(t, "", got.Timezone)
	})
}

// FuzzPolicyJSON: decoding arbitrary bytes never panics; whatever decodes re-encodes
// to canonical JSON that decodes and re-encodes byte for byte; a merge patch of it
// never panics either.
func FuzzPolicyJSON(f *testing.F) {
	for _, dir := range []string{"valid", "invalid"} {
		paths, err := filepath.Glob(filepath.Join(fixtures, dir, "*.json"))
		if err != nil {
			f.Fatal(err)
		}
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b, []byte(`{"daily_cap":null}`))
		}
	}
	f.Add([]byte(`{"daily_cap":1e400}`), []byte(`{}`))
	f.Add([]byte(`{"daily_cap":-0}`), []byte(`{"daily_usd_cap":1}`))
	f.Add([]byte(`{"period_start":"0000-01-01T00:00:00Z","expires_at":"9999-12-31T23:59:59.999999999+23:59"}`), []byte(`[]`))
	f.Add([]byte(`{"currency":"kwd","daily_cap":"0.0000000000000000000000000000001"}`), []byte(`{"currency":"usd"}`))
	f.Add([]byte(`{"idempotency":{"fields":[null,"a[b]"]}}`), []byte(`{"idempotency":null}`))
	f.Add([]byte(strings.Repeat(`[`, 50)), []byte(`null`))
	f.Fuzz(func(t *testing.T, data, patch []byte) {
		var p Policy
		if err := p.UnmarshalJSON(data); err != nil {
			return
		}
		_ = p.Validate()
		out, err := json.Marshal(p)
		if err != nil {
			// Only a time outside 0000-9999 may refuse to encode, and RFC 3339
			// parsing cannot produce one.
			t.Fatalf("accepted policy does not encode: %v", err)
		}
		assertRoundTrip(t, out)
		if q, err := p.MergePatch(patch); err == nil {
			out, err := json.Marshal(q)
			require.NoError(t, err)
			assertRoundTrip(t, out)
		}
	})
}

func TestRenewalsModeRoundTripsAndIsValidated(t *testing.T) {
	var p Policy
	require.NoError(t, json.Unmarshal([]byte(`{"vendor":"stripe","daily_cap":"10.00","expires_at":"2027-01-01T00:00:00Z","renewals":"count"}`), &p))
	assert.Equal(t, RenewalsCount, p.Renewals)
	out, err := json.Marshal(p)
	require.NoError(t, err)
	assert.Contains(t, string(out), `"renewals":"count"`)
	assert.NoError(t, p.Validate())

	var q Policy
	require.NoError(t, json.Unmarshal([]byte(`{"vendor":"stripe","daily_cap":"10.00","expires_at":"2027-01-01T00:00:00Z"}`), &q))
	assert.Equal(t, RenewalsPauseOverCap, q.EffectiveRenewals(), "pause_over_cap is the default")

	q.Renewals = "sometimes"
	var ve *ValidationError
	require.ErrorAs(t, q.Validate(), &ve)
	assert.Equal(t, "renewals", ve.Errors[0].Field)
}
