package stripeapi

import (
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strings"
)

// AccountRef is a connected account a request names, and where it names it (for
// a refusal's message). ID is "" when a place that names an account holds no
// single plain value.
type AccountRef struct {
	ID    string
	Where string
}

// accountParams are the names of the parameters that name a connected account,
// anywhere in a parameter key (transfer_data[destination],
// payment_intent_data[on_behalf_of], the legacy destination[account],
// parameters[connected_account] of a report run). true: the parameter only ever
// holds an account, so any value counts; false: it names an account when its
// value is an account id (acct_…) — destination is also a payout's bank account
// or card, source a card or token (source=acct_… on a charge is an account
// debit: it takes money from that account's balance), and account a Financial
// Connections account elsewhere. customer_account (an Account as a customer) is
// a customer, checked against the policy's customers. Keys under metadata are
// the caller's own and name nothing.
var accountParams = map[string]bool{
	"on_behalf_of":      true,
	"connected_account": true,
	"destination":       false,
	"source":            false,
	"account":           false,
}

// accountCollections are the paths whose next segment is a connected account's
// id, whatever its form: /v1/accounts/{id}/… (Stripe treats it as an implied
// Stripe-Account) and /v2/core/accounts/{id}/….
var accountCollections = []string{"/v1/accounts/", "/v2/core/accounts/"}

// Accounts lists every connected account a request names: its Stripe-Account
// and Stripe-Context headers (account, stripeContext; "" when absent), the id
// of an account collection path and every acct_… path segment, the parameters
// of accountParams, and the "account" of an account link or session (whatever
// its value). This is the one place that knows where a Stripe request can name
// an account; the proxy checks each against the policy's stripe_accounts.
// path is the exact path Classify read; operation is its Classification's.
func Accounts(account, stripeContext, path, operation string, params *Params) []AccountRef {
	var out []AccountRef
	if account != "" {
		out = append(out, AccountRef{account, "the Stripe-Account header"})
	}
	if stripeContext != "" {
		out = append(out, AccountRef{stripeContext, "the Stripe-Context header"})
	}
	for _, prefix := range accountCollections {
		if rest, ok := strings.CutPrefix(path, prefix); ok {
			id, _, _ := strings.Cut(rest, "/")
			out = append(out, AccountRef{id, "the path"})
		}
	}
	for seg := range strings.SplitSeq(path, "/") {
		if strings.HasPrefix(seg, "acct_") {
			out = append(out, AccountRef{seg, "the path"})
		}
	}
	for _, pr := range params.Pairs() {
		name, ok := accountParamName(pr.Key)
		if ok && (accountParams[name] || strings.HasPrefix(pr.Value, "acct_")) {
			out = append(out, AccountRef{pr.Value, "parameter " + Clip(pr.Key)})
		}
	}
	if operation == "account_links.create" || operation == "account_sessions.create" {
		if params.Has("account") {
			v, _ := params.Get("account") // "" when it is not a single value
			out = append(out, AccountRef{v, "parameter account"})
		}
	}
	return out
}

// accountParamName is the name in accountParams that a parameter key ends with
// (array indexes aside: account[0] names account), and whether there is one.
func accountParamName(key string) (string, bool) {
	var buf [keySegsOnStack]string
	segs, _, err := parseKey(key, buf[:])
	if err != nil || segs[0] == "metadata" {
		return "", false
	}
	for i := len(segs) - 1; i >= 0; i-- {
		if !isDigits(segs[i]) {
			_, ok := accountParams[segs[i]]
			return segs[i], ok
		}
	}
	return "", false
}

// LookupAccounts names the fields of the object cls.Lookup reads that name a
// connected account the request moves money to or from without naming it in the
// request: a transfer's destination (a reversal takes money back from it), an
// application fee's account (a fee refund pays it), and the destination and
// on_behalf_of of a charge, a PaymentIntent or an invoice that the request
// captures, confirms, raises or pays (the transfer to the account follows). A
// refund of a charge or a PaymentIntent comes out of the platform's balance,
// unless it reverses the transfer or refunds the application fee
// (reverse_transfer, refund_application_fee).
func LookupAccounts(cls Classification, params *Params) []string {
	if cls.Lookup == nil {
		return nil
	}
	if cls.Operation == "refunds.create" && !isTrue(params, "reverse_transfer") && !isTrue(params, "refund_application_fee") {
		return nil
	}
	res, _, _ := strings.Cut(strings.TrimPrefix(cls.Lookup.Path, "/v1/"), "/")
	switch res {
	case "transfers":
		return []string{"destination"}
	case "application_fees":
		return []string{"account"}
	case "charges":
		return []string{"transfer_data.destination", "destination", "on_behalf_of"}
	case "payment_intents", "invoices":
		return []string{"transfer_data.destination", "on_behalf_of"}
	case "invoiceitems":
		// A raise of an item already on an invoice is paid on by that invoice.
		return []string{"invoice.transfer_data.destination", "invoice.on_behalf_of"}
	}
	return nil
}

// expandable are the fields of a looked-up object that LookupAccounts reaches
// into, which Stripe answers as a bare id unless expanded.
var expandable = map[string]bool{"invoice": true}

