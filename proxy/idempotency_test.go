package proxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/stripeapi"
)

func TestParseIdempotencyKey(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		values  []string
		want    string
		present bool
		wantErr bool
	}{
		"absent":                 {nil, "", false, false},
		"bare stripe-go":         {[]string{"1764000000000000000_AbCdEf"}, "1764000000000000000_AbCdEf", true, false},
		"bare stripe-node":       {[]string{"stripe-node-retry-5f0c6a1e-8d7b-4f7a-9c1e-2b3c4d5e6f70"}, "stripe-node-retry-5f0c6a1e-8d7b-4f7a-9c1e-2b3c4d5e6f70", true, false},
		"structured string":      {[]string{`"abc"`}, "abc", true, false},
		"structured escapes":     {[]string{`"a\"b\\c"`}, `a"b\c`, true, false},
		"bare with inner space":  {[]string{"order 42"}, "order 42", true, false},
		"255 characters":         {[]string{strings.Repeat("k", 255)}, strings.Repeat("k", 255), true, false},
		"256 characters":         {[]string{strings.Repeat("k", 256)}, "", true, true},
		"257 quoted, 255 inside": {[]string{`"` + strings.Repeat("k", 255) + `"`}, strings.Repeat("k", 255), true, false},
		"empty":                  {[]string{""}, "", true, true},
		"empty string":           {[]string{`""`}, "", true, true},
		"unterminated":           {[]string{`"abc`}, "", true, true},
		"trailing after quote":   {[]string{`"abc"x`}, "", true, true},
		"bad escape":             {[]string{`"a\nb"`}, "", true, true},
		"non-ascii":              {[]string{"clé"}, "", true, true},
		"repeated header":        {[]string{"a", "b"}, "", true, true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := http.Header{}
			if tc.values != nil {
				h["Idempotency-Key"] = tc.values
			}
			got, present, err := proxy.ParseIdempotencyKey(h)
			assert.Equal(t, tc.present, present)
			if tc.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestDeriveIdempotencyKey(t *testing.T) {
	t.Parallel()
	params := func(body string) *stripeapi.Params {
		p, err := stripeapi.ParseForm([]byte(body))
		require.NoError(t, err)
		return p
	}
	fields := []string{"customer", "metadata[billing_period]"}
	a, err := proxy.DeriveIdempotencyKey("charges.create", fields, params("amount=100&currency=usd&customer=cus_1&metadata[billing_period]=2026-09").Get)
	require.NoError(t, err)
	assert.Len(t, a, 4+64)
	assert.True(t, strings.HasPrefix(a, "kbd_"))

	b, err := proxy.DeriveIdempotencyKey("charges.create", fields, params("metadata%5Bbilling_period%5D=2026-09&customer=cus_1&amount=999").Get)
	require.NoError(t, err)
	assert.Equal(t, a, b, "only the listed fields count, however they are encoded")

	c, err := proxy.DeriveIdempotencyKey("charges.create", fields, params("customer=cus_1&metadata[billing_period]=2026-10").Get)
	require.NoError(t, err)
	assert.NotEqual(t, a, c)
	d, err := proxy.DeriveIdempotencyKey("payment_intents.create", fields, params("customer=cus_1&metadata[billing_period]=2026-09").Get)
	require.NoError(t, err)
	assert.NotEqual(t, a, d, "the operation is part of the key")

	_, err = proxy.DeriveIdempotencyKey("charges.create", fields, params("customer=cus_1").Get)
	var missing *proxy.MissingFieldError
	require.ErrorAs(t, err, &missing)
	assert.Equal(t, "metadata[billing_period]", missing.Field)
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	base := proxy.Fingerprint("POST", "/v1/charges", "", "", []byte("x"))
	assert.Len(t, base, 64)
	assert.Equal(t, base, proxy.Fingerprint("POST", "/v1/charges", "", "", []byte("x")))
	for name, fp := range map[string]string{
		"method":  proxy.Fingerprint("GET", "/v1/charges", "", "", []byte("x")),
		"path":    proxy.Fingerprint("POST", "/v1/refunds", "", "", []byte("x")),
		"account": proxy.Fingerprint("POST", "/v1/charges", "acct_1", "", []byte("x")),
		"context": proxy.Fingerprint("POST", "/v1/charges", "", "acct_1", []byte("x")),
		"params":  proxy.Fingerprint("POST", "/v1/charges", "", "", []byte("y")),
		"shifted": proxy.Fingerprint("POST", "/v1/charges", "acct_1", "", []byte("")),
	} {
		assert.NotEqual(t, base, fp, name)
	}
	assert.NotEqual(t, proxy.Fingerprint("POST", "/v1/charges", "a", "", nil), proxy.Fingerprint("POST", "/v1/charges", "", "a", nil),
		"account and context are not interchangeable")
}
