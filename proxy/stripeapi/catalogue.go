package stripeapi

// The Stripe operation catalogue: method + path pattern → operation, direction of
// money, and how the amount is found. Decisions (the summary of what Classify and
// ParseForm refuse and why):
//
// Paths. Classify reads the raw path (r.URL.EscapedPath()). It must start with /v1/
// or /v2/, have no empty segment (no "//", no trailing slash), no segment made only
// of dots, and only the characters [A-Za-z0-9_.-]: no percent-encoding at all (so
// "%2F", "%2e%2e" and encoded letters never reach Stripe as a different path than
// the one metered), no ";" (matrix parameters), no "+" or other sub-delimiters. The
// resource segment and any segment that is a catalogue word in another case
// ("Capture", "CHARGES") are refused: Stripe's routes are lower case. Ids may hold
// upper case ("pi_3NxAbC").
//
// Operations. Every GET on a known resource is "<resource>.read" (searches and
// nested lists included: GET /v1/customers/cus_1/sources is "customers.read");
// namespaced resources keep their namespace ("checkout.sessions.read"). A DELETE
// with an id on a known resource is "<resource>.delete" (no money now). POSTs are
// matched against the table below; anything else is "unknown.write" (Known false:
// the pipeline refuses it) and a GET on an unknown resource is "unknown.read".
// Methods other than GET, POST and DELETE are "unknown.write". On /v2 (JSON only,
// see ParseJSON) a GET is "v2.<names>.read" (the non-id segments joined by dots,
// e.g. "v2.core.events.read", Known false) and every other method "unknown.write":
// keybrake does not yet know any v2 write that moves no money.
//
// Legacy refunds (POST /v1/charges/{id}/refund and /refunds) are "refunds.create",
// so a policy that allows refunds allows them and meters them alike. Transfer
// reversals are "transfer_reversals.create", application fee refunds
// "application_fee_refunds.create".
//
// Money fields (amount, unit_amount, quantity, amount_to_capture, …) must match
// ^[0-9]+$, have no leading zero ("0100" — Stripe would read 100, a careless parser
// 0100 octal or a string: refused as ambiguous), at most 12 digits (Stripe's
// documented maximum for any method; an amount that long is an attack or a bug) and
// so fit int64. "+100", "1e5", "-5", "", "1.0" and arrays or hashes ("amount[]=1")
// are refused. Sums and products are checked for overflow. A negative invoice item
// (a credit, which Stripe allows) is refused too: keybrake meters only
// non-negative amounts. Currencies ("currency" anywhere it is read, and the
// top-level "currency" of every request) must be three lower-case ASCII letters;
// Classify does not check that Stripe supports the currency (policy does).
//
// Amounts:
//   - charges.create, payment_intents.create, transfers.create, payouts.create,
//     topups.create: amount + currency from the request. Without both: amount
//     unknown (Stripe would refuse the request anyway).
//   - charges.capture: amount if given (currency from a lookup of the charge), else
//     the charge's "amount" (the full amount of an uncaptured charge).
//   - payment_intents.update with amount: the new total (NewTotal, Lookup of the
//     PaymentIntent's "amount"); with currency but no amount: the whole amount is
//     re-metered in the new currency (Lookup "amount", Currency the new one);
//     neither: no money.
//   - payment_intents.confirm: amount_to_confirm if given (currency by lookup),
//     else Lookup "amount". payment_intents.capture: amount_to_capture (currency by
//     lookup), else Lookup "amount_capturable".
//     payment_intents.increment_authorization: amount is the new total (NewTotal,
//     Lookup "amount").
//   - refunds.create: amount if given; the currency is that of the charge /
//     PaymentIntent looked up (a "currency" parameter is ignored then: a refund
//     moves money in the charge's currency), or the "currency" parameter for a
//     refund of a customer balance (no charge, no PaymentIntent). Without amount:
//     the charge's "amount" (NOT amount − amount_refunded: metering the full
//     amount can only overcount; the pipeline may refine) or the PaymentIntent's
//     "amount_received". Both charge and payment_intent, or neither (and no amount
//     + currency): amount unknown. Legacy charge refunds: amount or the charge's
//     "amount", always in the charge's currency.
//   - transfer_reversals.create / application_fee_refunds.create /
//     payouts.reverse: amount if given, else the transfer's / fee's / payout's
//     "amount" (again the full amount).
//   - payment_intents.apply_customer_balance: amount if given, else Lookup
//     "amount"; payment_intents.verify_microdeposits: Lookup "amount" (the
//     verification lets the PaymentIntent debit the account, like a confirmation).
//   - invoices.pay, invoices.finalize, invoices.send: Lookup "amount_remaining"
//     (also with paid_out_of_band: it overcounts rather than guess); each moves
//     money on the invoice (Target), so what its lines already hold is not counted
//     again, and pay commits the answer's amount_paid.
//   - invoiceitems.create: "amount"; or unit_amount × quantity; or
//     price_data[unit_amount] × quantity; or unit_amount_decimal /
//     price_data[unit_amount_decimal] × quantity when the decimal has no fractional
//     minor units (else amount unknown); quantity defaults to 1, quantity_decimal
//     counts when it is integral (else amount unknown). ("unit_amount" and "price"
//     are older API versions' names, still read because Stripe-Version can select
//     them.) A stored price (pricing[price], or "price") × an exact quantity is a
//     PriceRef, looked up at /v1/prices/{id} (a tiered, metered or custom-amount
//     price is refused there). More than one way of pricing in one request, no
//     currency (the customer's default would apply), or tax_rates: amount unknown.
//     With "invoice" the item is added to that invoice (Target, Creates) and its
//     currency is the invoice's; without it, it creates a pending item. Discounts
//     applied at invoice time are not included (they only lower the amount).
//   - invoiceitems.update that touches amount, quantity or pricing: the new total
//     (NewTotal, Lookup "amount"). A unit amount alone keeps the item's quantity
//     and a quantity alone its unit amount: the other factor is read at Stripe
//     (Lookup.Factors), never taken as 1. A stored price without its quantity, a
//     fractional quantity or tax_rates: amount unknown.
//   - invoices.add_lines, invoices.update_lines, /v1/invoices/{id}/lines/{line}:
//     lines priced like invoice items, added to the invoice (Target, Creates): a
//     new line adds its amount, a repriced line its whole new total (one line
//     cannot be looked up, so what it was is not subtracted); a line attaching an
//     existing invoice item (it may be a proration keybrake never metered), a
//     line changing one factor of unit × quantity, or carrying tax: amount
//     unknown. Lookup of the invoice for its currency.
//   - invoices.create / invoices.update: no money, but automatic tax, default tax
//     rates, shipping_cost, drawing in lines no request metered (pending items:
//     any pending_invoice_items_behavior but exclude, or none under a
//     Stripe-Version before 2022-08-01 — MinVersion —, a subscription's; a
//     revision's from_invoice) and a change of discounts (on invoices, items
//     and lines) are amount unknown; invoices.update with auto_advance=true or
//     automatically_finalizes_at hands the invoice to Stripe's own collection
//     and is metered like invoices.finalize.
//   - checkout.sessions.create: mode payment (or no mode): the sum over
//     line_items[i] of price_data[unit_amount] (or an integral
//     price_data[unit_amount_decimal]) × quantity (default 1), or a stored price ×
//     quantity (a PriceRef), plus the most expensive shipping option
//     (shipping_rate_data[fixed_amount][amount]). Amount unknown (fail closed)
//     when a line item uses a legacy line_items[i][amount] (older API versions'
//     ad-hoc price), when quantities are adjustable, when line items carry tax
//     rates, when automatic tax (or Managed Payments, which handles tax) is
//     enabled, when optional_items are offered, when a
//     shipping option is a stored rate, when there are no line items, and for
//     mode=subscription or any subscription_data (renewals happen without any
//     request keybrake sees, so the first period is not the exposure; older API
//     versions subscribe without a mode), and with after_expiration[recovery]
//     (an expired session's recovery URL creates a payable copy of it), and for
//     an inline recurring price (line_items[i][price_data][recurring]).
//     Currencies that differ between line items, shipping and the "currency"
//     parameter are malformed. mode=setup without line items moves no money.
//   - checkout.sessions.update with line_items: amount unknown; otherwise no money.
//   - subscriptions.create: one period of its items and add_invoice_items, priced
//     like Checkout line items (see recurring.go), refused with a
//     billing_cycle_anchor, billing_schedules or pending_invoice_item_interval;
//     subscription changes that invoice at once or at a moment the caller picks
//     are amount unknown (always_invoice, billing_cycle_anchor=now, any trial_end,
//     trial_from_plan, billing_schedules, pending_invoice_item_interval, a resume
//     that does not keep billing_cycle_anchor=unchanged — now is its default —,
//     an item moved to a new price, a new item), and add_invoice_items are
//     metered; subscription_schedules that set phases, a start date or default
//     settings, or a schedule cancelled with its default invoice_now: amount
//     unknown. Every time- or recurrence-shaped parameter has a rule in later.go.
//   - prices.update of currency_options (what the links and sessions that use
//     the price charge in other currencies): amount unknown; other changes move
//     no money.
//   - payment_links.create: line items × restrictions[completed_sessions][limit]
//     (stored prices must be one-time, inline ones without recurring), amount
//     unknown without a limit, or with what a customer may add (optional items,
//     shipping options); an update that changes what the link sells or what may
//     be added, or reactivates it (active=true): amount unknown.
//   - customers.update with a positive balance: the new total (NewTotal, Lookup
//     "balance", a credit counting as 0); customers.create with one: amount
//     unknown; customers.create_balance_transaction with a positive amount: that
//     amount. Credits move no money. A plan or trial_end on customers.create or
//     .update (older API versions subscribe with them): amount unknown.
//   - Named writes that move money later or not at all (MovesMoney false, must be
//     named in a policy): invoices.void/mark_uncollectible/remove_lines,
//     subscriptions.migrate, setup_intents.*, the rest of customers.*, prices.*,
//     products.*, plans.*, coupons.*, payment_methods.*, accounts.*, disputes.*,
//     cancels. Those that take money-named parameters say why they move no money
//     (route.why; the tests check Stripe's OpenAPI description against it).
//
// Parameters are read as ParseForm documents (duplicates, ambiguous keys and bad
// encodings never get here); Get of a key that holds a hash or an array fails, so
// "amount[]=1" cannot hide an amount.
//
// Customer: the "customer" parameter, else "customer_account" (v2 Accounts as
// customers), else the id of a /v1/customers/{id}/… path. Both parameters at once
// are malformed, so a policy's customer list cannot be sidestepped. The
// parameters are not taken from a request on an existing object other than a
// customer (a path id; a refund of a charge or PaymentIntent): they do not show
// whose object it is (see namesCustomer).
//
// Ids taken from parameters into a lookup path (charge, payment_intent, price) must
// be plain ids ([A-Za-z0-9_-], at most 255 bytes), else malformed. A "_method"
// parameter (Rack::MethodOverride turns a POST into another method) is malformed.

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// moneyFunc fills the money part of a Classification from a matched request.
type moneyFunc func(r *catRequest, c *Classification) error

