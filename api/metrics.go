package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// NearCapPercent is the share of a cap, in percent, from which a key counts in
// keybrake_keys_near_cap.
const NearCapPercent = 90

// scrapeTimeout bounds the store reads of one scrape.
const scrapeTimeout = 30 * time.Second

// Metrics are keybrake's Prometheus collectors outside the metering proxy (which
// registers its own, see proxy.Config.Registerer): the build, the Go runtime and
// the process, the store's group commits and its contents, and the reaper. They
// live on a registry that `serve` owns and hands to every component; nothing uses
// the global default registry.
type Metrics struct {
	reg            prometheus.Registerer
	commitDuration prometheus.Histogram
	batchSize      prometheus.Histogram
	reaperRuns     *prometheus.CounterVec
	reaperRemoved  prometheus.Counter
	webhooks       *webhookMetrics
}

// NewMetrics registers on reg the build info (version), the Go runtime and process
// collectors, the store's commit histograms and the reaper's counters. Feed them
// with ObserveCommit (bolt.Options.CommitObserver) and ObserveReap, and add the
// store's own gauges with WatchStore once the store is open.
func NewMetrics(reg prometheus.Registerer, version string) (*Metrics, error) {
	m := &Metrics{
		reg: reg,
		commitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "keybrake_store_commit_duration_seconds",
			Help:    "Write transactions of the store's group committer (holds, settles, claims), fsyncs included; _count is the number of commits.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1},
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "keybrake_store_commit_batch_size",
			Help:    "Operations carried by each write transaction of the group committer: how many callers shared one fsync; _sum is the number of operations.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9), // 1 … 256, the largest batch
		}),
		reaperRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keybrake_reaper_runs_total",
			Help: "Runs of the reaper that removes expired idempotency records, claims and old counters, by result (ok or error).",
		}, []string{"result"}),
		reaperRemoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keybrake_reaper_removed_total",
			Help: "Entries the reaper removed.",
		}),
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "keybrake_build_info",
		Help:        "The running keybrake's version; always 1.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	buildInfo.Set(1)
	m.reaperRuns.WithLabelValues("ok")
	m.reaperRuns.WithLabelValues("error")
	for _, c := range []prometheus.Collector{
		buildInfo,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.commitDuration, m.batchSize, m.reaperRuns, m.reaperRemoved,
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	var err error
	if m.webhooks, err = newWebhookMetrics(reg); err != nil {
		return nil, err
	}
	return m, nil
}

// ObserveCommit records one write transaction of the store's group committer; it
// is a bolt.Options.CommitObserver.
func (m *Metrics) ObserveCommit(ops int, d time.Duration) {
	m.commitDuration.Observe(d.Seconds())
	m.batchSize.Observe(float64(ops))
}

// ObserveReap records one run of the reaper: how many entries it removed, and
// whether it failed.
func (m *Metrics) ObserveReap(removed int, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.reaperRuns.WithLabelValues(result).Inc()
	m.reaperRemoved.Add(float64(removed))
}

// WatchStore registers the gauges read from the store at each scrape: unknown
// holds, the file's size, the active keys, the money in their current windows per
// currency, the keys near a cap, why the server is not ready (readiness's own
// write probe, whose failures log reports at Error), and the settles waiting for
// a retry.
func (m *Metrics) WatchStore(store vault.Store, log *slog.Logger) error {
	if err := m.reg.Register(newStoreCollector(store, log)); err != nil {
		return fmt.Errorf("register store metrics: %w", err)
	}
	return nil
}

// storeCollector reads the store's gauges at scrape time. Scrapes are serialized:
// counting unknown holds and summarizing usage walk the hold index and the keys,
// and concurrent scrapes must not multiply that work. A store failure fails the
// whole scrape (500), so Prometheus's up metric shows it.
type storeCollector struct {
	store vault.Store
	mu    sync.Mutex

	log *slog.Logger

	unknown, size, active, nearCap, committed, held, clockOffset, notReady, pending *prometheus.Desc
}

