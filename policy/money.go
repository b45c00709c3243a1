package policy

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"

	"github.com/shopspring/decimal"
)

// Sentinel errors of the money functions. They are wrapped with context; match them
// with errors.Is.
var (
	// ErrCurrency marks a currency code that is malformed (not three lower-case
	// letters) or that Stripe does not support.
	ErrCurrency = errors.New("unsupported currency")
	// ErrPrecision marks an amount with more decimals than its currency has.
	ErrPrecision = errors.New("too many decimals for currency")
	// ErrOverflow marks an amount that does not fit in int64 minor units.
	ErrOverflow = errors.New("amount out of range")
)

// stripeCurrencies is Stripe's list of supported presentment currencies (lower case,
// as the API carries them). It is never written after package initialisation.
//
// Source: docs.stripe.com/currencies ("Supported presentment currencies"), compared
// with the Currency constants of stripe-go v84: codes stripe-go still carries but
// Stripe no longer presents (eek, hrk, ltl, lvl, mro, sll, std, vef) are refused;
// their successors that Stripe lists (eur, sle) are accepted.
var stripeCurrencies = map[string]struct{}{
	"usd": {}, "aed": {}, "afn": {}, "all": {}, "amd": {}, "ang": {}, "aoa": {},
	"ars": {}, "aud": {}, "awg": {}, "azn": {}, "bam": {}, "bbd": {}, "bdt": {},
	"bgn": {}, "bhd": {}, "bif": {}, "bmd": {}, "bnd": {}, "bob": {}, "brl": {},
	"bsd": {}, "bwp": {}, "byn": {}, "bzd": {}, "cad": {}, "cdf": {}, "chf": {},
	"clp": {}, "cny": {}, "cop": {}, "crc": {}, "cve": {}, "czk": {}, "djf": {},
	"dkk": {}, "dop": {}, "dzd": {}, "egp": {}, "etb": {}, "eur": {}, "fjd": {},
	"fkp": {}, "gbp": {}, "gel": {}, "gip": {}, "gmd": {}, "gnf": {}, "gtq": {},
	"gyd": {}, "hkd": {}, "hnl": {}, "htg": {}, "huf": {}, "idr": {}, "ils": {},
	"inr": {}, "isk": {}, "jmd": {}, "jod": {}, "jpy": {}, "kes": {}, "kgs": {},
	"khr": {}, "kmf": {}, "krw": {}, "kwd": {}, "kyd": {}, "kzt": {}, "lak": {},
	"lbp": {}, "lkr": {}, "lrd": {}, "lsl": {}, "mad": {}, "mdl": {}, "mga": {},
	"mkd": {}, "mmk": {}, "mnt": {}, "mop": {}, "mur": {}, "mvr": {}, "mwk": {},
	"mxn": {}, "myr": {}, "mzn": {}, "nad": {}, "ngn": {}, "nio": {}, "nok": {},
	"npr": {}, "nzd": {}, "omr": {}, "pab": {}, "pen": {}, "pgk": {}, "php": {},
	"pkr": {}, "pln": {}, "pyg": {}, "qar": {}, "ron": {}, "rsd": {}, "rub": {},
	"rwf": {}, "sar": {}, "sbd": {}, "scr": {}, "sek": {}, "sgd": {}, "shp": {},
	"sle": {}, "sos": {}, "srd": {}, "szl": {}, "thb": {}, "tjs": {},
	"tnd": {}, "top": {}, "try": {}, "ttd": {}, "twd": {}, "tzs": {}, "uah": {},
	"ugx": {}, "uyu": {}, "uzs": {}, "vnd": {}, "vuv": {}, "wst": {}, "xaf": {},
	"xcd": {}, "xof": {}, "xpf": {}, "yer": {}, "zar": {}, "zmw": {},
}

