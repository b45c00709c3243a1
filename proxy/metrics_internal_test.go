package proxy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestMetricsLabelsAndBuckets(t *testing.T) {
	p := &Proxy{}
	m := &p.metrics
	m.observeRequest(decisionRefused, CodeSpendCapExceeded, 5*time.Millisecond) // on a bound: in that bucket
	m.observeRequest(decisionAllowed, "", 5*time.Millisecond+time.Microsecond)  // just above: the next
	m.observeRequest("", "", 2*time.Minute)                                     // above every bound; no decision
	m.observeRequest(decisionRefused, "not_a_code", time.Second)

	for status, class := range map[int]string{0: "error", 199: "error", 200: "2xx", 302: "3xx", 429: "4xx", 599: "5xx", 600: "error"} {
		before := p.Stats()
		m.observeUpstream(upstreamForward, status)
		after := p.Stats()
		for i, u := range after.Upstream {
			want := before.Upstream[i].Count
			if u.Kind == "forward" && u.StatusClass == class {
				want++
			}
			assert.Equal(t, want, u.Count, "status %d: %s %s", status, u.Kind, u.StatusClass)
		}
	}

	s := p.Stats()
	assert.Equal(t, []RequestCount{
		{Decision: "allowed", Code: "", Count: 1},
		{Decision: "refused", Code: "spend_cap_exceeded", Count: 1},
		{Decision: "refused", Code: "other", Count: 1},
		{Decision: "other", Code: "", Count: 1},
	}, s.Requests, "fixed order: by decision, then by code")
	assert.Equal(t, uint64(4), s.Duration.Count)
	assert.Equal(t, Bucket{UpperBound: 0.005, Count: 1}, s.Duration.Buckets[0])
	assert.Equal(t, Bucket{UpperBound: 0.01, Count: 2}, s.Duration.Buckets[1])
	assert.Equal(t, Bucket{UpperBound: 1, Count: 3}, s.Duration.Buckets[7])
	assert.Equal(t, uint64(3), s.Duration.Buckets[len(s.Duration.Buckets)-1].Count, "2 minutes is only in +Inf")
	assert.InDelta(t, 0.005+0.005001+120+1, s.Duration.Sum, 1e-9)
}

// BenchmarkObserveRequest is the per-request cost of the metrics.
func BenchmarkObserveRequest(b *testing.B) {
	var m metrics
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.observeRequest(decisionRefused, CodeSpendCapExceeded, 3*time.Millisecond)
		}
	})
}