// catRequest is a request matched against a route.
type catRequest struct {
	params *Params
	ids    []string // path ids in order
}

// route is one catalogue entry.
type route struct {
	method string
	segs   []string // pattern segments; "{id}" matches an id
	op     string
	dir    Direction
	money  moneyFunc
	object objectRole // which money object the money is counted on
	// why says why a write that takes money-named parameters moves no money
	// (checked against Stripe's OpenAPI description by the tests).
	why string
}

// objectRole says which Stripe money object a route's money is counted on
// (Classification.Target and Creates); the money function may refine it.
type objectRole int

const (
	objectNone    objectRole = iota // the money moves at once
	objectCreated                   // the object Stripe's answer creates
	objectPath                      // money moves on the object named by the path's first id
	objectAdded                     // new lines are added to the path's object
)

// creates marks rt as creating a money object.
func creates(rt route) route { rt.object = objectCreated; return rt }

// onPath marks rt as moving money on the path's object.
func onPath(rt route) route { rt.object = objectPath; return rt }

// addsTo marks rt as adding lines to the path's object.
func addsTo(rt route) route { rt.object = objectAdded; return rt }

// namespaces are the v1 path prefixes whose resource is "<ns>.<next segment>".
var namespaces = map[string]bool{
	"apps": true, "billing": true, "billing_portal": true, "checkout": true, "climate": true,
	"entitlements": true, "financial_connections": true, "forwarding": true, "identity": true,
	"issuing": true, "radar": true, "reporting": true, "sigma": true, "tax": true,
	"terminal": true, "test_helpers": true, "treasury": true,
}

