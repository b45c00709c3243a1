package main

import (
	"context"
	"net/http"
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
	var sub string
	e := newEventsChild(t, "kill9_renewals", func(s *bolt.Store, fake *proxytest.FakeStripe) {
		ctx := context.Background()
		sub, _ = fake.AddSubscription(fake.AddCustomer("usd"), fake.AddRecurringPrice(3000, "usd"), 1, "active")
		p := MustPolicy(t, 20)
		p.Operations = append(slices.Clone(policy.DefaultOperations), "subscriptions.create")
		k, _, err := s.MintKey(ctx, "test", vault.MintRequest{Name: "kill9-renewals", Upstream: upstreamDefault, Policy: p})
		require.NoError(t, err)
		_, _, err = s.LinkObject(ctx, vault.ObjectLink{Upstream: upstreamDefault, ObjectID: sub, KeyID: k.ID})
		require.NoError(t, err)
	}, "--upstream-timeout", "10s")
	fake := e.fake
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

	proxyURL := e.start(t)
	inv := fake.RenewSubscription(sub) // 30.00 over the 20.00 cap
	e.deliver(t, proxyURL, fake.Event("invoice.created", inv))
	require.Error(t, e.cur.signalAndWait(t, syscall.SIGKILL, 10*time.Second), "killed")
	require.Zero(t, pauses(inv), "the pause went out before the kill (the worker's tick is 10 s): the kill came too late to test anything")
	require.True(t, autoAdvance(inv))

	e.start(t)
	require.Eventually(t, func() bool { return !autoAdvance(inv) }, 20*time.Second, 10*time.Millisecond,
		"the restarted process sends the pause")
	assert.Empty(t, fake.AdvanceInvoices(), "the paused draft is never collected")
	assert.Equal(t, 1, pauses(inv))
}
