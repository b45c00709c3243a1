package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// An account debit (POST /v1/charges with source=acct_…) takes money from a
// connected account's balance: the account is touched like a Stripe-Account
// header, so a key that does not list it is refused before Stripe, and a key
// that lists it is metered like any charge.
func TestAccountDebitNeedsTheAccount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t)
	acct := e.Fake.AddConnectedAccount("usd", 50000)
	debit := func(idem string) *stripe.ChargeCreateParams {
		p := &stripe.ChargeCreateParams{
			Amount: stripe.Int64(2500), Currency: stripe.String("usd"),
			Source: &stripe.PaymentSourceSourceParams{Token: stripe.String(acct)},
		}
		p.SetIdempotencyKey(idem)
		return p
	}

	tok, _ := e.MustKey(t, Policy("99.00")) // names no stripe_accounts
	_, err := e.Client(tok, 0).V1Charges.Create(ctx, debit("debit-1"))
	se := StripeErr(t, err)
	assert.Equal(t, http.StatusForbidden, se.HTTPStatusCode)
	assert.Equal(t, stripe.ErrorCode("account_not_allowed"), se.Code)
	assert.Contains(t, se.Msg, acct)
	assert.Zero(t, e.Fake.Count(), "nothing reached Stripe")
	a, _ := e.Fake.ConnectedAccount(acct)
	assert.EqualValues(t, 50000, a.Balance, "the account was not debited")

	tok, key := e.MustKey(t, Policy("99.00", func(p *policy.Policy) { p.StripeAccounts = []string{acct} }))
	ch, err := e.Client(tok, 0).V1Charges.Create(ctx, debit("debit-2"))
	require.NoError(t, err)
	assert.Equal(t, acct, ch.Source.ID, "Stripe's answer names the debited account")
	a, _ = e.Fake.ConnectedAccount(acct)
	assert.EqualValues(t, 47500, a.Balance)
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 2500, c, "the debit is metered like any charge")
	assert.Zero(t, h)
	holds, _, err := e.Store.ListHolds(ctx, vault.HoldCommitted, 10, "")
	require.NoError(t, err)
	require.Len(t, holds, 1)
	assert.Equal(t, "charges.create", holds[0].Operation)
}

// Every place a request can name a connected account is checked: the id of
// /v2/core/accounts/{id}, an acct_… segment anywhere in a path, and parameters
// that name accounts — in a GET's query as in a POST's body, nested or not.
func TestEveryAccountNamingPlaceIsChecked(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	ok := e.Fake.AddConnectedAccount("usd", 0)
	tok, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) {
		p.Operations = []string{"*"}
		p.StripeAccounts = []string{ok}
	}))
	type req struct{ method, target, body string }
	refused := map[string]req{
		"v2 account":                 {http.MethodGet, "/v2/core/accounts/acct_other", ""},
		"v2 account persons":         {http.MethodGet, "/v2/core/accounts/acct_other/persons", ""},
		"v2 account, not acct_ form": {http.MethodGet, "/v2/core/accounts/other", ""},
		"acct_ segment in a path":    {http.MethodGet, "/v1/unknown_things/acct_other", ""},
		"transfers to an account":    {http.MethodGet, "/v1/transfers?destination=acct_other", ""},
		"report of an account":       {http.MethodGet, "/v1/balance_transactions?parameters[connected_account]=acct_other", ""},
		"account debit":              {http.MethodPost, "/v1/charges", "amount=100&currency=usd&source=acct_other"},
		"on_behalf_of, any form":     {http.MethodPost, "/v1/setup_intents", "on_behalf_of=other"},
		"account as an array":        {http.MethodPost, "/v1/setup_intents", "destination[0]=acct_other"},
		"account link, array":        {http.MethodPost, "/v1/account_links", "account[]=acct_other&type=account_onboarding"},
		"listed and unlisted":        {http.MethodPost, "/v1/transfers", "amount=100&currency=usd&destination=" + ok + "&transfer_data[destination]=acct_other"},
	}
	for name, tc := range refused {
		t.Run(name, func(t *testing.T) {
			r := e.MustSend(t, tc.method, tc.target, tok, hdr("Idempotency-Key", "acct-"+name), tc.body)
			AssertRefusal(t, r, http.StatusForbidden, "account_not_allowed")
		})
	}
	assert.Zero(t, e.Fake.Count(), "nothing reached Stripe")

	allowed := map[string]req{
		"v2 listed account":          {http.MethodGet, "/v2/core/accounts/" + ok, ""},
		"v1 listed account":          {http.MethodGet, "/v1/accounts/" + ok, ""},
		"payout to a bank account":   {http.MethodGet, "/v1/payouts?destination=ba_123", ""},
		"a card source":              {http.MethodPost, "/v1/charges", "amount=100&currency=usd&source=tok_visa"},
		"metadata is the caller's":   {http.MethodPost, "/v1/charges", "amount=100&currency=usd&source=tok_visa&metadata[destination]=acct_other"},
		"customer_account":           {http.MethodGet, "/v1/invoices?customer_account=acct_other", ""},
		"a financial account's path": {http.MethodGet, "/v1/financial_connections/accounts/fca_1", ""},
	}
	for name, tc := range allowed {
		t.Run(name, func(t *testing.T) {
			r := e.MustSend(t, tc.method, tc.target, tok, hdr("Idempotency-Key", "acct-"+name), tc.body)
			assert.NotEqual(t, "account_not_allowed", r.ErrCode(), "%s", r.Raw)
			assert.NotEmpty(t, r.Header.Get("Request-Id"))
		})
	}
	r := e.MustSend(t, http.MethodGet, "/v2/core/accounts/"+ok, tok, nil, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, ok, r.Body["id"])
}
