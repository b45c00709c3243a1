package api

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keybrake/keybrake/vault"
)

// webhookMetrics are the deliverer's counters, registered by NewMetrics.
type webhookMetrics struct {
	attempts *prometheus.CounterVec
	seconds  prometheus.Histogram
}

func newWebhookMetrics(reg prometheus.Registerer) (*webhookMetrics, error) {
	w := &webhookMetrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keybrake_webhook_attempts_total",
			Help: "Attempts to deliver a webhook event, by result: delivered (2xx), failed (any other status, or no answer).",
		}, []string{"result"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "keybrake_webhook_attempt_duration_seconds",
			Help:    "How long a webhook endpoint took to answer an attempt (15 s at most).",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15},
		}),
	}
	for _, c := range []prometheus.Collector{w.attempts, w.seconds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register webhook metrics: %w", err)
		}
	}
	w.attempts.WithLabelValues("delivered")
	w.attempts.WithLabelValues("failed")
	return w, nil
}

// ObserveDelivery records one attempt of the webhook deliverer.
func (m *Metrics) ObserveDelivery(_ vault.DeliveryJob, res vault.DeliveryResult, took time.Duration) {
	if m == nil || m.webhooks == nil {
		return
	}
	result := "failed"
	if res.Status >= 200 && res.Status < 300 {
		result = "delivered"
	}
	m.webhooks.attempts.WithLabelValues(result).Inc()
	m.webhooks.seconds.Observe(took.Seconds())
}
