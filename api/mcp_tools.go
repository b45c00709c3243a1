package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// The MCP tools. Where Stripe's agent toolkit has a tool, keybrake's has its name
// and its arguments (create_customer, list_customers, …, cancel_subscription);
// create_payment_intent is keybrake's own (the toolkit has none that moves money
// in), stripe_request reaches any operation the key's policy allows, and
// get_budget reads the key's own budget. Every argument becomes a Stripe parameter
// as the table below says, and the request goes through the proxy like any other.

// argKind is the JSON type of a tool argument and how it becomes a parameter.
type argKind int

const (
	argString   argKind = iota // a string, sent as it is
	argID                      // a Stripe object id: 1-255 of [A-Za-z0-9_-]
	argInteger                 // a JSON integer, sent as its digits (money never passes through a float)
	argNumber                  // a JSON number, sent as written (a percentage)
	argBoolean                 // true or false
	argMetadata                // an object of strings: param[key]=value
	argObject                  // any JSON object or array, nested as Stripe reads form parameters
)

// toolArg is one argument of a tool.
type toolArg struct {
	name     string
	kind     argKind
	desc     string
	required bool
	enum     []string
	min, max int64          // bounds of an integer, when max > 0
	param    string         // the Stripe parameter it becomes ("" → name)
	inPath   bool           // it fills {name} in the path instead
	control  bool           // not a parameter: the tool's handler reads it
	with     url.Values     // parameters sent along when it is given
	schema   map[string]any // argObject: the JSON schema of its value
	approval bool           // not a parameter: the reason shown to an approver
}

// toolSpec is one MCP tool that makes one Stripe request.
type toolSpec struct {
	name   string
	title  string
	desc   string
	method string
	path   string // with {arg} for path arguments
	args   []toolArg
	fixed  url.Values // parameters always sent

	// op is the catalogue's operation of the request ("" for tools every key
	// sees), money whether it can move money; both set from stripeapi.Classify.
	op    string
	money bool
	// defs are the tool as listed, for keys in require mode [0] and derive mode [1].
	defs [2]*mcp.Tool
}

// Names of the tools keybrake handles itself.
const (
	toolStripeRequest = "stripe_request"
	toolGetBudget     = "get_budget"
	toolRequestRaise  = "request_budget_raise"
)

// idempotencyArg is the argument every POST tool takes.
const idempotencyArg = "idempotency_key"

func limitArg() toolArg {
	return toolArg{name: "limit", kind: argInteger, min: 1, max: 100,
		desc: "A limit on the number of objects to be returned, between 1 and 100 (Stripe's default is 10)."}
}