// readResources are the resources whose GETs are "<resource>.read" and whose
// DELETEs with an id are "<resource>.delete".
var readResources = toSet(
	"account", "accounts", "application_fees", "apple_pay", "balance", "balance_settings",
	"balance_transactions", "charges", "confirmation_tokens", "country_specs", "coupons",
	"credit_notes", "customers", "disputes", "ephemeral_keys", "events", "exchange_rates",
	"file_links", "files", "invoice_payments", "invoice_rendering_templates", "invoiceitems",
	"invoices", "mandates", "payment_intents", "payment_links", "payment_method_configurations",
	"payment_method_domains", "payment_methods", "payouts", "plans", "prices", "products",
	"promotion_codes", "quotes", "refunds", "reviews", "setup_attempts", "setup_intents",
	"shipping_rates", "sources", "subscription_items", "subscription_schedules",
	"subscriptions", "tax_codes", "tax_ids", "tax_rates", "tokens", "topups", "transfers",
	"webhook_endpoints",
	"apps.secrets", "billing.alerts", "billing.credit_balance_summary",
	"billing.credit_balance_transactions", "billing.credit_grants", "billing.meters",
	"billing_portal.configurations", "billing_portal.sessions", "checkout.sessions",
	"climate.orders", "climate.products", "climate.suppliers", "entitlements.active_entitlements",
	"entitlements.features", "financial_connections.accounts", "financial_connections.sessions",
	"financial_connections.transactions", "forwarding.requests", "identity.verification_reports",
	"identity.verification_sessions", "issuing.authorizations", "issuing.cardholders",
	"issuing.cards", "issuing.disputes", "issuing.personalization_designs",
	"issuing.physical_bundles", "issuing.tokens", "issuing.transactions",
	"radar.early_fraud_warnings", "radar.value_list_items", "radar.value_lists",
	"reporting.report_runs", "reporting.report_types", "sigma.scheduled_query_runs",
	"tax.calculations", "tax.registrations", "tax.settings", "tax.transactions",
	"terminal.configurations", "terminal.connection_tokens", "terminal.locations",
	"terminal.readers", "treasury.credit_reversals", "treasury.debit_reversals",
	"treasury.financial_accounts", "treasury.inbound_transfers", "treasury.outbound_payments",
	"treasury.outbound_transfers", "treasury.received_credits", "treasury.received_debits",
	"treasury.transaction_entries", "treasury.transactions",
)