// LookupExpand is what a lookup must expand to read the account fields (the
// fields of LookupAccounts).
func LookupExpand(fields []string) []string {
	var out []string
	for _, f := range fields {
		if head, _, nested := strings.Cut(f, "."); nested && expandable[head] && !slices.Contains(out, head) {
			out = append(out, head)
		}
	}
	return out
}

// Payee is a subscription, or the subscriptions of a customer, whose invoices
// pay the money a request adds on to a connected account
// (transfer_data[destination], on_behalf_of) without the request naming it:
// add_invoice_items on a subscription, and a pending invoice item or a positive
// balance, which the customer's next invoice — a subscription's, maybe —
// collects. The pipeline reads each (Payee.Request, ReadPayeeAccounts) before
// forwarding and checks the accounts like those a request names.
type Payee struct {
	Subscription string // a subscription's id; else the customer's subscriptions
	Customer     string // the customer ("" when it is not known: refused)
	// CustomerParam is how the subscriptions list names Customer: "customer",
	// or "customer_account" for an Account as a customer.
	CustomerParam string
}

// payeeFields are where a subscription names the connected accounts its
// invoices pay.
var payeeFields = []string{"transfer_data.destination", "on_behalf_of"}

// maxPayeeSubscriptions is the most subscriptions of one customer read (one
// page of Stripe's list); a customer with more is refused.
const maxPayeeSubscriptions = "100"

// Payees lists the objects whose invoices pay a money-moving request's money
// (see Payee). lookedCustomer is the customer of the object the request's
// Lookup read ("" when none): the customer an invoice item update's raise is
// collected from. An invoice item added to an invoice (Target) is paid on by
// that invoice, whose accounts its lookup reads (LookupAccounts).
func Payees(cls Classification, params *Params, lookedCustomer string) []Payee {
	if !cls.MovesMoney {
		return nil
	}
	customerParam := "customer"
	if params.Has("customer_account") {
		customerParam = "customer_account"
	}
	switch cls.Operation {
	case "subscriptions.update", "subscriptions.resume":
		return []Payee{{Subscription: cls.ObjectID}}
	case "customers.update", "customers.create_balance_transaction":
		return []Payee{{Customer: cls.Customer, CustomerParam: "customer"}}
	case "invoiceitems.create":
		if cls.Target != "" {
			return nil
		}
		return []Payee{{Customer: cls.Customer, CustomerParam: customerParam}}
	case "invoiceitems.update":
		return []Payee{{Customer: lookedCustomer, CustomerParam: "customer"}}
	}
	return nil
}

// Request is the GET that reads the payee: its path and query; path is "" when
// the customer is not known.
func (py Payee) Request() (string, url.Values) {
	switch {
	case py.Subscription != "":
		return "/v1/subscriptions/" + py.Subscription, nil
	case py.Customer == "":
		return "", nil
	}
	return "/v1/subscriptions", url.Values{py.CustomerParam: {py.Customer}, "limit": {maxPayeeSubscriptions}}
}

// Where names the payee in a refusal's message.
func (py Payee) Where() string {
	if py.Subscription != "" {
		return "the subscription " + Clip(py.Subscription)
	}
	return "a subscription of customer " + Clip(py.Customer)
}

// ReadPayeeAccounts reads the connected accounts a subscription (or a list of
// them: every one must be on the page) pays its invoices on to.
func ReadPayeeAccounts(body []byte) ([]string, error) {
	obj := DecodeObject(body)
	if obj == nil {
		return nil, errors.New("the answer is not a JSON object")
	}
	if obj.Get("object") != "list" {
		return obj.accounts(payeeFields), nil
	}
	if obj.isTrue("has_more") {
		return nil, errors.New("the customer has more subscriptions than one page of Stripe's list")
	}
	var data []json.RawMessage
	if err := json.Unmarshal(obj["data"], &data); err != nil {
		return nil, errors.New("the list has no data")
	}
	var out []string
	for _, raw := range data {
		sub := DecodeObject(raw)
		if sub == nil {
			return nil, errors.New("a list entry is not an object")
		}
		out = append(out, sub.accounts(payeeFields)...)
	}
	return out, nil
}

// secretFields are the fields whose expansion makes Stripe reveal a secret that
// spends money, or lets its holder act, outside any request keybrake meters: an
// Issuing card's number, CVC and PIN (pin.number), a Treasury financial
// account's account number, a Stripe Apps secret's payload, a v2 event
// destination's webhook signing secret.
var secretFields = map[string]bool{"number": true, "cvc": true, "account_number": true, "payload": true,
	"signing_secret": true}

// RevealedSecret returns the first expand entry of params (v1: expand[]=…,
// expand[0]=…; v2: include) that names a field of secretFields, at any depth
// ("number", "data.number", "pin.number"), and whether there is one.
func RevealedSecret(params *Params) (string, bool) {
	if !params.Has("expand") && !params.Has("include") {
		return "", false // most requests: no walk over their parameters
	}
	var buf [keySegsOnStack]string
	for _, pr := range params.Pairs() {
		segs, _, err := parseKey(pr.Key, buf[:])
		if err != nil || (segs[0] != "expand" && segs[0] != "include") {
			continue
		}
		field := pr.Value[strings.LastIndexByte(pr.Value, '.')+1:]
		if secretFields[field] {
			return pr.Value, true
		}
	}
	return "", false
}
