package proxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
)

// everything allows every operation: invoicing must be named in a policy.
func everything(p *policy.Policy) { p.Operations = []string{"*"} }

// itemAt is the fake's invoice item (or line) id.
func itemAt(t *testing.T, e *env, id string) proxytest.InvoiceItem {
	t.Helper()
	for _, it := range e.Fake.InvoiceItems() {
		if it.ID == id || "il_"+strings.TrimPrefix(it.ID, "ii_") == id {
			return it
		}
	}
	t.Fatalf("no invoice item %s at the fake", id)
	return proxytest.InvoiceItem{}
}

// Hole: an invoice item updated with only unit_amount_decimal was metered as
// unit × 1, but Stripe keeps the item's quantity: an item of 10,000 × 1 became
// 10,000 × 5,000 with nothing held. The quantity (or, for a new quantity, the
// unit amount) is read at Stripe.
func TestInvoiceItemUpdateKeepsWhatItDoesNotName(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("200.00", everything))
	r := e.Post(t, "/v1/invoiceitems", tok, "create", form("customer", "cus_1", "currency", "usd",
		"quantity", "10000", "unit_amount_decimal", "1"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	id := r.Body["id"].(string)
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c)
	assert.EqualValues(t, 10000, h, "a pending invoice item is counted until it is invoiced or deleted")

	r = e.Post(t, "/v1/invoiceitems/"+id, tok, "unit-5000", form("unit_amount_decimal", "5000"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	assert.Equal(t, "499900.00", r.Keybrake()["requested"], "the new total, 5000 × 10000, less the 100.00 counted")
	assert.EqualValues(t, 10000, itemAt(t, e, id).Amount(), "the raise never reached Stripe")

	r = e.Post(t, "/v1/invoiceitems/"+id, tok, "unit-2", form("unit_amount_decimal", "2"))
	require.Equal(t, http.StatusOK, r.Status, "2 × 10000 fits: %s", r.Raw)
	_, h = usage(t, e, key.ID)
	assert.EqualValues(t, 20000, h)

	r = e.Post(t, "/v1/invoiceitems/"+id, tok, "qty-15000", form("quantity", "15000"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	assert.Equal(t, "100.00", r.Keybrake()["requested"], "a new quantity keeps the unit amount: 2 × 15000 − 200.00")

	r = e.Post(t, "/v1/invoiceitems/ii_missing", tok, "missing", form("unit_amount_decimal", "5"))
	AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")

	// Deleting the item through keybrake gives its budget back.
	r = e.MustSend(t, http.MethodDelete, "/v1/invoiceitems/"+id, tok, nil, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, h = usage(t, e, key.ID)
	assert.Zero(t, c+h, "a deleted invoice item can move no money")
}

// Hole: invoices.add_lines, update_lines and /v1/invoices/{id}/lines/{line}
// create and reprice invoice items, but moved no money to keybrake. They are
// metered like invoiceitems.create, on the invoice, and paying the invoice draws
// on what its lines counted.
func TestInvoiceLinesAreMetered(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("200.00", everything))
	r := e.Post(t, "/v1/invoices", tok, "inv", form("customer", "cus_1", "currency", "usd", "pending_invoice_items_behavior", "exclude"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	inv := r.Body["id"].(string)
	_, h := usage(t, e, key.ID)
	assert.Zero(t, h, "an empty invoice moves nothing")

	r = e.Post(t, "/v1/invoices/"+inv+"/add_lines", tok, "add-1", form("lines[0][amount]", "15000"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	_, h = usage(t, e, key.ID)
	assert.EqualValues(t, 15000, h)

	r = e.Post(t, "/v1/invoices/"+inv+"/add_lines", tok, "add-2", form("lines[0][price_data][currency]", "usd",
		"lines[0][price_data][product]", "prod_1", "lines[0][price_data][unit_amount]", "3000", "lines[0][quantity]", "2"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	assert.Len(t, e.Fake.Invoices()[0].Items, 1, "the line never reached Stripe")

	line := "il_" + strings.TrimPrefix(e.Fake.Invoices()[0].Items[0], "ii_")
	r = e.Post(t, "/v1/invoices/"+inv+"/update_lines", tok, "upd-1", form("lines[0][id]", line, "lines[0][amount]", "60000"))
	AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
	r = e.Post(t, "/v1/invoices/"+inv+"/lines/"+line, tok, "upd-2", form("quantity", "3"))
	AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
	r = e.Post(t, "/v1/invoices/"+inv+"/lines/"+line, tok, "upd-3", form("amount", "4000"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.EqualValues(t, 4000, itemAt(t, e, line).Amount())
	_, h = usage(t, e, key.ID)
	assert.EqualValues(t, 19000, h, "a repriced line counts at its new total until the invoice settles")

	r = e.Post(t, "/v1/invoices/"+inv+"/pay", tok, "pay", form("payment_method", "pm_card_visa"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "paid", r.Body["status"])
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 4000, c, "what was paid, once")
	assert.Zero(t, h, "a paid invoice can move no more money")
}

// Hole: invoices.pay held the amount_remaining looked up before the payment and
// committed that hold, so a line added between the lookup and the payment was
// charged unmetered. It commits what Stripe's answer says was paid.
func TestInvoicePayCommitsWhatWasPaid(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00", everything))
	inv := e.Fake.AddInvoice("usd", "cus_1", 5000)
	e.Fake.SetHook(func(r proxytest.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/pay") {
			e.Fake.AddInvoiceLine(inv, 3000) // changed at Stripe after keybrake's lookup
		}
	})
	r := e.Post(t, "/v1/invoices/"+inv+"/pay", tok, "pay", form())
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.EqualValues(t, 8000, r.Body["amount_paid"])
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 8000, c, "the money Stripe says moved is committed, all of it")
	assert.Zero(t, h)
	assert.Contains(t, e.Logs.String(), "Stripe moved more than keybrake held", "the overrun is logged")
}

// A declined invoices.pay leaves the invoice open (Stripe retries it itself): what
// its lines counted stays counted, and voiding it through keybrake releases it.
func TestDeclinedInvoicePayKeepsItsLinesCounted(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00", everything))
	r := e.Post(t, "/v1/invoices", tok, "inv", form("customer", "cus_1", "currency", "usd", "pending_invoice_items_behavior", "exclude"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	inv := r.Body["id"].(string)
	r = e.Post(t, "/v1/invoiceitems", tok, "item", form("customer", "cus_1", "currency", "usd", "amount", "7000", "invoice", inv))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)

	r = e.Post(t, "/v1/invoices/"+inv+"/pay", tok, "pay", form("payment_method", "pm_card_chargeDeclined"))
	require.Equal(t, http.StatusPaymentRequired, r.Status, "%s", r.Raw)
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c)
	assert.EqualValues(t, 7000, h, "the invoice is still open and collectable")

	r = e.Post(t, "/v1/invoices/"+inv+"/void", tok, "void", form())
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, h = usage(t, e, key.ID)
	assert.Zero(t, c+h, "a voided invoice can move no money")
}

// Taxes raise what Stripe collects by an amount keybrake cannot bound: refused,
// and the refusal says why.
func TestInvoiceTaxesAreRefused(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00", everything))
	for name, tc := range map[string]struct{ path, body string }{
		"item tax rates":   {"/v1/invoiceitems", "amount=1000&currency=usd&customer=cus_1&tax_rates[0]=txr_1"},
		"line tax rates":   {"/v1/invoices/in_1/add_lines", "lines[0][amount]=1000&lines[0][tax_rates][0]=txr_1"},
		"automatic tax":    {"/v1/invoices", "automatic_tax[enabled]=true&customer=cus_1"},
		"default tax rate": {"/v1/invoices/in_1", "default_tax_rates[0]=txr_1"},
	} {
		t.Run(name, func(t *testing.T) {
			r := e.MustSend(t, http.MethodPost, tc.path, tok, hdr("Idempotency-Key", name), tc.body)
			AssertRefusal(t, r, http.StatusForbidden, "amount_unknown")
			e, _ := r.Body["error"].(map[string]any)
			assert.Contains(t, e["message"], "tax")
		})
	}
	assert.Zero(t, e.Fake.Count(), "nothing reached Stripe")
}
