package main

import (
	"context"
	"net/http"
	"net/url"
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
	t.Parallel()
	if testing.Short() {
		t.Skip("starts and kills the real binary")
	}
	var keyID, token string
	e := newEventsChild(t, "kill9events", func(s *bolt.Store, _ *proxytest.FakeStripe) {
		k, tok := MustMintKey(t, s, "events", 100)
		keyID, token = k.ID, tok
	}, "--log-level", "info")
	fake := e.fake
	base := e.start(t)

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

	e.deliver(t, base, ev)
	_ = e.cur.signalAndWait(t, syscall.SIGKILL, 30*time.Second)
	require.False(t, e.cur.raceSeen.Load(), "data race in the child:\n%s", e.cur.logs())

	usage := func() (committed, held int64) {
		e.withStore(t, func(s *bolt.Store) {
			_, windows, u, err := s.KeyUsage(context.Background(), keyID)
			require.NoError(t, err)
			for _, w := range windows {
				if w.Kind == policy.WindowDaily {
					committed, held = u[w.ID].Committed, u[w.ID].Held
					return
				}
			}
			t.Fatal("no daily window")
		})
		return committed, held
	}
	committed, held := usage()
	assert.EqualValues(t, 4000, committed, "the event's effect survived the kill")
	assert.Zero(t, held)

	base = e.start(t)
	body := e.deliver(t, base, ev)
	assert.Contains(t, string(body), `"duplicate"`, "re-delivered after the restart: applied once")
	require.NoError(t, e.cur.signalAndWait(t, syscall.SIGTERM, 30*time.Second))
	e.cur = nil
	committed, held = usage()
	assert.EqualValues(t, 4000, committed)
	assert.Zero(t, held)
}
