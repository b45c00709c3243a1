package api_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"
	"go.yaml.in/yaml/v3"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault/bolt"
)

// A version with every character the text format must escape in a label value.
const metricsTestVersion = "v9.9.9-test \"quoted\" back\\slash\nnext line"

// MustMetricsAdmin starts the admin API over the agent env's store, serving the
// env's registry at /metrics.
func MustMetricsAdmin(tb testing.TB, env *agentEnv) *httptest.Server {
	tb.Helper()
	h := api.NewAdmin(api.AdminConfig{
		Store:     env.store,
		Logger:    slog.New(slog.NewJSONHandler(env.logs, nil)),
		JWTSecret: []byte("test-jwt-secret-0123456789abcdef-xyz"),
		Now:       env.clock.Now,
		Metrics:   env.registry,
	})
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	return srv
}

// scrape is a parsed exposition, by metric family name.
type scrape map[string]*dto.MetricFamily

// MustScrape GETs /metrics without a token, as a plain client does (no content
// negotiation: the text format), and parses it with Prometheus's own parser.
func MustScrape(tb testing.TB, url string) scrape {
	tb.Helper()
	resp, err := http.Get(url + "/metrics")
	require.NoError(tb, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	require.Equal(tb, http.StatusOK, resp.StatusCode, "body: %s", body)
	assert.True(tb, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4"), resp.Header.Get("Content-Type"))
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(tb, err, "exposition:\n%s", body)
	return families
}

func (s scrape) families() []*dto.MetricFamily { return slices.Collect(maps.Values(s)) }

// Value is the value of the series name{labels} (see proxytest.MetricValue).
func (s scrape) Value(name string, labels ...string) float64 {
	return proxytest.MetricValue(s.families(), name, labels...)
}

// Sum adds every series of name (histograms: sample counts).
func (s scrape) Sum(name string) float64 { return proxytest.MetricSum(s.families(), name) }

// HistogramSum is the sum of the observations of the histogram name (one series).
func (s scrape) HistogramSum(name string) float64 {
	f := s[name]
	if f == nil || len(f.GetMetric()) == 0 {
		return 0
	}
	return f.GetMetric()[0].GetHistogram().GetSampleSum()
}

func TestMetricsAfterTraffic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := MustAgentEnv(t)
	admin := MustMetricsAdmin(t, env)
	_, tok := env.MustKey("metered", seedPolicy, nil) // daily cap 99.00 usd, period 110.00
	sc := env.Stripe(tok)
	charge := func(amount int64, idem string) error {
		p := &stripe.ChargeCreateParams{
			Amount: stripe.Int64(amount), Currency: stripe.String("usd"),
			Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
		}
		p.SetIdempotencyKey(idem)
		_, err := sc.V1Charges.Create(ctx, p)
		return err
	}

	before := MustScrape(t, admin.URL)
	assert.Equal(t, 1.0, before.Value("keybrake_build_info", "version", metricsTestVersion, "goversion", runtime.Version()),
		"the version label survives escaping")
	assert.Equal(t, 0.0, before.Value("keybrake_holds_unknown"))
	assert.Equal(t, 1.0, before.Value("keybrake_keys_active"))

	require.NoError(t, charge(6000, "m-1"), "allowed")
	var se *stripe.Error
	require.ErrorAs(t, charge(5000, "m-2"), &se, "60 + 50 passes the daily cap")
	assert.Equal(t, http.StatusPaymentRequired, se.HTTPStatusCode)
	require.NoError(t, charge(6000, "m-1"), "replayed")
	env.fake.FailNext(proxytest.FailAfterCreate500, 1)
	require.ErrorAs(t, charge(3000, "m-3"), &se, "Stripe answers 500: outcome unknown")
	assert.Equal(t, http.StatusInternalServerError, se.HTTPStatusCode)
	r := env.Do(http.MethodGet, "/v1/charges", "vk_not_a_key", nil)
	require.Equal(t, http.StatusUnauthorized, r.Status)
	env.fake.WaitIdle(t)
	// m-3's settle was queued when its answer went out: a read waits for it.
	require.NoError(t, env.store.CheckInvariant(ctx))

	after := MustScrape(t, admin.URL)
	delta := func(name string, labels ...string) float64 {
		return after.Value(name, labels...) - before.Value(name, labels...)
	}
	const req = "keybrake_proxy_requests_total"
	assert.Equal(t, 2.0, delta(req, "operation", "charges.create", "outcome", "allowed"), "m-1 and m-3")
	assert.Equal(t, 1.0, delta(req, "operation", "charges.create", "outcome", "refused"))
	assert.Equal(t, 1.0, delta(req, "operation", "charges.create", "outcome", "replayed"))
	assert.Equal(t, 1.0, delta(req, "operation", "unclassified", "outcome", "refused"), "no valid key")
	assert.Equal(t, 5.0, after.Sum(req)-before.Sum(req), "every request counted once")
	assert.Equal(t, 1.0, delta("keybrake_proxy_refusals_total", "reason", "spend_cap_exceeded", "mode", "enforce"))
	assert.Equal(t, 1.0, delta("keybrake_proxy_refusals_total", "reason", "vault_key_invalid", "mode", "enforce"))

	const up = "keybrake_upstream_request_duration_seconds"
	assert.Equal(t, 1.0, delta(up, "kind", "forward", "status_class", "2xx"))
	assert.Equal(t, 1.0, delta(up, "kind", "forward", "status_class", "5xx"))
	assert.Equal(t, 2.0, after.Sum(up)-before.Sum(up), "only m-1 and m-3 reached Stripe; no lookups")
	assert.Equal(t, 2, env.fake.Count())
	assert.Equal(t, 5.0, delta("keybrake_proxy_request_duration_seconds"))
	assert.Equal(t, 5.0, delta("keybrake_proxy_added_latency_seconds"))
	assert.Greater(t, after.HistogramSum("keybrake_proxy_request_duration_seconds"),
		after.HistogramSum("keybrake_proxy_added_latency_seconds"), "Stripe's share is not keybrake's")
	assert.Zero(t, after.Value("keybrake_upstream_auth_failures_total"), "registered, and zero")
	assert.Contains(t, after, "keybrake_upstream_auth_failures_total")

	// Five operations: a Reserve for each of m-1, m-2 and m-3, a Settle for
	// m-1 and m-3; the replay is answered from a read. A queued settle may
	// share its commit with the next request's Reserve.
	commits := delta("keybrake_store_commit_duration_seconds")
	assert.Equal(t, commits, delta("keybrake_store_commit_batch_size"))
	assert.GreaterOrEqual(t, commits, 3.0)
	assert.LessOrEqual(t, commits, 5.0)
	assert.Equal(t, 5.0, after.HistogramSum("keybrake_store_commit_batch_size")-before.HistogramSum("keybrake_store_commit_batch_size"),
		"five operations, none for the replay")
	assert.Equal(t, 1.0, after.Value("keybrake_holds_unknown"), "m-3's hold")

	// Money in the current windows, in cents: m-1 committed, m-3 held. The daily
	// window (60 + 30 of 99) is at 90 %; the period (90 of 110) is not.
	for _, w := range []string{"daily", "period"} {
		assert.Equal(t, 6000.0, after.Value("keybrake_committed_minor_units", "currency", "usd", "window", w), w)
		assert.Equal(t, 3000.0, after.Value("keybrake_held_minor_units", "currency", "usd", "window", w), w)
	}
	assert.Equal(t, 1.0, after.Value("keybrake_keys_near_cap", "window", "daily"))
	assert.Equal(t, 0.0, after.Value("keybrake_keys_near_cap", "window", "period"))
	assert.Len(t, after["keybrake_keys_near_cap"].GetMetric(), 2, "both windows are always there, for alerts")
	assert.Positive(t, after.Value("keybrake_store_size_bytes"))

	for name, typ := range map[string]dto.MetricType{
		"keybrake_build_info": dto.MetricType_GAUGE, req: dto.MetricType_COUNTER, up: dto.MetricType_HISTOGRAM,
		"keybrake_proxy_refusals_total":          dto.MetricType_COUNTER,
		"keybrake_proxy_added_latency_seconds":   dto.MetricType_HISTOGRAM,
		"keybrake_store_commit_duration_seconds": dto.MetricType_HISTOGRAM,
		"keybrake_store_commit_batch_size":       dto.MetricType_HISTOGRAM,
		"keybrake_holds_unknown":                 dto.MetricType_GAUGE,
		"keybrake_keys_near_cap":                 dto.MetricType_GAUGE,
		"keybrake_reaper_runs_total":             dto.MetricType_COUNTER,
		"keybrake_reaper_removed_total":          dto.MetricType_COUNTER,
		"go_goroutines":                          dto.MetricType_GAUGE,
		"process_resident_memory_bytes":          dto.MetricType_GAUGE,
	} {
		f := after[name]
		if assert.NotNil(t, f, name) {
			assert.Equal(t, typ, f.GetType(), name)
			assert.NotEmpty(t, f.GetHelp(), name)
		}
	}

	// No label anywhere carries a key, a token or a customer: cardinality stays
	// bounded however many keys there are.
	for name, f := range after {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				assert.NotContains(t, []string{"key_id", "key", "customer", "token", "name"}, l.GetName(), name)
				assert.False(t, strings.HasPrefix(l.GetValue(), "key_") || strings.HasPrefix(l.GetValue(), "vk_"),
					"%s: %s=%s", name, l.GetName(), l.GetValue())
			}
		}
	}
}

