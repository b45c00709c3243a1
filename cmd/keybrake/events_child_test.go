package main

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/fakestripe"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault/bolt"
)

// eventsChild is a real `keybrake serve` on a bbolt data directory whose
// upstream takes Stripe's events signed with whsec, for the tests that kill it
// between an event's answer and what the event leads to.
type eventsChild struct {
	whsec   string
	fake    *proxytest.FakeStripe
	bin     string
	dbPath  string
	master  []byte
	args    []string
	environ []string
	cur     *child // the running process, killed at cleanup
}

// newEventsChild prepares the data directory (the upstream and its webhook
// secret, then whatever seed adds) and the command line; start runs it.
func newEventsChild(t *testing.T, name string, seed func(s *bolt.Store, fake *proxytest.FakeStripe), extraArgs ...string) *eventsChild {
	t.Helper()
	e := &eventsChild{whsec: "whsec_" + name, bin: MustBuildBinary(t), fake: proxytest.NewFakeStripe(t, "sk_test_"+name)}
	dataDir := t.TempDir()
	e.dbPath = filepath.Join(dataDir, databaseFile)
	masterText, err := newMasterKeyText()
	require.NoError(t, err)
	e.master, err = decodeMasterKey(masterText)
	require.NoError(t, err)
	e.withStore(t, func(s *bolt.Store) {
		_, _, err := s.PutUpstream(context.Background(), "test", upstreamDefault, "stripe", e.fake.Secret)
		require.NoError(t, err)
		_, err = s.SetUpstreamWebhookSecrets(context.Background(), "test", upstreamDefault, []string{e.whsec})
		require.NoError(t, err)
		seed(s, e.fake)
	})
	e.environ = childEnviron(envMasterKey+"="+masterText, envJWTSecret+"="+name+"-jwt-secret-0123456789abcdef",
		envStripeKey+"="+e.fake.Secret)
	e.args = append([]string{"serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--stripe-url", e.fake.URL, "--log-format", "json"}, extraArgs...)
	t.Cleanup(func() {
		if e.cur != nil {
			_ = e.cur.cmd.Process.Kill()
			<-e.cur.exited
		}
	})
	return e
}

// withStore opens the data directory's store while no process runs on it.
func (e *eventsChild) withStore(t *testing.T, fn func(s *bolt.Store)) {
	t.Helper()
	s, err := bolt.Open(e.dbPath, bolt.Options{MasterKey: e.master})
	require.NoError(t, err)
	defer s.Close()
	fn(s)
}

// start runs serve and returns its proxy's base URL.
func (e *eventsChild) start(t *testing.T) string {
	t.Helper()
	e.cur = startChild(t, e.bin, e.args, e.environ)
	return "http://" + e.cur.waitReady(t)
}

// deliver sends ev to the running process's events endpoint, signed as Stripe
// signs it; the answer must be 200, and its body is returned.
func (e *eventsChild) deliver(t *testing.T, base string, ev fakestripe.Event) []byte {
	t.Helper()
	status, body, err := e.fake.Deliver(base+"/keybrake/v1/stripe/events/"+upstreamDefault, e.whsec, ev)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	return body
}