func toSet(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// catalogue is the table of POST endpoints. It is built once and never changed.
var catalogue = buildCatalogue()

// catalogueWords are the literal path segments of the catalogue and the resource
// names: a path segment that equals one of them in another case is refused.
var catalogueWords = buildWords()

func buildCatalogue() []route {
	r := func(path, op string, dir Direction, money moneyFunc) route {
		return route{method: "POST", segs: strings.Split(strings.TrimPrefix(path, "/"), "/"), op: op, dir: dir, money: money}
	}
	w := func(path, op string) route { return r(path, op, DirectionNone, nil) }
	// n is a write whose money-named parameters move no money, and why.
	n := func(path, op, why string) route { rt := w(path, op); rt.why = why; return rt }
	const (
		catalogWhy = "a price, plan or product is a catalogue entry: the charges, invoices and subscriptions that use it are metered when they do"
		mandateWhy = "it saves a payment method and charges nothing; a mandate's amount limits later payments, each its own request"
	)
	return []route{
		// Charges.
		creates(r("/v1/charges", "charges.create", DirectionIn, requestAmount("amount"))),
		w("/v1/charges/{id}", "charges.update"),
		onPath(r("/v1/charges/{id}/capture", "charges.capture", DirectionIn, optionalAmount("amount", "/v1/charges/", "amount"))),
		r("/v1/charges/{id}/refund", "refunds.create", DirectionOut, optionalAmount("amount", "/v1/charges/", "amount")),
		r("/v1/charges/{id}/refunds", "refunds.create", DirectionOut, optionalAmount("amount", "/v1/charges/", "amount")),
		w("/v1/charges/{id}/refunds/{id}", "refunds.update"),
		w("/v1/charges/{id}/dispute", "disputes.update"),
		w("/v1/charges/{id}/dispute/close", "disputes.close"),

		// PaymentIntents.
		creates(r("/v1/payment_intents", "payment_intents.create", DirectionIn, requestAmount("amount"))),
		onPath(r("/v1/payment_intents/{id}", "payment_intents.update", DirectionIn, paymentIntentUpdate)),
		onPath(r("/v1/payment_intents/{id}/confirm", "payment_intents.confirm", DirectionIn, optionalAmount("amount_to_confirm", "/v1/payment_intents/", "amount"))),
		onPath(r("/v1/payment_intents/{id}/capture", "payment_intents.capture", DirectionIn, optionalAmount("amount_to_capture", "/v1/payment_intents/", "amount_capturable"))),
		onPath(r("/v1/payment_intents/{id}/increment_authorization", "payment_intents.increment_authorization", DirectionIn, newTotal("amount", "/v1/payment_intents/", "amount"))),
		w("/v1/payment_intents/{id}/cancel", "payment_intents.cancel"),
		onPath(r("/v1/payment_intents/{id}/apply_customer_balance", "payment_intents.apply_customer_balance", DirectionIn, optionalAmount("amount", "/v1/payment_intents/", "amount"))),
		onPath(r("/v1/payment_intents/{id}/verify_microdeposits", "payment_intents.verify_microdeposits", DirectionIn, lookupOnly("/v1/payment_intents/", "amount"))),

		// Refunds.
		r("/v1/refunds", "refunds.create", DirectionOut, refundCreate),
		w("/v1/refunds/{id}", "refunds.update"),
		w("/v1/refunds/{id}/cancel", "refunds.cancel"),

		// Transfers, payouts, top-ups, application fees.
		r("/v1/transfers", "transfers.create", DirectionOut, requestAmount("amount")),
		w("/v1/transfers/{id}", "transfers.update"),
		r("/v1/transfers/{id}/reversals", "transfer_reversals.create", DirectionIn, optionalAmount("amount", "/v1/transfers/", "amount")),
		w("/v1/transfers/{id}/reversals/{id}", "transfer_reversals.update"),
		r("/v1/payouts", "payouts.create", DirectionOut, requestAmount("amount")),
		w("/v1/payouts/{id}", "payouts.update"),
		w("/v1/payouts/{id}/cancel", "payouts.cancel"),
		r("/v1/payouts/{id}/reverse", "payouts.reverse", DirectionIn, lookupOnly("/v1/payouts/", "amount")),
		r("/v1/topups", "topups.create", DirectionIn, requestAmount("amount")),
		w("/v1/topups/{id}", "topups.update"),
		w("/v1/topups/{id}/cancel", "topups.cancel"),
		r("/v1/application_fees/{id}/refunds", "application_fee_refunds.create", DirectionOut, optionalAmount("amount", "/v1/application_fees/", "amount")),
		w("/v1/application_fees/{id}/refunds/{id}", "application_fee_refunds.update"),

		// Invoicing.
		creates(r("/v1/invoiceitems", "invoiceitems.create", DirectionIn, invoiceItemCreate)),
		onPath(r("/v1/invoiceitems/{id}", "invoiceitems.update", DirectionIn, invoiceItemUpdate)),
		r("/v1/invoices", "invoices.create", DirectionIn, invoiceSettings),
		n("/v1/invoices/create_preview", "invoices.create_preview", "a preview shows an invoice without creating one or charging anything"),
		r("/v1/invoices/{id}", "invoices.update", DirectionIn, invoiceSettings),
		onPath(r("/v1/invoices/{id}/finalize", "invoices.finalize", DirectionIn, lookupOnly("/v1/invoices/", "amount_remaining"))),
		onPath(r("/v1/invoices/{id}/send", "invoices.send", DirectionIn, lookupOnly("/v1/invoices/", "amount_remaining"))),
		w("/v1/invoices/{id}/void", "invoices.void"),
		w("/v1/invoices/{id}/mark_uncollectible", "invoices.mark_uncollectible"),
		addsTo(r("/v1/invoices/{id}/add_lines", "invoices.add_lines", DirectionIn, invoiceLines(true, false))),
		addsTo(r("/v1/invoices/{id}/update_lines", "invoices.update_lines", DirectionIn, invoiceLines(false, false))),
		w("/v1/invoices/{id}/remove_lines", "invoices.remove_lines"),
		addsTo(r("/v1/invoices/{id}/lines/{id}", "invoices.update_lines", DirectionIn, invoiceLines(false, true))),
		onPath(r("/v1/invoices/{id}/pay", "invoices.pay", DirectionIn, lookupOnly("/v1/invoices/", "amount_remaining"))),

		// Checkout and payment links.
		creates(r("/v1/checkout/sessions", "checkout.sessions.create", DirectionIn, checkoutSessionCreate)),
		onPath(r("/v1/checkout/sessions/{id}", "checkout.sessions.update", DirectionIn, checkoutSessionUpdate)),
		w("/v1/checkout/sessions/{id}/expire", "checkout.sessions.expire"),
		r("/v1/payment_links", "payment_links.create", DirectionIn, paymentLinkCreate),
		r("/v1/payment_links/{id}", "payment_links.update", DirectionIn, paymentLinkUpdate),

		// Subscriptions (money later: renewals are never seen by keybrake).
		r("/v1/subscriptions", "subscriptions.create", DirectionIn, subscriptionCreate),
		r("/v1/subscriptions/{id}", "subscriptions.update", DirectionIn, subscriptionUpdate),
		r("/v1/subscriptions/{id}/resume", "subscriptions.resume", DirectionIn, subscriptionResume),
		w("/v1/subscriptions/{id}/migrate", "subscriptions.migrate"),
		r("/v1/subscription_items", "subscription_items.create", DirectionIn, subscriptionItemCreate),
		r("/v1/subscription_items/{id}", "subscription_items.update", DirectionIn, subscriptionItemUpdate),
		r("/v1/subscription_schedules", "subscription_schedules.create", DirectionIn, scheduleWrite),
		r("/v1/subscription_schedules/{id}", "subscription_schedules.update", DirectionIn, scheduleWrite),
		r("/v1/subscription_schedules/{id}/cancel", "subscription_schedules.cancel", DirectionIn, scheduleCancel),
		w("/v1/subscription_schedules/{id}/release", "subscription_schedules.release"),

		// SetupIntents.
		n("/v1/setup_intents", "setup_intents.create", mandateWhy),
		n("/v1/setup_intents/{id}", "setup_intents.update", mandateWhy),
		n("/v1/setup_intents/{id}/confirm", "setup_intents.confirm", mandateWhy),
		w("/v1/setup_intents/{id}/cancel", "setup_intents.cancel"),
		w("/v1/setup_intents/{id}/verify_microdeposits", "setup_intents.verify_microdeposits"),

		// Customers.
		r("/v1/customers", "customers.create", DirectionIn, customerBalance(true)),
		r("/v1/customers/{id}", "customers.update", DirectionIn, customerBalance(false)),
		r("/v1/customers/{id}/balance_transactions", "customers.create_balance_transaction", DirectionIn, balanceTransaction),
		w("/v1/customers/{id}/balance_transactions/{id}", "customers.update_balance_transaction"),
		w("/v1/customers/{id}/sources", "customers.create_source"),
		w("/v1/customers/{id}/sources/{id}", "customers.update_source"),
		w("/v1/customers/{id}/sources/{id}/verify", "customers.verify_source"),
		w("/v1/customers/{id}/tax_ids", "customers.create_tax_id"),
		w("/v1/customers/{id}/cash_balance", "customers.update_cash_balance"),
		w("/v1/customers/{id}/funding_instructions", "customers.create_funding_instructions"),

		// Catalog.
		n("/v1/prices", "prices.create", catalogWhy),
		r("/v1/prices/{id}", "prices.update", DirectionIn, priceUpdate),
		n("/v1/products", "products.create", catalogWhy),
		w("/v1/products/{id}", "products.update"),
		n("/v1/plans", "plans.create", catalogWhy),
		w("/v1/plans/{id}", "plans.update"),
		n("/v1/coupons", "coupons.create", "a coupon lowers what later charges collect; it moves no money"),
		w("/v1/coupons/{id}", "coupons.update"),

		// PaymentMethods.
		n("/v1/payment_methods", "payment_methods.create", mandateWhy),
		w("/v1/payment_methods/{id}", "payment_methods.update"),
		w("/v1/payment_methods/{id}/attach", "payment_methods.attach"),
		w("/v1/payment_methods/{id}/detach", "payment_methods.detach"),

		// Connect.
		n("/v1/accounts", "accounts.create", "business_profile revenue figures describe the connected account's business; nothing is charged"),
		n("/v1/accounts/{id}", "accounts.update", "business_profile revenue figures describe the connected account's business; nothing is charged"),
		w("/v1/accounts/{id}/reject", "accounts.reject"),
		w("/v1/accounts/{id}/login_links", "accounts.create_login_link"),
		w("/v1/accounts/{id}/external_accounts", "accounts.create_external_account"),
		w("/v1/accounts/{id}/external_accounts/{id}", "accounts.update_external_account"),
		w("/v1/accounts/{id}/persons", "accounts.create_person"),
		w("/v1/accounts/{id}/persons/{id}", "accounts.update_person"),
		w("/v1/accounts/{id}/capabilities/{id}", "accounts.update_capability"),
		w("/v1/account_links", "account_links.create"),
		w("/v1/account_sessions", "account_sessions.create"),

		// Disputes.
		w("/v1/disputes/{id}", "disputes.update"),
		w("/v1/disputes/{id}/close", "disputes.close"),
	}
}

func buildWords() map[string]bool {
	m := map[string]bool{"v1": true, "v2": true}
	for _, rt := range catalogue {
		for _, s := range rt.segs {
			if s != "{id}" {
				m[s] = true
			}
		}
	}
	for res := range readResources {
		for s := range strings.SplitSeq(res, ".") {
			m[s] = true
		}
	}
	for ns := range namespaces {
		m[ns] = true
	}
	m["search"] = true
	m["upcoming"] = true
	return m
}

// classify is Classify.
func classify(method, path string, params *Params) (Classification, error) {
	segs, err := checkPath(path)
	if err != nil {
		return Classification{}, err
	}
	if err := checkCommonParams(params); err != nil {
		return Classification{}, err
	}
	if segs[0] == "v2" {
		return classifyV2(method, segs), nil
	}
	resource, ids := resourceOf(segs)
	var rt *route
	if method == "POST" {
		rt, ids = match(segs)
	}
	c := Classification{}
	if len(ids) > 0 {
		c.ObjectID = ids[0]
	}
	if resource == "customers" && len(ids) > 0 {
		c.Customer = ids[0]
	}
	if namesCustomer(resource, ids, rt) {
		if v, ok := params.Get("customer"); ok {
			c.Customer = v
		} else if v, ok := params.Get("customer_account"); ok {
			c.Customer = v
		}
	}
	switch method {
	case "GET":
		if readResources[resource] {
			c.Operation, c.Known = resource+".read", true
		} else {
			c.Operation = OpUnknownRead
		}
		return c, nil
	case "DELETE":
		if readResources[resource] && len(ids) > 0 {
			c.Operation, c.Known = resource+".delete", true
		} else {
			c.Operation = OpUnknownWrite
		}
		return c, nil
	case "POST":
	default:
		c.Operation = OpUnknownWrite
		return c, nil
	}
	if rt == nil {
		c.Operation = OpUnknownWrite
		return c, nil
	}
	c.Operation, c.Known = rt.op, true
	if rt.money == nil {
		return c, nil
	}
	c.MovesMoney, c.Direction = true, rt.dir
	switch rt.object {
	case objectCreated:
		c.Creates = true
	case objectPath:
		c.Target = ids[0]
	case objectAdded:
		c.Target, c.Creates = ids[0], true
	}
	if err := rt.money(&catRequest{params: params, ids: ids}, &c); err != nil {
		return Classification{}, err
	}
	if !c.MovesMoney {
		c.Direction, c.Target, c.Creates = DirectionNone, "", false
	}
	return c, nil
}

// namesCustomer reports whether a request's customer (or customer_account)
// parameter says which customer it touches. On a request that acts on an
// existing object other than a customer (an update, a capture: a path id) the
// object's customer is at Stripe, and the parameter proves nothing — on some
// endpoints (payment_intents.update, charges.update) it even hands the object to
// that customer —, so a policy's customer list refuses the request. Attaching a
// payment method is the exception: the parameter is where it goes, and Stripe
// refuses a method attached to another customer.
func namesCustomer(resource string, ids []string, rt *route) bool {
	return len(ids) == 0 || resource == "customers" || (rt != nil && rt.op == "payment_methods.attach")
}

// checkPath validates a raw request path and returns its segments ("v1", …).
func checkPath(path string) ([]string, error) {
	if !strings.HasPrefix(path, "/v1/") && !strings.HasPrefix(path, "/v2/") {
		return nil, formErr("path %q is not under /v1/ or /v2/", clipText(path))
	}
	segs := strings.Split(path[1:], "/")
	for i, s := range segs {
		if s == "" {
			return nil, formErr("path %q has an empty segment or a trailing slash", clipText(path))
		}
		if strings.Trim(s, ".") == "" {
			return nil, formErr("path %q has a dot segment", clipText(path))
		}
		for j := 0; j < len(s); j++ {
			if !isPathByte(s[j]) {
				return nil, formErr("path %q has %q, which is not allowed in a path", clipText(path), s[j])
			}
		}
		lower := strings.ToLower(s)
		if lower != s && (i == 1 || catalogueWords[lower]) {
			return nil, formErr("path %q has upper case where Stripe has lower case", clipText(path))
		}
	}
	return segs, nil
}

func isPathByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.'
}

