package stripeapi

import "errors"

// ErrMalformed marks a request that cannot be read exactly as Stripe would read it
// (duplicate scalar parameter, bad percent-encoding, non-canonical path, bad integer,
// upper-case currency, ...). The proxy answers 400 request_malformed.
var ErrMalformed = errors.New("request malformed")

// Pair is one decoded form parameter: Key is the full decoded key with brackets
// ("line_items[0][price_data][unit_amount]"), Value the decoded value.
type Pair struct {
	Key   string
	Value string
}

// Params are a request's parameters, parsed Rack-style like Stripe does. Parsing
// refuses (ErrMalformed) anything ambiguous: a scalar key given twice, a key used both
// as a scalar and as a hash/array, "[]" followed by further nesting, bad
// percent-encoding, empty or unbalanced brackets.
//
// The zero value and a nil *Params hold no parameters. ParseForm and ParseJSON (in
// form.go) build them.
type Params struct {
	pairs []Pair     // in body order
	kinds []byte     // value kind of each pair (kindString, kindNumber, …)
	root  *paramNode // parameter tree, for duplicate detection and lookups
}

// Pairs returns the parameters in body order.
func (p *Params) Pairs() []Pair {
	if p == nil {
		return nil
	}
	return p.pairs
}

// Lookup says that (part of) the money facts of a request live at Stripe: GET Path
// with the real key and read the integer field Field and the string "currency" from
// the JSON answer. How the answer is used depends on the Classification that
// carries it (see Classification).
type Lookup struct {
	Path  string // e.g. "/v1/payment_intents/pi_123"
	Field string // e.g. "amount", "amount_capturable", "amount_remaining"
	// Factors, when set, names the field of the object (the first of these that is
	// present and not null) that Classification.Amount multiplies to make the new
	// total: an update that changes one factor of unit × quantity keeps the other
	// (an invoice item updated with only unit_amount_decimal keeps its quantity).
	// The field must be an integer, or a decimal string without fractional minor
	// units.
	Factors []string
	// Signed: Field may be negative (a customer's credit balance), and then
	// counts as 0.
	Signed bool
	// Accounts are fields of the object (dots for nesting) that name a connected
	// account the request moves money to or from without naming it; ReadLookup
	// reads them, and the pipeline checks each like an account the request names.
	// The catalogue leaves them out: see LookupAccounts.
	Accounts []string
}

// PriceRef is a stored price a request uses: its unit_amount × Quantity is part of
// the request's amount.
type PriceRef struct {
	ID       string
	Quantity int64
	// OneTime: a recurring price is refused (on a Payment Link it would start a
	// subscription whose renewals keybrake never sees).
	OneTime bool
}

// Direction says which way a money-moving request moves money, seen from the
// platform's Stripe balance.
type Direction string

// Money directions.
const (
	DirectionNone Direction = ""    // moves no money (now)
	DirectionIn   Direction = "in"  // charges, captures, top-ups, reversals back to the platform
	DirectionOut  Direction = "out" // refunds, transfers, payouts
)

// Operations of requests outside the catalogue (Classification.Known false).
const (
	OpUnknownRead  = "unknown.read"  // a GET of an unknown resource
	OpUnknownWrite = "unknown.write" // any other request the catalogue does not know
)

