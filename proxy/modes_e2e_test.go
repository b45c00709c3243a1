package proxy_test

import (
	"context"
	"errors"
	"net/http"
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

// deriveBilling is a derive-mode policy keyed on the customer and the billing period.
func deriveBilling(p *policy.Policy) {
	p.Idempotency = policy.Idempotency{Mode: policy.IdempotencyDerive, Fields: []string{"customer", "metadata[billing_period]"}}
}

// billingCharge is what the seed's billing job sends: stripe-go params for a
// charge of amount to customer for period, with a fresh idempotency key per call
// (the seed's failure modes 1 and 2).
func billingCharge(amount int64, customer, period, freshKey string) *stripe.ChargeCreateParams {
	p := &stripe.ChargeCreateParams{
		Amount:   stripe.Int64(amount),
		Currency: stripe.String("usd"),
		Customer: stripe.String(customer),
		Source:   &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
	}
	if period != "" {
		p.AddMetadata("billing_period", period)
	}
	p.SetIdempotencyKey(freshKey)
	return p
}

// Derive mode: a caller that makes a fresh UUID for every retry still hits one
// record, because keybrake derives the key from the operation, the customer and
// the billing period and ignores the caller's.
func TestDeriveModeFreshUUIDsWithStripeGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00", deriveBilling))
	sc := e.Client(tok, 0)

	var ids, replayed, echoed []string
	for _, uuid := range []string{
		"7b0c7a8e-5f0e-4a43-9d0f-7f2f3c1d2a01",
		"0f6d3c1e-9a7b-4c52-8e1d-2b3a4c5d6e02",
		"c2d4e6f8-1a3b-4c5d-9e7f-8a9b0c1d2e03",
	} {
		ch, err := sc.V1Charges.Create(ctx, billingCharge(6000, "cus_1", "2026-09", uuid))
		require.NoError(t, err)
		ids = append(ids, ch.ID)
		replayed = append(replayed, ch.LastResponse.Header.Get("Idempotent-Replayed"))
		echoed = append(echoed, ch.LastResponse.Header.Get("Idempotency-Key"))
	}
	assert.Equal(t, []string{ids[0], ids[0], ids[0]}, ids, "three retries, one charge")
	assert.True(t, strings.HasPrefix(echoed[0], "kbd_"), "the answer names the derived key: %q", echoed[0])
	assert.Equal(t, []string{echoed[0], echoed[0], echoed[0]}, echoed, "three fresh UUIDs, one derived key")
	assert.Equal(t, []string{"", "true", "true"}, replayed, "one upstream charge, two replays")
	require.Len(t, e.Fake.Charges(), 1)
	assert.Equal(t, 1, e.Fake.CountWhere(func(r Request) bool { return r.Method == http.MethodPost }),
		"one request reached Stripe")
	assert.True(t, strings.HasPrefix(e.Fake.Charges()[0].IdempotencyKey, "keybrake_"),
		"Stripe got keybrake's stable upstream key")

	daily, period := keyUsage(t, e.Store, key.ID)
	assert.Equal(t, policy.Counter{Committed: 6000}, daily, "metered once")
	assert.Equal(t, policy.Counter{Committed: 6000}, period)

	// Another billing period is another charge; another amount for the same period
	// is a different request under the same derived key: refused, not charged.
	ch, err := sc.V1Charges.Create(ctx, billingCharge(2000, "cus_1", "2026-10", "fresh-4"))
	require.NoError(t, err)
	assert.NotEqual(t, ids[0], ch.ID)
	_, err = sc.V1Charges.Create(ctx, billingCharge(2500, "cus_1", "2026-09", "fresh-5"))
	se := StripeErr(t, err)
	assert.Equal(t, http.StatusUnprocessableEntity, se.HTTPStatusCode)
	assert.Equal(t, "idempotency_key_reused", string(se.Code))
	assert.Len(t, e.Fake.Charges(), 2)

	// A request without a listed field cannot be deduplicated: refused, naming it.
	_, err = sc.V1Charges.Create(ctx, billingCharge(100, "cus_1", "", "fresh-6"))
	se = StripeErr(t, err)
	assert.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	assert.Equal(t, "idempotency_key_required", string(se.Code))
	assert.Contains(t, se.Msg, `"metadata[billing_period]"`)
	assert.Equal(t, "metadata[billing_period]", se.Param)
	assert.Len(t, e.Fake.Charges(), 2, "nothing reached Stripe")
}

