package stripeapi

import (
	"slices"
	"strings"
)

// Money that a request makes Stripe move later or again: what the catalogue does
// with each time- or recurrence-shaped parameter (a recurring price, a trial
// end, a billing cycle anchor, a cancel or pause date, a backdate, an interval
// that invoices pending items, a schedule's phases) of every operation it
// forwards. The tests read Stripe's OpenAPI description and require a rule for
// every such parameter of every v1 POST operation keybrake forwards, and check
// each rule with a Sample against Classify.

// LaterClass is what keybrake does with a parameter that can make Stripe move
// money later or again.
type LaterClass string

// Later classes.
const (
	// LaterRefused: a request that carries the parameter (in the forms Why
	// names) is refused with amount_unknown, with a message that says how to do
	// the same in a way keybrake can meter.
	LaterRefused LaterClass = "refused"
	// LaterMetered: the request is metered with the bound the parameter
	// implies (Why says which).
	LaterMetered LaterClass = "metered"
	// LaterReason: the parameter moves no money later that keybrake does not
	// count; Why says why, for a reviewer to check.
	LaterReason LaterClass = "reason"
)

// LaterRule is what keybrake does with the parameters Param matches of the
// operations Ops (every operation when Ops is empty).
type LaterRule struct {
	Ops []string
	// Param is a parameter as Stripe's description nests it (dots, "[]" for an
	// array: "items[].price_data.recurring"); a trailing "*" matches every
	// parameter that starts with what precedes it.
	Param string
	Class LaterClass
	Why   string
	// Sample, for a refused or metered rule, is a form body (key=value&…) with
	// the parameter, which set over a request the operation meters makes
	// Classify refuse it (LaterRefused) or still meter it (LaterMetered).
	Sample string
}

// Matches reports whether the rule covers the parameter param of operation op.
func (r LaterRule) Matches(op, param string) bool {
	if len(r.Ops) > 0 && !slices.Contains(r.Ops, op) {
		return false
	}
	if prefix, ok := strings.CutSuffix(r.Param, "*"); ok {
		return strings.HasPrefix(param, prefix)
	}
	return param == r.Param
}

// The reasons several rules share.
const (
	paymentOptionsWhy = "when and how a payment method collects this payment (a debit date, a voucher's expiry, installments, " +
		"a mandate's dates and interval, a recurring plan told to the payment method): not how much; each later payment under a " +
		"mandate is a request of its own, metered when it is made"
	cancelWhy    = "a cancellation ends the renewals; a cancel date inside a period prorates a credit, which lowers what Stripe collects"
	trialEndsWhy = "what Stripe does when a trial ends without a payment method: cancel, pause, or invoice the period " +
		"the subscription was counted for when it was created"
	prorationDateWhy = "the moment prorations are computed from: they wait for the next renewal, on the subscription's own " +
		"schedule (always_invoice, which invoices them at once, is refused)"
	catalogueRecurrenceWhy = "a price's or plan's recurrence is what the subscriptions, links and sessions that use it bill: " +
		"each of those is metered or refused when it is made"
)

