package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// BenchmarkMeteredCharge measures a money-moving POST through the whole pipeline
// (authenticate, parse, classify, one durable Reserve, forward to the fake Stripe,
// one durable Settle, remaining-budget read) from parallel clients.
func BenchmarkMeteredCharge(b *testing.B) {
	e := MustEnv(b)
	tok, _ := e.MustKey(b, Policy("100000000.00"))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var n atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, e.URL+"/v1/charges",
				stringsReader("amount=100&currency=usd&source=tok_visa"))
			require.NoError(b, err)
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Idempotency-Key", fmt.Sprintf("bench-%d", i))
			r := MustDo(b, client, req)
			if r.Status != http.StatusOK {
				b.Fatalf("status %d: %s", r.Status, r.Raw)
			}
		}
	})
}

// BenchmarkRead measures a read (no store write) through the pipeline.
func BenchmarkRead(b *testing.B) {
	e := MustEnv(b)
	tok, _ := e.MustKey(b, Policy("99.00"))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, err := http.NewRequest(http.MethodGet, e.URL+"/v1/customers/cus_1", nil)
			require.NoError(b, err)
			req.Header.Set("Authorization", "Bearer "+tok)
			r := MustDo(b, client, req)
			if r.Status != http.StatusOK {
				b.Fatalf("status %d: %s", r.Status, r.Raw)
			}
		}
	})
}

// BenchmarkFingerprint measures the request fingerprint (SHA-256 over method, path,
// account headers and the canonical parameters) that every recorded request
// computes, from the canonical form (stripeapi's BenchmarkCanonical measures that).
func BenchmarkFingerprint(b *testing.B) {
	for _, bc := range []struct{ name, body string }{
		{"charge", "amount=2000&currency=usd&customer=cus_123&description=Order+42&metadata[order_id]=42"},
		{"checkout", "line_items[0][price_data][currency]=usd&line_items[0][price_data][product_data][name]=T-shirt&" +
			"line_items[0][price_data][unit_amount]=2000&line_items[0][quantity]=2&line_items[1][price_data][currency]=usd&" +
			"line_items[1][price_data][product_data][name]=Sticker&line_items[1][price_data][unit_amount]=500&" +
			"line_items[1][quantity]=1&metadata[order_id]=42&mode=payment&success_url=https%3A%2F%2Fexample.com%2Fsuccess"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			params, err := stripeapi.ParseForm([]byte(bc.body))
			require.NoError(b, err)
			canonical := params.Canonical()
			b.SetBytes(int64(len(canonical)))
			b.ReportAllocs()
			for b.Loop() {
				if fp := proxy.Fingerprint(http.MethodPost, "/v1/charges", "acct_123", "", canonical); len(fp) != 64 {
					b.Fatalf("fingerprint %q", fp)
				}
			}
		})
	}
}
