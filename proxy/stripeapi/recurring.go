package stripeapi

import (
	"fmt"
	"strings"
)

// Money that moves later, in the catalogue: subscriptions, subscription
// schedules, Payment Links and customer balances. Each move money at once or
// later without another request keybrake could see, so each is metered for what
// it can be bounded by, counted in full when it is made, or refused with a reason
// (amount_unknown). Renewals after the first period are never seen (the limits in
// docs/metering.md say so).

// subscriptionCreate meters one period of a new subscription: its items (a stored
// price or price_data × quantity) and its add_invoice_items, counted in full when
// it is created, whether Stripe charges it at once, at the end of a trial, or by
// an invoice the customer pays later (a prorated or trialing first invoice is
// less, never more). Refused: tax (automatic or rates), a backdated start (it
// bills past periods), a billing cycle anchor (a prorated first period, then a
// full one at the anchor: two periods where one is counted), billing schedules
// (billed in advance for a duration), an interval that invoices pending items,
// and items keybrake cannot price (tiered or metered prices, legacy plans).
// Stripe draws the customer's pending invoice items into the first invoice,
// under every API version and with no parameter to leave them out: the proxy
// refuses the request when the customer has any (NoPendingItems).
func subscriptionCreate(r *catRequest, c *Classification) error {
	p := r.params
	lines, err := requestLines(p, "items", "add_invoice_items")
	if err != nil {
		return err
	}
	c.Currency = lines.currency
	switch {
	case isTrue(p, "automatic_tax[enabled]") || hasValue(p, "default_tax_rates"):
		unknownBecause(c, "automatic tax and tax rates make Stripe collect more, by an amount keybrake cannot bound")
	case p.Has("backdate_start_date"):
		unknownBecause(c, "a backdated subscription bills the periods since its start at once")
	case p.Has("billing_cycle_anchor") || p.Has("billing_cycle_anchor_config"):
		unknownBecause(c, "a billing cycle anchor bills a prorated first period and then a full one at the anchor; "+
			"create it with trial_end at the anchor instead (one period, counted in full)")
	case p.Has("billing_schedules"):
		unknownBecause(c, billingSchedulesWhy)
	case p.Has("pending_invoice_item_interval"):
		unknownBecause(c, pendingIntervalWhy)
	case !p.Has("items") || !lines.known:
		unknownBecause(c, "every item needs a per-unit price (a stored price or price_data) and a whole quantity, and no tax rates")
	default:
		c.Amount, c.AmountKnown, c.Prices = lines.amount, true, lines.prices
		c.NoPendingItems = true
	}
	return nil
}

// subscriptionChange: subscriptions.update, subscriptions.resume and
// subscription_items.create/.update move money at once when they invoice
// immediately (proration_behavior=always_invoice, billing_cycle_anchor=now, or
// anything but unchanged, trial_end=now): the prorations depend on the billing period's position, which
// keybrake does not compute, so those forms are refused. A trial end at any
// other moment (trial_end, trial_from_plan) moves the billing cycle anchor
// there, and Stripe invoices a full period at the items as they are then, at a
// moment the caller picks: refused, like billing schedules and an interval that
// invoices pending items. add_invoice_items are one-time items on the next
// invoice: metered like a new subscription's. Other changes take effect at the
// next renewal, on the subscription's own schedule, which keybrake never sees.
func subscriptionChange(r *catRequest, c *Classification) error {
	p := r.params
	switch v, _ := p.Get("proration_behavior"); {
	case v == "always_invoice" || (p.Has("billing_cycle_anchor") && !isValue(p, "billing_cycle_anchor", "unchanged")) ||
		isValue(p, "trial_end", "now"):
		unknownBecause(c, "it invoices prorations at once, and keybrake does not compute prorations; change it with proration_behavior=create_prorations or none")
		return nil
	case p.Has("trial_end") || p.Has("trial_from_plan"):
		unknownBecause(c, "a new trial end moves the billing cycle anchor to it, and Stripe then invoices a full period at the "+
			"subscription's items as they are at that moment; set a trial when the subscription is created "+
			"(subscriptions.create with trial_end, which keybrake counts as one full period)")
		return nil
	case p.Has("billing_schedules"):
		unknownBecause(c, billingSchedulesWhy)
		return nil
	case p.Has("pending_invoice_item_interval"):
		unknownBecause(c, pendingIntervalWhy)
		return nil
	}
	if !p.Has("add_invoice_items") {
		c.MovesMoney = false
		return nil
	}
	extra, err := requestLines(p, "add_invoice_items")
	if err != nil {
		return err
	}
	c.Currency = extra.currency
	if !extra.known {
		unknownBecause(c, "every invoice item needs a per-unit price and a whole quantity, and no tax rates")
		return nil
	}
	c.Amount, c.AmountKnown, c.Prices = extra.amount, true, extra.prices
	if c.Currency == "" && len(c.Prices) == 0 {
		unknownAmount(c)
	}
	return nil
}

