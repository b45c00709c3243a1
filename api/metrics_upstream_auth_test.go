package api_test

import (
	"context"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"
)

// Stripe refusing keybrake's upstream secret is counted on /metrics, forwards
// and lookups alike; the requests themselves are not keybrake's refusals.
func TestMetricsCountUpstreamAuthFailures(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	admin := MustMetricsAdmin(t, env)
	_, tok := env.MustKey("metered", seedPolicy, nil)
	before := MustScrape(t, admin.URL)
	const name = "keybrake_upstream_auth_failures_total"
	require.Contains(t, before, name)
	assert.Equal(t, dto.MetricType_COUNTER, before[name].GetType())
	assert.NotEmpty(t, before[name].GetHelp())
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

	after := MustScrape(t, admin.URL)
	assert.Equal(t, 2.0, after.Value(name))
	// Both were let through by keybrake and failed at Stripe: not refusals.
	assert.Equal(t, 1.0, after.Value("keybrake_proxy_requests_total", "operation", "charges.create", "outcome", "allowed"))
	assert.Zero(t, after.Sum("keybrake_proxy_refusals_total"))
}
