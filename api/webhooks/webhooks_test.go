package webhooks_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api/webhooks"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// TestSignVerifiesWithTheStandardLibrary: both signatures of a rotation
// verify with the Standard Webhooks library, each secret alone; a changed
// body does not.
func TestSignVerifiesWithTheStandardLibrary(t *testing.T) {
	t.Parallel()
	secrets := []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"}
	body := []byte(`{"type":"webhook.test","timestamp":"2026-12-02T00:00:00Z","data":{}}`)
	now := time.Now()
	sig, err := webhooks.Sign(secrets, "msg_1", now, body)
	require.NoError(t, err)
	h := http.Header{}
	h.Set("webhook-id", "msg_1")
	h.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	h.Set("webhook-signature", sig)
	for _, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		require.NoError(t, err)
		assert.NoError(t, wh.Verify(body, h), s)
		assert.Error(t, wh.Verify(append(body, ' '), h), "a changed body")
	}
	other, err := standardwebhooks.NewWebhook("whsec_" + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
	require.NoError(t, err)
	assert.Error(t, other.Verify(body, h), "another secret")
}

// TestCheckAddr: what no webhook may reach.
func TestCheckAddr(t *testing.T) {
	t.Parallel()
	for addr, refused := range map[string]bool{
		"127.0.0.1": true, "10.0.0.1": true, "172.16.5.4": true, "192.168.1.1": true, "169.254.169.254": true,
		"100.64.0.1": true, "0.0.0.0": true, "::1": true, "fe80::1": true, "fc00::1": true, "fd00:ec2::254": true,
		"::ffff:127.0.0.1": true, "224.0.0.1": true, "192.0.2.10": true,
		"93.184.215.14": false, "8.8.8.8": false, "2606:4700:4700::1111": false,
	} {
		err := webhooks.CheckAddr(netip.MustParseAddr(addr))
		if refused {
			assert.ErrorIs(t, err, webhooks.ErrForbiddenAddress, addr)
		} else {
			assert.NoError(t, err, addr)
		}
	}
}

// TestDialerRefusesInternalAddresses: without AllowPrivate the client does
// not connect to a receiver on 127.0.0.1, by address or by a name that
// resolves to it (the dialled address is judged); with it, it does.
func TestDialerRefusesInternalAddresses(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	_, port, _ := netSplit(srv.URL)
	for _, u := range []string{srv.URL, "http://localhost:" + port} {
		_, err := webhooks.NewClient(webhooks.Guard{}).Post(u, "application/json", nil)
		require.ErrorIs(t, err, webhooks.ErrForbiddenAddress, u)
		assert.ErrorIs(t, webhooks.Guard{}.CheckURL(context.Background(), u), webhooks.ErrForbiddenAddress, u)
	}
	assert.Zero(t, hits.Load())
	resp, err := webhooks.NewClient(webhooks.Guard{AllowPrivate: true}).Post(srv.URL, "application/json", nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, int64(1), hits.Load())
}

func netSplit(u string) (host, port string, err error) {
	for i := len(u) - 1; i >= 0; i-- {
		if u[i] == ':' {
			return u[:i], u[i+1:], nil
		}
	}
	return "", "", errors.New("no port")
}

func mustStore(t *testing.T) vault.Store {
	t.Helper()
	s, err := bolt.Open(filepath.Join(t.TempDir(), "keybrake.db"), bolt.Options{MasterKey: make([]byte, 32)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestDelivererOutcomes: a 2xx delivers; a redirect is a failure and is not
// followed; a 410 disables the endpoint.
func TestDelivererOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var followed atomic.Int64
	var secret atomic.Pointer[string]
	var verified atomic.Int64
	mux := http.NewServeMux()
	check := func(r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		wh, err := standardwebhooks.NewWebhook(*secret.Load())
		if err == nil && wh.Verify(body, r.Header) == nil {
			verified.Add(1)
		}
	}
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { check(r); w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) {
		check(r)
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, _ *http.Request) { followed.Add(1) })
	mux.HandleFunc("/gone", func(w http.ResponseWriter, r *http.Request) { check(r); w.WriteHeader(http.StatusGone) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s := mustStore(t)
	d := &webhooks.Deliverer{Store: s, Client: webhooks.NewClient(webhooks.Guard{AllowPrivate: true})}

	states := map[string]vault.DeliveryState{}
	for _, path := range []string{"/ok", "/moved", "/gone"} {
		w, sec, err := s.CreateWebhook(ctx, "test", vault.WebhookInput{URL: srv.URL + path, Events: []string{"*"}})
		require.NoError(t, err)
		secret.Store(&sec)
		_, err = s.TestWebhook(ctx, "test", w.ID)
		require.NoError(t, err)
		require.Equal(t, 1, d.Drain(ctx))
		ds, _, err := s.ListDeliveries(ctx, w.ID, 10, "")
		require.NoError(t, err)
		require.Len(t, ds, 1)
		states[path] = ds[0].State
		got, err := s.GetWebhook(ctx, w.ID)
		require.NoError(t, err)
		if path == "/gone" {
			assert.Equal(t, vault.WebhookDisabled, got.Status)
		} else {
			assert.Equal(t, vault.WebhookEnabled, got.Status, path)
		}
		if path == "/moved" {
			assert.Equal(t, http.StatusFound, ds[0].LastStatus)
			assert.Contains(t, ds[0].LastError, "redirect")
			assert.False(t, ds[0].NextAttemptAt.IsZero(), "retried later")
		}
	}
	assert.Equal(t, map[string]vault.DeliveryState{"/ok": vault.DeliveryDelivered, "/moved": vault.DeliveryPending, "/gone": vault.DeliveryFailed}, states)
	assert.Zero(t, followed.Load(), "redirects are not followed")
	assert.Equal(t, int64(3), verified.Load())
}
