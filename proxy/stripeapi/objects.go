package stripeapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/keybrake/keybrake/policy"
)

// Reading Stripe's answers: the objects that outlive a request and can move money
// after it (money objects: see docs/metering.md), the fields an
// amount lookup reads, stored prices, and error bodies.

// Object is a Stripe object (a JSON object) decoded one level deep.
type Object map[string]json.RawMessage

// Get is the string member field ("" when it is missing or not a string).
func (o Object) Get(field string) string {
	raw, ok := o[field]
	if !ok {
		return ""
	}
	if n := len(raw); n >= 2 && raw[0] == '"' && raw[n-1] == '"' && isPlain(raw[1:n-1]) {
		return string(raw[1 : n-1]) // what json.Unmarshal gives, without reflection
	}
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

// Object is the object member field (nil when it is missing or not an object).
func (o Object) Object(field string) Object {
	raw, ok := o[field]
	if !ok {
		return nil
	}
	return DecodeObject(raw)
}

// int reads a non-negative integer field.
func (o Object) int(field string) (int64, bool) {
	raw, ok := o[field]
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

func (o Object) isTrue(field string) bool { return string(o[field]) == "true" }

// path is the raw value at a dotted path ("pricing.unit_amount_decimal"); a
// missing or null value gives ok false.
func (o Object) path(dotted string) (json.RawMessage, bool) {
	cur := o
	for {
		name, rest, nested := strings.Cut(dotted, ".")
		raw, ok := cur[name]
		if !ok || string(raw) == "null" {
			return nil, false
		}
		if !nested {
			return raw, true
		}
		if cur = DecodeObject(raw); cur == nil {
			return nil, false
		}
		dotted = rest
	}
}

// factor reads the first of fields that is present: an integer, or a decimal
// string without fractional minor units ("1500", "1500.000").
func (o Object) factor(fields []string) (int64, error) {
	for _, f := range fields {
		raw, ok := o.path(f)
		if !ok {
			continue
		}
		s := string(raw)
		if strings.HasPrefix(s, `"`) {
			if err := json.Unmarshal(raw, &s); err != nil {
				return 0, fmt.Errorf("lookup field %q: %w", f, err)
			}
		}
		ip, fp, _ := strings.Cut(s, ".")
		if !isDigits(ip) || (fp != "" && !isDigits(fp)) || strings.Trim(fp, "0") != "" || len(ip) > maxMoneyDigits {
			return 0, fmt.Errorf("lookup field %q: %q is not a whole number of minor units", f, Clip(s))
		}
		n, err := strconv.ParseInt(ip, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("lookup field %q: %w", f, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("lookup: none of %v present", fields)
}

// moneyKind says how to read one kind of Stripe money object (its "object" value).
type moneyKind struct {
	// moved is the object's cumulative money moved; ok is false when it cannot
	// be read, and always for a kind that moves no money by itself (noMoney).
	moved func(o Object) (n int64, ok bool)
	// noMoney: the kind moves no money by itself (an invoice item is collected
	// by its invoice).
	noMoney bool
	// terminal reports that the object can move no more money.
	terminal func(o Object) bool
}

func statusIn(statuses ...string) func(Object) bool {
	return func(o Object) bool {
		if o.isTrue("deleted") {
			return true
		}
		st := o.Get("status")
		for _, s := range statuses {
			if st == s {
				return true
			}
		}
		return false
	}
}

func intField(field string) func(Object) (int64, bool) {
	return func(o Object) (int64, bool) { return o.int(field) }
}

// moneyKinds are the objects whose answers keybrake reads. A PaymentIntent moves
// amount_received and is done once succeeded or cancelled (a final capture leaves it
// succeeded, releasing what was not captured); a Charge moves amount_captured and
// is done once captured, failed, or refunded uncaptured (an expired authorisation);
// an invoice moves amount_paid and is done once paid, void or deleted; a Checkout
// Session moves amount_total once paid and is done once expired or complete and
// paid; an invoice item moves nothing by itself and is done once deleted.
var moneyKinds = map[string]moneyKind{
	"payment_intent": {moved: intField("amount_received"), terminal: statusIn("succeeded", "canceled")},
	"charge": {moved: intField("amount_captured"), terminal: func(o Object) bool {
		return o.isTrue("captured") || o.Get("status") == "failed" || o.isTrue("refunded")
	}},
	"invoice": {moved: intField("amount_paid"), terminal: statusIn("paid", "void")},
	"checkout.session": {
		moved: func(o Object) (int64, bool) {
			switch o.Get("payment_status") {
			case "paid":
				return o.int("amount_total")
			case "unpaid", "no_payment_required":
				return 0, true
			}
			return 0, false // not a payment status keybrake knows
		},
		terminal: func(o Object) bool {
			st, ps := o.Get("status"), o.Get("payment_status")
			return st == "expired" || (st == "complete" && (ps == "paid" || ps == "no_payment_required"))
		},
	},
	"invoiceitem": {moved: func(Object) (int64, bool) { return 0, false }, terminal: statusIn(), noMoney: true},
}

// moneyIDs maps the prefix Stripe gives the ids of each kind of money object
// to the kind (its "object" value) and the path that retrieves one.
var moneyIDs = []struct{ prefix, kind, path string }{
	{"pi_", "payment_intent", "/v1/payment_intents/"},
	{"ch_", "charge", "/v1/charges/"},
	{"py_", "charge", "/v1/charges/"}, // the charge of an account debit and of some payment methods
	{"cs_", "checkout.session", "/v1/checkout/sessions/"},
	{"in_", "invoice", "/v1/invoices/"},
	{"ii_", "invoiceitem", "/v1/invoiceitems/"},
}

// MoneyObjectOf says which kind of money object id names, by the prefix of
// Stripe's ids, and the path that retrieves it (a GET); ok is false for an id
// of another kind or one that is not a plain id.
func MoneyObjectOf(id string) (kind, path string, ok bool) {
	if !IsID(id) {
		return "", "", false
	}
	for _, m := range moneyIDs {
		if strings.HasPrefix(id, m.prefix) {
			return m.kind, m.path + id, true
		}
	}
	return "", "", false
}

// MoneyObject is what one answer says about a money object.
type MoneyObject struct {
	ID string
	// Moved is the object's cumulative money moved, in minor units (MovedKnown
	// false for a kind that moves no money by itself, an invoice item).
	Moved      int64
	MovedKnown bool
	// Terminal: the object can move no more money (cancelled, succeeded,
	// captured, expired, paid, void, deleted).
	Terminal bool
}

// ReadMoneyObject reads o as a money object in currency. An object in another
// currency, of a kind keybrake does not read, or without a plain id gives ok
// false; a deleted object carries no currency. So does one whose money moved
// cannot be read (a field an older Stripe-Version leaves out, an unknown payment
// status): a terminal state read without what moved would release the
// object's exposure with nothing committed.
func ReadMoneyObject(o Object, currency string) (MoneyObject, bool) {
	kind, ok := moneyKinds[o.Get("object")]
	id := o.Get("id")
	if !ok || !IsID(id) {
		return MoneyObject{}, false
	}
	if cur := o.Get("currency"); cur != currency && !(cur == "" && o.isTrue("deleted")) {
		return MoneyObject{}, false
	}
	m := MoneyObject{ID: id, Terminal: kind.terminal(o)}
	m.Moved, m.MovedKnown = kind.moved(o)
	if !m.MovedKnown && !kind.noMoney && !o.isTrue("deleted") {
		return MoneyObject{}, false
	}
	return m, true
}

// MoneyObjectInError finds, in the members of a Stripe error body's "error", a
// money object in currency that the failed request created anyway (a
// PaymentIntent created with confirm=true whose payment was declined:
// error.payment_intent, still confirmable with its client_secret).
func MoneyObjectInError(body []byte, currency string) (Object, bool) {
	e := DecodeObject(body).Object("error")
	for field := range e {
		if o := e.Object(field); o != nil {
			if _, ok := ReadMoneyObject(o, currency); ok {
				return o, true
			}
		}
	}
	return nil, false
}

// ErrorType is error.type of a Stripe error body, "" when there is none.
func ErrorType(body []byte) string {
	return DecodeObject(body).Object("error").Get("type")
}

// LookupResult is what an amount lookup read from a Stripe object (see Lookup).
type LookupResult struct {
	Amount   int64  // the value of Lookup.Field (0 for a negative Signed value)
	Currency string // the object's "currency", when it has one
	// Moved is what the object has moved so far, when it is a money object (see
	// ReadMoneyObject).
	Moved      int64
	MovedKnown bool
	// Factor is the value of Lookup.Factors.
	Factor int64
	// Accounts are the connected accounts the fields of Lookup.Accounts name (a
	// field that is null or absent names none; an expanded one, its id).
	Accounts []string
	// Customer is the object's "customer" id, when it is a plain string.
	Customer string
}

// ReadLookup reads the answer to the lookup l: the non-negative integer at
// l.Field (dots for nesting), the top-level "currency" (one Stripe supports),
// the factor l.Factors names and, for a money object, what it has moved so far.
func ReadLookup(body []byte, l Lookup) (LookupResult, error) {
	obj := DecodeObject(body)
	if obj == nil {
		return LookupResult{}, errors.New("lookup answer is not a JSON object")
	}
	var res LookupResult
	if kind, ok := moneyKinds[obj.Get("object")]; ok {
		res.Moved, res.MovedKnown = kind.moved(obj)
	}
	if raw, ok := obj["currency"]; ok {
		if err := json.Unmarshal(raw, &res.Currency); err != nil {
			return LookupResult{}, fmt.Errorf("lookup currency: %w", err)
		}
		if _, ok := policy.Exponent(res.Currency); !ok {
			return LookupResult{}, fmt.Errorf("lookup currency %q not supported", Clip(res.Currency))
		}
	}
	raw, ok := obj.path(l.Field)
	if !ok {
		return LookupResult{}, fmt.Errorf("lookup field %q missing", l.Field)
	}
	digits := string(raw)
	if l.Signed {
		digits = strings.TrimPrefix(digits, "-")
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 || strings.TrimLeft(digits, "0123456789") != "" {
		return LookupResult{}, fmt.Errorf("lookup field %q is not a non-negative integer", l.Field)
	}
	if digits != string(raw) {
		n = 0 // a credit
	}
	res.Amount = n
	if len(l.Factors) > 0 {
		if res.Factor, err = obj.factor(l.Factors); err != nil {
			return LookupResult{}, err
		}
	}
	res.Accounts = obj.accounts(l.Accounts)
	res.Customer = obj.Get("customer")
	return res, nil
}

// accounts are the connected accounts the dotted fields name: none for a field
// that is null or absent, its id for an expanded one, and "" (which the
// pipeline refuses) for one it cannot read.
func (o Object) accounts(fields []string) []string {
	var out []string
	for _, f := range fields {
		raw, ok := o.path(f)
		if !ok {
			continue
		}
		id := ""
		if err := json.Unmarshal(raw, &id); err != nil {
			id = DecodeObject(raw).Get("id")
		}
		out = append(out, id)
	}
	return out
}

// Price is a stored price keybrake can bound.
type Price struct {
	Unit      int64  // unit_amount, in minor units of Currency
	Currency  string // one Stripe supports
	Recurring bool   // a recurring price: it starts a subscription
	// MultiCurrency: the price has amounts in other currencies too
	// (currency_options), which Stripe charges instead of Unit when the payment
	// is in one of them — a customer's local currency when the request does not
	// fix the currency.
	MultiCurrency bool
}

// PriceExpand is what a price lookup must expand (GET
// /v1/prices/{id}?expand[]=currency_options) for ReadPrice to see a
// multi-currency price: Stripe leaves currency_options out otherwise.
const PriceExpand = "currency_options"

// ReadPrice reads a stored price (GET /v1/prices/{id}, with PriceExpand)
// keybrake can bound: charged per unit (not tiered), licensed (not metered by
// usage), with an integer unit_amount (not a custom amount the customer
// chooses, nor a fractional unit_amount_decimal), in a currency Stripe supports.
// Ignoring transform_quantity can only overcount (it divides). A price read
// without its currency_options is refused: whether Stripe may charge another
// currency's amount would be unknown.
func ReadPrice(body []byte) (Price, error) {
	o := DecodeObject(body)
	switch {
	case o == nil || o.Get("object") != "price":
		return Price{}, errors.New("not a price")
	case o.Get("billing_scheme") != "" && o.Get("billing_scheme") != "per_unit":
		return Price{}, errors.New("a tiered price's amount depends on quantities keybrake does not know")
	case o.Object("recurring").Get("usage_type") == "metered":
		return Price{}, errors.New("a metered price is billed for usage reported later")
	}
	unit, ok := o.int("unit_amount")
	if !ok {
		return Price{}, errors.New("the price has no integer unit_amount (a custom or fractional amount)")
	}
	cur := o.Get("currency")
	if _, ok := policy.Exponent(cur); !ok {
		return Price{}, fmt.Errorf("currency %q not supported", Clip(cur))
	}
	options := o.Object("currency_options")
	if options == nil {
		return Price{}, errors.New("the price's currency_options could not be read")
	}
	pr := Price{Unit: unit, Currency: cur, Recurring: o.Get("type") == "recurring"}
	for c := range options {
		pr.MultiCurrency = pr.MultiCurrency || c != cur
	}
	return pr, nil
}
