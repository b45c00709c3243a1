package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// largeChargeStripe is a Stripe that answers every charge 200 with a large
// answer (random, so that it does not compress): a settle that stores it
// needs fresh pages, which a full disk refuses. Before it answers, it calls
// beforeAnswer. It counts the charges it got.
type largeChargeStripe struct {
	*httptest.Server
	charges      atomic.Int32
	beforeAnswer atomic.Pointer[func()]
}

func newLargeChargeStripe(t *testing.T) *largeChargeStripe {
	t.Helper()
	s := &largeChargeStripe{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/charges" {
			http.NotFound(w, r)
			return
		}
		n := s.charges.Add(1)
		if f := s.beforeAnswer.Load(); f != nil {
			(*f)()
		}
		noise := make([]byte, 1<<20)
		_, _ = rand.Read(noise)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", fmt.Sprintf("req_%d", n))
		fmt.Fprintf(w, `{"id":"ch_%d","object":"charge","amount":700,"currency":"usd","captured":true,"paid":true,"status":"succeeded","description":%q}`,
			n, base64.StdEncoding.EncodeToString(noise))
	}))
	t.Cleanup(s.Close)
	return s
}

// metricValue is the value of the sample line (name and labels exactly, as
// the text exposition writes them) in a scrape, or "" when absent.
func metricValue(scrape, sample string) string {
	for line := range strings.SplitSeq(scrape, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return v
		}
	}
	return ""
}

// eventually polls cond every 50 ms until it holds, for at most a minute.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			require.FailNow(t, "never happened: "+what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFullDisk runs a server on a small file system that fills up after
// Stripe accepted a charge, before keybrake settled it: the caller gets its
// 200; /readyz says the store cannot commit, and keybrake_not_ready says why;
// the settle is kept in memory (keybrake_settles_pending) instead of leaving
// an outcome-unknown hold; an online compact answers 507 "no space". Once
// space is freed, the settle becomes durable by itself, /readyz is ready
// again, and a retry of the charge is a replay that never reaches Stripe.
func TestFullDisk(t *testing.T) {
	t.Parallel()
	small := MustSmallFileSystem(t, 64<<20)
	dataDir := filepath.Join(small, "data")
	stripe := newLargeChargeStripe(t)
	m := MustServe(t, dataDir, stripe.URL, env{envStripeKey: "sk_test_full"})
	_, vaultKey := MustMintKey(t, m.Store(), "full", 100)
	ctx := context.Background()
	scrape := func() string {
		status, body := MustGet(t, m.AdminURL()+"/metrics", "")
		require.Equal(t, http.StatusOK, status, "%s", body)
		return string(body)
	}
	status, body := MustGet(t, m.AdminURL()+"/readyz", "")
	require.Equal(t, http.StatusOK, status, "%s", body)

	var filler string
	var once sync.Once
	fill := func() { once.Do(func() { filler = fillFileSystem(t, small) }) }
	stripe.beforeAnswer.Store(&fill)
	status, body, err := postForm(ctx, http.DefaultClient, m.ProxyURL()+"/v1/charges", vaultKey, "order-1", chargeForm(700, "order-1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "Stripe charged: the caller is told so")
	require.Contains(t, string(body), `"ch_1"`)
	stripe.beforeAnswer.Store(nil)

	status, body = MustGet(t, m.ProxyURL()+"/readyz", "")
	assert.Equal(t, http.StatusServiceUnavailable, status, "a full disk is not ready: %s", body)
	assert.Contains(t, string(body), "no space")
	// The settle was queued when the caller got its answer; it fails soon after.
	eventually(t, "the settle that could not commit is kept for a retry", func() bool {
		return metricValue(scrape(), "keybrake_settles_pending") == "1"
	})
	metrics := scrape()
	assert.Equal(t, "1", metricValue(metrics, `keybrake_not_ready{reason="no_space"}`), "the metric says why")
	assert.Equal(t, "0", metricValue(metrics, `keybrake_not_ready{reason="storage"}`))
	assert.Contains(t, m.stderr.String(), "kept in memory and retried")

	_, err = runCommand(env{}, "compact", "--admin-url", m.AdminURL(), "--data-dir", dataDir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "507")
	assert.Contains(t, err.Error(), "no space")
	leftovers, err := filepath.Glob(filepath.Join(dataDir, ".keybrake.db.compact-*"))
	require.NoError(t, err)
	assert.Empty(t, leftovers, "the failed copy is removed")

	require.NoError(t, os.Remove(filler))
	eventually(t, "the kept settle commits once there is space", func() bool {
		return metricValue(scrape(), "keybrake_settles_pending") == "0"
	})
	status, body = MustGet(t, m.ProxyURL()+"/readyz", "")
	assert.Equal(t, http.StatusOK, status, "%s", body)
	assert.Equal(t, "0", metricValue(scrape(), `keybrake_not_ready{reason="no_space"}`))

	req, err := http.NewRequest(http.MethodPost, m.ProxyURL()+"/v1/charges", strings.NewReader(chargeForm(700, "order-1").Encode()))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+vaultKey)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "order-1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "the settle is durable: the retry replays it")
	assert.Equal(t, int32(1), stripe.charges.Load(), "the retry never reached Stripe")
	holds := MustRunCommand(t, env{}, "check", "--admin-url", m.AdminURL(), "--data-dir", dataDir)
	assert.Contains(t, holds, "invariant: ok")
}
