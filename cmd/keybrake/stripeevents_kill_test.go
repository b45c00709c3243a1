package main

import (
	"context"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault/bolt"
)

// kill -9 right after the events endpoint answered 200: the event's effect was
// committed with its id, so after a restart the money is counted and a
// re-delivery of the event (Stripe never saw the 200, say) changes nothing.
func TestKill9AfterAStripeEventWasAnswered(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills the real binary")
	}
	const whsec = "whsec_kill9_events"
	bin := MustBuildBinary(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_kill9events")
	dataDir := t.TempDir()
	dbPath := filepath.Join(dataDir, databaseFile)
	masterText, err := newMasterKeyText()
	require.NoError(t, err)
	masterKey, err := decodeMasterKey(masterText)
	require.NoError(t, err)
	var keyID, token string
	func() {
		s, err := bolt.Open(dbPath, bolt.Options{MasterKey: masterKey})
		require.NoError(t, err)
		defer s.Close()
		_, _, err = s.PutUpstream(context.Background(), "test", upstreamDefault, "stripe", fake.Secret)
		require.NoError(t, err)
		_, err = s.SetUpstreamWebhookSecrets(context.Background(), "test", upstreamDefault, []string{whsec})
		require.NoError(t, err)
		k, tok := MustMintKey(t, s, "events", 100)
		keyID, token = k.ID, tok
	}()
	environ := childEnviron(envMasterKey+"="+masterText, envJWTSecret+"=kill9-events-jwt-secret-kill9-events", envStripeKey+"="+fake.Secret)
	args := []string{"serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--stripe-url", fake.URL, "--log-format", "json", "--log-level", "info"}
	var c *child
	t.Cleanup(func() {
		if c != nil {
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	})
	c = startChild(t, bin, args, environ)
	base := "http://" + c.waitReady(t)

	// A PaymentIntent made through keybrake, paid in the browser.
	req, err := http.NewRequest(http.MethodPost, base+"/v1/payment_intents",
		strings.NewReader(url.Values{"amount": {"4000"}, "currency": {"usd"}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "pi-events")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	pis := fake.PaymentIntents()
	require.Len(t, pis, 1)
	fake.ConfirmClientSide(pis[0].ID)
	ev := fake.Event("payment_intent.succeeded", pis[0].ID)

	status, body, err := fake.Deliver(base+"/keybrake/v1/stripe/events/"+upstreamDefault, whsec, ev)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	_ = c.signalAndWait(t, syscall.SIGKILL, 30*time.Second)
	require.False(t, c.raceSeen.Load(), "data race in the child:\n%s", c.logs())

	usage := func() (committed, held int64) {
		s, err := bolt.Open(dbPath, bolt.Options{MasterKey: masterKey})
		require.NoError(t, err)
		defer s.Close()
		_, windows, u, err := s.KeyUsage(context.Background(), keyID)
		require.NoError(t, err)
		for _, w := range windows {
			if w.Kind == policy.WindowDaily {
				return u[w.ID].Committed, u[w.ID].Held
			}
		}
		t.Fatal("no daily window")
		return 0, 0
	}
	committed, held := usage()
	assert.EqualValues(t, 4000, committed, "the event's effect survived the kill")
	assert.Zero(t, held)

	c = startChild(t, bin, args, environ)
	base = "http://" + c.waitReady(t)
	status, body, err = fake.Deliver(base+"/keybrake/v1/stripe/events/"+upstreamDefault, whsec, ev)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Contains(t, string(body), `"duplicate"`, "re-delivered after the restart: applied once")
	require.NoError(t, c.signalAndWait(t, syscall.SIGTERM, 30*time.Second))
	c = nil
	committed, held = usage()
	assert.EqualValues(t, 4000, committed)
	assert.Zero(t, held)
}
