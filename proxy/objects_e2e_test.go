package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
)

// Money objects outlive requests: these tests follow one object through several
// requests and check what keybrake counts at each step against what the fake
// Stripe really did.

// piWith is the fake's PaymentIntent id.
func piWith(t *testing.T, e *env, id string) proxytest.PaymentIntent {
	t.Helper()
	pi, ok := e.Fake.PaymentIntent(id)
	require.True(t, ok, "no PaymentIntent %s at the fake", id)
	return pi
}

// Hole: a multicapture of an authorisation the key did not create was metered as
// zero from the second capture on (each capture held amount_to_capture minus
// everything metered on the object so far), so 1,600.00 moved against a 60.00
// cap. Each capture moves its own money and is counted in full.
func TestMulticaptureOfAForeignAuthorisation(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("60.00"))
	id := e.Fake.AddAuthorization(200000, "usd", "") // 2,000.00 authorised by the merchant

	capture := func(idem, amount string) reply {
		return e.Post(t, "/v1/payment_intents/"+id+"/capture", tok, idem, form("amount_to_capture", amount, "final_capture", "false"))
	}
	for i := range 3 {
		r := capture(fmt.Sprintf("cap-%d", i), "2000")
		require.Equal(t, http.StatusOK, r.Status, "capture %d: %s", i, r.Raw)
	}
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 6000, c, "three captures of 20.00 each")
	assert.Zero(t, h)

	r := capture("cap-3", "2000")
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	assert.Equal(t, "20.00", r.Keybrake()["requested"])
	assert.EqualValues(t, 6000, piWith(t, e, id).AmountReceived, "the fourth capture never reached Stripe")
	assert.Equal(t, 3, postsTo(e, "/v1/payment_intents/"+id+"/capture"))
}

// A PaymentIntent the key created is counted once: its captures, partial or not,
// take from what its creation counted, and the final capture gives back what was
// not captured.
func TestMulticaptureOfOwnPaymentIntent(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	r := e.Post(t, "/v1/payment_intents", tok, "create", form("amount", "6000", "currency", "usd",
		"capture_method", "manual", "payment_method", "pm_card_visa", "confirm", "true"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	id := r.Body["id"].(string)
	assert.Equal(t, "requires_capture", r.Body["status"])
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c, "authorised, not captured")
	assert.EqualValues(t, 6000, h)

	for i, amount := range []string{"2000", "1500"} {
		r = e.Post(t, "/v1/payment_intents/"+id+"/capture", tok, fmt.Sprintf("cap-%d", i),
			form("amount_to_capture", amount, "final_capture", "false"))
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	}
	c, h = usage(t, e, key.ID)
	assert.EqualValues(t, 3500, c, "each capture commits its amount, once")
	assert.EqualValues(t, 2500, h, "the rest stays capturable, so it stays counted")

	r = e.Post(t, "/v1/payment_intents/"+id+"/capture", tok, "cap-final", form("amount_to_capture", "500"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "succeeded", r.Body["status"])
	c, h = usage(t, e, key.ID)
	assert.EqualValues(t, 4000, c)
	assert.Zero(t, h, "the final capture released the 20.00 never captured")
	assert.EqualValues(t, 4000, piWith(t, e, id).AmountReceived)
}

// Hole: a PaymentIntent created with confirm=true whose card was declined exists
// (Stripe's 402 carries it in error.payment_intent, status
// requires_payment_method) and can be confirmed later with its client_secret,
// where keybrake never sees it. Releasing its hold let ten declined 50.00
// creations leave 500.00 confirmable against a 50.00 cap.
func TestDeclinedCreationKeepsItsPaymentIntentCounted(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("50.00"))
	create := form("amount", "5000", "currency", "usd", "confirm", "true", "payment_method", "pm_card_chargeDeclined")

	r := e.Post(t, "/v1/payment_intents", tok, "declined-1", create)
	require.Equal(t, http.StatusPaymentRequired, r.Status, "Stripe's decline is passed on: %s", r.Raw)
	assert.Equal(t, "card_declined", r.ErrCode())
	pi, _ := r.Body["error"].(map[string]any)["payment_intent"].(map[string]any)
	require.NotNil(t, pi, "the decline carries the PaymentIntent")
	id := pi["id"].(string)
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c)
	assert.EqualValues(t, 5000, h, "the PaymentIntent can still be confirmed: its amount stays counted")

	for i := 2; i <= 10; i++ {
		r = e.Post(t, "/v1/payment_intents", tok, fmt.Sprintf("declined-%d", i), create)
		AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	}
	assert.Len(t, e.Fake.PaymentIntents(), 1, "only one PaymentIntent was created")

	again := e.Post(t, "/v1/payment_intents", tok, "declined-1", create)
	assert.Equal(t, http.StatusPaymentRequired, again.Status)
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"), "the decline is replayed, not sent again")

	// Cancelling it through keybrake (here without an idempotency key) frees it.
	r = e.MustSend(t, http.MethodPost, "/v1/payment_intents/"+id+"/cancel", tok, nil, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "canceled", r.Body["status"])
	c, h = usage(t, e, key.ID)
	assert.Zero(t, c)
	assert.Zero(t, h, "a cancelled PaymentIntent can move no money")
	r = e.Post(t, "/v1/payment_intents", tok, "after-cancel", form("amount", "5000", "currency", "usd"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
}

// A decline of a PaymentIntent keybrake already counts changes nothing, and a
// decline on a request that creates nothing releases its hold.
func TestDeclinesThatCreateNothing(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("50.00"))
	r := e.Post(t, "/v1/charges", tok, "ch-declined", form("amount", "5000", "currency", "usd", "source", "tok_chargeDeclined"))
	require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Raw)
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c+h, "a declined charge moves nothing and can move nothing")

	r = e.Post(t, "/v1/payment_intents", tok, "pi", form("amount", "3000", "currency", "usd"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	id := r.Body["id"].(string)
	r = e.Post(t, "/v1/payment_intents/"+id+"/confirm", tok, "confirm-declined", form("payment_method", "pm_card_chargeDeclined"))
	require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Raw)
	c, h = usage(t, e, key.ID)
	assert.Zero(t, c)
	assert.EqualValues(t, 3000, h, "still confirmable: still counted, once")
}

