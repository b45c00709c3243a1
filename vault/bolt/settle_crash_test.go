package bolt

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// TestQueuedSettleLostInACrash: the proxy answers a charge while its settle is
// still queued for the next commit. The file and its log as they are on disk at that moment are
// what a crash (kill -9, power loss) would leave: the claim and hold durable,
// the settle not. Opened again, the record is outcome unknown with its hold
// counted — nothing over the cap. The caller's retry with the same idempotency
// key resumes it under the same upstream key, Stripe replays the charge it
// made, the caller gets that charge again and the hold is committed exactly
// once: one charge at Stripe, committed its amount, nothing held.
func TestQueuedSettleLostInACrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := vaulttest.NewClock(vaulttest.T0)
	s, path := MustOpen(t, clock)
	fake := proxytest.NewFakeStripe(t, "sk_test_crashwindow")
	vaulttest.MustUpstream(t, s, fake.Secret)
	key, token := vaulttest.MustMint(t, s, "k", vaulttest.Policy(t, "100.00", "150.00", ""), nil)

	// When Stripe executes the charge, the claim and hold are durable: stop the
	// committer before its next batch, which will hold the settle.
	var (
		armed   sync.Once
		stopped = make(chan struct{})
		release = make(chan struct{})
	)
	fake.SetHook(func(r proxytest.Request) {
		if r.Method != http.MethodPost {
			return
		}
		armed.Do(func() {
			gate := func() {
				s.testGate.Store(nil) // only this batch waits
				close(stopped)
				<-release
			}
			s.testGate.Store(&gate)
		})
	})
	type answer struct {
		ch  *stripe.Charge
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		ch, err := chargeThrough(s, fake, token, clock, "order-1")
		answered <- answer{ch, err}
	}()
	<-stopped
	var first answer
	select {
	case first = <-answered:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the answer waited for the settle's commit")
	}
	require.NoError(t, first.err)
	crashImage := filepath.Join(t.TempDir(), "crashed.db")
	// What is on disk is the file and its log; no fold runs while they are
	// copied.
	resume := stopFolds(s)
	copyStore(t, path, crashImage)
	resume()
	close(release)
	ch := first.ch
	assert.Equal(t, int64(2500), ch.Amount)

	// The crash: the next start opens what was on disk.
	after := MustOpenPath(t, crashImage, clock)
	holds := allHolds(t, after)
	require.Len(t, holds, 1)
	for _, h := range holds {
		assert.Equal(t, vault.HoldUnknown, h.State, "the answered request is outcome unknown, its hold counted")
	}
	daily, _ := usageOf(t, after, key.ID)
	assert.Equal(t, int64(2500), daily.Held)

	again, err := chargeThrough(after, fake, token, clock, "order-1")
	require.NoError(t, err)
	assert.Equal(t, ch.ID, again.ID, "the retry gets the charge Stripe made, replayed under the same upstream key")
	assert.Len(t, fake.Charges(), 1, "Stripe moved the money once")
	daily, period := usageOf(t, after, key.ID)
	assert.Equal(t, int64(2500), daily.Committed)
	assert.Zero(t, daily.Held)
	assert.Equal(t, int64(2500), period.Committed)
	for _, h := range allHolds(t, after) {
		assert.Equal(t, vault.HoldCommitted, h.State)
	}
	require.NoError(t, after.CheckInvariant(ctx))
}

// chargeThrough creates a charge of 25.00 usd with stripe-go through a proxy on
// store s, under the vault key token and the idempotency key idem.
func chargeThrough(s vault.Store, fake *proxytest.FakeStripe, token string, clock *vaulttest.Clock, idem string) (*stripe.Charge, error) {
	up, err := url.Parse(fake.URL)
	if err != nil {
		return nil, err
	}
	p, err := proxy.New(proxy.Config{Store: s, Upstream: up, Now: clock.Now, Logger: vaulttest.QuietLogger()})
	if err != nil {
		return nil, err
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	sc := stripe.NewClient(token, stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL: stripe.String(srv.URL), MaxNetworkRetries: stripe.Int64(0),
	})))
	params := &stripe.ChargeCreateParams{Amount: stripe.Int64(2500), Currency: stripe.String("usd"),
		Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")}}
	params.SetIdempotencyKey(idem)
	return sc.V1Charges.Create(context.Background(), params)
}

// copyFile copies src to dst.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.Create(dst)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}
