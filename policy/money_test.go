package policy

import (
	"math"
	"math/big"
	"strconv"
	"strings"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExponent(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		currency string
		exp      int32
		ok       bool
	}{
		"usd":            {"usd", 2, true},
		"eur":            {"eur", 2, true},
		"jpy zero":       {"jpy", 0, true},
		"krw zero":       {"krw", 0, true},
		"xof zero":       {"xof", 0, true},
		"kwd three":      {"kwd", 3, true},
		"bhd three":      {"bhd", 3, true},
		"tnd three":      {"tnd", 3, true},
		"isk two":        {"isk", 2, true},
		"ugx two":        {"ugx", 2, true},
		"huf two":        {"huf", 2, true},
		"twd two":        {"twd", 2, true},
		"upper case":     {"USD", 0, false},
		"too short":      {"us", 0, false},
		"too long":       {"usdd", 0, false},
		"empty":          {"", 0, false},
		"unsupported":    {"xxx", 0, false},
		"retired eek":    {"eek", 0, false},
		"crypto":         {"btc", 0, false},
		"digits":         {"us1", 0, false},
		"leading space":  {" usd", 0, false},
		"trailing space": {"usd ", 0, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			exp, ok := Exponent(tc.currency)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.exp, exp)
		})
	}
}

// TestExponentTable pins Stripe's table exactly as docs/idempotency-and-caps.md
// states it ("Amounts").
func TestExponentTable(t *testing.T) {
	t.Parallel()
	zero := []string{"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "vnd", "vuv", "xaf", "xof", "xpf"}
	three := []string{"bhd", "jod", "kwd", "omr", "tnd"}
	want := map[string]int32{}
	for _, c := range zero {
		want[c] = 0
	}
	for _, c := range three {
		want[c] = 3
	}
	all := SupportedCurrencies()
	require.GreaterOrEqual(t, len(all), 135, "Stripe presents more than 135 currencies")
	for _, c := range all {
		exp, ok := Exponent(c)
		require.True(t, ok, c)
		w, special := want[c]
		if !special {
			w = 2
		}
		assert.Equal(t, w, exp, c)
		assert.True(t, isLowerAlpha3(c), c)
	}
	for c := range want {
		assert.Contains(t, all, c, "exponent table names a currency that is not in the supported list")
	}
	assert.IsNonDecreasing(t, all)
}

func TestFromMinorToMinor(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		currency string
		minor    int64
		major    string
		format   string
	}{
		"usd":          {"usd", 9900, "99", "99.00"},
		"usd cent":     {"usd", 1, "0.01", "0.01"},
		"usd zero":     {"usd", 0, "0", "0.00"},
		"usd negative": {"usd", -150, "-1.5", "-1.50"},
		"jpy":          {"jpy", 500, "500", "500"},
		"kwd":          {"kwd", 5120, "5.12", "5.120"},
		"kwd fils":     {"kwd", 1, "0.001", "0.001"},
		"isk":          {"isk", 500, "5", "5.00"},
		"ugx":          {"ugx", 500, "5", "5.00"},
		"huf":          {"huf", 1045, "10.45", "10.45"},
		"twd":          {"twd", 80045, "800.45", "800.45"},
		"usd max":      {"usd", math.MaxInt64, "92233720368547758.07", "92233720368547758.07"},
		"usd min":      {"usd", math.MinInt64, "-92233720368547758.08", "-92233720368547758.08"},
		"jpy max":      {"jpy", math.MaxInt64, "9223372036854775807", "9223372036854775807"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			major, err := FromMinor(tc.currency, tc.minor)
			require.NoError(t, err)
			assert.True(t, major.Equal(decimal.RequireFromString(tc.major)), "FromMinor = %s", major)
			back, err := ToMinor(tc.currency, major)
			require.NoError(t, err)
			assert.Equal(t, tc.minor, back)
			assert.Equal(t, tc.format, FormatMinor(tc.currency, tc.minor))
			parsed, err := ParseAmount(tc.format)
			require.NoError(t, err)
			back, err = ToMinor(tc.currency, parsed)
			require.NoError(t, err)
			assert.Equal(t, tc.minor, back)
		})
	}
}

func TestToMinorErrors(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		currency string
		major    string
		want     error
	}{
		"usd three decimals":  {"usd", "5.001", ErrPrecision},
		"jpy fraction":        {"jpy", "1.5", ErrPrecision},
		"kwd four decimals":   {"kwd", "1.0001", ErrPrecision},
		"usd over int64":      {"usd", "92233720368547758.08", ErrOverflow},
		"usd under int64":     {"usd", "-92233720368547758.09", ErrOverflow},
		"jpy over int64":      {"jpy", "9223372036854775808", ErrOverflow},
		"huge":                {"usd", "1000000000000000000000000000000000000", ErrOverflow},
		"unknown currency":    {"abc", "1", ErrCurrency},
		"malformed currency":  {"US", "1", ErrCurrency},
		"trailing zeros fine": {"usd", "5.0000", nil},
		"jpy trailing zero":   {"jpy", "5.0", nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ToMinor(tc.currency, decimal.RequireFromString(tc.major))
			if tc.want == nil {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, tc.want)
		})
	}
	t.Run("huge exponent does not allocate its power of ten", func(t *testing.T) {
		_, err := ToMinor("usd", decimal.New(1, math.MaxInt32))
		assert.ErrorIs(t, err, ErrOverflow)
	})
	t.Run("unknown currency from minor", func(t *testing.T) {
		_, err := FromMinor("zzz", 1)
		assert.ErrorIs(t, err, ErrCurrency)
		assert.Equal(t, "12", FormatMinor("zzz", 12))
	})
}