// mcpTools is the table of tools, in the order tools/list shows them.
var mcpTools = mustTools([]*toolSpec{
	{name: "create_customer", title: "Create customer", method: http.MethodPost, path: "/v1/customers",
		desc: "Create a customer in Stripe.",
		args: []toolArg{
			{name: "name", kind: argString, required: true, desc: "The name of the customer."},
			{name: "email", kind: argString, desc: "The email of the customer."},
		}},
	{name: "list_customers", title: "List customers", method: http.MethodGet, path: "/v1/customers",
		desc: "Fetch a list of customers from Stripe.",
		args: []toolArg{
			limitArg(),
			{name: "email", kind: argString, desc: "A case-sensitive filter on the customer's email."},
		}},
	{name: "create_product", title: "Create product", method: http.MethodPost, path: "/v1/products",
		desc: "Create a product in Stripe.",
		args: []toolArg{
			{name: "name", kind: argString, required: true, desc: "The name of the product."},
			{name: "description", kind: argString, desc: "The description of the product."},
		}},
	{name: "list_products", title: "List products", method: http.MethodGet, path: "/v1/products",
		desc: "Fetch a list of products from Stripe.", args: []toolArg{limitArg()}},
	{name: "create_price", title: "Create price", method: http.MethodPost, path: "/v1/prices",
		desc: "Create a one-time price for a product in Stripe (create the product first).",
		args: []toolArg{
			{name: "product", kind: argID, required: true, desc: "The ID of the product to create the price for."},
			{name: "unit_amount", kind: argInteger, min: 0, max: 999_999_999_999, required: true,
				desc: "The unit amount in the currency's minor unit (cents for usd)."},
			{name: "currency", kind: argString, required: true, desc: "Three-letter ISO currency code, in lower case (usd)."},
		}},
	{name: "list_prices", title: "List prices", method: http.MethodGet, path: "/v1/prices",
		desc: "Fetch a list of prices from Stripe.",
		args: []toolArg{
			{name: "product", kind: argID, desc: "Only the prices of this product."},
			limitArg(),
		}},
	{name: "create_payment_link", title: "Create payment link", method: http.MethodPost, path: "/v1/payment_links",
		desc: "Create a payment link for a price. The customer pays it later in a browser, with no API request " +
			"keybrake could see, so keybrake creates the link payable once (restrictions.completed_sessions.limit = 1) " +
			"and counts price × quantity against the caps when the link is created.",
		fixed: url.Values{"restrictions[completed_sessions][limit]": {"1"}},
		args: []toolArg{
			{name: "price", kind: argID, required: true, param: "line_items[0][price]",
				desc: "The ID of the price to create the payment link for."},
			{name: "quantity", kind: argInteger, min: 1, max: 999_999, required: true, param: "line_items[0][quantity]",
				desc: "The quantity of the product to include."},
			{name: "redirect_url", kind: argString, param: "after_completion[redirect][url]",
				with: url.Values{"after_completion[type]": {"redirect"}},
				desc: "The URL to redirect to after the payment is completed."},
		}},
	{name: "create_invoice", title: "Create invoice", method: http.MethodPost, path: "/v1/invoices",
		desc:  "Create a draft invoice for a customer, to be sent (collection_method send_invoice).",
		fixed: url.Values{"collection_method": {"send_invoice"}, "pending_invoice_items_behavior": {"exclude"}},
		args: []toolArg{
			{name: "customer", kind: argID, required: true, desc: "The ID of the customer to create the invoice for."},
			{name: "days_until_due", kind: argInteger, min: 0, max: 3650, desc: "The number of days until the invoice is due."},
		}},
	{name: "list_invoices", title: "List invoices", method: http.MethodGet, path: "/v1/invoices",
		desc: "Fetch a list of invoices from Stripe.",
		args: []toolArg{
			{name: "customer", kind: argID, desc: "Only the invoices of this customer."},
			limitArg(),
		}},
	{name: "create_invoice_item", title: "Create invoice item", method: http.MethodPost, path: "/v1/invoiceitems",
		desc: "Add an item for a price to a draft invoice.",
		args: []toolArg{
			{name: "customer", kind: argID, required: true, desc: "The ID of the customer to create the invoice item for."},
			{name: "price", kind: argID, required: true, param: "pricing[price]", desc: "The ID of the price for the item."},
			{name: "invoice", kind: argID, required: true, desc: "The ID of the invoice to add the item to."},
		}},
	{name: "finalize_invoice", title: "Finalize invoice", method: http.MethodPost, path: "/v1/invoices/{invoice}/finalize",
		desc: "Finalize a draft invoice. Stripe may then collect it without any further request keybrake could cap.",
		args: []toolArg{
			{name: "invoice", kind: argID, required: true, inPath: true, desc: "The ID of the invoice to finalize."},
		}},
	{name: "retrieve_balance", title: "Retrieve balance", method: http.MethodGet, path: "/v1/balance",
		desc: "Retrieve the Stripe account's balance."},
	{name: "create_refund", title: "Create refund", method: http.MethodPost, path: "/v1/refunds",
		desc: "Refund a PaymentIntent, in full or in part.",
		args: []toolArg{
			{name: "payment_intent", kind: argID, required: true, desc: "The ID of the PaymentIntent to refund."},
			{name: "amount", kind: argInteger, min: 1, max: 999_999_999_999,
				desc: "The amount to refund in the currency's minor unit (cents for usd); the whole payment when omitted."},
			{name: "reason", kind: argString, enum: []string{"duplicate", "fraudulent", "requested_by_customer"},
				desc: "Why the payment is refunded."},
		}},
	{name: "create_payment_intent", title: "Create PaymentIntent", method: http.MethodPost, path: "/v1/payment_intents",
		desc: "Create a PaymentIntent to collect a payment (keybrake's tool: Stripe's toolkit has none).",
		args: []toolArg{
			{name: "amount", kind: argInteger, min: 1, max: 999_999_999_999, required: true,
				desc: "The amount in the currency's minor unit (cents for usd)."},
			{name: "currency", kind: argString, required: true, desc: "Three-letter ISO currency code, in lower case (usd)."},
			{name: "customer", kind: argID, desc: "The ID of the customer the payment is for."},
			{name: "description", kind: argString, desc: "An arbitrary description."},
			{name: "payment_method", kind: argID, desc: "The ID of the payment method to charge."},
			{name: "confirm", kind: argBoolean, desc: "Confirm the PaymentIntent at once (needs payment_method)."},
			{name: "capture_method", kind: argString, enum: []string{"automatic", "manual"},
				desc: "manual only authorises the payment; capture it later."},
			{name: "metadata", kind: argMetadata, desc: "Key-value pairs to store on the PaymentIntent."},
		}},
	{name: "list_payment_intents", title: "List PaymentIntents", method: http.MethodGet, path: "/v1/payment_intents",
		desc: "Fetch a list of PaymentIntents from Stripe.",
		args: []toolArg{
			{name: "customer", kind: argID, desc: "Only the PaymentIntents of this customer."},
			limitArg(),
		}},
	{name: "list_subscriptions", title: "List subscriptions", method: http.MethodGet, path: "/v1/subscriptions",
		desc: "Fetch a list of subscriptions from Stripe.",
		args: []toolArg{
			{name: "customer", kind: argID, desc: "Only the subscriptions of this customer."},
			{name: "price", kind: argID, desc: "Only the subscriptions to this price."},
			{name: "status", kind: argString, desc: "Only subscriptions in this status.",
				enum: []string{"active", "past_due", "unpaid", "canceled", "incomplete", "incomplete_expired", "trialing", "all"}},
			limitArg(),
		}},
	{name: "cancel_subscription", title: "Cancel subscription", method: http.MethodDelete, path: "/v1/subscriptions/{subscription}",
		desc: "Cancel a subscription at once.",
		args: []toolArg{
			{name: "subscription", kind: argID, required: true, inPath: true, desc: "The ID of the subscription to cancel."},
		}},
	{name: "update_subscription", title: "Update subscription", method: http.MethodPost, path: "/v1/subscriptions/{subscription}",
		desc: "Update a subscription's items. To change an item, mark the existing one deleted and add the new one. " +
			"Renewals are charged by Stripe without any request keybrake could cap.",
		args: []toolArg{
			{name: "subscription", kind: argID, required: true, inPath: true, desc: "The ID of the subscription to update."},
			{name: "proration_behavior", kind: argString, enum: []string{"create_prorations", "none", "always_invoice"},
				desc: "How to handle prorations when the items change."},
			{name: "items", kind: argObject, desc: "The subscription items to update, add or remove.",
				schema: map[string]any{"type": "array", "items": map[string]any{
					"type": "object", "additionalProperties": false,
					"properties": map[string]any{
						"id":       map[string]any{"type": "string", "description": "The ID of the subscription item to modify."},
						"price":    map[string]any{"type": "string", "description": "The ID of the price to switch to."},
						"quantity": map[string]any{"type": "integer", "minimum": 1, "description": "The quantity."},
						"deleted":  map[string]any{"type": "boolean", "description": "Whether to delete this item."},
					}}}},
		}},
	{name: "list_coupons", title: "List coupons", method: http.MethodGet, path: "/v1/coupons",
		desc: "Fetch a list of coupons from Stripe.", args: []toolArg{limitArg()}},
	{name: "create_coupon", title: "Create coupon", method: http.MethodPost, path: "/v1/coupons",
		desc: "Create a coupon: percent_off or amount_off with currency.",
		args: []toolArg{
			{name: "name", kind: argString, required: true, desc: "The name customers see on invoices and receipts."},
			{name: "percent_off", kind: argNumber, desc: "The percentage off, above 0 and at most 100."},
			{name: "amount_off", kind: argInteger, min: 1, max: 999_999_999_999,
				desc: "The amount off in the currency's minor unit (needs currency)."},
			{name: "currency", kind: argString, desc: "Three-letter ISO currency code of amount_off, in lower case."},
			{name: "duration", kind: argString, enum: []string{"once", "repeating", "forever"},
				desc: "How long the discount lasts (Stripe's default: once)."},
			{name: "duration_in_months", kind: argInteger, min: 1, max: 1200,
				desc: "The number of months a repeating discount lasts."},
		}},
	{name: "list_disputes", title: "List disputes", method: http.MethodGet, path: "/v1/disputes",
		desc: "Fetch a list of disputes from Stripe.",
		args: []toolArg{
			{name: "charge", kind: argID, desc: "Only the disputes of this charge."},
			{name: "payment_intent", kind: argID, desc: "Only the disputes of this PaymentIntent."},
			limitArg(),
		}},
	{name: "update_dispute", title: "Update dispute", method: http.MethodPost, path: "/v1/disputes/{dispute}",
		desc: "Add evidence to a dispute, or submit it.",
		args: []toolArg{
			{name: "dispute", kind: argID, required: true, inPath: true, desc: "The ID of the dispute to update."},
			{name: "evidence", kind: argObject, schema: map[string]any{"type": "object"},
				desc: "Evidence fields (Stripe's dispute evidence hash); updating any submits all of them for review."},
			{name: "metadata", kind: argMetadata, desc: "Key-value pairs to store on the dispute."},
			{name: "submit", kind: argBoolean, desc: "Submit the evidence to the bank now (false stages it)."},
		}},
	{name: toolStripeRequest, title: "Stripe API request", desc: "Send any Stripe API request that this vault key's " +
		"policy allows, e.g. {\"method\": \"POST\", \"path\": \"/v1/charges\", \"params\": {\"amount\": 2500, " +
		"\"currency\": \"usd\", \"source\": \"tok_visa\"}, \"idempotency_key\": \"order-42\"}. params are Stripe's " +
		"parameters as nested JSON (sent as a form body for POST, as the query for GET). A request that moves money " +
		"counts against the caps; without an idempotency_key it gets one derived from the call, so a retry of the " +
		"same call moves money once.",
		args: []toolArg{
			{name: "method", kind: argString, required: true, control: true,
				enum: []string{http.MethodGet, http.MethodPost, http.MethodDelete}, desc: "The HTTP method."},
			{name: "path", kind: argString, required: true, control: true,
				desc: "The API path, e.g. /v1/charges or /v1/customers/cus_123."},
			{name: "params", kind: argObject, control: true, schema: map[string]any{"type": "object"},
				desc: "Stripe's parameters."},
			{name: "stripe_account", kind: argID, control: true,
				desc: "A connected account to act on (Stripe-Account); the policy must allow it."},
		}},
	apiReadTool, apiWriteTool, apiSearchTool, apiDetailsTool, apiAccountsTool,
	{name: toolGetBudget, title: "Get budget", desc: "Read this vault key's policy and what is left of its budget: " +
		"per cap window (daily, period) the cap, what is committed, what is held by requests in flight or whose " +
		"outcome is unknown, what remains and when the window resets; and the per-request cap. Call it before a " +
		"payment to plan instead of discovering a cap by hitting it."},
	{name: toolRequestRaise, title: "Request budget raise", desc: "Ask a human operator for a temporary raise of one of " +
		"this vault key's caps, with a reason. Nothing changes until an admin approves: the answer is the request, " +
		"pending; call get_budget later to see the raise among the caps. At most 5 requests may be pending at once.",
		args: []toolArg{
			{name: "window", kind: argString, required: true, enum: []string{"daily", "period", "per_request"},
				desc: "The cap to raise."},
			{name: "amount", kind: argString, required: true,
				desc: "How much to add to the cap, a decimal string in the key's currency (\"50.00\")."},
			{name: "until", kind: argString, required: true,
				desc: "When the raise ends by itself: an RFC 3339 time in the future, at most 31 days ahead."},
			{name: "reason", kind: argString, required: true, desc: "Why the raise is needed, for the approver (at most 500 characters)."},
		}},
})