func TestMetricsReaperRuns(t *testing.T) {
	t.Parallel()
	env := MustAgentEnv(t)
	admin := MustMetricsAdmin(t, env)
	env.metrics.ObserveReap(3, nil)
	env.metrics.ObserveReap(0, errors.New("disk on fire"))
	s := MustScrape(t, admin.URL)
	assert.Equal(t, 1.0, s.Value("keybrake_reaper_runs_total", "result", "ok"))
	assert.Equal(t, 1.0, s.Value("keybrake_reaper_runs_total", "result", "error"))
	assert.Equal(t, 3.0, s.Value("keybrake_reaper_removed_total"))
}

func TestMetricsWithoutRegistryAndWithoutToken(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)                           // no metrics configured
	r := env.Do(http.MethodGet, "/metrics", "", nil) // checked against the OpenAPI document
	require.Equal(t, http.StatusOK, r.Status, "no token needed")
	assert.Empty(t, strings.TrimSpace(string(r.Body)), "an empty registry")
	r = env.Do(http.MethodPost, "/metrics", "", nil)
	assert.Equal(t, http.StatusMethodNotAllowed, r.Status)
}

func TestMetricsScrapeFailsWhenTheStoreFails(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := api.NewMetrics(reg, "test")
	require.NoError(t, err)
	store, err := bolt.Open(filepath.Join(t.TempDir(), "keybrake.db"), bolt.Options{MasterKey: bytes.Repeat([]byte{1}, 32)})
	require.NoError(t, err)
	require.NoError(t, m.WatchStore(store, slog.Default()))
	logs := &adminLogBuffer{}
	srv := httptest.NewServer(api.NewAdmin(api.AdminConfig{Store: store, Metrics: reg, Logger: slog.New(slog.NewJSONHandler(logs, nil))}))
	t.Cleanup(srv.Close)
	MustScrape(t, srv.URL)

	require.NoError(t, store.Close())
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, "Prometheus's up metric shows a broken store")
	assert.Contains(t, logs.String(), "metrics scrape failed")
	assert.Error(t, m.WatchStore(store, slog.Default()), "registered once")
}

