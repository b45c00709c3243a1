package proxytest_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// TestStripeMockAcceptsCatalogueSamples sends every catalogue case marked
// stripe_mock straight to stripe-mock: each must pass Stripe's own parameter
// validation, which proves the samples are real Stripe requests.
func TestStripeMockAcceptsCatalogueSamples(t *testing.T) {
	t.Parallel()
	cases := proxytest.CatalogueCases(t)
	var samples []proxytest.CatalogueCase
	for _, c := range cases {
		if c.StripeMock {
			samples = append(samples, c)
		}
	}
	require.NotEmpty(t, samples, "no catalogue case is marked stripe_mock")

	base := proxytest.StripeMock(t)
	client := &http.Client{}
	for _, c := range samples {
		t.Run(c.Name, func(t *testing.T) {
			target := base.String() + c.Path
			if c.Query != "" {
				target += "?" + c.Query
			}
			var body io.Reader
			if c.Method == http.MethodPost {
				body = strings.NewReader(c.Body)
			}
			req, err := http.NewRequest(c.Method, target, body)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+proxytest.StripeMockKey)
			if c.Method == http.MethodPost {
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.True(t, resp.StatusCode >= 200 && resp.StatusCode < 300,
				"stripe-mock answered %d: %s", resp.StatusCode, got)
		})
	}
}

// TestStripeMockRefusesInvalidParameters makes sure the acceptance test above can
// fail: stripe-mock refuses an unknown parameter and a missing required one.
func TestStripeMockRefusesInvalidParameters(t *testing.T) {
	t.Parallel()
	base := proxytest.StripeMock(t)
	tests := map[string]struct {
		path, body string
	}{
		"unknown parameter":         {"/v1/charges", "amount=100&currency=usd&no_such_param=1"},
		"missing required amount":   {"/v1/payment_intents", "currency=usd"},
		"integer field not integer": {"/v1/payment_intents", "amount=ten&currency=usd"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, base.String()+tc.path, strings.NewReader(tc.body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+proxytest.StripeMockKey)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		})
	}
}

// TestCaseFilesDecode checks that both case files decode strictly and that case
// names are unique (subtests are keyed by them).
func TestCaseFilesDecode(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, c := range proxytest.CatalogueCases(t) {
		assert.False(t, seen[c.Name], "duplicate catalogue case %q", c.Name)
		seen[c.Name] = true
	}
	seen = map[string]bool{}
	for _, c := range proxytest.MalformedCases(t) {
		assert.False(t, seen[c.Name], "duplicate malformed case %q", c.Name)
		seen[c.Name] = true
		_, err := c.RawBody()
		assert.NoError(t, err, c.Name)
	}
}