// mustTools derives each tool's operation from the catalogue and builds its two
// listed forms. It panics on a table that the catalogue does not know, which
// the tests catch.
func mustTools(specs []*toolSpec) []*toolSpec {
	for _, t := range specs {
		if t.method != "" {
			cls, err := stripeapi.Classify(t.method, samplePath(t.path), nil)
			if err != nil || !cls.Known {
				panic(fmt.Sprintf("mcp tool %s: %s %s is not in the catalogue (%v)", t.name, t.method, t.path, err))
			}
			t.op, t.money = cls.Operation, cls.MovesMoney
		}
		if t.method == http.MethodPost || t.name == toolStripeRequest || t.name == toolAPIWrite {
			t.args = append(t.args, toolArg{name: idempotencyArg, kind: argString})
		}
		if t.money || t.name == toolStripeRequest || t.name == toolAPIWrite {
			t.args = append(t.args, t.approvalReasonArg())
		}
		t.defs = [2]*mcp.Tool{t.listed(false), t.listed(true)}
	}
	return specs
}

// approvalReasonArg is the argument that says why a payment is made, shown
// to the person who approves it when the key's policy asks for approval:
// "reason", or "approval_reason" on a tool where "reason" is Stripe's own
// parameter (create_refund).
func (t *toolSpec) approvalReasonArg() toolArg {
	name := "reason"
	for _, a := range t.args {
		if a.name == name {
			name = "approval_reason"
		}
	}
	return toolArg{name: name, kind: argString, approval: true,
		desc: "Why this payment is made, in a sentence (at most 500 characters): shown to the person who approves it " +
			"when this vault key's policy asks for approval above an amount."}
}

