package proxy_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// withApproval asks for approval of charges above 200.00.
func withApproval(p *policy.Policy) {
	d := decimal.RequireFromString("200.00")
	p.Approval = &policy.Approval{Above: &d}
}

func chargeForm(amount string) url.Values {
	return url.Values{"amount": {amount}, "currency": {"usd"}, "source": {"tok_visa"},
		"card[number]": {"4242424242424242"}, "description": {"order 42"}}
}

// TestApprovalRequiredThenForwardedOnce: a charge above the threshold is held,
// not forwarded, and answered 402 approval_required with its approval; the
// approver sees the reason and the parameters, card fields masked; approved,
// the retry with the same key and request reaches Stripe once; a different
// request under the key is 422.
func TestApprovalRequiredThenForwardedOnce(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	token, key := e.MustKey(t, Policy("1000.00", withApproval))
	ctx := context.Background()

	small := e.Post(t, "/v1/charges", token, "small", chargeForm("20000"))
	require.Equal(t, http.StatusOK, small.Status, "%s", small.Raw)

	h := http.Header{"Idempotency-Key": {"big"}, "Keybrake-Approval-Reason": {"customer asked for the annual plan"}}
	r := e.MustSend(t, http.MethodPost, "/v1/charges", token, h, chargeForm("25000").Encode())
	AssertRefusal(t, r, http.StatusPaymentRequired, "approval_required")
	assert.Equal(t, "invalid_request_error", r.ErrType())
	assert.Equal(t, "false", r.Header.Get("Stripe-Should-Retry"))
	kb := r.Keybrake()
	id, _ := kb["approval_id"].(string)
	require.True(t, strings.HasPrefix(id, "apr_"), "%s", r.Raw)
	assert.Equal(t, "250.00", kb["amount"])
	assert.Equal(t, "charges.create", kb["operation"])
	assert.NotEmpty(t, kb["expires_at"])
	assert.Equal(t, 1, e.Fake.Count(), "only the small charge reached Stripe")

	a, err := e.Store.GetApproval(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "customer asked for the annual plan", a.Reason)
	params := map[string]string{}
	for _, p := range a.Params {
		params[p.Name] = p.Value
	}
	assert.Equal(t, "••••4242", params["card[number]"], "card fields are masked")
	assert.Equal(t, "25000", params["amount"])
	assert.Equal(t, key.ID, a.KeyID)

	again := e.MustSend(t, http.MethodPost, "/v1/charges", token, http.Header{"Idempotency-Key": {"big"}}, chargeForm("25000").Encode())
	AssertRefusal(t, again, http.StatusPaymentRequired, "approval_required")
	assert.Equal(t, id, again.Keybrake()["approval_id"])

	_, err = e.Store.DecideApproval(ctx, "alice", id, true, "")
	require.NoError(t, err)
	other := e.MustSend(t, http.MethodPost, "/v1/charges", token, http.Header{"Idempotency-Key": {"big"}}, chargeForm("26000").Encode())
	AssertRefusal(t, other, http.StatusUnprocessableEntity, "idempotency_key_reused")

	// The real SDK's retry: the same request under the same key.
	ch, err := e.Client(token, 0).V1Charges.Create(ctx, chargeParams(25000, "usd", "big"))
	require.Error(t, err, "the SDK's params differ from the form above (no card, no description)")
	assert.Equal(t, "idempotency_key_reused", string(StripeErr(t, err).Code))
	_ = ch

	ok := e.MustSend(t, http.MethodPost, "/v1/charges", token, http.Header{"Idempotency-Key": {"big"}}, chargeForm("25000").Encode())
	require.Equal(t, http.StatusOK, ok.Status, "%s", ok.Raw)
	assert.Equal(t, 2, e.Fake.Count(), "forwarded once")
	replay := e.MustSend(t, http.MethodPost, "/v1/charges", token, http.Header{"Idempotency-Key": {"big"}}, chargeForm("25000").Encode())
	require.Equal(t, http.StatusOK, replay.Status)
	assert.Equal(t, "true", replay.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, 2, e.Fake.Count())
	used, err := e.Store.GetApproval(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, vault.ApprovalUsed, used.State)
}

// TestApprovalDeclinedIsReplayed: declined, every retry is 402
// approval_declined and nothing reaches Stripe; the SDK sees the code.
func TestApprovalDeclinedIsReplayed(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	token, _ := e.MustKey(t, Policy("1000.00", withApproval))
	ctx := context.Background()
	sdk := e.Client(token, 0)
	_, err := sdk.V1Charges.Create(ctx, chargeParams(30000, "usd", "big"))
	se := StripeErr(t, err)
	assert.Equal(t, stripe.ErrorCode("approval_required"), se.Code)
	assert.Equal(t, 402, se.HTTPStatusCode)
	list, _, err := e.Store.ListApprovals(ctx, vault.ApprovalFilter{State: vault.ApprovalPending})
	require.NoError(t, err)
	require.Len(t, list, 1)
	_, err = e.Store.DecideApproval(ctx, "alice", list[0].ID, false, "no")
	require.NoError(t, err)
	for range 2 {
		_, err = sdk.V1Charges.Create(ctx, chargeParams(30000, "usd", "big"))
		assert.Equal(t, stripe.ErrorCode("approval_declined"), StripeErr(t, err).Code)
	}
	assert.Equal(t, 0, e.Fake.Count())
}

// TestApprovalWaitForwardsWhenApproved: with Keybrake-Approval-Wait the
// request waits on its connection and is forwarded as soon as an admin
// approves; the answer is Stripe's.
func TestApprovalWaitForwardsWhenApproved(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	token, key := e.MustKey(t, Policy("1000.00", withApproval))
	ctx := context.Background()
	done := make(chan reply, 1)
	go func() {
		h := http.Header{"Idempotency-Key": {"wait"}, "Keybrake-Approval-Wait": {"60"}}
		done <- e.MustSend(t, http.MethodPost, "/v1/charges", token, h, chargeForm("25000").Encode())
	}()
	var id string
	require.Eventually(t, func() bool {
		list, _, err := e.Store.ListApprovals(ctx, vault.ApprovalFilter{State: vault.ApprovalPending, KeyID: key.ID})
		if err != nil || len(list) == 0 {
			return false
		}
		id = list[0].ID
		return true
	}, 30*time.Second, 10*time.Millisecond)
	assert.Equal(t, 0, e.Fake.Count())
	_, err := e.Store.DecideApproval(ctx, "alice", id, true, "")
	require.NoError(t, err)
	r := <-done
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "charge", r.Body["object"])
	assert.Equal(t, 1, e.Fake.Count())

	bad := e.MustSend(t, http.MethodPost, "/v1/charges", token, http.Header{"Idempotency-Key": {"w2"}, "Keybrake-Approval-Wait": {"61"}}, chargeForm("25000").Encode())
	AssertRefusal(t, bad, http.StatusBadRequest, "request_malformed")
	long := e.MustSend(t, http.MethodPost, "/v1/charges", token, http.Header{"Idempotency-Key": {"w3"}, "Keybrake-Approval-Reason": {strings.Repeat("x", 501)}}, chargeForm("25000").Encode())
	AssertRefusal(t, long, http.StatusBadRequest, "request_malformed")
	assert.Equal(t, 1, e.Fake.Count())
}