// The example alerting rules in docs/ are valid rules that name metrics keybrake
// really exposes, with label values it really uses.
func TestAlertRulesNameRealMetrics(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "docs", "prometheus", "keybrake-alerts.yml"))
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&rules))
	require.Len(t, rules.Groups, 1)

	env := MustAgentEnv(t)
	families, err := env.registry.Gather()
	require.NoError(t, err)
	series := map[string][]*dto.Metric{}
	for _, f := range families {
		series[f.GetName()] = f.GetMetric()
	}
	selector := regexp.MustCompile(`\b(keybrake_[a-z_]+)(\{([^}]*)\})?`)
	matcher := regexp.MustCompile(`([a-z_]+)="([^"]*)"`)
	alerts := map[string]bool{}
	for _, r := range rules.Groups[0].Rules {
		alerts[r.Alert] = true
		assert.NotEmpty(t, r.Expr, r.Alert)
		assert.NotEmpty(t, r.Annotations["summary"], r.Alert)
		assert.NotEmpty(t, r.Labels["severity"], r.Alert)
		if r.For != "" {
			_, err := model.ParseDuration(r.For)
			assert.NoError(t, err, r.Alert)
		}
		for _, m := range selector.FindAllStringSubmatch(r.Expr, -1) {
			name := m[1]
			ms, ok := series[name]
			if !assert.True(t, ok, "%s: %s is not a metric keybrake exposes", r.Alert, name) {
				continue
			}
			for _, lv := range matcher.FindAllStringSubmatch(m[3], -1) {
				found := false
				for _, metric := range ms {
					for _, l := range metric.GetLabel() {
						found = found || (l.GetName() == lv[1] && l.GetValue() == lv[2])
					}
				}
				assert.True(t, found, "%s: %s has no series with %s=%q", r.Alert, name, lv[1], lv[2])
			}
		}
	}
	for _, want := range []string{"KeybrakeUnknownHolds", "KeybrakeUpstreamAuthFailures", "KeybrakeKeyNearCap"} {
		assert.True(t, alerts[want], want)
	}
}