// pathArg matches a {name} placeholder of a tool's path.
var pathArg = regexp.MustCompile(`\{[a-z_]+\}`)

// samplePath fills the path's placeholders with an id, to classify it.
func samplePath(path string) string { return pathArg.ReplaceAllString(path, "id_sample") }

// visibleTo says whether tools/list shows the tool to a key with policy p: when the
// policy allows its operation, or lets everything through in report mode.
func (t *toolSpec) visibleTo(p *policy.Policy) bool {
	return t.op == "" || p.EffectiveMode() == policy.ModeReport || p.AllowsOperation(t.op)
}

// listed is the tool as tools/list shows it to a key in require mode, or derive.
func (t *toolSpec) listed(derive bool) *mcp.Tool {
	props := map[string]any{}
	var required []string
	for _, a := range t.args {
		s := a.jsonSchema()
		if a.name == idempotencyArg {
			s["description"] = t.idempotencyText(derive)
		}
		props[a.name] = s
		if a.required {
			required = append(required, a.name)
		}
	}
	schema := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		schema["required"] = required
	}
	desc := t.desc
	if t.money {
		desc += " Moves money: it counts against this vault key's spend caps, and keybrake refuses it before " +
			"it reaches Stripe when a cap would be exceeded (call get_budget to see what is left)."
	}
	ann := &mcp.ToolAnnotations{Title: t.title}
	switch {
	case t.method == http.MethodGet || t.name == toolGetBudget || t.name == toolAPIRead || t.describes():
		ann.ReadOnlyHint, ann.IdempotentHint = true, true
	case t.name == toolRequestRaise:
		ann.DestructiveHint = ptr(false) // it only asks
	case t.money:
		// The idempotency key is part of the arguments: the same call twice moves
		// money once.
		ann.DestructiveHint, ann.IdempotentHint = ptr(true), true
	default:
		// Creating objects only adds; cancelling, updating and finalising change
		// what exists, and stripe_request may do anything the policy allows.
		additive := t.method == http.MethodPost && !strings.Contains(t.path, "{") && t.name != toolStripeRequest
		ann.DestructiveHint = ptr(!additive)
	}
	if t.name == toolGetBudget || t.name == toolRequestRaise || t.describes() {
		ann.OpenWorldHint = ptr(false)
	}
	return &mcp.Tool{Name: t.name, Title: t.title, Description: desc, InputSchema: schema, Annotations: ann}
}

