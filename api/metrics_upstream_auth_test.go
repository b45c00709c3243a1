package api_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"
)

// Stripe refusing keybrake's upstream secret is counted on /metrics, forwards
// and lookups alike, and the refused requests under their own code.
func TestMetricsCountUpstreamAuthFailures(t *testing.T) {
	env := MustAgentEnv(t)
	admin := MustMetricsAdmin(t, env)
	_, tok := env.MustKey("metered", seedPolicy, nil)
	before := MustScrape(t, admin)
	const name = "keybrake_upstream_auth_failures_total"
	assert.Equal(t, "counter", before.types[name])
	assert.NotEmpty(t, before.help[name])
	assert.Equal(t, 0.0, before.Value(name))

	env.fake.SetSecret("sk_test_rolledatstripe")
	p := &stripe.ChargeCreateParams{
		Amount: stripe.Int64(1000), Currency: stripe.String("usd"),
		Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
	}
	p.SetIdempotencyKey("auth-1")
	_, err := env.Stripe(tok).V1Charges.Create(context.Background(), p)
	var se *stripe.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, http.StatusBadGateway, se.HTTPStatusCode)
	r := env.Do(http.MethodGet, "/v1/charges", tok, nil)
	require.Equal(t, http.StatusBadGateway, r.Status)

	after := MustScrape(t, admin)
	assert.Equal(t, 2.0, after.Value(name))
	assert.Equal(t, 2.0, after.Value("keybrake_proxy_requests_total", "decision", "allowed", "code", "upstream_authentication_failed"))
}
