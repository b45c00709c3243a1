package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/proxy/proxytest"
)

// receivedEvent is one delivery a receiver accepted.
type receivedEvent struct {
	ID   string
	Type string
	Data map[string]any
}

// receiver is an operator's webhook endpoint on 127.0.0.1: it verifies every
// delivery with the Standard Webhooks library (not keybrake's code) and
// answers status() (200 when nil) to the verified ones, 400 to the others.
type receiver struct {
	*httptest.Server
	secret   atomic.Pointer[string]
	status   atomic.Pointer[func() int]
	mu       sync.Mutex
	events   []receivedEvent
	rejected atomic.Int64
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		sec := r.secret.Load()
		if sec == nil {
			r.rejected.Add(1)
			http.Error(w, "no secret yet", http.StatusServiceUnavailable)
			return
		}
		wh, err := standardwebhooks.NewWebhook(*sec)
		if err == nil {
			err = wh.Verify(body, req.Header)
		}
		if err != nil {
			r.rejected.Add(1)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var ev struct {
			Type      string         `json:"type"`
			Timestamp time.Time      `json:"timestamp"`
			Data      map[string]any `json:"data"`
		}
		if err := json.Unmarshal(body, &ev); err != nil || ev.Timestamp.IsZero() {
			r.rejected.Add(1)
			http.Error(w, "not an event", http.StatusBadRequest)
			return
		}
		status := http.StatusOK
		if f := r.status.Load(); f != nil {
			status = (*f)()
		}
		r.mu.Lock()
		if status < 300 {
			r.events = append(r.events, receivedEvent{ID: req.Header.Get("webhook-id"), Type: ev.Type, Data: ev.Data})
		}
		r.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) setStatus(f func() int) { r.status.Store(&f) }

// got returns the accepted events of type typ.
func (r *receiver) got(typ string) []receivedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []receivedEvent
	for _, e := range r.events {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// mustCreateWebhook creates an endpoint through the admin API and gives its
// secret to r.
func mustCreateWebhook(t *testing.T, admin, token string, r *receiver, events []string, thresholds []int) string {
	t.Helper()
	var created struct {
		ID     string `json:"id"`
		Secret string `json:"secret"`
	}
	require.Equal(t, http.StatusCreated, adminDo(t, http.MethodPost, admin+"/webhooks", token, map[string]any{
		"url": r.URL + "/hooks", "events": events, "thresholds": thresholds,
	}, &created))
	require.True(t, strings.HasPrefix(created.Secret, "whsec_"))
	r.secret.Store(&created.Secret)
	return created.ID
}

type deliveryList struct {
	Deliveries []struct {
		ID        string `json:"id"`
		EventID   string `json:"event_id"`
		EventType string `json:"event_type"`
		State     string `json:"state"`
		Attempts  int    `json:"attempts"`
		// LastStatus is set when an attempt's outcome is recorded; until
		// then the delivery is pending under the attempt's lease.
		LastStatus int `json:"last_status"`
	} `json:"deliveries"`
}

// waitFor polls cond every 50 ms until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			require.FailNow(t, "timed out waiting", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWebhooksAcrossReplicasOneCrossing: two replicas on one PostgreSQL
// database, 100 concurrent $1 charges spread over both against a $100 daily
// and period cap: the receiver gets exactly one budget.threshold_crossed per
// window and threshold, each delivered once, verified by the Standard
// Webhooks library.
func TestWebhooksAcrossReplicasOneCrossing(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs two real replicas")
	}
	dbURL := migrated.URL(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_webhooks_replicas")
	store, masterText := MustPostgresVault(t, dbURL, fake.Secret)
	key, tok := MustMintKey(t, store, "cust_hooks", 100)
	rs := MustReplicas(t, 2, dbURL, fake.URL, masterText, "--upstream-timeout", "10s", "--webhook-allow-private")
	token, err := api.IssueToken([]byte(replicaJWTSecret), "webhooks-test", api.RoleAdmin, time.Hour, time.Now())
	require.NoError(t, err)
	rcv := newReceiver(t)
	hookID := mustCreateWebhook(t, rs.adminURL(0)+"/api/v1", token, rcv, []string{"budget.threshold_crossed"}, []int{50, 100})

	client := &http.Client{Timeout: 30 * time.Second}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var ok atomic.Int64
	for i := range 100 {
		wg.Go(func() {
			<-start
			req, err := http.NewRequest(http.MethodPost, rs.proxyURL(i%2)+"/v1/charges", strings.NewReader(chargeForm(100, fmt.Sprint(i)).Encode()))
			if !assert.NoError(t, err) {
				return
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Idempotency-Key", fmt.Sprintf("hooks-%d", i))
			resp, err := client.Do(req)
			if assert.NoError(t, err) {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ok.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	require.Equal(t, int64(100), ok.Load())

	waitFor(t, 30*time.Second, "the crossings delivered", func() bool { return len(rcv.got("budget.threshold_crossed")) >= 4 })
	// Every delivery of the endpoint is done: nothing more will come.
	var list deliveryList
	waitFor(t, 30*time.Second, "every delivery done", func() bool {
		require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, rs.adminURL(1)+"/api/v1/webhooks/"+hookID+"/deliveries", token, nil, &list))
		for _, d := range list.Deliveries {
			if d.State != "delivered" {
				return false
			}
		}
		return len(list.Deliveries) > 0
	})
	assert.Len(t, list.Deliveries, 4)
	got := rcv.got("budget.threshold_crossed")
	require.Len(t, got, 4, "one event per window and threshold, each received once")
	crossings, ids := map[string]int{}, map[string]bool{}
	for _, e := range got {
		crossings[fmt.Sprintf("%s %v", e.Data["window"], e.Data["threshold"])]++
		ids[e.ID] = true
		assert.Equal(t, key.ID, e.Data["scope"].(map[string]any)["id"])
	}
	assert.Equal(t, map[string]int{"daily 50": 1, "daily 100": 1, "period 50": 1, "period 100": 1}, crossings)
	assert.Len(t, ids, 4)
	assert.Zero(t, rcv.rejected.Load(), "every delivery verifies")
	rs.stopAll()
}

// TestWebhookDeliverySurvivesKill9: without --webhook-allow-private an
// endpoint on 127.0.0.1 is refused; with it, a delivery whose first attempt
// failed is retried after a kill -9 and a restart, with the same webhook-id.
func TestWebhookDeliverySurvivesKill9(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and kills the real binary")
	}
	bin := MustBuildBinary(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_webhooks_kill9")
	dataDir := t.TempDir()
	masterText, err := newMasterKeyText()
	require.NoError(t, err)
	const jwtSecret = "webhooks-jwt-secret-webhooks-jwt-secret"
	token, err := api.IssueToken([]byte(jwtSecret), "webhooks-test", api.RoleAdmin, time.Hour, time.Now())
	require.NoError(t, err)
	environ := childEnviron(envMasterKey+"="+masterText, envJWTSecret+"="+jwtSecret, envStripeKey+"="+fake.Secret)
	args := []string{"serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--stripe-url", fake.URL, "--log-format", "json"}
	var current atomic.Pointer[child]
	t.Cleanup(func() {
		if c := current.Load(); c != nil {
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	})
	start := func(extra ...string) string {
		c := startChild(t, bin, append(append([]string{}, args...), extra...), environ)
		current.Store(c)
		c.waitReady(t)
		return "http://" + *c.admin.Load() + "/api/v1"
	}
	kill := func() {
		c := current.Load()
		require.Error(t, c.signalAndWait(t, syscall.SIGKILL, 30*time.Second))
		require.False(t, c.raceSeen.Load(), "data race:\n%s", c.logs())
	}
	rcv := newReceiver(t)

	admin := start()
	status := adminDo(t, http.MethodPost, admin+"/webhooks", token, map[string]any{"url": rcv.URL + "/hooks", "events": []string{"*"}}, nil)
	assert.Equal(t, http.StatusUnprocessableEntity, status, "loopback refused without --webhook-allow-private")
	kill()

	admin = start("--webhook-allow-private")
	hookID := mustCreateWebhook(t, admin, token, rcv, []string{"*"}, nil)
	var attempts atomic.Int64
	rcv.setStatus(func() int {
		attempts.Add(1)
		return http.StatusServiceUnavailable
	})
	var queued struct {
		ID      string `json:"id"`
		EventID string `json:"event_id"`
	}
	require.Equal(t, http.StatusAccepted, adminDo(t, http.MethodPost, admin+"/webhooks/"+hookID+"/test", token, nil, &queued))
	waitFor(t, 20*time.Second, "the first attempt", func() bool { return attempts.Load() >= 1 })
	var list deliveryList
	waitFor(t, 20*time.Second, "the failure recorded", func() bool {
		adminDo(t, http.MethodGet, admin+"/webhooks/"+hookID+"/deliveries", token, nil, &list)
		return len(list.Deliveries) == 1 && list.Deliveries[0].Attempts == 1 && list.Deliveries[0].State == "pending" &&
			list.Deliveries[0].LastStatus == http.StatusServiceUnavailable
	})
	kill()

	rcv.setStatus(func() int { return http.StatusNoContent })
	admin = start("--webhook-allow-private")
	waitFor(t, 30*time.Second, "the retry after the restart", func() bool { return len(rcv.got("webhook.test")) == 1 })
	got := rcv.got("webhook.test")[0]
	assert.Equal(t, queued.EventID, got.ID, "the webhook-id is stable across attempts and restarts")
	assert.Equal(t, hookID, got.Data["webhook_id"])
	waitFor(t, 20*time.Second, "delivered", func() bool {
		adminDo(t, http.MethodGet, admin+"/webhooks/"+hookID+"/deliveries", token, nil, &list)
		return len(list.Deliveries) == 1 && list.Deliveries[0].State == "delivered"
	})
	assert.Equal(t, 2, list.Deliveries[0].Attempts)
}
