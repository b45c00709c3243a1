package api

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"runtime"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/vault"
)

// ContentTypeMetrics is the media type of GET /metrics: Prometheus's text
// exposition format, version 0.0.4.
const ContentTypeMetrics = "text/plain; version=0.0.4; charset=utf-8"

// ProxyStats is the source of the metering proxy's counters: *proxy.Proxy.
type ProxyStats interface {
	Stats() proxy.Stats
}

// metrics handles GET /metrics (no token, like /healthz: the admin listener is
// loopback by default, and the answer holds only totals — no key, customer, amount
// or token). Scrapes are serialized: counting unknown holds walks the hold index,
// and concurrent scrapes must not multiply that work. A store failure fails the
// whole scrape (500), so Prometheus's up metric shows it.
func (a *admin) metrics(c echo.Context) error {
	a.metricsMu.Lock()
	defer a.metricsMu.Unlock()
	unknown, err := a.store.CountHolds(c.Request().Context(), vault.HoldUnknown)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	var w exposition
	w.family("keybrake_build_info", "gauge", "The running keybrake's version; always 1.")
	w.sample("keybrake_build_info", "1", "version", a.version, "goversion", runtime.Version())

	if a.proxy != nil {
		s := a.proxy.Stats()
		w.family("keybrake_proxy_requests_total", "counter",
			"Requests through the metering proxy, by the decision and reason (code) of their canonical log line.")
		for _, r := range s.Requests {
			w.sample("keybrake_proxy_requests_total", u64(r.Count), "decision", r.Decision, "code", r.Code)
		}
		w.family("keybrake_proxy_upstream_requests_total", "counter",
			"Requests keybrake sent to Stripe: forwarded requests and amount lookups, by status class of the answer (error: no answer).")
		for _, u := range s.Upstream {
			w.sample("keybrake_proxy_upstream_requests_total", u64(u.Count), "kind", u.Kind, "status_class", u.StatusClass)
		}
		const dur = "keybrake_proxy_request_duration_seconds"
		w.family(dur, "histogram", "Time from a proxied request's arrival to the end of its answer.")
		for _, b := range s.Duration.Buckets {
			w.sample(dur+"_bucket", u64(b.Count), "le", formatFloat(b.UpperBound))
		}
		w.sample(dur+"_bucket", u64(s.Duration.Count), "le", "+Inf")
		w.sample(dur+"_sum", formatFloat(s.Duration.Sum))
		w.sample(dur+"_count", u64(s.Duration.Count))
		w.family("keybrake_upstream_auth_failures_total", "counter",
			"Stripe answers of 401 or 403 to keybrake's own upstream secret (wrong, rolled or lacking a permission): nothing executed, the request was refused.")
		w.sample("keybrake_upstream_auth_failures_total", u64(s.UpstreamAuthFailures))
	}

	st := a.store.Stats()
	w.family("keybrake_store_commits_total", "counter",
		"Write transactions run by the store's group committer (Reserve, Settle, claims), each shared by the operations of its batch.")
	w.sample("keybrake_store_commits_total", strconv.FormatInt(st.Commits, 10))
	w.family("keybrake_store_ops_total", "counter",
		"Operations carried by the group committer's write transactions; ops/commits is the batching factor.")
	w.sample("keybrake_store_ops_total", strconv.FormatInt(st.Ops, 10))
	w.family("keybrake_holds_unknown", "gauge",
		"Holds whose outcome is unknown (Stripe gave no answer): money that may have moved, waiting for a retry or an operator.")
	w.sample("keybrake_holds_unknown", strconv.Itoa(unknown))

	return c.Blob(http.StatusOK, ContentTypeMetrics, w.buf.Bytes())
}

// exposition writes the Prometheus text format (0.0.4): per metric family a HELP
// and a TYPE line, then its samples, one per line, each ending in "\n".
type exposition struct {
	buf bytes.Buffer
}

// family writes the HELP and TYPE lines of a metric family.
func (w *exposition) family(name, typ, help string) {
	w.buf.WriteString("# HELP " + name + " " + helpEscaper.Replace(help) + "\n")
	w.buf.WriteString("# TYPE " + name + " " + typ + "\n")
}

// sample writes one sample; labels are name, value pairs.
func (w *exposition) sample(name, value string, labels ...string) {
	w.buf.WriteString(name)
	if len(labels) > 0 {
		w.buf.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				w.buf.WriteByte(',')
			}
			w.buf.WriteString(labels[i] + `="` + labelEscaper.Replace(labels[i+1]) + `"`)
		}
		w.buf.WriteByte('}')
	}
	w.buf.WriteString(" " + value + "\n")
}

// The escapes of the text format: a label value escapes backslash, double quote
// and line feed; a HELP text backslash and line feed.
var (
	labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)

func u64(n uint64) string { return strconv.FormatUint(n, 10) }

// formatFloat renders a sample value or bucket bound as Prometheus's clients do:
// the shortest representation, +Inf, -Inf and NaN.
func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	case math.IsNaN(f):
		return "NaN"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
