package proxy

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/stripeapi"
)

func TestMetricLabels(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	require.NoError(t, err)

	m.observeRequest(&call{decision: decisionRefused, reason: CodeSpendCapExceeded,
		cls: stripeapi.Classification{Operation: "charges.create", Known: true}}, 5*time.Millisecond)
	m.observeRequest(&call{decision: decisionWouldRefuse, reason: "not_a_code",
		cls: stripeapi.Classification{Operation: "v2.core.things.read"}}, time.Millisecond)
	m.observeRequest(&call{}, time.Second) // a panic: no decision, no classification
	m.observeRequest(&call{decision: decisionAllowed, cls: stripeapi.Classification{Operation: "unknown.write"},
		upstreamWait: 2 * time.Second}, time.Second) // more waiting than duration: added latency 0

	assert.Equal(t, 1.0, testutil.ToFloat64(m.requests.WithLabelValues("charges.create", "refused")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.requests.WithLabelValues("unknown.read", "would_refuse")),
		"a v2 read's path-derived name is not a label")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.requests.WithLabelValues("unclassified", "other")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.requests.WithLabelValues("unknown.write", "allowed")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.refusals.WithLabelValues("spend_cap_exceeded", "enforce")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.refusals.WithLabelValues("other", "report")))
	assert.Equal(t, 2, testutil.CollectAndCount(m.refusals), "allowed and undecided requests are no refusals")

	m.observeUpstreamAuthFailure()
	assert.Equal(t, 1.0, testutil.ToFloat64(m.authFailures))
	n, err := testutil.GatherAndCount(reg, "keybrake_upstream_auth_failures_total")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "registered")

	for status, class := range map[int]string{0: "error", 199: "error", 200: "2xx", 302: "3xx", 429: "4xx", 599: "5xx", 600: "error"} {
		assert.Equal(t, class, statusClass(status), "status %d", status)
	}

	_, err = newMetrics(reg)
	assert.Error(t, err, "registering twice on one registry fails instead of sharing series")
	m, err = newMetrics(nil)
	require.NoError(t, err, "without a registry the collectors still count")
	m.observeUpstreamAuthFailure()
}

// BenchmarkObserveRequest is the per-request cost of the metrics.
func BenchmarkObserveRequest(b *testing.B) {
	m, err := newMetrics(prometheus.NewRegistry())
	require.NoError(b, err)
	c := &call{decision: decisionRefused, reason: CodeSpendCapExceeded, cls: stripeapi.Classification{Operation: "charges.create", Known: true}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.observeRequest(c, 3*time.Millisecond)
		}
	})
}
