package proxy_test

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
)

// MetricValue gathers g and returns the value of the series name{labels} (see
// proxytest.MetricValue).
func MetricValue(tb testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	tb.Helper()
	families, err := g.Gather()
	require.NoError(tb, err)
	return proxytest.MetricValue(families, name, labels...)
}

// MetricSum gathers g and adds every series of name.
func MetricSum(tb testing.TB, g prometheus.Gatherer, name string) float64 {
	tb.Helper()
	families, err := g.Gather()
	require.NoError(tb, err)
	return proxytest.MetricSum(families, name)
}

func TestMetricsCountLookupsAndForwards(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	reg := e.Metrics
	assert.Zero(t, MetricSum(t, reg, "keybrake_proxy_requests_total"), "nothing counted yet")
	assert.Equal(t, 0.0, MetricValue(t, reg, "keybrake_upstream_request_duration_seconds", "kind", "forward", "status_class", "2xx"))

	pi := e.Fake.AddPaymentIntent(7000, "usd", "")
	r := e.Post(t, "/v1/payment_intents/"+pi+"/confirm", tok, "c1", form("payment_method", "pm_card_visa"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	r = e.Post(t, "/v1/payment_intents/pi_missing/confirm", tok, "c2", form("payment_method", "pm_card_visa"))
	AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
	r = e.Post(t, "/v1/charges", tok, "", form("amount", "100", "currency", "usd"))
	AssertRefusal(t, r, http.StatusBadRequest, "idempotency_key_required")
	r = e.MustSend(t, http.MethodGet, "/v1/charges", "vk_not_a_key", nil, "")
	AssertRefusal(t, r, http.StatusUnauthorized, "vault_key_invalid")

	const up = "keybrake_upstream_request_duration_seconds"
	assert.Equal(t, 1.0, MetricValue(t, reg, up, "kind", "forward", "status_class", "2xx"))
	assert.Equal(t, 1.0, MetricValue(t, reg, up, "kind", "lookup", "status_class", "2xx"))
	assert.Equal(t, 1.0, MetricValue(t, reg, up, "kind", "lookup", "status_class", "4xx"))
	assert.Equal(t, 3.0, MetricSum(t, reg, up), "one forward and two lookups reached Stripe")

	const req = "keybrake_proxy_requests_total"
	assert.Equal(t, 1.0, MetricValue(t, reg, req, "operation", "payment_intents.confirm", "outcome", "allowed"))
	assert.Equal(t, 1.0, MetricValue(t, reg, req, "operation", "payment_intents.confirm", "outcome", "refused"))
	assert.Equal(t, 1.0, MetricValue(t, reg, req, "operation", "charges.create", "outcome", "refused"))
	assert.Equal(t, 1.0, MetricValue(t, reg, req, "operation", "unclassified", "outcome", "refused"),
		"refused before it was classified")
	assert.Equal(t, 4.0, MetricSum(t, reg, req))

	const ref = "keybrake_proxy_refusals_total"
	assert.Equal(t, 1.0, MetricValue(t, reg, ref, "reason", "amount_unknown", "mode", "enforce"))
	assert.Equal(t, 1.0, MetricValue(t, reg, ref, "reason", "idempotency_key_required", "mode", "enforce"))
	assert.Equal(t, 1.0, MetricValue(t, reg, ref, "reason", "vault_key_invalid", "mode", "enforce"))
	assert.Equal(t, 3.0, MetricSum(t, reg, ref))

	assert.Equal(t, 4.0, MetricValue(t, reg, "keybrake_proxy_request_duration_seconds"))
	assert.Equal(t, 4.0, MetricValue(t, reg, "keybrake_proxy_added_latency_seconds"))
}

func TestMetricsBoundTheOperationLabel(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) { p.Operations = []string{"*.read"} }))
	// v2 reads are named after their path: a caller could invent any number of
	// names. They are counted as unknown.read, like v1 paths outside the catalogue.
	for _, path := range []string{"/v2/aaa/bbb", "/v2/ccc", "/v1/not_a_resource"} {
		e.MustSend(t, http.MethodGet, path, tok, nil, "")
	}
	families, err := e.Metrics.Gather()
	require.NoError(t, err)
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				assert.False(t, strings.Contains(l.GetValue(), "aaa") || strings.Contains(l.GetValue(), "ccc") ||
					strings.Contains(l.GetValue(), "not_a_resource"), "%s: %s=%s", f.GetName(), l.GetName(), l.GetValue())
			}
		}
	}
	assert.Equal(t, 3.0, MetricSum(t, e.Metrics, "keybrake_proxy_requests_total"))
}

func TestMetricsCountUpstreamWithoutAnswer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there any more

	e := MustEnv(t, withUpstreamURL(down, upstreamSecret))
	tok, _ := e.MustKey(t, Policy("99.00"))
	r := e.Post(t, "/v1/charges", tok, "k1", form("amount", "100", "currency", "usd", "source", "tok_visa"))
	AssertRefusal(t, r, http.StatusBadGateway, "upstream_unavailable")

	assert.Equal(t, 1.0, MetricValue(t, e.Metrics, "keybrake_upstream_request_duration_seconds", "kind", "forward", "status_class", "error"))
	assert.Equal(t, 1.0, MetricValue(t, e.Metrics, "keybrake_proxy_requests_total", "operation", "charges.create", "outcome", "allowed"),
		"the hold was placed and the request forwarded; Stripe never answered")
	assert.Zero(t, MetricSum(t, e.Metrics, "keybrake_proxy_refusals_total"), "not a refusal")
}