// laterRules is the table; the first rule that matches decides.
var laterRules = []LaterRule{
	// Subscriptions.
	{Ops: []string{"subscriptions.create"}, Param: "backdate_start_date", Class: LaterRefused,
		Why: "it bills the periods since the backdated start at once", Sample: "backdate_start_date=1700000000"},
	{Ops: []string{"subscriptions.create"}, Param: "billing_cycle_anchor", Class: LaterRefused,
		Why:    "a prorated first period, then a full one at the anchor: two periods where one is counted; trial_end at the anchor is metered",
		Sample: "billing_cycle_anchor=1900000000"},
	{Ops: []string{"subscriptions.create"}, Param: "billing_cycle_anchor_config*", Class: LaterRefused,
		Why: "as billing_cycle_anchor", Sample: "billing_cycle_anchor_config[day_of_month]=1"},
	{Ops: []string{"subscriptions.create", "subscriptions.update"}, Param: "billing_schedules*", Class: LaterRefused,
		Why: "it bills the subscription in advance for a duration", Sample: "billing_schedules[0][bill_until][duration][interval]=month"},
	{Ops: []string{"subscriptions.create", "subscriptions.update"}, Param: "pending_invoice_item_interval*", Class: LaterRefused,
		Why:    "it invoices pending items, Stripe's prorations included, on a schedule of its own",
		Sample: "pending_invoice_item_interval[interval]=day"},
	{Ops: []string{"subscriptions.create"}, Param: "trial_end", Class: LaterMetered,
		Why:    "one period of the items, counted in full when the subscription is created, though Stripe charges it when the trial ends",
		Sample: "trial_end=1900000000"},
	{Ops: []string{"subscriptions.create"}, Param: "trial_period_days", Class: LaterMetered, Why: "as trial_end", Sample: "trial_period_days=7"},
	{Ops: []string{"subscriptions.create"}, Param: "trial_from_plan", Class: LaterMetered, Why: "as trial_end", Sample: "trial_from_plan=true"},
	{Ops: []string{"subscriptions.create"}, Param: "items[].price_data.recurring*", Class: LaterMetered,
		Why: "the item's own recurring price: its first period is counted in full; its renewals, on the subscription's schedule, are a documented limit"},
	{Ops: []string{"subscriptions.create"}, Param: "proration_behavior", Class: LaterReason,
		Why: "on a new subscription prorations only lower the first invoice (a billing cycle anchor, which makes them, is refused)"},
	{Ops: []string{"subscriptions.update", "subscriptions.resume"}, Param: "billing_cycle_anchor", Class: LaterRefused,
		Why:    "now starts and invoices a new period at once (the default of a resume); unchanged keeps the subscription's schedule",
		Sample: "billing_cycle_anchor=now"},
	{Ops: []string{"subscriptions.update"}, Param: "trial_end", Class: LaterRefused,
		Why:    "the billing cycle anchor moves to the trial end, where Stripe invoices a full period at the items as they are then",
		Sample: "trial_end=1900000000"},
	{Ops: []string{"subscriptions.update"}, Param: "trial_from_plan", Class: LaterRefused, Why: "as trial_end", Sample: "trial_from_plan=true"},
	{Ops: []string{"subscriptions.update"}, Param: "items[].price_data.recurring*", Class: LaterRefused,
		Why: "a new price can start and charge a new period at once", Sample: "items[0][id]=si_1&items[0][price_data][recurring][interval]=month"},
	{Ops: []string{"subscriptions.update", "subscriptions.resume", "subscription_items.update"}, Param: "proration_behavior", Class: LaterRefused,
		Why:    "always_invoice invoices prorations at once; create_prorations and none leave them to the next renewal",
		Sample: "proration_behavior=always_invoice"},
	{Ops: []string{"subscriptions.update", "subscriptions.resume", "subscription_items.update"}, Param: "proration_date",
		Class: LaterReason, Why: prorationDateWhy},
	{Ops: []string{"subscriptions.create", "subscriptions.update"}, Param: "trial_settings*", Class: LaterReason, Why: trialEndsWhy},
	{Ops: []string{"subscriptions.create", "subscriptions.update"}, Param: "cancel_at*", Class: LaterReason, Why: cancelWhy},
	{Ops: []string{"subscriptions.update"}, Param: "pause_collection*", Class: LaterReason,
		Why: "while paused, Stripe voids, writes off or keeps as drafts (without automatic collection) the invoices it makes; " +
			"collecting a kept draft takes invoices.finalize or invoices.pay, which keybrake meters; resuming returns to the subscription's own schedule"},
	{Ops: []string{"subscription_items.create"}, Param: "*", Class: LaterRefused,
		Why: "a new item on a subscription is refused whatever it says", Sample: "proration_behavior=none"},
	{Ops: []string{"subscription_items.update"}, Param: "price_data.recurring*", Class: LaterRefused,
		Why: "a new price can start and charge a new period at once", Sample: "price_data[recurring][interval]=month"},

	// Subscription schedules.
	{Ops: []string{"subscription_schedules.create", "subscription_schedules.update"}, Param: "phases*", Class: LaterRefused,
		Why: "a schedule bills its phases on dates keybrake never sees", Sample: "phases[0][items][0][price]=price_1"},
	{Ops: []string{"subscription_schedules.create"}, Param: "start_date", Class: LaterRefused,
		Why: "as phases", Sample: "start_date=now"},
	{Ops: []string{"subscription_schedules.create", "subscription_schedules.update"}, Param: "default_settings*", Class: LaterRefused,
		Why: "every phase bills with the default settings", Sample: "default_settings[billing_cycle_anchor]=phase_start"},
	{Ops: []string{"subscription_schedules.create", "subscription_schedules.update"}, Param: "end_behavior", Class: LaterReason,
		Why: "whether the subscription is released (renewing on its own schedule) or cancelled when the last phase ends"},
	{Ops: []string{"subscription_schedules.update"}, Param: "proration_behavior", Class: LaterReason,
		Why: "how a change of phases is prorated; a change of phases is refused"},
	{Ops: []string{"subscription_schedules.release"}, Param: "preserve_cancel_date", Class: LaterReason,
		Why: "it keeps the subscription's cancel date: fewer renewals, not more"},

	// Checkout and Payment Links: each payer of a recurring line subscribes.
	{Ops: []string{"checkout.sessions.create", "checkout.sessions.update", "payment_links.create"}, Param: "line_items[].price_data.recurring*",
		Class: LaterRefused, Why: "each customer who pays starts a subscription whose renewals keybrake never sees",
		Sample: "line_items[0][price_data][recurring][interval]=month"},
	{Ops: []string{"checkout.sessions.create", "payment_links.create", "payment_links.update"}, Param: "subscription_data*", Class: LaterRefused,
		Why: "as a recurring line", Sample: "subscription_data[trial_period_days]=7"},
	{Ops: []string{"checkout.sessions.create"}, Param: "expires_at", Class: LaterReason,
		Why: "when an unpaid session stops being payable: its amount is held until Stripe reports it paid or expired"},

	// Invoices.
	{Ops: []string{"invoices.update"}, Param: "automatically_finalizes_at", Class: LaterMetered,
		Why:    "it hands the invoice to Stripe's collection: its amount_remaining is held on it, like invoices.finalize",
		Sample: "automatically_finalizes_at=1900000000"},
	{Ops: []string{"invoices.create"}, Param: "automatically_finalizes_at", Class: LaterReason,
		Why: "a new invoice collects only the lines added to it, each metered when it is added"},
	{Ops: []string{"invoices.create", "invoices.update"}, Param: "due_date", Class: LaterReason,
		Why: "when a send_invoice invoice is due: the customer pays what its lines add up to, each metered when added"},
	{Ops: []string{"invoices.create", "invoices.update"}, Param: "effective_at", Class: LaterReason,
		Why: "the date the invoice shows as in effect; it charges nothing"},
	{Ops: []string{"invoices.create_preview"}, Param: "*", Class: LaterReason, Why: "a preview creates nothing and charges nothing"},

	// Catalogue, coupons, Connect, disputes, payment methods.
	{Ops: []string{"prices.create", "plans.create", "plans.update", "products.create"}, Param: "*", Class: LaterReason, Why: catalogueRecurrenceWhy},
	{Ops: []string{"coupons.create"}, Param: "duration*", Class: LaterReason, Why: "how long a coupon lowers a customer's invoices"},
	{Ops: []string{"accounts.create", "accounts.update"}, Param: "settings.payouts.schedule*", Class: LaterReason,
		Why: "when Stripe pays out the connected account's own balance: none of the platform's money"},
	{Ops: []string{"accounts.create", "accounts.update"}, Param: "company.registration_date", Class: LaterReason,
		Why: "a fact about the connected account's business"},
	{Ops: []string{"disputes.update"}, Param: "evidence.*", Class: LaterReason, Why: "dates in dispute evidence; nothing is charged"},
	{Ops: []string{"payment_methods.create"}, Param: "*", Class: LaterReason, Why: paymentOptionsWhy},

	// Every operation.
	{Param: "payment_method_options.*", Class: LaterReason, Why: paymentOptionsWhy},
	{Param: "payment_method_data.*", Class: LaterReason, Why: paymentOptionsWhy},
	{Param: "payment_settings.*", Class: LaterReason, Why: paymentOptionsWhy},
	{Param: "mandate_data.*", Class: LaterReason, Why: "when the customer accepted a mandate; it charges nothing"},
	{Param: "billing_mode.flexible.proration_discounts", Class: LaterReason,
		Why: "how discounts are itemized on prorations; discounts only lower what is collected"},
}

// LaterRules returns the rules, in the order they are tried.
func LaterRules() []LaterRule { return slices.Clone(laterRules) }

// LaterRuleFor is the rule that decides the parameter param of operation op,
// and whether there is one.
func LaterRuleFor(op, param string) (LaterRule, bool) {
	for _, r := range laterRules {
		if r.Matches(op, param) {
			return r, true
		}
	}
	return LaterRule{}, false
}