// SupportedCurrencies returns Stripe's supported presentment currencies, sorted.
// The slice is a fresh copy.
func SupportedCurrencies() []string {
	out := make([]string, 0, len(stripeCurrencies))
	for c := range stripeCurrencies {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// Exponent returns the number of decimals Stripe uses for the currency on the wire
// (Stripe's table, not ISO 4217's: 0 for bif clp djf gnf jpy kmf krw mga pyg rwf vnd
// vuv xaf xof xpf; 3 for bhd jod kwd omr tnd; 2 for every other currency Stripe
// supports, including isk, ugx, huf and twd). ok is false for a currency code that
// is malformed (not three lower-case letters) or that Stripe does not support.
func Exponent(currency string) (exp int32, ok bool) {
	if _, known := stripeCurrencies[currency]; !known {
		return 0, false
	}
	switch currency {
	case "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf",
		"vnd", "vuv", "xaf", "xof", "xpf":
		return 0, true
	case "bhd", "jod", "kwd", "omr", "tnd":
		return 3, true
	default:
		return 2, true
	}
}

// FromMinor converts an amount in minor units (Stripe's wire integer) to the
// currency's major unit, exactly.
func FromMinor(currency string, minor int64) (decimal.Decimal, error) {
	exp, ok := Exponent(currency)
	if !ok {
		return decimal.Decimal{}, fmt.Errorf("from minor units: %q: %w", currency, ErrCurrency)
	}
	return decimal.New(minor, -exp), nil
}

var (
	maxInt64 = big.NewInt(math.MaxInt64)
	minInt64 = big.NewInt(math.MinInt64)
)

// pow10 holds 10^0 .. 10^18, the powers of ten that fit int64.
var pow10 = [19]int64{
	1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9,
	1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18,
}

// ToMinor converts an amount in the currency's major unit to minor units. It fails
// (ErrPrecision) when the amount has more decimals than the currency has, and
// (ErrOverflow) when it does not fit in int64.
func ToMinor(currency string, major decimal.Decimal) (int64, error) {
	exp, ok := Exponent(currency)
	if !ok {
		return 0, fmt.Errorf("to minor units: %q: %w", currency, ErrCurrency)
	}
	return toMinorExp(exp, currency, major)
}

func toMinorExp(exp int32, currency string, major decimal.Decimal) (int64, error) {
	// Fast path, no big.Int: a coefficient of at most 18 digits fits int64.
	if scale := int64(major.Exponent()) + int64(exp); major.NumDigits() <= 18 && scale >= -18 && scale <= 18 {
		c := major.CoefficientInt64()
		if scale < 0 {
			p := pow10[-scale]
			if c%p != 0 {
				return 0, fmt.Errorf("to minor units: %s %s has more than %d decimals: %w",
					exactString(major), currency, exp, ErrPrecision)
			}
			return c / p, nil
		}
		p := pow10[scale]
		if c > math.MaxInt64/p || c < math.MinInt64/p {
			return 0, fmt.Errorf("to minor units: %s %s: %w", exactString(major), currency, ErrOverflow)
		}
		return c * p, nil
	}
	if tooManyDigits(major) { // before Shift, whose exponent arithmetic could wrap
		return 0, fmt.Errorf("to minor units: %s %s: %w", exactString(major), currency, ErrOverflow)
	}
	// Shift only moves the exponent; the coefficient is untouched, so this is exact.
	shifted := major.Shift(exp)
	if !shifted.IsInteger() {
		return 0, fmt.Errorf("to minor units: %s %s has more than %d decimals: %w",
			exactString(major), currency, exp, ErrPrecision)
	}
	// An absurd exponent (a huge power of ten) must not make us allocate a huge
	// integer: anything with more than 19 integer digits overflows int64 anyway.
	if tooManyDigits(shifted) {
		return 0, fmt.Errorf("to minor units: %s %s: %w", exactString(major), currency, ErrOverflow)
	}
	bi := shifted.BigInt()
	if bi.Cmp(maxInt64) > 0 || bi.Cmp(minInt64) < 0 {
		return 0, fmt.Errorf("to minor units: %s %s: %w", exactString(major), currency, ErrOverflow)
	}
	return bi.Int64(), nil
}

// FormatMinor renders minor units as a decimal string in the major unit with exactly
// the currency's number of decimals ("99.00" for 9900 usd, "500" for 500 jpy).
// For a currency Stripe does not support it renders the bare integer.
func FormatMinor(currency string, minor int64) string {
	exp, ok := Exponent(currency)
	if !ok {
		return strconv.FormatInt(minor, 10)
	}
	return decimal.New(minor, -exp).StringFixed(exp)
}

// exactString renders d with every digit it carries and never rounds or uses
// scientific notation. It does not depend on decimal's package-level formatting
// switches, which any other package could change.
//
// A value too large for any cap (more than maxExactDigits integer digits) is written
// as coefficient "e" exponent instead: expanding a huge power of ten would cost
// unbounded memory, and such a value is invalid anyway.
func exactString(d decimal.Decimal) string {
	if tooManyDigits(d) {
		return d.Coefficient().String() + "e" + strconv.Itoa(int(d.Exponent()))
	}
	places := -d.Exponent()
	if places < 0 {
		places = 0
	}
	return d.StringFixed(places)
}

// maxExactDigits bounds the integer digits of values this package expands: int64
// has 19, so anything beyond is an overflow whatever the currency.
const maxExactDigits = 40

// tooManyDigits reports whether d has more than maxExactDigits integer digits,
// without expanding it.
func tooManyDigits(d decimal.Decimal) bool {
	if d.IsZero() || d.Exponent() <= 0 {
		return false
	}
	return int64(d.Exponent())+int64(d.NumDigits()) > maxExactDigits
}

// formatMajor renders a cap in the canonical form: exactly the currency's decimals
// when the value has no more than that, otherwise every digit it carries (an invalid
// cap is kept as it was written, so validation can still report it after a round trip).
func formatMajor(currency string, d decimal.Decimal) string {
	exp, ok := Exponent(currency)
	if !ok || tooManyDigits(d) || !d.Shift(exp).IsInteger() {
		return exactString(d)
	}
	return d.StringFixed(exp)
}

// maxAmountLen bounds the length of an amount literal: no real cap needs more, and a
// bound keeps parsing cheap whatever a client sends.
const maxAmountLen = 64

// errAmountSyntax is returned by ParseAmount for malformed literals.
var errAmountSyntax = errors.New("must be a decimal number like \"99.00\" (digits, an optional '-' and an optional fraction; no exponent, no '+', no spaces)")

// ParseAmount parses a decimal amount in the major unit as written in policy JSON:
// an optional '-', digits, and an optional '.' followed by digits. Exponents
// ("1e5"), a leading '+', a leading or trailing '.', spaces and literals longer than
// 64 characters are refused: they are ambiguous or hostile, never needed.
func ParseAmount(s string) (decimal.Decimal, error) {
	if len(s) == 0 || len(s) > maxAmountLen {
		return decimal.Decimal{}, errAmountSyntax
	}
	i := 0
	if s[0] == '-' {
		i++
	}
	digits := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
		digits++
	}
	if digits == 0 {
		return decimal.Decimal{}, errAmountSyntax
	}
	if i < len(s) && s[i] == '.' {
		i++
		frac := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			frac++
		}
		if frac == 0 {
			return decimal.Decimal{}, errAmountSyntax
		}
	}
	if i != len(s) {
		return decimal.Decimal{}, errAmountSyntax
	}
	d, err := decimal.NewFromString(s)
	if err != nil {
		return decimal.Decimal{}, fmt.Errorf("parse amount: %w", err)
	}
	return d, nil
}