// IsID reports whether s is a plain Stripe id, safe to put into a lookup path.
func IsID(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// resourceOf names the resource of a v1 path and returns the ids after it.
func resourceOf(segs []string) (string, []string) {
	rest := segs[1:]
	res := rest[0]
	rest = rest[1:]
	if namespaces[res] && len(rest) > 0 {
		res += "." + rest[0]
		rest = rest[1:]
	}
	var ids []string
	// Ids sit at every other position after the resource (/res/{id}/sub/{id});
	// a catalogue word there ("search", "create_preview") is not an id.
	for i := 0; i < len(rest); i += 2 {
		if catalogueWords[rest[i]] {
			break
		}
		ids = append(ids, rest[i])
	}
	return res, ids
}

// match finds the POST route for segs, preferring literal segments over ids.
func match(segs []string) (*route, []string) {
	var best *route
	bestScore := -1
	for i := range catalogue {
		rt := &catalogue[i]
		if len(rt.segs) != len(segs) {
			continue
		}
		score := 0
		ok := true
		for j, s := range rt.segs {
			switch {
			case s == "{id}":
				ok = IsID(segs[j])
			case s == segs[j]:
				score++
			default:
				ok = false
			}
			if !ok {
				break
			}
		}
		if ok && score > bestScore {
			best, bestScore = rt, score
		}
	}
	if best == nil {
		return nil, nil
	}
	var ids []string
	for j, s := range best.segs {
		if s == "{id}" {
			ids = append(ids, segs[j])
		}
	}
	return best, ids
}

// classifyV2 names a v2 request: reads by their resource names, everything else
// an unknown write.
func classifyV2(method string, segs []string) Classification {
	if method != "GET" {
		return Classification{Operation: OpUnknownWrite}
	}
	names := []string{"v2"}
	c := Classification{}
	for _, s := range segs[1:] {
		if isResourceName(s) {
			names = append(names, s)
		} else if c.ObjectID == "" {
			c.ObjectID = s
		}
	}
	if len(names) == 1 {
		return Classification{Operation: OpUnknownRead}
	}
	c.Operation = strings.Join(names, ".") + ".read"
	return c
}

func isResourceName(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || c == '_') {
			return false
		}
	}
	return true
}