// billingSchedulesWhy and pendingIntervalWhy are why those subscription
// settings cannot be metered.
const (
	billingSchedulesWhy = "a billing schedule bills the subscription in advance for a duration, by an amount keybrake does not compute; " +
		"leave billing_schedules out (each period is billed on the subscription's own schedule)"
	pendingIntervalWhy = "pending_invoice_item_interval invoices the customer's pending items, Stripe's prorations included, " +
		"on a schedule of its own; leave it out (pending items then wait for the subscription's next invoice)"
)

// newPriceWhy is why a new price on an existing subscription cannot be metered.
const newPriceWhy = "a new price on an existing subscription starts a new billing period and charges it at once when " +
	"its billing interval differs (or the old price was free), by an amount keybrake cannot bound before Stripe answers; " +
	"start a new subscription with the new price instead (subscriptions.create, metered at its first period)"

// subscriptionUpdate: subscriptions.update is a subscriptionChange, and an
// item moved to a new price (items[i][price], [price_data], the legacy [plan])
// is refused: whether Stripe starts and charges a new billing period at once
// depends on the prices' intervals, which the request does not show.
func subscriptionUpdate(r *catRequest, c *Classification) error {
	for _, k := range r.params.Keys("items") {
		if hasNewPrice(r.params, "items["+k+"]") {
			unknownBecause(c, newPriceWhy)
			return nil
		}
	}
	return subscriptionChange(r, c)
}

// subscriptionItemUpdate: subscription_items.update, refused like
// subscriptionUpdate when it moves the item to a new price.
func subscriptionItemUpdate(r *catRequest, c *Classification) error {
	if hasNewPrice(r.params, "") {
		unknownBecause(c, newPriceWhy)
		return nil
	}
	return subscriptionChange(r, c)
}

// subscriptionItemCreate: a new item on an existing subscription is a new price
// on it (see newPriceWhy): refused.
func subscriptionItemCreate(_ *catRequest, c *Classification) error {
	unknownBecause(c, newPriceWhy)
	return nil
}

// hasNewPrice reports whether the item under prefix ("" or "items[0]") names a
// price.
func hasNewPrice(p *Params, prefix string) bool {
	for _, f := range []string{"price", "price_data", "plan"} {
		if hasValue(p, nested(prefix, f)) {
			return true
		}
	}
	return false
}

// subscriptionResume: subscriptions.resume defaults to billing_cycle_anchor=now,
// which starts a new billing period and charges it at once; only a resume on the
// old cycle (billing_cycle_anchor=unchanged), whose prorations wait for the next
// renewal, is a subscriptionChange.
func subscriptionResume(r *catRequest, c *Classification) error {
	if !isValue(r.params, "billing_cycle_anchor", "unchanged") {
		unknownBecause(c, "resuming starts a new billing period and charges it at once (billing_cycle_anchor defaults to now); "+
			"resume with billing_cycle_anchor=unchanged")
		return nil
	}
	return subscriptionChange(r, c)
}