// Derive mode needs at least one field, and only form paths.
func TestDeriveModePolicyValidation(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tests := map[string]struct {
		idem  policy.Idempotency
		field string
	}{
		"no fields":             {policy.Idempotency{Mode: policy.IdempotencyDerive}, "idempotency.fields"},
		"fields without derive": {policy.Idempotency{Mode: policy.IdempotencyRequire, Fields: []string{"customer"}}, "idempotency.fields"},
		"unknown mode":          {policy.Idempotency{Mode: "guess"}, "idempotency.mode"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := Policy("99.00", func(p *policy.Policy) { p.Idempotency = tc.idem })
			p.Normalize(time.Now())
			_, _, err := e.Store.MintKey(context.Background(), "test", vault.MintRequest{Name: "derive-" + strings.ReplaceAll(name, " ", "-"), Upstream: "default", Policy: p})
			require.ErrorIs(t, err, vault.ErrInvalid)
			var verr *policy.ValidationError
			require.True(t, errors.As(err, &verr), "%v", err)
			var fields []string
			for _, fe := range verr.Errors {
				fields = append(fields, fe.Field)
			}
			assert.Contains(t, fields, tc.field)
		})
	}
}

// keyUsage returns a key's daily and period counters now.
func keyUsage(tb testing.TB, s vault.Store, keyID string) (daily, period policy.Counter) {
	tb.Helper()
	_, windows, u, err := s.KeyUsage(context.Background(), keyID)
	require.NoError(tb, err)
	require.Len(tb, windows, 2)
	return u[windows[0].ID], u[windows[1].ID]
}

// wouldRefuseEvents returns the reasons of a key's would_refuse events.
func wouldRefuseEvents(tb testing.TB, s vault.Store, keyID string) []string {
	tb.Helper()
	events, _, err := s.ListEvents(context.Background(), keyID, 500, "")
	require.NoError(tb, err)
	var reasons []string
	for _, ev := range events {
		if ev.Decision == "would_refuse" {
			reasons = append(reasons, ev.Reason)
		}
	}
	return reasons
}

