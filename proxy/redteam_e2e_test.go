package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
)

// Regression tests for ways around the money path found by review. Each names
// the hole it closes.

// postsTo counts the POSTs to path that reached the fake.
func postsTo(e *env, path string) int {
	return e.Fake.CountWhere(func(r proxytest.Request) bool { return r.Method == http.MethodPost && r.Path == path })
}

// Go's http.Transport resends a request that carries an Idempotency-Key when a
// reused connection breaks after the request was written. If Stripe is still
// executing the first write, the resend gets 409 idempotency_key_in_use, and a
// fresh claim answered 409 was abandoned: the hold was released while the money
// moved. Each keybrake attempt must reach Stripe at most once.
func TestTransportDoesNotResendAPayment(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	// A read first, so that the payment goes over a reused connection.
	r := e.MustSend(t, http.MethodGet, "/v1/balance", tok, nil, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)

	// Stripe goes on executing the payment after the reset, until keybrake
	// has answered its caller: a resend would find it in flight.
	e.Fake.SetFailDelay(time.Minute)
	release := e.Fake.HoldDelayed()
	defer release()
	e.Fake.FailNext(proxytest.FailAfterCreateResetInFlight, 1)
	r = e.Post(t, "/v1/charges", tok, "k1", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	release()
	e.Fake.WaitIdle(t)
	assert.Equal(t, 1, postsTo(e, "/v1/charges"), "the payment was written to Stripe once")
	assert.Equal(t, http.StatusBadGateway, r.Status, "%s", r.Raw)

	c, h := usage(t, e, key.ID)
	assert.GreaterOrEqual(t, c+h, e.Fake.TotalMoved("usd"), "the money Stripe moved is held or committed")
	assert.EqualValues(t, 6000, h, "outcome unknown: the hold stays")

	// The retry resumes with the same upstream key and settles from Stripe's replay.
	r = e.Post(t, "/v1/charges", tok, "k1", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, h = usage(t, e, key.ID)
	assert.EqualValues(t, 6000, c)
	assert.Zero(t, h)
	assert.Len(t, e.Fake.Charges(), 1)
}

// A resumed request (the first attempt's outcome is unknown) that Stripe answers
// with 400 idempotency_error was seen by Stripe under the same upstream key with
// other parameters (e.g. another Stripe-Version, which the fingerprint does not
// cover): the first attempt may well have moved the money, so the answer is no
// reason to release the hold.
func TestResumedIdempotencyErrorKeepsTheHold(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	e.Fake.FailNext(proxytest.FailAfterCreate500, 1)
	charge := form("amount", "6000", "currency", "usd", "source", "tok_visa")
	r := e.Post(t, "/v1/charges", tok, "k1", charge)
	require.Equal(t, http.StatusInternalServerError, r.Status, "%s", r.Raw)
	_, h := usage(t, e, key.ID)
	require.EqualValues(t, 6000, h)

	e.Fake.FailNext(proxytest.FailIdempotencyMismatch, 1)
	r = e.Post(t, "/v1/charges", tok, "k1", charge)
	assert.Equal(t, http.StatusBadRequest, r.Status, "Stripe's answer is passed on: %s", r.Raw)
	assert.Equal(t, "idempotency_error", r.ErrType())
	c, h := usage(t, e, key.ID)
	assert.GreaterOrEqual(t, c+h, e.Fake.TotalMoved("usd"), "the first attempt's money stays counted")
	assert.EqualValues(t, 6000, h)

	// A second charge that only fits if the first hold were released is refused.
	r = e.Post(t, "/v1/charges", tok, "k2", charge)
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	holds, _, err := e.Store.ListHolds(context.Background(), vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	assert.Len(t, holds, 1, "an operator can resolve it")
}

// Updating a PaymentIntent's amount AND currency makes the whole new amount new
// money in the new currency: subtracting the old amount (in another currency's
// minor units) metered nothing for a PaymentIntent whose client_secret can now be
// confirmed for the new amount without passing keybrake.
func TestPaymentIntentCurrencyChangeIsMeteredInFull(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00", func(p *policy.Policy) { p.Operations = []string{"*"} }))
	id := e.Fake.AddPaymentIntent(1000000, "jpy", "") // ¥1,000,000, created outside keybrake

	r := e.Post(t, "/v1/payment_intents/"+id, tok, "u1", form("amount", "990000", "currency", "usd"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	assert.Zero(t, postsTo(e, "/v1/payment_intents/"+id), "the raise never reached Stripe")

	r = e.Post(t, "/v1/payment_intents/"+id, tok, "u2", form("amount", "5000", "currency", "usd"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c, "nothing has moved yet")
	assert.EqualValues(t, 5000, h, "the new total in the new currency is counted as the PaymentIntent's exposure")
}

// /v1/accounts/{id}/… acts on that connected account as a Stripe-Account header
// would: an account outside the policy's stripe_accounts is refused.
func TestAccountInPathMustBeAllowed(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) {
		p.Operations = []string{"accounts.*", "account_links.*", "*.read"}
		p.StripeAccounts = []string{"acct_ok"}
	}))
	for name, tc := range map[string]struct{ method, target, body string }{
		"read":             {http.MethodGet, "/v1/accounts/acct_other", ""},
		"nested read":      {http.MethodGet, "/v1/accounts/acct_other/external_accounts", ""},
		"update":           {http.MethodPost, "/v1/accounts/acct_other", "metadata[k]=v"},
		"external account": {http.MethodPost, "/v1/accounts/acct_other/external_accounts", "external_account=btok_1"},
		"delete":           {http.MethodDelete, "/v1/accounts/acct_other", ""},
		"account link":     {http.MethodPost, "/v1/account_links", "account=acct_other&type=account_onboarding"},
	} {
		t.Run(name, func(t *testing.T) {
			r := e.MustSend(t, tc.method, tc.target, tok, hdr("Idempotency-Key", "acct-"+name), tc.body)
			AssertRefusal(t, r, http.StatusForbidden, "account_not_allowed")
		})
	}
	assert.Zero(t, e.Fake.Count(), "nothing reached Stripe")

	r := e.MustSend(t, http.MethodGet, "/v1/accounts/acct_ok", tok, nil, "")
	assert.NotEqual(t, "account_not_allowed", r.ErrCode(), "a listed account passes: %s", r.Raw)
}

// An invoice item priced by a stored price moves money in the price's currency;
// a request that names another currency is not metered in it.
func TestInvoiceItemStoredPriceInAnotherCurrency(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("1", func(p *policy.Policy) {
		cp := decimal.RequireFromString("200000")
		p.Currency, p.DailyCap, p.Operations = "jpy", &cp, []string{"*"}
	}))
	price := e.Fake.AddPrice(100000, "usd") // $1,000.00
	r := e.Post(t, "/v1/invoiceitems", tok, "ii1", form("customer", "cus_1", "currency", "jpy", "price", price))
	AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
	assert.Zero(t, postsTo(e, "/v1/invoiceitems"))
}

// Money sent to or on behalf of a connected account touches that account: a
// transfer's destination, a destination charge's transfer_data[destination] and
// on_behalf_of must be in the policy's stripe_accounts, like Stripe-Account.
func TestDestinationAccountMustBeAllowed(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) {
		p.Operations = []string{"transfers.create", "charges.create", "payment_intents.create", "checkout.sessions.create"}
		p.StripeAccounts = []string{"acct_ok"}
	}))
	for name, body := range map[string]string{
		"transfer":           "amount=100&currency=usd&destination=acct_other",
		"destination charge": "amount=100&currency=usd&source=tok_visa&transfer_data[destination]=acct_other",
		"legacy destination": "amount=100&currency=usd&source=tok_visa&destination[account]=acct_other",
		"on behalf of":       "amount=100&currency=usd&on_behalf_of=acct_other",
		"nested in checkout": "mode=payment&success_url=https://x.test&line_items[0][price_data][currency]=usd&line_items[0][price_data][unit_amount]=100&line_items[0][price_data][product_data][name]=x&line_items[0][quantity]=1&payment_intent_data[transfer_data][destination]=acct_other",
	} {
		t.Run(name, func(t *testing.T) {
			path := map[string]string{"transfer": "/v1/transfers", "on behalf of": "/v1/payment_intents", "nested in checkout": "/v1/checkout/sessions"}[name]
			if path == "" {
				path = "/v1/charges"
			}
			r := e.MustSend(t, http.MethodPost, path, tok, hdr("Idempotency-Key", "dest-"+name), body)
			AssertRefusal(t, r, http.StatusForbidden, "account_not_allowed")
		})
	}
	assert.Zero(t, e.Fake.Count(), "nothing reached Stripe")

	r := e.Post(t, "/v1/transfers", tok, "dest-ok", form("amount", "100", "currency", "usd", "destination", "acct_ok"))
	assert.NotEqual(t, "account_not_allowed", r.ErrCode(), "a listed account passes: %s", r.Raw)
}