// A PaymentIntent confirmed where keybrake cannot see it (in a browser, with its
// client_secret) is committed when an answer through keybrake shows it paid.
func TestReadShowsAPaymentConfirmedElsewhere(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	r := e.Post(t, "/v1/payment_intents", tok, "pi", form("amount", "4200", "currency", "usd"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	id := r.Body["id"].(string)

	// The browser confirms it directly at Stripe.
	req, err := http.NewRequest(http.MethodPost, e.Fake.URL+"/v1/payment_intents/"+id+"/confirm",
		strings.NewReader("payment_method=pm_card_visa"))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+e.Fake.Secret)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	direct := MustDo(t, http.DefaultClient, req)
	require.Equal(t, http.StatusOK, direct.Status)

	c, h := usage(t, e, key.ID)
	assert.Zero(t, c)
	assert.EqualValues(t, 4200, h, "keybrake has not seen it move yet")
	r = e.MustSend(t, http.MethodGet, "/v1/payment_intents/"+id, tok, nil, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, h = usage(t, e, key.ID)
	assert.EqualValues(t, 4200, c, "the read shows it succeeded: committed")
	assert.Zero(t, h)
}

// Hole: the per-request cap limited each increase, not the payment. A 10.00
// PaymentIntent raised in 10.00 steps became one 100.00 payment under a 10.00
// per-request cap; increment_authorization split the same way. The cap bounds
// the new total of the object.
func TestPerRequestCapBoundsThePayment(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("500.00", func(p *policy.Policy) {
		c := decimal.RequireFromString("10.00")
		p.PerRequestCap = &c
	}))
	r := e.Post(t, "/v1/payment_intents", tok, "create", form("amount", "1000", "currency", "usd"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	id := r.Body["id"].(string)
	r = e.Post(t, "/v1/payment_intents/"+id, tok, "raise", form("amount", "2000"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	assert.Equal(t, "per_request", r.Keybrake()["cap"])
	assert.Equal(t, "20.00", r.Keybrake()["requested"], "the payment's new total")
	assert.EqualValues(t, 1000, piWith(t, e, id).Amount, "the raise never reached Stripe")
	r = e.Post(t, "/v1/payment_intents/"+id, tok, "lower", form("amount", "800"))
	require.Equal(t, http.StatusOK, r.Status, "a total within the cap passes: %s", r.Raw)

	auth := e.Fake.AddAuthorization(900, "usd", "")
	r = e.Post(t, "/v1/payment_intents/"+auth+"/increment_authorization", tok, "incr", form("amount", "1900"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	assert.EqualValues(t, 900, piWith(t, e, auth).Amount)

	// Captures of one authorisation through the key add up to what it moves.
	big := e.Fake.AddAuthorization(100000, "usd", "")
	r = e.Post(t, "/v1/payment_intents/"+big+"/capture", tok, "big-1", form("amount_to_capture", "600", "final_capture", "false"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	r = e.Post(t, "/v1/payment_intents/"+big+"/capture", tok, "big-2", form("amount_to_capture", "600", "final_capture", "false"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	assert.Equal(t, "12.00", r.Keybrake()["requested"])
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 600, c)
	assert.EqualValues(t, 1000, h, "the PaymentIntent's exposure, not lowered by an update")

	exp, ok, err := e.Store.ObjectExposure(context.Background(), key.ID, id)
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, exp.Own)
}