// scheduleCancel: cancelling a subscription schedule generates, by default
// (invoice_now), a final invoice of the subscription's pending prorations and
// usage, which Stripe charges by itself: refused unless invoice_now=false.
func scheduleCancel(r *catRequest, c *Classification) error {
	if !isValue(r.params, "invoice_now", "false") {
		unknownBecause(c, "cancelling a subscription schedule invoices its pending prorations and usage at once "+
			"(invoice_now defaults to true); cancel with invoice_now=false")
		return nil
	}
	c.MovesMoney = false
	return nil
}

// scheduleWrite: a subscription schedule bills its phases on dates keybrake never
// sees, starting at once when a phase starts now: refused when it sets phases,
// or the default settings every phase bills with; other changes (metadata, end
// behavior) move no money.
func scheduleWrite(r *catRequest, c *Classification) error {
	if r.params.Has("phases") || r.params.Has("from_subscription") || r.params.Has("start_date") || r.params.Has("default_settings") {
		unknownBecause(c, "a subscription schedule bills its phases on dates keybrake never sees; "+
			"create each subscription it would start with subscriptions.create, which keybrake meters")
		return nil
	}
	c.MovesMoney = false
	return nil
}

// paymentLinkCreate meters a Payment Link that can be paid a bounded number of
// times (restrictions[completed_sessions][limit]): its line items (a stored price
// or price_data × quantity) times that limit, counted in full when it is created,
// whether or not it is ever paid. Without a limit it can be paid any number of
// times, by anyone with the link, without a request keybrake could see: refused.
// Refused too: adjustable quantities, tax, recurring prices (stored ones, read
// at Stripe; inline price_data[recurring]; subscription_data), shipping options,
// and optional items (each customer may add them).
func paymentLinkCreate(r *catRequest, c *Classification) error {
	p := r.params
	limit, hasLimit, err := minorParam(p, "restrictions[completed_sessions][limit]")
	if err != nil {
		return err
	}
	lines, err := requestLines(p, "line_items")
	if err != nil {
		return err
	}
	c.Currency = lines.currency
	switch {
	case !hasLimit || limit == 0:
		unknownBecause(c, "a Payment Link can be paid any number of times; set restrictions[completed_sessions][limit] to bound it")
		return nil
	case lines.recurring:
		unknownBecause(c, recurringLineWhy)
		return nil
	case p.Has("subscription_data"):
		unknownBecause(c, recurringLineWhy)
		return nil
	case addsTax(p) || p.Has("shipping_options") || p.Has("optional_items"):
		unknownBecause(c, linkExtrasWhy)
		return nil
	case !p.Has("line_items") || !lines.known:
		unknownBecause(c, "every line item needs a per-unit price (a stored price or price_data), a fixed whole quantity, and no tax rates")
		return nil
	}
	if c.Amount, err = MulMinor(lines.amount, limit); err != nil {
		return err
	}
	for _, pr := range lines.prices {
		q, err := MulMinor(pr.Quantity, limit)
		if err != nil {
			return err
		}
		c.Prices = append(c.Prices, PriceRef{ID: pr.ID, Quantity: q, OneTime: true})
	}
	c.AmountKnown = true
	return nil
}

// recurringLineWhy is why a Payment Link or a Checkout Session with an inline
// recurring price cannot be metered.
const recurringLineWhy = "a recurring price (price_data[recurring]) starts a subscription for each customer who pays, " +
	"whose renewals keybrake never sees; sell one-time prices, or create each subscription with subscriptions.create, which keybrake meters"

// linkExtrasWhy is why a Payment Link with more than fixed line items cannot be
// metered.
const linkExtrasWhy = "tax, shipping options, optional items (which each customer may add) and subscriptions " +
	"make a Payment Link collect more than its line items"

