package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/policy"
)

// usage returns the committed and held amounts of the key's daily window.
func usage(t *testing.T, e *env, keyID string) (committed, held int64) {
	t.Helper()
	_, windows, u, err := e.Store.KeyUsage(context.Background(), keyID)
	require.NoError(t, err)
	for _, w := range windows {
		if w.Kind == policy.WindowDaily {
			return u[w.ID].Committed, u[w.ID].Held
		}
	}
	t.Fatalf("no daily window")
	return 0, 0
}

// A PaymentIntent is counted at creation (held as its exposure: its client_secret
// can confirm it without keybrake); raising it holds the difference; confirming
// it authorises without moving money; the capture turns the exposure into
// committed money without counting it twice; a refund counts.
func TestPaymentIntentMeteredOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	sc := e.Client(tok, 0)

	create := &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(3000), Currency: stripe.String("usd"),
		CaptureMethod: stripe.String("manual"), PaymentMethod: stripe.String("pm_card_visa")}
	create.SetIdempotencyKey("pi-create")
	pi, err := sc.V1PaymentIntents.Create(ctx, create)
	require.NoError(t, err)
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c)
	assert.EqualValues(t, 3000, h, "counted at creation: the client_secret can confirm it")

	up := &stripe.PaymentIntentUpdateParams{Amount: stripe.Int64(4500)}
	up.SetIdempotencyKey("pi-raise")
	_, err = sc.V1PaymentIntents.Update(ctx, pi.ID, up)
	require.NoError(t, err)
	_, h = usage(t, e, key.ID)
	assert.EqualValues(t, 4500, h, "the raise holds only the difference")

	conf := &stripe.PaymentIntentConfirmParams{}
	conf.SetIdempotencyKey("pi-confirm")
	_, err = sc.V1PaymentIntents.Confirm(ctx, pi.ID, conf)
	require.NoError(t, err)
	c, h = usage(t, e, key.ID)
	assert.Zero(t, c, "an authorisation moves no money yet")
	assert.EqualValues(t, 4500, h)
	capt := &stripe.PaymentIntentCaptureParams{}
	capt.SetIdempotencyKey("pi-capture")
	captured, err := sc.V1PaymentIntents.Capture(ctx, pi.ID, capt)
	require.NoError(t, err)
	assert.EqualValues(t, 4500, captured.AmountReceived)
	c, h = usage(t, e, key.ID)
	assert.EqualValues(t, 4500, c, "the capture commits the exposure, not a second amount")
	assert.Zero(t, h)

	ref := &stripe.RefundCreateParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(1000)}
	ref.SetIdempotencyKey("pi-refund")
	_, err = sc.V1Refunds.Create(ctx, ref)
	require.NoError(t, err)
	c, _ = usage(t, e, key.ID)
	assert.EqualValues(t, 5500, c, "money out counts against the caps too")
}

// Objects created outside keybrake are looked up at Stripe with the real key.
func TestLookups(t *testing.T) {
	t.Parallel()
	t.Run("confirm of a foreign PaymentIntent holds its amount", func(t *testing.T) {
		e := MustEnv(t)
		tok, key := e.MustKey(t, Policy("99.00"))
		id := e.Fake.AddPaymentIntent(7000, "usd", "")
		r := e.Post(t, "/v1/payment_intents/"+id+"/confirm", tok, "c1", form("payment_method", "pm_card_visa"))
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
		c, _ := usage(t, e, key.ID)
		assert.EqualValues(t, 7000, c)
		gets := e.Fake.CountWhere(func(r Request) bool { return r.Method == http.MethodGet })
		assert.Equal(t, 1, gets, "one lookup")
		for _, rq := range e.Fake.Requests() {
			assert.Equal(t, "Bearer "+upstreamSecret, rq.Header.Get("Authorization"))
		}

		other := e.Fake.AddPaymentIntent(5000, "usd", "")
		over := e.Post(t, "/v1/payment_intents/"+other+"/confirm", tok, "c2", form("payment_method", "pm_card_visa"))
		AssertRefusal(t, over, http.StatusPaymentRequired, "spend_cap_exceeded")
		assert.Equal(t, "50.00", over.Keybrake()["requested"])
	})

	t.Run("capture without amount of a foreign charge", func(t *testing.T) {
		e := MustEnv(t)
		tok, key := e.MustKey(t, Policy("99.00"))
		id := e.Fake.AddCharge(4000, "usd", "", false)
		r := e.Post(t, "/v1/charges/"+id+"/capture", tok, "cap1", form())
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
		c, _ := usage(t, e, key.ID)
		assert.EqualValues(t, 4000, c)
	})

	t.Run("partial capture commits what Stripe captured", func(t *testing.T) {
		e := MustEnv(t)
		tok, key := e.MustKey(t, Policy("99.00"))
		id := e.Fake.AddCharge(4000, "usd", "", false)
		r := e.Post(t, "/v1/charges/"+id+"/capture", tok, "cap2", form("amount", "2500"))
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
		c, h := usage(t, e, key.ID)
		assert.EqualValues(t, 2500, c)
		assert.Zero(t, h)
	})

	t.Run("capture of a charge created through the key adds nothing", func(t *testing.T) {
		e := MustEnv(t)
		tok, key := e.MustKey(t, Policy("99.00"))
		created := e.Post(t, "/v1/charges", tok, "auth", form("amount", "4000", "currency", "usd", "capture", "false", "source", "tok_visa"))
		require.Equal(t, http.StatusOK, created.Status, "%s", created.Raw)
		id := created.Body["id"].(string)
		r := e.Post(t, "/v1/charges/"+id+"/capture", tok, "cap3", form())
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
		c, h := usage(t, e, key.ID)
		assert.EqualValues(t, 4000, c)
		assert.Zero(t, h)
	})

	t.Run("the lookup carries the validated account headers", func(t *testing.T) {
		e := MustEnv(t)
		tok, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) { p.StripeAccounts = []string{"acct_1"} }))
		id := e.Fake.AddPaymentIntent(1000, "usd", "")
		r := e.MustSend(t, http.MethodPost, "/v1/payment_intents/"+id+"/confirm", tok,
			hdr("Idempotency-Key", "acct-c", "Stripe-Account", "acct_1", "Stripe-Version", "2026-08-26.dahlia"), "")
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
		reqs := e.Fake.Requests()
		require.Len(t, reqs, 2)
		assert.Equal(t, http.MethodGet, reqs[0].Method)
		assert.Equal(t, "/v1/payment_intents/"+id, reqs[0].Path)
		for _, rq := range reqs {
			assert.Equal(t, "acct_1", rq.Header.Get("Stripe-Account"))
			assert.Equal(t, "2026-08-26.dahlia", rq.Header.Get("Stripe-Version"))
		}
	})

	t.Run("a failed lookup refuses amount_unknown and forwards nothing", func(t *testing.T) {
		e := MustEnv(t)
		tok, _ := e.MustKey(t, Policy("99.00"))
		r := e.Post(t, "/v1/payment_intents/pi_missing/confirm", tok, "c3", form())
		AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
		posts := e.Fake.CountWhere(func(r Request) bool { return r.Method == http.MethodPost })
		assert.Zero(t, posts)
	})
}
