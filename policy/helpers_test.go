package policy

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"
)

// MustDecimal parses a decimal literal or fails the test.
func MustDecimal(tb testing.TB, s string) *decimal.Decimal {
	tb.Helper()
	d, err := ParseAmount(s)
	require.NoError(tb, err, s)
	return &d
}

// MustTime parses an RFC 3339 time or fails the test.
func MustTime(tb testing.TB, s string) time.Time {
	tb.Helper()
	t, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(tb, err, s)
	return t
}

// MustLocation loads an IANA zone or fails the test.
func MustLocation(tb testing.TB, name string) *time.Location {
	tb.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(tb, err, name)
	return loc
}

// MustPolicy decodes policy JSON, normalizes it at now and requires it to validate.
func MustPolicy(tb testing.TB, js string, now time.Time) *Policy {
	tb.Helper()
	var p Policy
	require.NoError(tb, p.UnmarshalJSON([]byte(js)), js)
	p.Normalize(now)
	require.NoError(tb, p.Validate(), js)
	return &p
}

// MustReadFile reads a fixture or fails the test.
func MustReadFile(tb testing.TB, path ...string) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(path...))
	require.NoError(tb, err)
	return b
}

// fieldsOf returns the field names of a *ValidationError, in order.
func fieldsOf(tb testing.TB, err error) []string {
	tb.Helper()
	var ve *ValidationError
	require.ErrorAs(tb, err, &ve)
	out := make([]string, 0, len(ve.Errors))
	for _, f := range ve.Errors {
		out = append(out, f.Field)
	}
	return out
}
