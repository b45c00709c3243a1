package proxy

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
type Params struct {
	pairs []Pair // in body order
}

// ParseForm parses an application/x-www-form-urlencoded body ("+" and "%20" for
// spaces, percent-encoded brackets accepted).
func ParseForm(body []byte) (*Params, error) { panic("unimplemented") }

// Get returns the value of a scalar key ("amount", "metadata[billing_period]").
func (p *Params) Get(key string) (string, bool) { panic("unimplemented") }

// Pairs returns the parameters in body order.
func (p *Params) Pairs() []Pair { return p.pairs }

// Canonical returns a deterministic encoding of the parameters (sorted by key, then
// value, decoded) for fingerprints: two bodies Stripe reads the same have the same
// canonical form.
func (p *Params) Canonical() []byte { panic("unimplemented") }

// Lookup says that the amount of a request lives at Stripe: GET Path with the real
// key and read the integer field Field (and "currency") from the JSON answer.
type Lookup struct {
	Path  string // e.g. "/v1/payment_intents/pi_123"
	Field string // e.g. "amount", "amount_capturable", "amount_remaining"
}

// Classification is what the catalogue says about one request.
type Classification struct {
	// Operation is "resource.verb" ("charges.create", "customers.read"); for an
	// endpoint not in the catalogue it is "unknown.read" or "unknown.write".
	Operation string
	// Known is false for endpoints not in the catalogue.
	Known bool
	// MovesMoney is true when the request can move money in either direction.
	MovesMoney bool
	// Amount (minor units) and Currency, when the request itself says them.
	Amount   int64
	Currency string
	// AmountKnown is true when Amount is exact from the request alone.
	AmountKnown bool
	// Lookup, when non-nil, says where to read the amount (AmountKnown is false).
	Lookup *Lookup
	// Customer is the customer the request touches ("" when none is named).
	Customer string
	// ObjectID is the id in the path, if any ("pi_123").
	ObjectID string
}

// Classify maps method + canonical path + params to an operation and its amount.
// It returns ErrMalformed for a non-canonical path (".." or "." segments, "//",
// percent-encoding in the path, upper case where Stripe has lower case, trailing
// slash) and for money fields that are not ^[0-9]+$ or not within int64, and for
// currencies that are not three lower-case letters.
func Classify(method, path string, params *Params) (Classification, error) {
	panic("unimplemented")
}