// Report mode relaxes cap, operation, customer and currency refusals: the request
// is forwarded, metered like any other, and the refusal it would have had is
// recorded as a would_refuse event and in the canonical log line.
func TestReportModeRelaxesPolicyDecisions(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		policy func(*policy.Policy)
		path   string
		body   []string
		reason string
		amount int64
	}{
		"cap": {
			path: "/v1/charges", body: []string{"amount", "6000", "currency", "usd", "source", "tok_visa"},
			reason: "spend_cap_exceeded", amount: 6000,
		},
		"per-request cap": {
			policy: func(p *policy.Policy) { d := decimal.RequireFromString("5.00"); p.PerRequestCap = &d },
			path:   "/v1/charges", body: []string{"amount", "900", "currency", "usd", "source", "tok_visa"},
			reason: "spend_cap_exceeded", amount: 900,
		},
		"operation": {
			policy: func(p *policy.Policy) { p.Operations = []string{"charges.create"} },
			path:   "/v1/payment_intents", body: []string{"amount", "700", "currency", "usd"},
			reason: "operation_not_allowed", amount: 700,
		},
		"customer": {
			policy: func(p *policy.Policy) { p.Customers = []string{"cus_allowed"} },
			path:   "/v1/charges", body: []string{"amount", "500", "currency", "usd", "customer", "cus_other", "source", "tok_visa"},
			reason: "customer_not_allowed", amount: 500,
		},
		"currency": {
			path: "/v1/charges", body: []string{"amount", "300", "currency", "eur", "source", "tok_visa"},
			reason: "currency_not_allowed", amount: 300,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := MustEnv(t)
			tok, key := e.MustKey(t, Policy("10.00", func(p *policy.Policy) {
				p.Mode = policy.ModeReport
				if tc.policy != nil {
					tc.policy(p)
				}
			}))
			r := e.Post(t, tc.path, tok, "report-"+name, form(tc.body...))
			require.Equal(t, http.StatusOK, r.Status, "forwarded in report mode; body: %s", r.Raw)
			assert.Equal(t, 1, e.Fake.Count(), "the request reached Stripe")

			assert.Equal(t, []string{tc.reason}, wouldRefuseEvents(t, e.Store, key.ID),
				"a would_refuse event records what enforcing would have refused")
			daily, _ := keyUsage(t, e.Store, key.ID)
			assert.Equal(t, tc.amount, daily.Committed+daily.Held, "metered like any other request")

			var line map[string]any
			for _, l := range e.Logs.LogLines(t) {
				line = l
			}
			require.NotNil(t, line)
			assert.Equal(t, "would_refuse", line["decision"])
			assert.Equal(t, tc.reason, line["reason"])

			// The same request under an enforce-mode key is refused and never forwarded.
			enforce := MustEnv(t)
			enforceTok, _ := enforce.MustKey(t, Policy("10.00", func(p *policy.Policy) {
				if tc.policy != nil {
					tc.policy(p)
				}
			}))
			r = enforce.Post(t, tc.path, enforceTok, "enforce-"+name, form(tc.body...))
			assert.GreaterOrEqual(t, r.Status, 400)
			assert.Equal(t, tc.reason, r.ErrCode())
			assert.Zero(t, enforce.Fake.Count(), "enforce mode refuses before Stripe")
		})
	}
}