// describes reports whether the tool only describes (the operations, the
// accounts) and sends nothing to Stripe.
func (t *toolSpec) describes() bool {
	return t.name == toolAPISearch || t.name == toolAPIDetails || t.name == toolAPIAccounts
}

// derivedKeyText is what a money tool's idempotency_key says of the key
// keybrake derives when it is omitted.
const derivedKeyText = "Optional: 1-255 printable characters naming this unit of work (e.g. order-42). Without it, " +
	"keybrake derives one from this vault key, the operation and its parameters, so the same call repeated within " +
	"the idempotency TTL (24 h by default) moves money once. Give your own key to make a deliberate second, " +
	"identical payment; a retry with the same key gets the first call's answer and moves no money."

// idempotencyText describes the idempotency_key argument of the tool.
func (t *toolSpec) idempotencyText(derive bool) string {
	general := t.name == toolStripeRequest || t.name == toolAPIWrite
	switch {
	case derive && (t.money || general):
		return "Ignored when the request moves money: this vault key derives the idempotency key from the " +
			"request's own fields, so a retry of the same payment is the same payment."
	case t.money:
		return derivedKeyText
	case general:
		return "Optional: 1-255 printable characters naming this unit of work (e.g. order-42); a retry with the same " +
			"key gets the first call's answer instead of running again. A request that moves money and has none gets " +
			"one derived from this vault key, the operation and its parameters, so the same call repeated within the " +
			"idempotency TTL (24 h by default) moves money once; give your own key to make a deliberate second, " +
			"identical payment."
	default:
		return "Optional: a retry with the same key gets the first call's answer instead of running again."
	}
}