// checkCommonParams applies the checks that hold for every request.
func checkCommonParams(p *Params) error {
	if p.Has("_method") {
		return formErr("parameter _method (method override) is not allowed")
	}
	if _, _, err := currencyParam(p, "currency"); err != nil {
		return err
	}
	for _, k := range []string{"customer", "customer_account"} {
		if p.IsContainer(k) {
			return formErr("parameter %s must be a single value", k)
		}
	}
	if p.Has("customer") && p.Has("customer_account") {
		return formErr("parameters customer and customer_account are both given")
	}
	return nil
}

// minorParam reads an integer money field (amount, quantity, …).
func minorParam(p *Params, key string) (int64, bool, error) {
	if p.IsContainer(key) {
		return 0, false, formErr("parameter %s must be a single integer", key)
	}
	v, ok := p.Get(key)
	if !ok {
		return 0, false, nil
	}
	n, err := parseMinor(v)
	if err != nil {
		return 0, false, fmt.Errorf("parameter %s: %w", key, err)
	}
	return n, true, nil
}

// maxMoneyDigits is the longest integer money field accepted.
const maxMoneyDigits = 12

// parseMinor parses ^[0-9]+$ without a leading zero and at most 12 digits.
func parseMinor(s string) (int64, error) {
	if !isDigits(s) {
		return 0, formErr("%q is not a non-negative integer", clipText(s))
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, formErr("%q has a leading zero", s)
	}
	if len(s) > maxMoneyDigits {
		return 0, formErr("%q has more than %d digits", clipText(s), maxMoneyDigits)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, formErr("%q: %v", s, err)
	}
	return n, nil
}

// decimalParam reads a *_decimal money field (up to 12 integer digits and 12
// decimals). integral is false when it has fractional minor units.
func decimalParam(p *Params, key string) (n int64, integral, present bool, err error) {
	if p.IsContainer(key) {
		return 0, false, false, formErr("parameter %s must be a single decimal", key)
	}
	v, ok := p.Get(key)
	if !ok {
		return 0, false, false, nil
	}
	ip, fp, hasDot := strings.Cut(v, ".")
	if hasDot && (fp == "" || !isDigits(fp) || len(fp) > 12) {
		return 0, false, false, formErr("parameter %s: %q is not a decimal", key, clipText(v))
	}
	n, err = parseMinor(ip)
	if err != nil {
		return 0, false, false, fmt.Errorf("parameter %s: %w", key, err)
	}
	return n, strings.Trim(fp, "0") == "", true, nil
}

// currencyParam reads a currency field: three lower-case ASCII letters.
func currencyParam(p *Params, key string) (string, bool, error) {
	if p.IsContainer(key) {
		return "", false, formErr("parameter %s must be a single currency code", key)
	}
	v, ok := p.Get(key)
	if !ok {
		return "", false, nil
	}
	if len(v) != 3 || !isLowerAlpha(v) {
		return "", false, formErr("parameter %s: %q is not a lower-case three-letter currency code", key, clipText(v))
	}
	return v, true, nil
}

func isLowerAlpha(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 'a' || s[i] > 'z' {
			return false
		}
	}
	return true
}

// idParam reads an id that will be put into a lookup path.
func idParam(p *Params, key string) (string, bool, error) {
	if p.IsContainer(key) {
		return "", false, formErr("parameter %s must be a single id", key)
	}
	v, ok := p.Get(key)
	if !ok {
		return "", false, nil
	}
	if !IsID(v) {
		return "", false, formErr("parameter %s: %q is not an id", key, clipText(v))
	}
	return v, true, nil
}

// MulMinor multiplies two non-negative amounts; an overflow is an error wrapping
// ErrMalformed.
func MulMinor(a, b int64) (int64, error) {
	if a != 0 && b > math.MaxInt64/a {
		return 0, formErr("amount %d × %d overflows", a, b)
	}
	return a * b, nil
}

// AddMinor adds two non-negative amounts; an overflow is an error wrapping
// ErrMalformed.
func AddMinor(a, b int64) (int64, error) {
	if b > math.MaxInt64-a {
		return 0, formErr("amount %d + %d overflows", a, b)
	}
	return a + b, nil
}

// settle fills c from what the request and the catalogue know (cases 1, 2, 4, 5 of
// the Classification documentation).
func settle(c *Classification, amount int64, amountOK bool, currency string, lk *Lookup) {
	c.Currency = currency
	switch {
	case amountOK && currency != "":
		c.Amount, c.AmountKnown = amount, true
	case amountOK && lk != nil:
		c.Amount, c.AmountKnown, c.Lookup = amount, true, lk
	case lk != nil:
		c.Lookup = lk
	}
}

// unknownAmount marks a money-moving request whose amount cannot be known.
func unknownAmount(c *Classification) {
	c.Amount, c.AmountKnown, c.NewTotal, c.Lookup, c.Prices = 0, false, false, nil, nil
}

// unknownBecause marks a money-moving request whose amount cannot be known, and
// says why (the refusal repeats it).
func unknownBecause(c *Classification, why string) {
	unknownAmount(c)
	c.Unknown = why
}

// requestAmount: amount and currency from the request (creates).
func requestAmount(field string) moneyFunc {
	return func(r *catRequest, c *Classification) error {
		amt, ok, err := minorParam(r.params, field)
		if err != nil {
			return err
		}
		cur, _, err := currencyParam(r.params, "currency")
		if err != nil {
			return err
		}
		settle(c, amt, ok, cur, nil)
		return nil
	}
}

// optionalAmount: field if given, else the object's lookupField; the currency is
// always the object's (a "currency" parameter, which the legacy charge refund
// accepts, cannot change the currency money moves in).
func optionalAmount(field, prefix, lookupField string) moneyFunc {
	return func(r *catRequest, c *Classification) error {
		amt, ok, err := minorParam(r.params, field)
		if err != nil {
			return err
		}
		settle(c, amt, ok, "", &Lookup{Path: prefix + r.ids[0], Field: lookupField})
		return nil
	}
}

// lookupOnly: the amount is the object's field.
func lookupOnly(prefix, field string) moneyFunc {
	return func(r *catRequest, c *Classification) error {
		c.Lookup = &Lookup{Path: prefix + r.ids[0], Field: field}
		return nil
	}
}

// newTotal: field is the object's new total; the lookup gives the current one.
func newTotal(field, prefix, lookupField string) moneyFunc {
	return func(r *catRequest, c *Classification) error {
		amt, ok, err := minorParam(r.params, field)
		if err != nil {
			return err
		}
		if !ok {
			unknownAmount(c)
			return nil
		}
		cur, _, err := currencyParam(r.params, "currency")
		if err != nil {
			return err
		}
		c.Amount, c.AmountKnown, c.NewTotal, c.Currency = amt, true, true, cur
		c.Lookup = &Lookup{Path: prefix + r.ids[0], Field: lookupField}
		return nil
	}
}