// Report mode never relaxes the refusals that protect security: no, unknown,
// revoked or expired key, a malformed request, an account the policy does not
// allow, a write to an endpoint outside the catalogue. None reaches Stripe.
func TestReportModeNeverRelaxesSecurity(t *testing.T) {
	t.Parallel()
	clock := &offsetClock{}
	e := MustEnv(t, withClocks(clock.Now, clock.Now))
	report := func(p *policy.Policy) {
		p.Mode = policy.ModeReport
		p.StripeAccounts = []string{"acct_ok"}
	}
	tok, _ := e.MustKey(t, Policy("10.00", report))
	revokedTok, revoked := e.MustKey(t, Policy("10.00", report))
	_, err := e.Store.RevokeKey(context.Background(), "test", revoked.ID)
	require.NoError(t, err)
	unknownTok := "vk_" + strings.Repeat("A", 43)

	charge := "amount=100&currency=usd&source=tok_visa"
	tests := map[string]struct {
		method, path, token string
		header              http.Header
		body                string
		status              int
		code                string
	}{
		"no key":             {"POST", "/v1/charges", "", hdr("Idempotency-Key", "a"), charge, 401, "vault_key_invalid"},
		"unknown key":        {"POST", "/v1/charges", unknownTok, hdr("Idempotency-Key", "a"), charge, 401, "vault_key_invalid"},
		"revoked key":        {"POST", "/v1/charges", revokedTok, hdr("Idempotency-Key", "a"), charge, 401, "vault_key_revoked"},
		"account":            {"POST", "/v1/charges", tok, hdr("Idempotency-Key", "a", "Stripe-Account", "acct_other"), charge, 403, "account_not_allowed"},
		"context":            {"POST", "/v1/charges", tok, hdr("Idempotency-Key", "a", "Stripe-Context", "acct_other"), charge, 403, "account_not_allowed"},
		"duplicate param":    {"POST", "/v1/charges", tok, hdr("Idempotency-Key", "a"), charge + "&amount=999999", 400, "request_malformed"},
		"query on a POST":    {"POST", "/v1/charges?amount=999999", tok, hdr("Idempotency-Key", "a"), charge, 400, "request_malformed"},
		"JSON v1 body":       {"POST", "/v1/charges", tok, hdr("Idempotency-Key", "a", "Content-Type", "application/json"), `{"amount":100}`, 400, "request_malformed"},
		"unknown write":      {"POST", "/v1/not_a_stripe_thing", tok, hdr("Idempotency-Key", "a"), "x=1", 403, "operation_not_allowed"},
		"no idempotency":     {"POST", "/v1/charges", tok, nil, charge, 400, "idempotency_key_required"},
		"negative amount":    {"POST", "/v1/charges", tok, hdr("Idempotency-Key", "a"), "amount=-100&currency=usd&source=tok_visa", 400, "request_malformed"},
		"non-canonical path": {"GET", "/v1//charges", tok, nil, "", 400, "request_malformed"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := e.Fake.Count()
			r := e.MustSend(t, tc.method, tc.path, tc.token, tc.header, tc.body)
			AssertRefusal(t, r, tc.status, tc.code)
			assert.Equal(t, before, e.Fake.Count(), "nothing reached Stripe")
		})
	}

	t.Run("amount unknown", func(t *testing.T) {
		posts := func() int {
			return e.Fake.CountWhere(func(r Request) bool { return r.Method == http.MethodPost })
		}
		before := posts()
		r := e.Post(t, "/v1/payment_intents/pi_missing/confirm", tok, "confirm", form())
		AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
		assert.Equal(t, before, posts(), "only the amount lookup reached Stripe, never the confirm")
	})

	t.Run("expired key", func(t *testing.T) {
		expTok, exp := e.MustKey(t, Policy("10.00", report))
		clock.Advance(31 * 24 * time.Hour)
		t.Cleanup(func() { clock.Advance(-31 * 24 * time.Hour) })
		before := e.Fake.Count()
		r := e.Post(t, "/v1/charges", expTok, "late", form("amount", "100", "currency", "usd", "source", "tok_visa"))
		AssertRefusal(t, r, http.StatusUnauthorized, "vault_key_expired")
		assert.Equal(t, before, e.Fake.Count())
		assert.Empty(t, wouldRefuseEvents(t, e.Store, exp.ID))
	})
}

// A write that moves no money is relaxed by report mode too; it is not metered,
// but the canonical log line and the ledger both say what would have been refused.
func TestReportModeRelaxesUnmeteredWrites(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("10.00", func(p *policy.Policy) {
		p.Mode = policy.ModeReport
		p.Operations = []string{"charges.create"}
	}))
	r := e.Post(t, "/v1/customers", tok, "", form("email", "a@example.com"))
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Raw)
	assert.Equal(t, 1, e.Fake.Count())
	lines := e.Logs.LogLines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, "would_refuse", lines[0]["decision"])
	assert.Equal(t, "operation_not_allowed", lines[0]["reason"])
	assert.Equal(t, []string{"operation_not_allowed"}, wouldRefuseEvents(t, e.Store, key.ID),
		"the ledger records what report mode let through")

	// With an idempotency key the request claims a record too; still one event.
	r = e.Post(t, "/v1/customers", tok, "cust-1", form("email", "b@example.com"))
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Raw)
	r = e.Post(t, "/v1/customers", tok, "cust-1", form("email", "b@example.com"))
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Raw)
	assert.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
	assert.Len(t, wouldRefuseEvents(t, e.Store, key.ID), 2, "a replay is not a new would_refuse")

	// An allowed request in report mode records nothing of the kind.
	r = e.Post(t, "/v1/charges", tok, "ch-1", form("amount", "100", "currency", "usd", "source", "tok_visa"))
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Raw)
	assert.Len(t, wouldRefuseEvents(t, e.Store, key.ID), 2)
}