func ptr[T any](v T) *T { return &v }

// jsonSchema is the argument's JSON schema.
func (a toolArg) jsonSchema() map[string]any {
	s := map[string]any{}
	switch a.kind {
	case argString, argID:
		s["type"] = "string"
	case argInteger:
		s["type"] = "integer"
	case argNumber:
		s["type"] = "number"
	case argBoolean:
		s["type"] = "boolean"
	case argMetadata:
		s["type"], s["additionalProperties"] = "object", map[string]any{"type": "string"}
	case argObject:
		for k, v := range a.schema {
			s[k] = v
		}
	}
	if a.max > 0 {
		s["minimum"], s["maximum"] = a.min, a.max
	}
	if len(a.enum) > 0 {
		s["enum"] = a.enum
	}
	if a.desc != "" {
		s["description"] = a.desc
	}
	return s
}

// toolCall is a tool's arguments turned into a Stripe request.
type toolCall struct {
	method         string
	path           string
	params         url.Values
	idempotencyKey string
	approvalReason string // sent as Keybrake-Approval-Reason
	stripeAccount  string
	jsonBody       []byte // a v2 POST's body (v2 takes JSON)
}

// argError is an argument a tool cannot use; its text tells the model what to fix.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }

func argErrorf(format string, args ...any) error { return &argError{msg: fmt.Sprintf(format, args...)} }

// integerText matches a JSON integer.
var integerText = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// idText matches a Stripe object id.
var idText = regexp.MustCompile(`^[A-Za-z0-9_-]{1,255}$`)

// decodeArgs reads the arguments object, keeping numbers as written.
func decodeArgs(raw json.RawMessage) (map[string]any, error) {
	args := map[string]any{}
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return args, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&args); err != nil {
		return nil, argErrorf("the arguments must be a JSON object: %v", err)
	}
	return args, nil
}

// request turns validated arguments into the tool's Stripe request.
func (t *toolSpec) request(raw json.RawMessage) (toolCall, error) {
	args, err := decodeArgs(raw)
	if err != nil {
		return toolCall{}, err
	}
	for name := range args {
		if !slices.ContainsFunc(t.args, func(a toolArg) bool { return a.name == name }) {
			return toolCall{}, argErrorf("unknown argument %q; %s takes %s", name, t.name, t.argNames())
		}
	}
	call := toolCall{method: t.method, path: t.path, params: url.Values{}}
	for k, v := range t.fixed {
		call.params[k] = slices.Clone(v)
	}
	for _, a := range t.args {
		v, ok := args[a.name]
		if !ok || v == nil {
			if a.required {
				return toolCall{}, argErrorf("the argument %q is required: %s", a.name, a.desc)
			}
			continue
		}
		if err := a.check(v); err != nil {
			return toolCall{}, err
		}
		switch {
		case a.control:
		case a.name == idempotencyArg:
			call.idempotencyKey = v.(string)
		case a.approval:
			call.approvalReason = v.(string)
		case a.inPath:
			call.path = strings.ReplaceAll(call.path, "{"+a.name+"}", v.(string))
		default:
			param := a.param
			if param == "" {
				param = a.name
			}
			if err := formEncode(param, v, call.params); err != nil {
				return toolCall{}, err
			}
			for k, vs := range a.with {
				call.params[k] = slices.Clone(vs)
			}
		}
	}
	if t.name == toolStripeRequest {
		return stripeRequestCall(args, call)
	}
	return call, nil
}

