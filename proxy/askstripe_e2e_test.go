package proxy_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
)

// unknownCharge makes a charge of amount whose outcome is unknown: the fake
// fails it with mode, and the client does not retry.
func unknownCharge(t *testing.T, e *env, tok, idem string, amount int64, mode proxytest.FailMode) {
	t.Helper()
	e.Fake.FailNext(mode, 1)
	_, err := e.Client(tok, 0).V1Charges.Create(context.Background(), chargeParams(amount, "usd", idem))
	require.Error(t, err)
	holds, _, err := e.Store.ListHolds(context.Background(), vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	require.Len(t, holds, 1, "the outcome is unknown")
}

// askSettleEvent is the ledger's settle event of the hold written by an ask.
func askSettleEvent(t *testing.T, e *env, keyID, holdID string) vault.Event {
	t.Helper()
	events, _, err := e.Store.ListEvents(context.Background(), keyID, 100, "")
	require.NoError(t, err)
	for _, ev := range events {
		if ev.HoldID == holdID && ev.Decision == vault.DecisionSettled && ev.Tool == proxy.ToolAskStripe {
			return ev
		}
	}
	t.Fatalf("no settle event of %s by %s", holdID, proxy.ToolAskStripe)
	return vault.Event{}
}

// Stripe executed the charge, and the connection broke before its answer:
// asking Stripe sends the kept request again under the same upstream key,
// Stripe replays what it did, and the hold is committed — the money moved
// once.
func TestAskStripeAfterStripeExecuted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	unknownCharge(t, e, tok, "ask-1", 6000, proxytest.FailAfterCreateReset)
	require.Len(t, e.Fake.Charges(), 1, "Stripe executed it")
	holdID := vault.HoldID(key.ID, "ask-1")

	res, err := e.Proxy.AskStripe(ctx, holdID)
	require.NoError(t, err)
	assert.True(t, res.Replayed, "Stripe replayed the first execution")
	assert.Equal(t, vault.SettleCommit, res.Outcome)
	assert.Equal(t, http.StatusOK, res.Status)
	assert.Len(t, e.Fake.Charges(), 1, "money moved once")
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 6000, c)
	assert.Zero(t, h)
	assert.Equal(t, "commit", askSettleEvent(t, e, key.ID, holdID).Reason)

	// The caller's own retry now replays keybrake's stored answer.
	ch, err := e.Client(tok, 0).V1Charges.Create(ctx, chargeParams(6000, "usd", "ask-1"))
	require.NoError(t, err)
	assert.Equal(t, e.Fake.Charges()[0].ID, ch.ID)
	assert.Len(t, e.Fake.Charges(), 1)

	_, err = e.Proxy.AskStripe(ctx, holdID)
	var ae *proxy.AskError
	require.ErrorAs(t, err, &ae, "committed: nothing to ask")
	assert.Equal(t, http.StatusConflict, ae.Status)
	assert.Len(t, e.Fake.Requests(), 2, "the first attempt and the ask: the retry was replayed by keybrake, the second ask sent nothing")
}

// Stripe never executed it (a 500 before anything was done): asking Stripe
// executes it now, once.
func TestAskStripeWhenStripeNeverExecuted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	unknownCharge(t, e, tok, "ask-2", 4000, proxytest.FailBefore500)
	require.Empty(t, e.Fake.Charges(), "nothing executed")
	holdID := vault.HoldID(key.ID, "ask-2")

	res, err := e.Proxy.AskStripe(ctx, holdID)
	require.NoError(t, err)
	assert.False(t, res.Replayed, "executed now")
	assert.Equal(t, vault.SettleCommit, res.Outcome)
	require.Len(t, e.Fake.Charges(), 1)
	assert.EqualValues(t, 4000, e.Fake.Charges()[0].Amount)
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 4000, c)
	assert.Zero(t, h)
	askSettleEvent(t, e, key.ID, holdID)

	_, err = e.Proxy.AskStripe(ctx, holdID)
	var ae *proxy.AskError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, http.StatusConflict, ae.Status)
	assert.Len(t, e.Fake.Charges(), 1, "committed once")

	_, err = e.Proxy.AskStripe(ctx, "hold_nope")
	assert.True(t, errors.Is(err, vault.ErrNotFound), "%v", err)
}