// paymentIntentUpdate: amount raises (or lowers) the total; a currency change
// re-meters the whole amount; otherwise no money.
func paymentIntentUpdate(r *catRequest, c *Classification) error {
	if r.params.Has("amount") {
		return newTotal("amount", "/v1/payment_intents/", "amount")(r, c)
	}
	cur, ok, err := currencyParam(r.params, "currency")
	if err != nil {
		return err
	}
	if !ok {
		c.MovesMoney = false
		return nil
	}
	c.Currency = cur
	c.Lookup = &Lookup{Path: "/v1/payment_intents/" + r.ids[0], Field: "amount"}
	return nil
}

// refundCreate: see the catalogue documentation.
func refundCreate(r *catRequest, c *Classification) error {
	amt, ok, err := minorParam(r.params, "amount")
	if err != nil {
		return err
	}
	cur, _, err := currencyParam(r.params, "currency")
	if err != nil {
		return err
	}
	ch, hasCh, err := idParam(r.params, "charge")
	if err != nil {
		return err
	}
	pi, hasPI, err := idParam(r.params, "payment_intent")
	if err != nil {
		return err
	}
	var lk *Lookup
	switch {
	case hasCh && hasPI:
		unknownAmount(c)
		return nil
	case hasCh:
		lk = &Lookup{Path: "/v1/charges/" + ch, Field: "amount"}
	case hasPI:
		lk = &Lookup{Path: "/v1/payment_intents/" + pi, Field: "amount_received"}
	}
	if lk != nil {
		// A refund moves money in the charge's currency, whatever the request says,
		// and to the charge's customer, whatever customer it names.
		cur, c.Customer = "", ""
	}
	settle(c, amt, ok, cur, lk)
	return nil
}

// pricing is the unit price × quantity of an invoice item or line item.
type pricing struct {
	amount    int64
	known     bool   // amount is exact
	currency  string // from price_data[currency], "" when absent
	unit      int64  // the unit amount, when given
	unitKnown bool   // the unit amount is given and has no fractional minor units
	quantity  int64
	qtyExact  bool // quantity is an exact integer (quantity_decimal may not be)
	qtyGiven  bool // quantity or quantity_decimal is in the request
}

// unitPricing reads one way of pricing under prefix ("" or "line_items[0]"): the
// unit_amount[_decimal] fields given in fields, × quantity. n counts how many ways
// were given (more than one is ambiguous).
func unitPricing(p *Params, prefix string, fields []string) (pr pricing, n int, err error) {
	key := func(k string) string { return nested(prefix, k) }
	pr.quantity = 1
	q, hasQ, err := minorParam(p, key("quantity"))
	if err != nil {
		return pr, 0, err
	}
	qd, qdIntegral, hasQD, err := decimalParam(p, key("quantity_decimal"))
	if err != nil {
		return pr, 0, err
	}
	qtyExact := !(hasQ && hasQD) && (!hasQD || qdIntegral)
	pr.qtyExact, pr.qtyGiven = qtyExact, hasQ || hasQD
	switch {
	case hasQ:
		pr.quantity = q
	case hasQD:
		pr.quantity = qd
	}
	var unit int64
	for _, f := range fields {
		if strings.HasSuffix(strings.TrimSuffix(f, "]"), "_decimal") {
			v, integral, ok, err := decimalParam(p, key(f))
			if err != nil {
				return pr, 0, err
			}
			if ok {
				n++
				unit, pr.known = v, integral
			}
			continue
		}
		v, ok, err := minorParam(p, key(f))
		if err != nil {
			return pr, 0, err
		}
		if ok {
			n++
			unit, pr.known = v, true
		}
	}
	if cur, ok, err := currencyParam(p, key("price_data[currency]")); err != nil {
		return pr, 0, err
	} else if ok {
		pr.currency = cur
	}
	pr.unit, pr.unitKnown = unit, pr.known && n == 1
	pr.known = pr.known && qtyExact
	if pr.known {
		if pr.amount, err = MulMinor(unit, pr.quantity); err != nil {
			return pr, 0, err
		}
	}
	return pr, n, nil
}

// nested is key k under prefix: nested("lines[0]", "price_data[currency]") is
// "lines[0][price_data][currency]"; an empty prefix leaves k as it is.
func nested(prefix, k string) string {
	if prefix == "" {
		return k
	}
	name, rest, _ := strings.Cut(k, "[")
	if rest != "" {
		rest = "[" + rest
	}
	return prefix + "[" + name + "]" + rest
}

// checkoutSessionCreate: see the catalogue documentation.
func checkoutSessionCreate(r *catRequest, c *Classification) error {
	p := r.params
	mode, hasMode := p.Get("mode")
	if p.IsContainer("mode") {
		return formErr("parameter mode must be a single value")
	}
	if hasMode && mode == "setup" && !p.Has("line_items") {
		c.MovesMoney = false
		return nil
	}
	// subscription_data[items] starts a subscription in API versions that had no
	// mode: renewals are never seen.
	known := (!hasMode || mode == "payment") && p.Has("line_items") &&
		!p.Has("optional_items") && !addsTax(p) && !p.Has("subscription_data")
	lines, err := requestLines(p, "line_items")
	if err != nil {
		return err
	}
	if isTrue(p, "after_expiration[recovery][enabled]") {
		unknownBecause(c, "once it expires, its recovery URL creates a copy of it that the customer can pay, which keybrake never sees")
		return nil
	}
	known = known && lines.known
	cur := lines.currency
	total := lines.amount
	var shipping int64
	for _, k := range p.Keys("shipping_options") {
		so := "shipping_options[" + k + "][shipping_rate_data][fixed_amount]"
		amt, ok, err := minorParam(p, so+"[amount]")
		if err != nil {
			return err
		}
		scur, _, err := currencyParam(p, so+"[currency]")
		if err != nil {
			return err
		}
		if scur != "" {
			if cur != "" && cur != scur {
				return formErr("shipping currency %q differs from %q", scur, cur)
			}
			cur = scur
		}
		if !ok || p.Has("shipping_options["+k+"][shipping_rate]") {
			known = false
			continue
		}
		shipping = max(shipping, amt)
	}
	if p.Has("shipping_options") && p.Keys("shipping_options") == nil {
		known = false
	}
	if total, err = AddMinor(total, shipping); err != nil {
		return err
	}
	c.Currency = cur
	if lines.recurring || mode == "subscription" || p.Has("subscription_data") {
		unknownBecause(c, recurringLineWhy)
		return nil
	}
	if !known || (cur == "" && len(lines.prices) == 0) {
		unknownAmount(c)
		return nil
	}
	// Without a mode, a recurring stored price could make it a subscription
	// (in payment mode Stripe refuses one).
	for i := range lines.prices {
		lines.prices[i].OneTime = !hasMode
	}
	c.Amount, c.AmountKnown, c.Prices = total, true, lines.prices
	return nil
}

