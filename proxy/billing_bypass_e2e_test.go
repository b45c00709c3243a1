package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
)

// Holes found by the second adversarial review: requests that make Stripe
// charge at once, or later without another request, an amount keybrake never
// metered. The fake Stripe behaves as Stripe documents each case; the harness's
// cleanup checks that it never moved more than the caps allow.

// refusedUnknown asserts an amount_unknown refusal whose message says why.
func refusedUnknown(t *testing.T, r reply, words string) {
	t.Helper()
	AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
	assert.Contains(t, r.ErrMessage(), words)
}

// Hole: POST /v1/subscriptions/{id}/resume defaults to billing_cycle_anchor=now
// (Stripe's API reference), which starts a new billing period at once and
// charges it. Only an explicit billing_cycle_anchor=now was refused, so a plain
// resume of a paused 400.00 subscription was forwarded unmetered past a 50.00
// cap.
func TestSubscriptionResumeChargesAPeriodAtOnce(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("50.00", everything))
	monthly := e.Fake.AddRecurringPrice(40000, "usd")
	sub, _ := e.Fake.AddSubscription(e.Fake.AddCustomer("usd"), monthly, 1, "paused")

	refusedUnknown(t, e.Post(t, "/v1/subscriptions/"+sub+"/resume", tok, "resume", nil), "billing_cycle_anchor=unchanged")
	assert.Zero(t, postsTo(e, "/v1/subscriptions/"+sub+"/resume"), "the resume never reached Stripe")

	// Resuming on the old cycle bills the rest of the period at the next renewal,
	// which keybrake never sees (a documented limit), and charges nothing now.
	r := e.Post(t, "/v1/subscriptions/"+sub+"/resume", tok, "resume-unchanged", form("billing_cycle_anchor", "unchanged"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c+h)
	assert.Zero(t, e.Fake.TotalMoved("usd"))
}

// Hole: changing a subscription item to a price with another billing interval
// (monthly to yearly), or away from a free price, starts the new billing period
// at once and charges it in full (Stripe's "How does Stripe handle subscription
// plan changes"), whatever proration_behavior says. The update was classified as
// moving no money.
func TestSubscriptionPriceChangeChargesAtOnce(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("50.00", everything))
	monthly := e.Fake.AddRecurringPrice(1000, "usd")
	yearly := e.Fake.AddRecurringPriceEvery(120000, "usd", "year")
	sub, item := e.Fake.AddSubscription(e.Fake.AddCustomer("usd"), monthly, 1, "active")

	for name, f := range map[string]map[string]string{
		"subscription": {"items[0][id]": item, "items[0][price]": yearly, "proration_behavior": "none"},
		"price_data": {"items[0][id]": item, "items[0][price_data][currency]": "usd", "items[0][price_data][product]": "prod_1",
			"items[0][price_data][recurring][interval]": "year", "items[0][price_data][unit_amount]": "120000"},
	} {
		body := form()
		for k, v := range f {
			body.Set(k, v)
		}
		refusedUnknown(t, e.Post(t, "/v1/subscriptions/"+sub, tok, "upd-"+name, body), "new price")
	}
	refusedUnknown(t, e.Post(t, "/v1/subscription_items/"+item, tok, "item", form("price", yearly)), "new price")
	assert.Zero(t, e.Fake.TotalMoved("usd"), "no new period was charged")

	// A quantity change waits for the next renewal (prorations), as before.
	r := e.Post(t, "/v1/subscriptions/"+sub, tok, "qty", form("items[0][id]", item, "items[0][quantity]", "2"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
}

// Hole: invoices.create refused pending_invoice_items_behavior=include only.
// Stripe also takes include_and_require, and makes it the default when the
// parameter is absent under API versions before 2022-08-01 (a Stripe-Version
// header, or the account's default version when none is sent). With
// auto_advance, Stripe then collects the drawn-in items by itself: a merchant's
// 500.00 pending item was charged past a 50.00 cap. A revision (from_invoice)
// copies another invoice's lines the same way.
func TestInvoiceCreateCannotDrawInUnmeteredLines(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("50.00", everything))
	cus := e.Fake.AddCustomer("usd")
	e.Fake.AddPendingItem("usd", cus, 50000)
	old := e.Fake.AddInvoice("usd", cus, 50000)
	n := 0
	create := func(version string, kv ...string) reply {
		n++
		h := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}, "Idempotency-Key": {fmt.Sprint("inv-", n)}}
		if version != "" {
			h.Set("Stripe-Version", version)
		}
		return e.MustSend(t, http.MethodPost, "/v1/invoices", tok, h,
			form(append([]string{"customer", cus, "currency", "usd", "auto_advance", "true"}, kv...)...).Encode())
	}

	refusedUnknown(t, create("2026-08-26.dahlia", "pending_invoice_items_behavior", "include_and_require"), "pending invoice items")
	refusedUnknown(t, create("2020-08-27"), "pending_invoice_items_behavior=exclude")
	refusedUnknown(t, create(""), "without a Stripe-Version")
	refusedUnknown(t, create("2026-08-26.dahlia", "subscription", "sub_1"), "pending invoice items")
	refusedUnknown(t, create("2026-08-26.dahlia", "from_invoice[action]", "revision", "from_invoice[invoice]", old), "revision")
	assert.Zero(t, e.Fake.TotalMoved("usd"))

	// What the SDKs send (their pinned, recent version), or an explicit exclude
	// under any version, creates an empty invoice.
	for _, r := range []reply{create("2026-08-26.dahlia"), create("2020-08-27", "pending_invoice_items_behavior", "exclude")} {
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
		assert.EqualValues(t, 0, r.Body["amount_due"])
	}
	assert.Zero(t, e.Fake.TotalMoved("usd"))
}

