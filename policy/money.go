package policy

import "github.com/shopspring/decimal"

// Exponent returns the number of decimals Stripe uses for the currency on the wire
// (Stripe's table, not ISO 4217's: 0 for bif clp djf gnf jpy kmf krw mga pyg rwf vnd
// vuv xaf xof xpf; 3 for bhd jod kwd omr tnd; 2 for every other currency Stripe
// supports, including isk, ugx, huf and twd). ok is false for a currency code that
// is malformed (not three lower-case letters) or that Stripe does not support.
func Exponent(currency string) (exp int32, ok bool) { panic("unimplemented") }

// FromMinor converts an amount in minor units (Stripe's wire integer) to the
// currency's major unit, exactly.
func FromMinor(currency string, minor int64) (decimal.Decimal, error) { panic("unimplemented") }

// ToMinor converts an amount in the currency's major unit to minor units. It fails
// (ErrPrecision) when the amount has more decimals than the currency has, and
// (ErrOverflow) when it does not fit in int64.
func ToMinor(currency string, major decimal.Decimal) (int64, error) { panic("unimplemented") }

// FormatMinor renders minor units as a decimal string in the major unit with exactly
// the currency's number of decimals ("99.00" for 9900 usd, "500" for 500 jpy).
func FormatMinor(currency string, minor int64) string { panic("unimplemented") }
