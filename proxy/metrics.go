package proxy

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// The proxy's Prometheus collectors. Every label takes its values from a fixed,
// short list, never from a request: a key id, a customer, an amount or a path
// never becomes a label, so the number of series stays bounded whatever callers
// send.

// metricOutcomes are the outcome label values: the decisions of the canonical log
// line, and "other" for a request that ended without one (only a panic does).
var metricOutcomes = [...]decision{
	decisionAllowed, decisionWouldRefuse, decisionRefused, decisionReplayed, decisionResumed, "other",
}

// metricReasons are the reason label values of the refusal counter: every code of
// a keybrake refusal (the policy's reasons are among them), and "other" for a
// reason not in this list.
var metricReasons = [...]ErrorCode{
	CodeVaultKeyInvalid, CodeVaultKeyRevoked, CodeVaultKeyExpired, CodeVaultKeyNotYetValid,
	CodeOperationNotAllowed, CodeCustomerNotAllowed, CodeAccountNotAllowed, CodeCurrencyNotAllowed,
	CodeAmountUnknown, CodeSpendCapExceeded, CodeRequestMalformed, CodeRequestTooLarge,
	CodeIdemKeyRequired, CodeIdemKeyInvalid, CodeIdemKeyReused, CodeIdemKeyInUse, CodeIdemOutcomeUnknown,
	CodeUpstreamUnavailable, CodeUpstreamAuthFailed, CodeUpstreamPermission, CodeStoreUnavailable, CodeInternalError,
	"other",
}

// Operation label values for requests whose operation is not a catalogue name.
const (
	opUnclassified = "unclassified" // refused before it was classified (no key, malformed)
)

// Kinds of upstream request, the kind label of the upstream histogram.
const (
	upstreamForward = "forward" // the caller's request, forwarded
	upstreamLookup  = "lookup"  // keybrake's own GET of an object's amount
)

// Latency buckets, in seconds. Refusals take milliseconds and keybrake's own work
// on a forwarded request (a hold and a settle, each a shared fsync) a few more;
// Stripe typically answers in a few hundred milliseconds, at most the upstream
// timeout (80 s by default).
var (
	requestBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 90}
	addedBuckets   = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
)

// metrics are a Proxy's collectors.
type metrics struct {
	requests     *prometheus.CounterVec   // operation, outcome
	refusals     *prometheus.CounterVec   // reason, mode
	duration     prometheus.Histogram     // arrival to end of answer
	added        prometheus.Histogram     // duration minus the time spent waiting on Stripe
	upstream     *prometheus.HistogramVec // kind, status_class
	authFailures prometheus.Counter
	events       *prometheus.CounterVec // outcome
	eventsDenied *prometheus.CounterVec // reason

	// requestsByOp holds requests' series already resolved, by operation
	// label (a bounded set: operationLabel): every request counts itself with
	// a map read instead of hashing its labels into the vector.
	requestsByOp sync.Map // string → *outcomeCounters
}

// outcomeCounters are one operation's series of requests, by outcome.
type outcomeCounters [len(metricOutcomes)]prometheus.Counter

// newMetrics builds the proxy's collectors and registers them on reg; with a nil
// reg they count but are exposed nowhere (never the global default registry).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keybrake_proxy_requests_total",
			Help: "Requests through the metering proxy, by Stripe operation (catalogue names; unknown.read, unknown.write, or unclassified when refused before classification) and outcome (the decision of the canonical log line).",
		}, []string{"operation", "outcome"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keybrake_proxy_refusals_total",
			Help: "Requests keybrake refused (mode enforce) or, in report mode, would have refused (mode report), by reason: the code of the Stripe-shaped error.",
		}, []string{"reason", "mode"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "keybrake_proxy_request_duration_seconds",
			Help:    "Time from a proxied request's arrival to the end of its answer.",
			Buckets: requestBuckets,
		}),
		added: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "keybrake_proxy_added_latency_seconds",
			Help:    "keybrake's own share of a proxied request's time: its duration minus the time spent waiting for Stripe's answers (amount lookups and the forward, up to their response headers).",
			Buckets: addedBuckets,
		}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keybrake_upstream_request_duration_seconds",
			Help:    "Requests keybrake sent to Stripe, from sending to the response headers, by kind (forward: the caller's request; lookup: keybrake reading an object's amount) and status class of the answer (error: no answer).",
			Buckets: requestBuckets,
		}, []string{"kind", "status_class"}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keybrake_upstream_auth_failures_total",
			Help: "Stripe rejected keybrake's own upstream secret (401 or 403 to a forwarded request): the registered secret is wrong, revoked or lacks a permission.",
		}),
	}
	m.events = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "keybrake_stripe_events_total",
		Help: "Stripe events accepted at the events endpoint, by outcome (applied: changed what a key counts; unchanged: a known object, nothing new; dropped: no key knows the object; duplicate: the event id was applied before).",
	}, []string{"outcome"})
	m.eventsDenied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "keybrake_stripe_events_rejected_total",
		Help: "Deliveries to the Stripe events endpoint turned down with a 400 or 413, nothing changed, by reason.",
	}, []string{"reason"})
	for _, o := range stripeEventOutcomes {
		m.events.WithLabelValues(string(o))
	}
	for _, r := range stripeEventRejections {
		m.eventsDenied.WithLabelValues(string(r))
	}
	// Zero series for the label values an alert or a dashboard expects to find.
	for _, kind := range []string{upstreamForward, upstreamLookup} {
		for _, class := range []string{"2xx", "4xx", "5xx", "error"} {
			m.upstream.WithLabelValues(kind, class)
		}
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.refusals, m.duration, m.added, m.upstream, m.authFailures, m.events, m.eventsDenied} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// observeRequest counts one finished request by its canonical line (operation,
// decision, reason) and its durations.
func (m *metrics) observeRequest(c *call, d time.Duration) {
	m.requestCounters(operationLabel(c))[labelIndex(metricOutcomes[:], c.decision)].Inc()
	switch c.decision {
	case decisionRefused:
		m.refusals.WithLabelValues(labelValue(metricReasons[:], c.reason), "enforce").Inc()
	case decisionWouldRefuse:
		m.refusals.WithLabelValues(labelValue(metricReasons[:], c.reason), "report").Inc()
	}
	m.duration.Observe(d.Seconds())
	m.added.Observe(max(0, d-c.upstreamWait).Seconds())
}