// Hole: invoices.update with auto_advance=true (or automatically_finalizes_at)
// hands a draft invoice to Stripe's automatic collection: Stripe finalises and
// charges it without another request. It was classified as moving no money, so
// a merchant's 400.00 draft was collected past a 50.00 cap. It is metered like
// invoices.finalize now; shipping_cost, which adds to what an invoice collects
// without a line, and a change of its discounts are refused.
func TestInvoiceAutoAdvanceIsMetered(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("50.00", everything))
	big := e.Fake.AddDraftInvoice("usd", "cus_1", 40000)
	r := e.Post(t, "/v1/invoices/"+big, tok, "adv-big", form("auto_advance", "true"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	r = e.Post(t, "/v1/invoices/"+big, tok, "fin-big", form("automatically_finalizes_at", "1900000000"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	assert.Zero(t, e.Fake.TotalMoved("usd"), "the draft was not collected")

	small := e.Fake.AddDraftInvoice("usd", "cus_1", 3000)
	refusedUnknown(t, e.Post(t, "/v1/invoices/"+small, tok, "ship",
		form("shipping_cost[shipping_rate_data][display_name]", "Post", "shipping_cost[shipping_rate_data][type]", "fixed_amount",
			"shipping_cost[shipping_rate_data][fixed_amount][amount]", "90000",
			"shipping_cost[shipping_rate_data][fixed_amount][currency]", "usd")), "shipping")
	refusedUnknown(t, e.Post(t, "/v1/invoices/"+small, tok, "disc", form("discounts", "")), "discounts")
	r = e.Post(t, "/v1/invoices/"+small, tok, "adv-small", form("auto_advance", "true"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 3000, c+h, "what Stripe collects by itself is counted")
	assert.EqualValues(t, 3000, e.Fake.TotalMoved("usd"))

	// A plain update (a description) moves nothing and needs no idempotency key.
	r = e.MustSend(t, http.MethodPost, "/v1/invoices/"+big, tok,
		http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, "description=hello")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
}

// Hole: a Payment Link's optional_items (which each paying customer may add to
// the line items) were not part of its metered amount, and payment_links.update
// could add optional items or shipping options to a link already counted: a
// link limited to one payment and metered at 10.00 collected 510.00.
func TestPaymentLinkExtrasAreNotUnmetered(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("50.00", everything))
	cheap, dear := e.Fake.AddPrice(1000, "usd"), e.Fake.AddPrice(50000, "usd")
	link := form("line_items[0][price]", cheap, "line_items[0][quantity]", "1", "restrictions[completed_sessions][limit]", "1")
	withOptional := form()
	for k, v := range link {
		withOptional[k] = v
	}
	withOptional.Set("optional_items[0][price]", dear)
	withOptional.Set("optional_items[0][quantity]", "1")
	refusedUnknown(t, e.Post(t, "/v1/payment_links", tok, "link-opt", withOptional), "optional items")

	r := e.Post(t, "/v1/payment_links", tok, "link", link)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	id := r.Body["id"].(string)
	refusedUnknown(t, e.Post(t, "/v1/payment_links/"+id, tok, "upd-opt",
		form("optional_items[0][price]", dear, "optional_items[0][quantity]", "1")), "optional items")
	refusedUnknown(t, e.Post(t, "/v1/payment_links/"+id, tok, "upd-ship",
		form("shipping_options[0][shipping_rate_data][display_name]", "Post",
			"shipping_options[0][shipping_rate_data][type]", "fixed_amount",
			"shipping_options[0][shipping_rate_data][fixed_amount][amount]", "50000",
			"shipping_options[0][shipping_rate_data][fixed_amount][currency]", "usd")), "shipping")
	c, _ := usage(t, e, key.ID)
	assert.EqualValues(t, 1000, c)
	assert.EqualValues(t, 1000, e.Fake.TotalMoved("usd"))

	// Deactivating it moves nothing.
	r = e.Post(t, "/v1/payment_links/"+id, tok, "off", form("active", "false"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
}

// Hole: a Checkout Session created with after_expiration[recovery][enabled]
// gets, once it expires, a recovery URL that creates a new session — a copy of
// it — which the customer can still pay, without any request keybrake sees.
// keybrake released the session's exposure when it saw it expire, so the key
// could open another session's worth on top.
func TestCheckoutSessionRecoveryIsRefused(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("50.00", everything))
	session := func(idem string, kv ...string) reply {
		return e.Post(t, "/v1/checkout/sessions", tok, idem, form(append([]string{"mode", "payment",
			"success_url", "https://example.test/ok", "line_items[0][quantity]", "1",
			"line_items[0][price_data][currency]", "usd", "line_items[0][price_data][unit_amount]", "4000",
			"line_items[0][price_data][product_data][name]", "Order 42"}, kv...)...))
	}
	r := session("cs-recover", "after_expiration[recovery][enabled]", "true")
	if r.Status == http.StatusOK {
		// The attack, had it been let through: expire the session, which freed its
		// exposure, while its recovery URL can still be paid.
		e.Post(t, "/v1/checkout/sessions/"+r.Body["id"].(string)+"/expire", tok, "exp-recover", nil)
	}
	refusedUnknown(t, r, "recovery")

	// Without recovery, an expired session frees its exposure for good.
	r = session("cs-1")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	r = e.Post(t, "/v1/checkout/sessions/"+r.Body["id"].(string)+"/expire", tok, "exp-1", nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	r = session("cs-2")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	_, h := usage(t, e, key.ID)
	assert.EqualValues(t, 4000, h)
}

// Hole: a stored price can carry amounts in other currencies
// (currency_options), and Checkout and Payment Links charge a customer the
// amount of their local currency when the request does not fix the currency.
// keybrake read only the price's own unit_amount (Stripe leaves
// currency_options out unless expanded), so a link metered at 1.00 usd could
// collect ¥9,000,000 from a customer in Japan.
func TestMultiCurrencyPricesNeedAFixedCurrency(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("50.00", everything))
	price := e.Fake.AddMultiCurrencyPrice(100, "usd", map[string]int64{"jpy": 9_000_000})
	link := form("line_items[0][price]", price, "line_items[0][quantity]", "1", "restrictions[completed_sessions][limit]", "1")
	session := form("mode", "payment", "success_url", "https://example.test/ok", "line_items[0][price]", price,
		"line_items[0][quantity]", "1")

	refusedUnknown(t, e.Post(t, "/v1/payment_links", tok, "link", link), "currency_options")
	refusedUnknown(t, e.Post(t, "/v1/checkout/sessions", tok, "cs", session), "currency_options")
	assert.Zero(t, e.Fake.TotalMoved("jpy"), "nothing can be paid in another currency")

	// Fixing the currency to the policy's charges the price's own amount.
	link.Set("currency", "usd")
	session.Set("currency", "usd")
	for idem, r := range map[string]reply{"link-usd": e.Post(t, "/v1/payment_links", tok, "link-usd", link),
		"cs-usd": e.Post(t, "/v1/checkout/sessions", tok, "cs-usd", session)} {
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", idem, r.Raw)
	}
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 200, c+h)
	assert.Zero(t, e.Fake.TotalMoved("jpy"))

	// A price sold in one currency needs nothing more.
	plain := e.Fake.AddPrice(100, "usd")
	r := e.Post(t, "/v1/payment_links", tok, "link-plain", form("line_items[0][price]", plain, "line_items[0][quantity]", "1",
		"restrictions[completed_sessions][limit]", "1"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
}

// Hole: every read is allowed by default (and by "*.read"), and a read can
// expand secrets that spend money outside any request keybrake meters: an
// Issuing card's full number and CVC (GET /v1/issuing/cards/{id} with
// expand[]=number), a Treasury account number, a Stripe Apps secret's payload.
// A vault key capped at 50.00 could read a card and spend with it freely. Such
// expansions are refused whatever the policy says; the plain read passes.
func TestReadsDoNotRevealSpendableSecrets(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("50.00", func(p *policy.Policy) { p.Operations = nil }))
	card := e.Fake.AddIssuingCard()
	for _, target := range []string{
		"/v1/issuing/cards/" + card + "?expand[]=number",
		"/v1/issuing/cards/" + card + "?expand[0]=cvc",
		"/v1/issuing/cards/" + card + "?expand%5B%5D=pin.number",
		"/v1/issuing/cards?expand[]=data.number",
		"/v1/treasury/financial_accounts/fa_1?expand[]=financial_addresses.aba.account_number",
		"/v1/apps/secrets/find?name=k&scope[type]=account&expand[]=payload",
		"/v2/core/event_destinations/ed_1?include[0]=webhook_endpoint.signing_secret",
	} {
		r := e.MustSend(t, http.MethodGet, target, tok, nil, "")
		AssertRefusal(t, r, http.StatusForbidden, "operation_not_allowed")
		assert.NotContains(t, string(r.Raw), proxytest.IssuingCardNumber)
	}
	assert.Zero(t, e.Fake.Count(), "none reached Stripe")

	r := e.MustSend(t, http.MethodGet, "/v1/issuing/cards/"+card+"?expand[]=cardholder", tok, nil, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "0001", r.Body["last4"])
}

// Hole: with a customers list, a request on an existing object (a PaymentIntent
// update, a refund of a charge, a read of one object) passed when it carried a
// customer parameter naming a listed customer — which says nothing about whose
// object it acts on, and on payment_intents.update hands the object over to
// that customer. A key for cus_A took cus_B's PaymentIntent and refunded
// cus_B's charge.
func TestCustomerParameterDoesNotProveWhoseObject(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00", everything, func(p *policy.Policy) { p.Customers = []string{"cus_A"} }))
	piB := e.Fake.AddPaymentIntent(1000, "usd", "cus_B")
	chB := e.Fake.AddCharge(5000, "usd", "cus_B", true)

	r := e.Post(t, "/v1/payment_intents/"+piB, tok, "take", form("customer", "cus_A", "description", "mine now"))
	AssertRefusal(t, r, http.StatusForbidden, "customer_not_allowed")
	r = e.Post(t, "/v1/refunds", tok, "refund", form("charge", chB, "customer", "cus_A", "amount", "1000"))
	AssertRefusal(t, r, http.StatusForbidden, "customer_not_allowed")
	r = e.MustSend(t, http.MethodGet, "/v1/payment_intents/"+piB+"?customer=cus_A", tok, nil, "")
	AssertRefusal(t, r, http.StatusForbidden, "customer_not_allowed")
	assert.Zero(t, e.Fake.Count(), "none reached Stripe")
	pi, _ := e.Fake.PaymentIntent(piB)
	assert.Equal(t, "cus_B", pi.Customer)
	assert.Empty(t, e.Fake.Refunds())

	// What the customer list is for still works: a payment for cus_A, and a list
	// filtered by it.
	r = e.Post(t, "/v1/payment_intents", tok, "pay", form("amount", "2000", "currency", "usd", "customer", "cus_A"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	r = e.MustSend(t, http.MethodGet, "/v1/payment_intents?customer=cus_A", tok, nil, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
}

// Hole: a request can move money to or from a connected account without naming
// it: a transfer reversal takes money back from the transfer's destination, a
// capture of a destination charge transfers to its destination, and a refund
// with reverse_transfer=true debits it. A key without stripe_accounts — which
// "can neither send money to a connected account nor take money from one" —
// did all three. The account is read from the object keybrake looks up anyway.
func TestUnnamedConnectedAccountsAreChecked(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00", everything, func(p *policy.Policy) { p.StripeAccounts = []string{"acct_ok"} }))
	other, ok := e.Fake.AddTransfer(5000, "usd", "acct_other"), e.Fake.AddTransfer(5000, "usd", "acct_ok")
	destination := e.Fake.AddDestinationCharge(3000, "usd", "acct_other", false)

	r := e.Post(t, "/v1/transfers/"+other+"/reversals", tok, "rev", form("amount", "1000"))
	AssertRefusal(t, r, http.StatusForbidden, "account_not_allowed")
	assert.Contains(t, r.ErrMessage(), "acct_other")
	r = e.Post(t, "/v1/charges/"+destination+"/capture", tok, "cap", nil)
	AssertRefusal(t, r, http.StatusForbidden, "account_not_allowed")
	assert.Zero(t, postsTo(e, "/v1/transfers/"+other+"/reversals")+postsTo(e, "/v1/charges/"+destination+"/capture"))

	// A listed account passes.
	r = e.Post(t, "/v1/transfers/"+ok+"/reversals", tok, "rev-ok", form("amount", "1000"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)

	// A refund of a destination charge comes out of the platform's balance;
	// reverse_transfer takes it from the connected account.
	captured := e.Fake.AddDestinationCharge(3000, "usd", "acct_other", true)
	r = e.Post(t, "/v1/refunds", tok, "refund-rev", form("charge", captured, "amount", "500", "reverse_transfer", "true"))
	AssertRefusal(t, r, http.StatusForbidden, "account_not_allowed")
	r = e.Post(t, "/v1/refunds", tok, "refund", form("charge", captured, "amount", "500"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, _ := usage(t, e, key.ID)
	assert.EqualValues(t, 1500, c, "the reversal from acct_ok and the plain refund")
}

// Hole: prices.update can add amounts in other currencies to a price that
// Payment Links already use: a link metered at 1.00 usd then collected
// ¥9,000,000 from a customer in Japan.
func TestPriceUpdateCannotAddCurrencies(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("50.00", everything))
	price := e.Fake.AddPrice(100, "usd")
	r := e.Post(t, "/v1/payment_links", tok, "link", form("line_items[0][price]", price, "line_items[0][quantity]", "1",
		"restrictions[completed_sessions][limit]", "1"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)

	refusedUnknown(t, e.Post(t, "/v1/prices/"+price, tok, "opt", form("currency_options[jpy][unit_amount]", "9000000")),
		"other currencies")
	assert.Zero(t, e.Fake.TotalMoved("jpy"))
	r = e.Post(t, "/v1/prices/"+price, tok, "meta", form("metadata[k]", "v"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
}

// Hole: Managed Payments (managed_payments[enabled], Stripe as merchant of
// record) has Stripe handle the tax itself, adding it to tax-exclusive prices
// like automatic tax, which keybrake refuses because it cannot bound it. A 45.00
// session under a 50.00 cap collected 54.00.
func TestManagedPaymentsAddTaxLikeAutomaticTax(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("50.00", everything))
	session := form("mode", "payment", "success_url", "https://example.test/ok", "line_items[0][quantity]", "1",
		"line_items[0][price_data][currency]", "usd", "line_items[0][price_data][unit_amount]", "4500",
		"line_items[0][price_data][product_data][name]", "Ebook", "managed_payments[enabled]", "true")
	refusedUnknown(t, e.Post(t, "/v1/checkout/sessions", tok, "cs-managed", session), "checkout.sessions.create")
	price := e.Fake.AddPrice(4500, "usd")
	refusedUnknown(t, e.Post(t, "/v1/payment_links", tok, "link-managed", form("line_items[0][price]", price,
		"line_items[0][quantity]", "1", "restrictions[completed_sessions][limit]", "1", "managed_payments[enabled]", "true")), "tax")
	assert.Zero(t, e.Fake.TotalMoved("usd"))
}