// stripeRequestCall builds stripe_request's request from its checked arguments.
func stripeRequestCall(args map[string]any, call toolCall) (toolCall, error) {
	call.method = args["method"].(string)
	call.path = args["path"].(string)
	if !strings.HasPrefix(call.path, "/v1/") && !strings.HasPrefix(call.path, "/v2/") {
		return toolCall{}, argErrorf("path must be a Stripe API path starting with /v1/ or /v2/, e.g. /v1/charges")
	}
	if strings.ContainsAny(call.path, "?#") {
		return toolCall{}, argErrorf("path may not carry a query: put the parameters in params")
	}
	params, _ := args["params"].(map[string]any)
	if call.method == http.MethodDelete && len(params) > 0 {
		return toolCall{}, argErrorf("a DELETE request takes no params")
	}
	call.stripeAccount, _ = args["stripe_account"].(string)
	if call.method == http.MethodPost && strings.HasPrefix(call.path, "/v2/") {
		if params == nil {
			params = map[string]any{}
		}
		body, err := json.Marshal(params) // json.Number keeps every number as written
		if err != nil {
			return toolCall{}, argErrorf("params cannot be sent as JSON: %v", err)
		}
		call.jsonBody = body
		return call, nil
	}
	for _, name := range sortedKeys(params) {
		if err := formEncode(name, params[name], call.params); err != nil {
			return toolCall{}, err
		}
	}
	return call, nil
}

// argNames lists the tool's arguments for an error message.
func (t *toolSpec) argNames() string {
	if len(t.args) == 0 {
		return "no arguments"
	}
	names := make([]string, len(t.args))
	for i, a := range t.args {
		names[i] = a.name
	}
	return strings.Join(names, ", ")
}

// check validates a value of the argument.
func (a toolArg) check(v any) error {
	bad := func(want string) error {
		return argErrorf("the argument %q must be %s", a.name, want)
	}
	switch a.kind {
	case argString, argID:
		s, ok := v.(string)
		if !ok {
			return bad("a string")
		}
		if a.kind == argID && !idText.MatchString(s) {
			return bad("a Stripe object id (letters, digits, _ and -)")
		}
		if len(a.enum) > 0 && !slices.Contains(a.enum, s) {
			return bad("one of " + strings.Join(a.enum, ", "))
		}
	case argInteger:
		n, ok := v.(json.Number)
		if !ok || !integerText.MatchString(n.String()) {
			return bad("an integer (amounts in the currency's minor unit, e.g. 2500 for 25.00 usd)")
		}
		if a.max > 0 {
			i, err := strconv.ParseInt(n.String(), 10, 64)
			if err != nil || i < a.min || i > a.max {
				return bad(fmt.Sprintf("an integer from %d to %d", a.min, a.max))
			}
		}
	case argNumber:
		if _, ok := v.(json.Number); !ok {
			return bad("a number")
		}
	case argBoolean:
		if _, ok := v.(bool); !ok {
			return bad("true or false")
		}
	case argMetadata:
		m, ok := v.(map[string]any)
		if !ok {
			return bad("an object of strings")
		}
		for _, x := range m {
			if _, ok := x.(string); !ok {
				return bad("an object of strings")
			}
		}
	case argObject:
		want := a.schema["type"]
		_, isMap := v.(map[string]any)
		_, isList := v.([]any)
		if (want == "object" && !isMap) || (want == "array" && !isList) {
			return bad(fmt.Sprintf("a JSON %s", want))
		}
	}
	return nil
}

// sortedKeys returns the keys of m in order.
func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// formEncode adds v under key to out as Stripe reads form parameters: objects as
// key[field], arrays as key[0], key[1], …, numbers as written, booleans as true or
// false, null and empty objects or arrays as "" (which Stripe reads as "unset").
// Object fields are sent in sorted order, so the same arguments are the same body.
func formEncode(key string, v any, out url.Values) error {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 {
			out.Add(key, "")
		}
		for _, k := range sortedKeys(x) {
			if err := formEncode(key+"["+k+"]", x[k], out); err != nil {
				return err
			}
		}
	case []any:
		if len(x) == 0 {
			out.Add(key, "")
		}
		for i, e := range x {
			if err := formEncode(key+"["+strconv.Itoa(i)+"]", e, out); err != nil {
				return err
			}
		}
	case string:
		out.Add(key, x)
	case json.Number:
		out.Add(key, x.String())
	case bool:
		out.Add(key, strconv.FormatBool(x))
	case nil:
		out.Add(key, "")
	default:
		return errors.New("unexpected JSON value")
	}
	return nil
}
