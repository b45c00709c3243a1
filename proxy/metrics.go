package proxy

import (
	"sync/atomic"
	"time"
)

// The proxy's counters are fixed arrays of atomics indexed by label value, so
// counting a request costs a few atomic adds and no lock or allocation. Proxy.Stats
// copies them out; the api package renders them for /metrics.

// metricDecisions are the decision label values, by index: the decisions of the
// canonical log line, and "other" for a request that ended without one (a panic).
var metricDecisions = [...]string{
	decisionAllowed, decisionWouldRefuse, decisionRefused, decisionReplayed, decisionResumed, "other",
}

// metricCodes are the code label values, by index: "" (no refusal), every code of
// a keybrake refusal (the policy's reasons are among them), and "other" for a
// reason not in this list.
var metricCodes = [...]string{
	"",
	CodeVaultKeyInvalid, CodeVaultKeyRevoked, CodeVaultKeyExpired, CodeVaultKeyNotYetValid,
	CodeOperationNotAllowed, CodeCustomerNotAllowed, CodeAccountNotAllowed, CodeCurrencyNotAllowed,
	CodeAmountUnknown, CodeSpendCapExceeded, CodeRequestMalformed, CodeRequestTooLarge,
	CodeIdemKeyRequired, CodeIdemKeyInvalid, CodeIdemKeyReused, CodeIdemKeyInUse, CodeIdemOutcomeUnknown,
	CodeUpstreamUnavailable, CodeUpstreamAuthFailed, CodeUpstreamPermission, CodeInternalError,
	"other",
}

// Kinds of upstream request.
const (
	upstreamForward = iota // the caller's request, forwarded
	upstreamLookup         // keybrake's own GET of an object's amount
	numUpstreamKinds
)

// metricUpstreamKinds are the kind label values, by index.
var metricUpstreamKinds = [numUpstreamKinds]string{upstreamForward: "forward", upstreamLookup: "lookup"}

// metricStatusClasses are the status_class label values, by index: "error" when
// no answer came (or its status is outside 200–599), else the class of Stripe's
// status.
var metricStatusClasses = [...]string{"error", "2xx", "3xx", "4xx", "5xx"}

// durationBuckets are the upper bounds, in seconds, of the request duration
// histogram: refusals take milliseconds, forwarded requests what Stripe takes
// (typically a few hundred milliseconds, at most the upstream timeout).
var durationBuckets = [...]float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 90}

// metrics are a Proxy's counters.
type metrics struct {
	requests [len(metricDecisions)][len(metricCodes)]atomic.Uint64
	upstream [numUpstreamKinds][len(metricStatusClasses)]atomic.Uint64
	// duration holds per-bucket (not cumulative) counts; the last is above every
	// bound. The sum is in microseconds: an int64 of them overflows only after
	// 290,000 years of summed request time.
	duration    [len(durationBuckets) + 1]atomic.Uint64
	durationSum atomic.Int64
	// upstreamAuthFailures counts Stripe's 401 and 403 answers to keybrake's own
	// credentials, forwards and lookups alike.
	upstreamAuthFailures atomic.Uint64
}

// observeRequest counts one request by its canonical line's decision and reason,
// and its duration.
func (m *metrics) observeRequest(decision, code string, d time.Duration) {
	m.requests[labelIndex(metricDecisions[:], decision)][labelIndex(metricCodes[:], code)].Add(1)
	secs := d.Seconds()
	i := 0
	for i < len(durationBuckets) && secs > durationBuckets[i] {
		i++
	}
	m.duration[i].Add(1)
	m.durationSum.Add(d.Microseconds())
}

// observeUpstream counts one upstream request of kind; status 0 means no answer.
func (m *metrics) observeUpstream(kind, status int) {
	class := 0
	if status >= 200 && status < 600 {
		class = status/100 - 1
	}
	m.upstream[kind][class].Add(1)
}

// labelIndex is the index of v in values, or the last index ("other") when v is
// not there. The lists are short and most lookups hit the first few entries.
func labelIndex(values []string, v string) int {
	for i, s := range values {
		if s == v {
			return i
		}
	}
	return len(values) - 1
}

// Stats is a snapshot of a Proxy's counters since it was built. The counters are
// read one by one, not all at one instant.
type Stats struct {
	// Requests counts requests by the decision and reason of their canonical log
	// line, in a fixed order; pairs never seen are left out.
	Requests []RequestCount
	// Upstream counts the requests keybrake sent to Stripe, for every kind and
	// status class (zeros included), in a fixed order.
	Upstream []UpstreamCount
	// Duration is the distribution of request durations, from the request's
	// arrival to the end of its answer.
	Duration Histogram
	// UpstreamAuthFailures counts the times Stripe answered 401 or 403 to
	// keybrake's own upstream credential (a wrong, rolled or restricted secret),
	// forwarded requests and amount lookups alike.
	UpstreamAuthFailures uint64
}

// RequestCount is the number of requests with one decision and code.
type RequestCount struct {
	// Decision is allowed, would_refuse, refused, replayed or resumed; "other"
	// for a request that ended without one (only a panic does).
	Decision string
	// Code is the reason of the canonical log line: the refusal's code, the
	// policy's reason of a would_refuse, upstream_unavailable when Stripe gave no
	// answer; "" when there is none.
	Code  string
	Count uint64
}

// UpstreamCount is the number of upstream requests of one kind and status class.
type UpstreamCount struct {
	// Kind is "forward" (the caller's request) or "lookup" (keybrake reading an
	// object's amount before forwarding).
	Kind string
	// StatusClass is 2xx, 3xx, 4xx or 5xx by Stripe's answer, or "error" when none
	// came (connection failure, timeout).
	StatusClass string
	Count       uint64
}

// Histogram is a cumulative histogram, as Prometheus exposes one.
type Histogram struct {
	// Buckets count the observations at most UpperBound seconds, by increasing
	// bound; the implicit last bucket (+Inf) is Count.
	Buckets []Bucket
	// Count is the number of observations; never less than any bucket's.
	Count uint64
	// Sum is the sum of the observations, in seconds.
	Sum float64
}

// Bucket is one bucket of a Histogram.
type Bucket struct {
	UpperBound float64
	Count      uint64
}

// Stats returns the proxy's counters. It allocates; call it per scrape, not per
// request.
func (p *Proxy) Stats() Stats {
	m := &p.metrics
	var s Stats
	for d := range m.requests {
		for c := range m.requests[d] {
			if n := m.requests[d][c].Load(); n > 0 {
				s.Requests = append(s.Requests, RequestCount{Decision: metricDecisions[d], Code: metricCodes[c], Count: n})
			}
		}
	}
	for k := range m.upstream {
		for c := range m.upstream[k] {
			s.Upstream = append(s.Upstream, UpstreamCount{
				Kind: metricUpstreamKinds[k], StatusClass: metricStatusClasses[c], Count: m.upstream[k][c].Load(),
			})
		}
	}
	// Count is the sum of the buckets read here, so the +Inf bucket and the
	// count always agree, as the exposition format requires.
	var cum uint64
	s.Duration.Buckets = make([]Bucket, len(durationBuckets))
	for i, le := range durationBuckets {
		cum += m.duration[i].Load()
		s.Duration.Buckets[i] = Bucket{UpperBound: le, Count: cum}
	}
	s.Duration.Count = cum + m.duration[len(durationBuckets)].Load()
	s.Duration.Sum = float64(m.durationSum.Load()) / 1e6
	s.UpstreamAuthFailures = m.upstreamAuthFailures.Load()
	return s
}