// Classification is what the catalogue says about one request.
//
// For a request with MovesMoney, the money it moves is found like this, in order:
//
//  1. AmountKnown, NewTotal false, Lookup nil: Amount minor units of Currency
//     (Currency is never "" then).
//  2. AmountKnown, NewTotal false, Lookup set: Amount is exact, the currency is the
//     looked-up object's "currency" (Currency is "" then). Example: a capture or a
//     refund with an explicit amount.
//  3. AmountKnown, NewTotal true (Lookup is always set): Amount is the object's NEW
//     total (payment_intents.update with amount, increment_authorization,
//     invoiceitems.update); Lookup.Field is its current total. The money added is
//     Amount − current, at least 0; when Currency is "" the currency is the
//     object's. A pipeline that cannot or will not look up may meter Amount in
//     full: that is never less than the truth.
//  4. AmountKnown false, Lookup set: the amount is the looked-up Field, in Currency
//     when it is set (a PaymentIntent update that changes only the currency) or else
//     in the object's "currency".
//  5. AmountKnown false, Lookup nil: the amount cannot be known; refuse with
//     amount_unknown. Amount is 0.
//
// Prices (with AmountKnown) adds, to the Amount the request states, each stored
// price's unit_amount × quantity, looked up at /v1/prices/{id}; the currency is
// then the prices' when Currency is "" and no Lookup says it. A price that is not
// a per-unit, licensed price with a unit_amount, or is in another currency, refuses
// the request with amount_unknown.
//
// A failed lookup (non-2xx, missing or non-integer field, missing or malformed
// currency) must be refused with amount_unknown as well.
type Classification struct {
	// Operation is "resource.verb" ("charges.create", "customers.read",
	// "checkout.sessions.create"); for an endpoint not in the catalogue it is
	// "unknown.read" or "unknown.write", and "v2.<resource>.read" for a v2 read.
	Operation string
	// Known is false for endpoints not in the catalogue.
	Known bool
	// MovesMoney is true when the request can move money in either direction.
	MovesMoney bool
	// Direction is DirectionIn or DirectionOut when MovesMoney.
	Direction Direction
	// Amount (minor units) and Currency, when the request itself says them.
	Amount   int64
	Currency string
	// AmountKnown is true when Amount is exact from the request alone (see the
	// type documentation for how it combines with Lookup and NewTotal).
	AmountKnown bool
	// NewTotal is true when Amount is the object's new total rather than an
	// amount that moves by itself; Lookup then names the current total.
	NewTotal bool
	// Lookup, when non-nil, says where to read the amount, the current total or the
	// currency at Stripe (see the type documentation).
	Lookup *Lookup
	// Prices are stored prices whose amounts add to Amount (see the type
	// documentation).
	Prices []PriceRef
	// Unknown says why the amount of a money-moving request cannot be known, when
	// there is more to say than that the request does not state it; with
	// MinVersion, why the request is refused under an older API version.
	Unknown string
	// MinVersion, when set, is the earliest Stripe API version (a date,
	// "2022-08-01") under which Stripe reads the request as classified: under an
	// older Stripe-Version, or none (the account's default version applies, which
	// keybrake does not know), a default Stripe changed since moves money the
	// classification does not count, and the request must be refused
	// (amount_unknown, with Unknown). See VersionAtLeast.
	MinVersion string
	// NoPendingItems: the request draws the customer's pending invoice items
	// into an invoice it makes (subscriptions.create's first invoice), by an
	// amount keybrake did not meter if they were made outside it. The proxy
	// asks Stripe for the customer's pending items before forwarding and
	// refuses the request (amount_unknown) when there are any.
	NoPendingItems bool
	// Customer is the customer the request names: the "customer" parameter, or the
	// id in a /v1/customers/{id}/… path ("" when none is named). For requests on an
	// existing object (capture, confirm, refund) the customer lives at Stripe.
	Customer string
	// ObjectID is the first id in the path, if any ("pi_123").
	ObjectID string
	// Target is the existing money object the request's money is counted on (see
	// "The metering model" in docs/ARCHITECTURE.md): the path's PaymentIntent,
	// Charge or invoice item of a confirm, a capture or a raise, the invoice of
	// invoices.pay or of its lines, or the invoice an invoice item is added to.
	Target string
	// Creates is true when the request creates money that can move after it: a new
	// money object when Target is "" (a PaymentIntent, an uncaptured Charge, a
	// Checkout Session, a pending invoice item: Stripe's answer names it), or new
	// lines on Target (an invoice item added to an invoice, invoice lines). What has
	// not moved yet stays counted as the object's exposure. With Target but not
	// Creates, the request moves money on Target (a confirm, a capture, paying an
	// invoice), and what Target's exposure already counts is not counted again. A
	// money-moving request with neither moves its money at once (transfers,
	// refunds, payouts, …).
	Creates bool
}

// Classify maps method + canonical path + params to an operation and its amount.
//
// path is the raw request path as the client sent it: the pipeline passes
// r.URL.EscapedPath(), never the decoded r.URL.Path, and no query. params are the
// parsed body of a POST (nil or empty for GET and DELETE).
//
// It returns ErrMalformed for a non-canonical path (".." or "." segments, "//",
// percent-encoding or any character outside [A-Za-z0-9_.-] in the path, upper case
// where Stripe has lower case, trailing slash, neither /v1/ nor /v2/), for money
// fields that are not ^[0-9]+$ without a leading zero, longer than 12 digits or
// not within int64, for currencies that are not three lower-case letters, for a
// "_method" parameter (Rack's method override), and for ids in parameters that
// would be put into a lookup path but are not plain ids. The catalogue.go package
// comment documents every decision.
func Classify(method, path string, params *Params) (Classification, error) {
	return classify(method, path, params)
}

// VersionAtLeast reports whether the Stripe-Version header value version
// ("2024-06-20", "2026-08-26.dahlia") names an API version released on or after
// date ("2022-08-01"). An empty or unreadable version is not: keybrake cannot
// know the account's default version.
func VersionAtLeast(version, date string) bool {
	if len(version) < len(date) {
		return false
	}
	d := version[:len(date)]
	for i := 0; i < len(d); i++ {
		if (date[i] == '-') != (d[i] == '-') || (d[i] != '-' && (d[i] < '0' || d[i] > '9')) {
			return false
		}
	}
	return d >= date
}