// paymentLinkUpdate: changing what a Payment Link sells (its line items,
// optional items, shipping options, tax, a subscription) or how often it can be
// paid changes what it can collect: refused. So is reactivating it
// (active=true): a link Stripe deactivated once its completed-sessions limit
// was reached, or that was deactivated by hand (keybrake then releases what it
// still counted), could be paid again. Deactivating it, or changing its texts,
// moves no money.
func paymentLinkUpdate(r *catRequest, c *Classification) error {
	p := r.params
	if isTrue(p, "active") {
		unknownBecause(c, "reactivating a Payment Link lets customers pay it again, beyond what keybrake counted for it; "+
			"create a new Payment Link instead")
		return nil
	}
	if p.Has("subscription_data") {
		unknownBecause(c, recurringLineWhy)
		return nil
	}
	if p.Has("line_items") || p.Has("restrictions") || p.Has("automatic_tax") ||
		p.Has("optional_items") || p.Has("shipping_options") {
		unknownBecause(c, "changing what a Payment Link sells, what a customer may add to it, or how often it can be paid, "+
			"changes what it collects; "+linkExtrasWhy)
		return nil
	}
	c.MovesMoney = false
	return nil
}

// customerBalance: a positive customer balance is added to the customer's next
// invoice (a negative one is a credit, which moves no money). customers.update
// with balance sets the new balance: the rise over the current one (a credit
// counts as 0) is counted in full when it is made, in the customer's currency.
// customers.create cannot know that currency (a new customer has none until its
// first invoice): a positive balance there is refused. A plan (or trial_end)
// on either is refused: see legacyCustomerPlanWhy.
func customerBalance(create bool) moneyFunc {
	return func(r *catRequest, c *Classification) error {
		if r.params.Has("plan") || r.params.Has("trial_end") {
			unknownBecause(c, legacyCustomerPlanWhy)
			return nil
		}
		n, ok, err := signedMinorParam(r.params, "balance")
		switch {
		case err != nil:
			return err
		case !ok || n <= 0:
			c.MovesMoney = false
		case create:
			unknownBecause(c, "a new customer's balance is in the currency of its first invoice, which keybrake cannot know")
		default:
			c.Amount, c.AmountKnown, c.NewTotal = n, true, true
			c.Lookup = &Lookup{Path: "/v1/customers/" + r.ids[0], Field: "balance", Signed: true}
		}
		return nil
	}
}

// legacyCustomerPlanWhy is why customers.create and .update with a plan are
// refused: under API versions before 2018-02-05 (and the account's default
// version, when the request has no Stripe-Version) a customer's plan
// (with its quantity and trial_end) starts or changes a subscription.
const legacyCustomerPlanWhy = "under older API versions a customer's plan starts a subscription; " +
	"create it with subscriptions.create, which keybrake meters"

// balanceTransaction: a customer balance transaction with a positive amount is
// added to the customer's next invoice (in the request's currency), counted in
// full; a negative one is a credit, which moves no money.
func balanceTransaction(r *catRequest, c *Classification) error {
	n, ok, err := signedMinorParam(r.params, "amount")
	if err != nil {
		return err
	}
	if !ok || n <= 0 {
		c.MovesMoney = false
		return nil
	}
	cur, _, err := currencyParam(r.params, "currency")
	if err != nil {
		return err
	}
	settle(c, n, true, cur, nil)
	if cur == "" {
		unknownAmount(c)
	}
	return nil
}

// signedMinorParam reads an integer money field that may be negative (a credit).
func signedMinorParam(p *Params, key string) (int64, bool, error) {
	if v, ok := p.Get(key); ok && strings.HasPrefix(v, "-") {
		n, err := parseMinor(v[1:])
		if err != nil {
			return 0, false, fmt.Errorf("parameter %s: %w", key, err)
		}
		return -n, true, nil
	}
	return minorParam(p, key)
}

// isValue reports whether key is the single value want.
func isValue(p *Params, key, want string) bool {
	v, ok := p.Get(key)
	return ok && v == want
}