func TestParseAmount(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		"integer":        "99",
		"decimal":        "99.00",
		"negative":       "-1.5",
		"zero":           "0",
		"leading zeros":  "007.50",
		"many decimals":  "0.000000000000000000000001",
		"max length":     "1234567890123456789012345678901234567890123456789012345678901234",
		"negative zero":  "-0",
		"large integer":  "92233720368547758070000",
		"single decimal": "1.5",
	}
	for name, in := range good {
		t.Run("good "+name, func(t *testing.T) {
			d, err := ParseAmount(in)
			require.NoError(t, err)
			assert.True(t, d.Equal(decimal.RequireFromString(in)))
		})
	}
	bad := map[string]string{
		"empty":          "",
		"letters":        "abc",
		"exponent":       "1e5",
		"upper exponent": "1E5",
		"plus":           "+5",
		"leading dot":    ".5",
		"trailing dot":   "5.",
		"space":          " 5",
		"inner space":    "5 .0",
		"comma":          "5,00",
		"two dots":       "1.2.3",
		"minus only":     "-",
		"double minus":   "--5",
		"hex":            "0x10",
		"infinity":       "Infinity",
		"nan":            "NaN",
		"too long":       "12345678901234567890123456789012345678901234567890123456789012345",
		"unicode digit":  "٣",
	}
	for name, in := range bad {
		t.Run("bad "+name, func(t *testing.T) {
			_, err := ParseAmount(in)
			assert.Error(t, err)
		})
	}
}

// FuzzMoney checks, for any currency and integer, that FromMinor and ToMinor are exact
// inverses and FormatMinor parses back to the same integer; and that ParseAmount
// never panics and agrees with ToMinor on what it accepts.
func FuzzMoney(f *testing.F) {
	for _, c := range []string{"usd", "jpy", "kwd", "isk", "ugx", "huf", "twd", "zzz", "USD", ""} {
		for _, m := range []int64{0, 1, -1, 99, 9900, 11000, 5120, math.MaxInt64, math.MinInt64} {
			f.Add(c, m, strconv.FormatInt(m, 10))
		}
	}
	f.Add("usd", int64(1), "5.001")
	f.Add("jpy", int64(1), "1.5")
	f.Add("usd", int64(1), "1e5")
	f.Add("usd", int64(1), "92233720368547758.08")
	f.Fuzz(func(t *testing.T, currency string, minor int64, text string) {
		exp, ok := Exponent(currency)
		major, err := FromMinor(currency, minor)
		if !ok {
			require.ErrorIs(t, err, ErrCurrency)
			_, err = ToMinor(currency, decimal.NewFromInt(minor))
			require.ErrorIs(t, err, ErrCurrency)
			return
		}
		require.NoError(t, err)
		back, err := ToMinor(currency, major)
		require.NoError(t, err)
		require.Equal(t, minor, back)

		s := FormatMinor(currency, minor)
		parsed, err := ParseAmount(s)
		require.NoError(t, err, s)
		back, err = ToMinor(currency, parsed)
		require.NoError(t, err, s)
		require.Equal(t, minor, back, s)

		d, err := ParseAmount(text)
		if err != nil {
			return
		}
		m, err := ToMinor(currency, d)
		// Reference: exact rational arithmetic.
		r := new(big.Rat).Mul(d.Rat(), new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(exp)), nil)))
		switch {
		case !r.IsInt():
			require.ErrorIs(t, err, ErrPrecision, text)
			return
		case !r.Num().IsInt64():
			require.ErrorIs(t, err, ErrOverflow, text)
			return
		}
		require.NoError(t, err, text)
		require.Equal(t, r.Num().Int64(), m, text)
		// Accepted: the integer renders back to the same value, with exactly exp decimals.
		again, err := ParseAmount(FormatMinor(currency, m))
		require.NoError(t, err)
		require.True(t, again.Equal(d), "%s -> %d -> %s", text, m, again)
		formatted := FormatMinor(currency, m)
		if dot := strings.IndexByte(formatted, '.'); dot >= 0 {
			require.Equal(t, int(exp), len(formatted)-dot-1, formatted)
		} else {
			require.Zero(t, exp, formatted)
		}
	})
}