// requestLines reads the request's "currency" and the line items under each of
// names (see readLines), and adds them up.
func requestLines(p *Params, names ...string) (lineTotal, error) {
	cur, _, err := currencyParam(p, "currency")
	if err != nil {
		return lineTotal{}, err
	}
	all := lineTotal{currency: cur, known: true}
	for _, name := range names {
		lt, err := readLines(p, name, all.currency)
		if err != nil {
			return all, err
		}
		if all.amount, err = AddMinor(all.amount, lt.amount); err != nil {
			return all, err
		}
		all.prices = append(all.prices, lt.prices...)
		all.currency, all.known = lt.currency, all.known && lt.known
		all.recurring = all.recurring || lt.recurring
	}
	return all, nil
}

// lineTotal is what a list of line items adds up to.
type lineTotal struct {
	amount   int64      // the lines priced by price_data
	prices   []PriceRef // the lines priced by a stored price
	currency string     // the currency stated so far
	known    bool       // every line could be priced
	// recurring: a line's inline price recurs (price_data[recurring]); on a
	// Payment Link or a Checkout Session it starts a subscription.
	recurring bool
}

// readLines reads the line items under name ("line_items", "items",
// "add_invoice_items"), each priced by price_data[unit_amount] (or an integral
// price_data[unit_amount_decimal]) × quantity, or by a stored price × quantity
// (quantity 1 when absent). A line priced another way or by more than one way
// (line_items[i][amount], the ad-hoc price of API versions before 2022-08-01, is
// not guessed against price_data; a legacy plan is not looked up), with an
// adjustable quantity, with tax rates or with a fractional quantity leaves the
// total unknown. cur is the currency stated so far; line currencies that differ
// from it are malformed.
func readLines(p *Params, name, cur string) (lineTotal, error) {
	lt := lineTotal{currency: cur, known: true}
	keys := p.Keys(name)
	if p.Has(name) && keys == nil {
		return lt, formErr("parameter %s must be indexed (%s[0][…])", name, name)
	}
	for _, k := range keys {
		if !isDigits(k) {
			return lt, formErr("parameter %s[%s] is not indexed by a number", name, clipText(k))
		}
		li := name + "[" + k + "]"
		pr, n, err := unitPricing(p, li, []string{"price_data[unit_amount]", "price_data[unit_amount_decimal]"})
		if err != nil {
			return lt, err
		}
		if pr.currency != "" {
			if lt.currency != "" && lt.currency != pr.currency {
				return lt, formErr("line item currencies differ (%q, %q)", lt.currency, pr.currency)
			}
			lt.currency = pr.currency
		}
		price, hasPrice, err := idParam(p, li+"[price]")
		if err != nil {
			return lt, err
		}
		lt.recurring = lt.recurring || p.Has(li+"[price_data][recurring]")
		switch {
		case n+boolInt(hasPrice) != 1 || p.Has(li+"[amount]") || p.Has(li+"[plan]") ||
			isTrue(p, li+"[adjustable_quantity][enabled]") ||
			hasValue(p, li+"[tax_rates]") || hasValue(p, li+"[dynamic_tax_rates]"):
			lt.known = false
		case hasPrice && pr.qtyExact:
			lt.prices = append(lt.prices, PriceRef{ID: price, Quantity: pr.quantity})
		case hasPrice || !pr.known:
			lt.known = false
		default:
			if lt.amount, err = AddMinor(lt.amount, pr.amount); err != nil {
				return lt, err
			}
		}
	}
	return lt, nil
}

// priceUpdate: a price's amounts in other currencies (currency_options) are what
// Payment Links, Checkout Sessions and subscriptions that use it charge a
// customer paying in one of them — including links keybrake metered before the
// change: refused; other changes (metadata, active, a lookup key) move no money.
func priceUpdate(r *catRequest, c *Classification) error {
	if r.params.Has("currency_options") {
		unknownBecause(c, "a price's amounts in other currencies change what the Payment Links and Checkout Sessions "+
			"that use it collect, including those already counted")
		return nil
	}
	c.MovesMoney = false
	return nil
}

// checkoutSessionUpdate: changing line items changes the amount in ways keybrake
// does not compute; other updates move no money.
func checkoutSessionUpdate(r *catRequest, c *Classification) error {
	if r.params.Has("line_items") || r.params.Has("shipping_options") {
		unknownBecause(c, "changing a session's line items or shipping options changes what it collects, by an amount keybrake "+
			"does not compute; expire the session and create a new one, which keybrake meters")
		return nil
	}
	c.MovesMoney = false
	return nil
}

// addsTax reports whether a Checkout Session or a Payment Link has Stripe add
// tax keybrake cannot bound: automatic tax, or Managed Payments (Stripe as
// merchant of record, which handles the tax itself).
func addsTax(p *Params) bool {
	return isTrue(p, "automatic_tax[enabled]") || isTrue(p, "managed_payments[enabled]")
}

func isTrue(p *Params, key string) bool {
	v, _ := p.Get(key)
	return v == "true"
}

// Operations returns the names of the catalogue's POST operations, sorted, each
// once: what a policy's operation list can name besides "<resource>.read" and
// "<resource>.delete".
func Operations() []string {
	seen := map[string]bool{}
	var ops []string
	for _, rt := range catalogue {
		if !seen[rt.op] {
			seen[rt.op] = true
			ops = append(ops, rt.op)
		}
	}
	slices.Sort(ops)
	return ops
}

// Route describes one POST entry of the catalogue, for documentation and tests.
type Route struct {
	Method    string
	Path      string // pattern, "{id}" for an id segment
	Operation string
	// MovesMoney is true when the entry can move money (a given request may still
	// classify as moving none, e.g. a PaymentIntent update without amount).
	MovesMoney bool
	Direction  Direction
	// Unmetered says why a write that moves no money may take parameters named
	// like money (a coupon's amount_off, a price's unit_amount).
	Unmetered string
}

// Routes returns the catalogue's POST entries in table order.
func Routes() []Route {
	out := make([]Route, 0, len(catalogue))
	for _, rt := range catalogue {
		out = append(out, Route{
			Method:     rt.method,
			Path:       "/" + strings.Join(rt.segs, "/"),
			Operation:  rt.op,
			MovesMoney: rt.money != nil,
			Direction:  rt.dir,
			Unmetered:  rt.why,
		})
	}
	return out
}
