package webhooks_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api/webhooks"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

func benchStore(b *testing.B) vault.Store {
	b.Helper()
	s, err := bolt.Open(filepath.Join(b.TempDir(), "keybrake.db"), bolt.Options{MasterKey: make([]byte, 32)})
	require.NoError(b, err)
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkOutboxDrain: deliveries per second from a full outbox (bbolt) to
// a receiver on 127.0.0.1 that answers 204: claim, sign, POST, record.
//
//	go test -run '^$' -bench OutboxDrain -benchtime 2000x ./api/webhooks
func BenchmarkOutboxDrain(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	b.Cleanup(srv.Close)
	s := benchStore(b)
	ctx := context.Background()
	w, _, err := s.CreateWebhook(ctx, "bench", vault.WebhookInput{URL: srv.URL, Events: []string{"*"}})
	require.NoError(b, err)
	for range b.N {
		_, err := s.TestWebhook(ctx, "bench", w.ID)
		require.NoError(b, err)
	}
	d := &webhooks.Deliverer{Store: s, Client: webhooks.NewClient(webhooks.Guard{AllowPrivate: true})}
	b.ResetTimer()
	start := time.Now()
	done := 0
	for done < b.N {
		n := d.Drain(ctx)
		require.NotZero(b, n)
		done += n
	}
	b.ReportMetric(float64(done)/time.Since(start).Seconds(), "deliveries/s")
}

// BenchmarkCommitToFirstDelivery: the time from the commit of an event to
// its arrival at the receiver, with serve's deliverer (polling every 200 ms)
// running; one event at a time, each committed after the previous one was
// recorded.
//
//	go test -run '^$' -bench CommitToFirstDelivery -benchtime 50x ./api/webhooks
func BenchmarkCommitToFirstDelivery(b *testing.B) {
	got := make(chan time.Time, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		got <- time.Now()
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	s := benchStore(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, _, err := s.CreateWebhook(ctx, "bench", vault.WebhookInput{URL: srv.URL, Events: []string{"*"}})
	require.NoError(b, err)
	d := &webhooks.Deliverer{Store: s, Client: webhooks.NewClient(webhooks.Guard{AllowPrivate: true})}
	stopped := make(chan struct{})
	go func() { defer close(stopped); d.Run(ctx) }()
	defer func() { cancel(); <-stopped }()
	var lat []time.Duration
	b.ResetTimer()
	for range b.N {
		_, err := s.TestWebhook(ctx, "bench", w.ID)
		committed := time.Now()
		require.NoError(b, err)
		lat = append(lat, (<-got).Sub(committed))
		// The next event is committed once this one is recorded, while the
		// deliverer waits for its next look at the outbox (at any point of
		// its 200 ms), not while it is still draining.
		for {
			ds, _, err := s.ListDeliveries(ctx, w.ID, 1, "")
			require.NoError(b, err)
			if ds[0].State == vault.DeliveryDelivered {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(lat[len(lat)*9/10].Microseconds())/1000, "p90-ms")
}