// requestCounters returns op's series of the requests counter, by outcome
// (the index in metricOutcomes), resolving them the first time op is seen.
func (m *metrics) requestCounters(op string) *outcomeCounters {
	if cs, ok := m.requestsByOp.Load(op); ok {
		return cs.(*outcomeCounters)
	}
	cs := new(outcomeCounters)
	for i, o := range metricOutcomes {
		cs[i] = m.requests.WithLabelValues(op, string(o))
	}
	got, _ := m.requestsByOp.LoadOrStore(op, cs) // a racing first request resolved the same series
	return got.(*outcomeCounters)
}

// observeUpstreamAuthFailure counts one answer in which Stripe rejected
// keybrake's own secret (401/403 to a forwarded request). The pipeline calls it
// once per such answer, next to its handling of the failure.
func (m *metrics) observeUpstreamAuthFailure() { m.authFailures.Inc() }

// operationLabel is the operation label of a request: a catalogue operation name
// (a bounded set), else unknown.read / unknown.write (a v2 read's name comes from
// its path, so it is not used), else unclassified.
func operationLabel(c *call) string {
	switch {
	case c.cls.Known:
		return c.cls.Operation
	case c.cls.Operation == "":
		return opUnclassified
	case strings.HasSuffix(c.cls.Operation, ".read"):
		return stripeapi.OpUnknownRead
	default:
		return stripeapi.OpUnknownWrite
	}
}

// labelValue is v when it is one of values, else the last of them ("other").
func labelValue[T ~string](values []T, v T) string { return string(values[labelIndex(values, v)]) }

// labelIndex is the index of v in values, or of the last of them ("other")
// when v is not among them.
func labelIndex[T ~string](values []T, v T) int {
	for i, s := range values {
		if s == v {
			return i
		}
	}
	return len(values) - 1
}

// statusClass is the status_class label of an upstream answer: 2xx … 5xx, or
// "error" when no answer came (status 0) or its status is outside 200–599.
func statusClass(status int) string { return statusClasses[statusClassIndex(status)] }

// statusClasses are the status_class label values, by statusClassIndex.
var statusClasses = [...]string{"error", "2xx", "3xx", "4xx", "5xx"}

// statusClassIndex is the index of status's class in statusClasses.
func statusClassIndex(status int) int {
	if status < 200 || status > 599 {
		return 0
	}
	return status/100 - 1
}

// timedTransport times every upstream request of one kind for the upstream
// histogram, and adds the wait to the request's call (for the added-latency
// histogram). The time ends when the response headers arrive; reading the body
// is not included.
type timedTransport struct {
	next http.RoundTripper
	// byClass are the kind's series of the upstream histogram, by
	// statusClassIndex, resolved once.
	byClass [len(statusClasses)]prometheus.Observer
}

// newTimedTransport times next's requests as upstream requests of kind.
func newTimedTransport(next http.RoundTripper, kind string, m *metrics) *timedTransport {
	t := &timedTransport{next: next}
	for i, class := range statusClasses {
		t.byClass[i] = m.upstream.WithLabelValues(kind, class)
	}
	return t
}

// RoundTrip implements http.RoundTripper. The ReverseProxy and the lookup client
// call it on the request's own goroutine, so the call needs no lock.
func (t *timedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.next.RoundTrip(req)
	d := time.Since(start)
	status := 0
	if err == nil {
		status = resp.StatusCode
	}
	t.byClass[statusClassIndex(status)].Observe(d.Seconds())
	if c := callFrom(req.Context()); c != nil {
		c.upstreamWait += d
	}
	return resp, err
}

var _ http.RoundTripper = (*timedTransport)(nil)

// stripeEventAccepted counts one accepted Stripe event by its outcome.
func (m *metrics) stripeEventAccepted(o vault.StripeEventOutcome) {
	m.events.WithLabelValues(string(o)).Inc()
}

// stripeEventRejected counts one delivery turned down.
func (m *metrics) stripeEventRejected(r StripeEventRejection) {
	m.eventsDenied.WithLabelValues(string(r)).Inc()
}
