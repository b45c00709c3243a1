package main

import (
	"context"
	"net/http"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// TestKill9BeforeTheRenewalPauseReachedStripe kills the real `keybrake serve`
// with SIGKILL right after it answered 200 to the invoice.created of a
// renewal over the cap, before its pause (auto_advance=false) reached Stripe:
// the restarted process sends the pause, and Stripe never collects the draft.
func TestKill9BeforeTheRenewalPauseReachedStripe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the real binary")
	}
	t.Parallel()
	bin := MustBuildBinary(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_kill9_renewals")
	dataDir := t.TempDir()
	masterText, err := newMasterKeyText()
	require.NoError(t, err)
	masterKey, err := decodeMasterKey(masterText)
	require.NoError(t, err)
	const whsec = "whsec_kill9_renewals"

	sub, _ := fake.AddSubscription(fake.AddCustomer("usd"), fake.AddRecurringPrice(3000, "usd"), 1, "active")
	func() {
		ctx := context.Background()
		s, err := bolt.Open(filepath.Join(dataDir, databaseFile), bolt.Options{MasterKey: masterKey})
		require.NoError(t, err)
		defer s.Close()
		_, _, err = s.PutUpstream(ctx, "test", upstreamDefault, "stripe", fake.Secret)
		require.NoError(t, err)
		_, err = s.SetUpstreamWebhookSecrets(ctx, "test", upstreamDefault, []string{whsec})
		require.NoError(t, err)
		p := MustPolicy(t, 20)
		p.Operations = append(slices.Clone(policy.DefaultOperations), "subscriptions.create")
		k, _, err := s.MintKey(ctx, "test", vault.MintRequest{Name: "kill9-renewals", Upstream: upstreamDefault, Policy: p})
		require.NoError(t, err)
		_, _, err = s.LinkObject(ctx, vault.ObjectLink{Upstream: upstreamDefault, ObjectID: sub, KeyID: k.ID})
		require.NoError(t, err)
	}()

	environ := childEnviron(envMasterKey+"="+masterText, envJWTSecret+"="+"kill9-renewals-jwt-secret-0123456789abcd",
		envStripeKey+"="+fake.Secret)
	args := []string{"serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--stripe-url", fake.URL, "--log-format", "json", "--upstream-timeout", "10s"}
	var cur *child
	t.Cleanup(func() {
		if cur != nil {
			_ = cur.cmd.Process.Kill()
			<-cur.exited
		}
	})
	pauses := func(inv string) int {
		return fake.CountWhere(func(r proxytest.Request) bool { return r.Method == http.MethodPost && r.Path == "/v1/invoices/"+inv })
	}
	autoAdvance := func(inv string) bool {
		for _, i := range fake.Invoices() {
			if i.ID == inv {
				return i.AutoAdvance
			}
		}
		t.Fatalf("no invoice %s", inv)
		return false
	}

	cur = startChild(t, bin, args, environ)
	proxyURL := "http://" + cur.waitReady(t)
	inv := fake.RenewSubscription(sub) // 30.00 over the 20.00 cap
	status, body, err := fake.Deliver(proxyURL+"/keybrake/v1/stripe/events/"+upstreamDefault, whsec, fake.Event("invoice.created", inv))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Error(t, cur.signalAndWait(t, syscall.SIGKILL, 10*time.Second), "killed")
	require.Zero(t, pauses(inv), "the pause went out before the kill (the worker's tick is 10 s): the kill came too late to test anything")
	require.True(t, autoAdvance(inv))

	cur = startChild(t, bin, args, environ)
	cur.waitReady(t)
	require.Eventually(t, func() bool { return !autoAdvance(inv) }, 20*time.Second, 10*time.Millisecond,
		"the restarted process sends the pause")
	assert.Empty(t, fake.AdvanceInvoices(), "the paused draft is never collected")
	assert.Equal(t, 1, pauses(inv))
}