// Stripe answers 409 idempotency_key_in_use while it executes an earlier attempt
// under the same upstream key. Whoever sent that attempt, the money may move: a
// fresh claim answered 409 keeps its hold as outcome unknown, and the retry
// settles from Stripe's replay.
func TestUpstreamInUseKeepsTheHold(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	charge := form("amount", "6000", "currency", "usd", "source", "tok_visa")

	// An earlier attempt under keybrake's upstream key for ("k1"), still executing.
	// Its answer is held until the test has seen keybrake's attempt refused.
	e.Fake.SetFailDelay(time.Minute)
	release := e.Fake.HoldDelayed()
	defer release()
	e.Fake.FailNext(proxytest.FailAfterCreateDelay, 1)
	earlier := make(chan struct{})
	go func() {
		defer close(earlier)
		req, _ := http.NewRequest(http.MethodPost, e.Fake.URL+"/v1/charges", strings.NewReader(charge.Encode()))
		req.Header.Set("Authorization", "Bearer "+e.Fake.Secret)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", vault.UpstreamKey(key.ID, "k1"))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return len(e.Fake.Charges()) == 1 }, 5*time.Second, 5*time.Millisecond)

	r := e.Post(t, "/v1/charges", tok, "k1", charge)
	assert.Equal(t, http.StatusConflict, r.Status, "Stripe's answer is passed on: %s", r.Raw)
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c)
	assert.EqualValues(t, 6000, h, "the money may move: the hold stays")

	release()
	<-earlier
	e.Fake.WaitIdle(t)
	r = e.Post(t, "/v1/charges", tok, "k1", charge)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, h = usage(t, e, key.ID)
	assert.EqualValues(t, 6000, c, "settled from Stripe's replay")
	assert.Zero(t, h)
	assert.Len(t, e.Fake.Charges(), 1)
}
