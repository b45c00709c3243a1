package proxy_test

import (
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy"
)

// upstreamCounts maps "kind status_class" to its count.
func upstreamCounts(s proxy.Stats) map[string]uint64 {
	out := map[string]uint64{}
	for _, u := range s.Upstream {
		out[u.Kind+" "+u.StatusClass] = u.Count
	}
	return out
}

// requestCounts maps "decision code" to its count.
func requestCounts(s proxy.Stats) map[string]uint64 {
	out := map[string]uint64{}
	for _, r := range s.Requests {
		out[r.Decision+" "+r.Code] = r.Count
	}
	return out
}

func TestStatsCountLookupsAndForwards(t *testing.T) {
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	s := e.Proxy.Stats()
	assert.Empty(t, s.Requests, "nothing counted yet")
	assert.Len(t, s.Upstream, 10, "every kind and status class, zeros included")
	assert.Zero(t, s.Duration.Count)

	pi := e.Fake.AddPaymentIntent(7000, "usd", "")
	r := e.Post(t, "/v1/payment_intents/"+pi+"/confirm", tok, "c1", form("payment_method", "pm_card_visa"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	r = e.Post(t, "/v1/payment_intents/pi_missing/confirm", tok, "c2", form("payment_method", "pm_card_visa"))
	AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
	r = e.Post(t, "/v1/charges", tok, "", form("amount", "100", "currency", "usd"))
	AssertRefusal(t, r, http.StatusBadRequest, "idempotency_key_required")

	s = e.Proxy.Stats()
	assert.Equal(t, map[string]uint64{
		"forward error": 0, "forward 2xx": 1, "forward 3xx": 0, "forward 4xx": 0, "forward 5xx": 0,
		"lookup error": 0, "lookup 2xx": 1, "lookup 3xx": 0, "lookup 4xx": 1, "lookup 5xx": 0,
	}, upstreamCounts(s))
	assert.Equal(t, map[string]uint64{
		"allowed ":                         1,
		"refused amount_unknown":           1,
		"refused idempotency_key_required": 1,
	}, requestCounts(s))
	assert.Equal(t, uint64(3), s.Duration.Count)
	require.Len(t, s.Duration.Buckets, 13)
	for i, b := range s.Duration.Buckets {
		if i > 0 {
			assert.Greater(t, b.UpperBound, s.Duration.Buckets[i-1].UpperBound)
			assert.GreaterOrEqual(t, b.Count, s.Duration.Buckets[i-1].Count, "cumulative")
		}
		assert.LessOrEqual(t, b.Count, s.Duration.Count)
	}
	assert.Greater(t, s.Duration.Sum, 0.0)
}

func TestStatsCountUpstreamWithoutAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there any more

	e := MustEnv(t, withUpstreamURL(down, upstreamSecret))
	tok, _ := e.MustKey(t, Policy("99.00"))
	r := e.Post(t, "/v1/charges", tok, "k1", form("amount", "100", "currency", "usd", "source", "tok_visa"))
	AssertRefusal(t, r, http.StatusBadGateway, "upstream_unavailable")

	s := e.Proxy.Stats()
	assert.Equal(t, uint64(1), upstreamCounts(s)["forward error"])
	assert.Equal(t, map[string]uint64{"allowed upstream_unavailable": 1}, requestCounts(s),
		"the hold was placed and the request forwarded; Stripe never answered")
}
