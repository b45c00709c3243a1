package stripeapi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadLookup(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		body, field string
		amount      int64
		currency    string
		wantErr     bool
	}{
		"payment intent":   {`{"id":"pi_1","amount":1099,"currency":"usd"}`, "amount", 1099, "usd", false},
		"nested":           {`{"amount_details":{"tip":{"amount":5}},"currency":"eur"}`, "amount_details.tip.amount", 5, "eur", false},
		"no currency":      {`{"unit_amount":1500}`, "unit_amount", 1500, "", false},
		"missing field":    {`{"currency":"usd"}`, "amount", 0, "", true},
		"null field":       {`{"amount":null,"currency":"usd"}`, "amount", 0, "", true},
		"negative":         {`{"amount":-5,"currency":"usd"}`, "amount", 0, "", true},
		"float":            {`{"amount":10.5,"currency":"usd"}`, "amount", 0, "", true},
		"exponent":         {`{"amount":1e3,"currency":"usd"}`, "amount", 0, "", true},
		"string":           {`{"amount":"100","currency":"usd"}`, "amount", 0, "", true},
		"overflow":         {`{"amount":99999999999999999999,"currency":"usd"}`, "amount", 0, "", true},
		"upper currency":   {`{"amount":1,"currency":"USD"}`, "amount", 0, "", true},
		"not an object":    {`[1]`, "amount", 0, "", true},
		"currency numeric": {`{"amount":1,"currency":840}`, "amount", 0, "", true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ReadLookup([]byte(tc.body), Lookup{Field: tc.field})
			if tc.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.amount, got.Amount)
			assert.Equal(t, tc.currency, got.Currency)
		})
	}
}

// An update that changes one factor of unit × quantity reads the other from the
// object: an integer, or a decimal string with no fractional minor units, in the
// first of the named fields that is present and not null.
func TestReadLookupFactors(t *testing.T) {
	t.Parallel()
	item := `{"object":"invoiceitem","amount":10000,"currency":"usd","quantity":10000,"quantity_decimal":"10000.000","pricing":{"unit_amount_decimal":null},"unit_amount_decimal":"1"}`
	cases := map[string]struct {
		body    string
		factors []string
		want    int64
		wantErr bool
	}{
		"quantity_decimal first":  {item, itemQuantityFactors, 10000, false},
		"null skipped":            {item, itemUnitFactors, 1, false},
		"integer":                 {`{"amount":5,"quantity":5}`, []string{"quantity"}, 5, false},
		"fractional":              {`{"amount":5,"quantity_decimal":"2.5"}`, itemQuantityFactors, 0, true},
		"none present":            {`{"amount":5}`, itemUnitFactors, 0, true},
		"negative":                {`{"amount":5,"quantity":-2}`, []string{"quantity"}, 0, true},
		"not a number":            {`{"amount":5,"quantity":"lots"}`, []string{"quantity"}, 0, true},
		"too many digits":         {`{"amount":5,"quantity":"1234567890123"}`, []string{"quantity"}, 0, true},
		"nested pricing, new API": {`{"amount":5,"pricing":{"unit_amount_decimal":"250.0000"}}`, itemUnitFactors, 250, false},
		"fractional unit refuses": {`{"amount":5,"pricing":{"unit_amount_decimal":"250.5"}}`, itemUnitFactors, 0, true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ReadLookup([]byte(tc.body), Lookup{Field: "amount", Factors: tc.factors})
			if tc.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Factor)
		})
	}
}

// Every kind of money object keybrake counts is told by its id and retrieved
// where Stripe serves it; ids of other kinds, or that are not plain, are not.
func TestMoneyObjectOf(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ kind, path string }{
		"pi_3Nx":          {"payment_intent", "/v1/payment_intents/pi_3Nx"},
		"ch_1":            {"charge", "/v1/charges/ch_1"},
		"py_1":            {"charge", "/v1/charges/py_1"},
		"cs_test_a1":      {"checkout.session", "/v1/checkout/sessions/cs_test_a1"},
		"in_1":            {"invoice", "/v1/invoices/in_1"},
		"ii_1":            {"invoiceitem", "/v1/invoiceitems/ii_1"},
		"sub_1":           {},
		"pi":              {},
		"pi_1/../charges": {},
		"pi_1?expand=x":   {},
		"":                {},
	}
	for id, want := range cases {
		kind, path, ok := MoneyObjectOf(id)
		assert.Equal(t, want.kind != "", ok, id)
		assert.Equal(t, want.kind, kind, id)
		assert.Equal(t, want.path, path, id)
		if ok {
			_, known := moneyKinds[kind]
			assert.True(t, known, "%s: a kind ReadMoneyObject reads", id)
		}
	}
}

// An answer whose money moved cannot be read — a field an older Stripe-Version
// leaves out, a payment status keybrake does not know — is not read as a money
// object: read as terminal, it would release the object's exposure with nothing
// committed although the money moved.
func TestReadMoneyObjectNeedsWhatMoved(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		body     string
		ok       bool
		terminal bool
		moved    int64
	}{
		"succeeded":                         {`{"id":"pi_1","object":"payment_intent","currency":"usd","status":"succeeded","amount_received":500}`, true, true, 500},
		"succeeded without amount_received": {`{"id":"pi_1","object":"payment_intent","currency":"usd","status":"succeeded"}`, false, false, 0},
		"captured without amount_captured":  {`{"id":"ch_1","object":"charge","currency":"usd","captured":true}`, false, false, 0},
		"paid without amount_paid":          {`{"id":"in_1","object":"invoice","currency":"usd","status":"paid"}`, false, false, 0},
		"session complete and paid":         {`{"id":"cs_1","object":"checkout.session","currency":"usd","status":"complete","payment_status":"paid","amount_total":700}`, true, true, 700},
		"session complete, free":            {`{"id":"cs_1","object":"checkout.session","currency":"usd","status":"complete","payment_status":"no_payment_required","amount_total":0}`, true, true, 0},
		"session complete, no status":       {`{"id":"cs_1","object":"checkout.session","currency":"usd","status":"complete","amount_total":700}`, false, false, 0},
		"session expired":                   {`{"id":"cs_1","object":"checkout.session","currency":"usd","status":"expired","payment_status":"unpaid","amount_total":700}`, true, true, 0},
		"deleted invoice item":              {`{"id":"ii_1","object":"invoiceitem","deleted":true}`, true, true, 0},
		"pending invoice item":              {`{"id":"ii_1","object":"invoiceitem","currency":"usd","amount":5}`, true, false, 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m, ok := ReadMoneyObject(DecodeObject([]byte(tc.body)), "usd")
			require.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.terminal, m.Terminal)
			assert.Equal(t, tc.moved, m.Moved)
		})
	}
}