func newStoreCollector(store vault.Store, log *slog.Logger) *storeCollector {
	return &storeCollector{
		store: store,
		log:   log,
		notReady: prometheus.NewDesc("keybrake_not_ready",
			"1 for the reason the store's last hot-path commit (a request's, or GET /readyz's write probe) failed — no_space: the disk is full; storage: another storage failure; closed — and 0 for the others: all 0 while commits succeed. GET /readyz answers 503 meanwhile.",
			[]string{"reason"}, nil),
		pending: prometheus.NewDesc("keybrake_settles_pending",
			"Settles of requests Stripe answered whose commit failed (a full disk): kept in memory and retried until durable. A crash now would leave their records outcome unknown.", nil, nil),
		unknown: prometheus.NewDesc("keybrake_holds_unknown",
			"Holds whose outcome is unknown (Stripe gave no answer): money that may have moved, waiting for a retry with the same idempotency key or an operator (GET /api/v1/holds?state=unknown).", nil, nil),
		clockOffset: prometheus.NewDesc("keybrake_store_clock_offset_seconds",
			"How far the store's clock (PostgreSQL: the database's, by which every key and window is decided) is ahead of this replica's own (negative: behind), as measured at the start of the latest transaction; absent on bbolt, whose clock is the process's. /readyz fails beyond --max-clock-offset.", nil, nil),
		size: prometheus.NewDesc("keybrake_store_size_bytes",
			"Size of the store on disk: the bbolt database file, or keybrake's tables in PostgreSQL (with their indexes).", nil, nil),
		active: prometheus.NewDesc("keybrake_keys_active",
			"Vault keys that are neither revoked nor expired.", nil, nil),
		nearCap: prometheus.NewDesc("keybrake_keys_near_cap",
			fmt.Sprintf("Active vault keys whose committed + held in their current window (daily: today in the key's time zone; period) has reached %d %% of its cap.", NearCapPercent),
			[]string{"window"}, nil),
		committed: prometheus.NewDesc("keybrake_committed_minor_units",
			"Money committed in the current windows of the active keys, summed per currency, in the currency's minor unit (cents for usd).",
			[]string{"currency", "window"}, nil),
		held: prometheus.NewDesc("keybrake_held_minor_units",
			"Money held (requests in flight or with an unknown outcome, and the exposure of money objects) in the current windows of the active keys, summed per currency, in the currency's minor unit.",
			[]string{"currency", "window"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.unknown, c.size, c.active, c.nearCap, c.committed, c.held, c.clockOffset, c.notReady, c.pending} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()

	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	why := commitFailure(c.store.CommitError())
	for _, r := range notReadyReasons {
		v := 0.0
		if r == why {
			v = 1
		}
		gauge(c.notReady, v, r)
	}
	gauge(c.pending, float64(c.store.PendingSettles()))
	if n, err := c.store.CountHolds(ctx, vault.HoldUnknown); err != nil {
		ch <- prometheus.NewInvalidMetric(c.unknown, err)
	} else {
		gauge(c.unknown, float64(n))
	}
	if cr, ok := c.store.(vault.ClockReader); ok {
		if off, ok := cr.ClockOffset(); ok {
			gauge(c.clockOffset, off.Seconds())
		}
	}
	if n, err := c.store.Size(ctx); err != nil {
		ch <- prometheus.NewInvalidMetric(c.size, err)
	} else {
		gauge(c.size, float64(n))
	}
	sum, err := c.store.SummarizeUsage(ctx, NearCapPercent)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.active, err)
		return
	}
	gauge(c.active, float64(sum.ActiveKeys))
	for _, w := range []policy.WindowKind{policy.WindowDaily, policy.WindowPeriod} {
		gauge(c.nearCap, float64(sum.NearCap[w]), string(w))
	}
	for cw, cnt := range sum.Totals {
		gauge(c.committed, float64(cnt.Committed), cw.Currency, string(cw.Window))
		gauge(c.held, float64(cnt.Held), cw.Currency, string(cw.Window))
	}
}

// metricsHandler serves g in the Prometheus exposition formats (text by default,
// others as the scraper negotiates). A collector's error fails the scrape with
// 500; it is logged once.
func metricsHandler(g prometheus.Gatherer, log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorHandling: promhttp.HTTPErrorOnError,
		ErrorLog:      promLogger{log},
	})
}

// promLogger passes promhttp's error messages to slog at Error.
type promLogger struct{ log *slog.Logger }

// Println implements promhttp.Logger.
func (l promLogger) Println(v ...any) {
	l.log.Error("metrics scrape failed", slog.String(logfield.Error, fmt.Sprint(v...)))
}
