package fakestripe

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
)

// Billing that moves money later, in the fake Stripe: subscriptions (the first
// period is charged at once), customer balances (added to the next invoice) and
// Payment Links (paid later by customers). Each counts in TotalMoved for what it
// will move without another API request.

// AddRecurringPrice creates a per-unit monthly price of unitAmount in currency and
// returns its id.
func (f *FakeStripe) AddRecurringPrice(unitAmount int64, currency string) string {
	return f.addPrice(unitAmount, currency, map[string]any{"interval": "month", "interval_count": 1, "usage_type": "licensed"})
}

// AddRecurringPriceEvery creates a per-unit price of unitAmount in currency that
// recurs every interval ("day", "week", "month", "year") and returns its id.
func (f *FakeStripe) AddRecurringPriceEvery(unitAmount int64, currency, interval string) string {
	return f.addPrice(unitAmount, currency, map[string]any{"interval": interval, "interval_count": 1, "usage_type": "licensed"})
}

// Subscription is a subscription the fake keeps: its items, and whether its
// collection is paused.
type Subscription struct {
	ID       string
	Customer string
	Currency string
	Status   string // active, paused
	Items    []SubscriptionItem
	// Destination is the connected account its invoices' payments go to
	// (transfer_data[destination]), "" for none.
	Destination string
}

// SubscriptionItem is one price × quantity of a subscription.
type SubscriptionItem struct {
	ID       string
	Price    string
	Quantity int64
}

// AddSubscription creates, as if outside keybrake, a subscription of quantity ×
// price for customer in status ("active" or "paused"), and returns its id and
// its item's id.
func (f *FakeStripe) AddSubscription(customer, price string, quantity int64, status string) (string, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	sub := &Subscription{ID: fmt.Sprintf("sub_fake%06d", f.seq), Customer: customer, Status: status,
		Currency: f.prices[price]["currency"].(string)}
	f.seq++
	sub.Items = []SubscriptionItem{{ID: fmt.Sprintf("si_fake%06d", f.seq), Price: price, Quantity: quantity}}
	f.subs[sub.ID] = sub
	return sub.ID, sub.Items[0].ID
}

// SetSubscriptionDestination makes the subscription's invoices pay their
// payments on to the connected account acct (transfer_data[destination]), as a
// merchant would set it outside keybrake.
func (f *FakeStripe) SetSubscriptionDestination(sub, acct string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subs[sub].Destination = acct
}

// periodTotal is what one billing period of the subscription charges.
func (f *FakeStripe) periodTotal(sub *Subscription) int64 {
	var n int64
	for _, it := range sub.Items {
		n += f.prices[it.Price]["unit_amount"].(int64) * it.Quantity
	}
	return n
}

// interval is a recurring price's interval ("" for a one-time price).
func (f *FakeStripe) interval(price string) string {
	rec, _ := f.prices[price]["recurring"].(map[string]any)
	s, _ := rec["interval"].(string)
	return s
}

// resumeSubscription resumes a paused subscription. Stripe's default
// billing_cycle_anchor for a resume is now: a new billing period starts, and is
// invoiced and charged, at once; with billing_cycle_anchor=unchanged the
// prorations wait for the next renewal.
func (f *FakeStripe) resumeSubscription(sub *Subscription, p url.Values) answer {
	if sub.Status != "paused" {
		return paramErr("subscription", "Only a paused subscription can be resumed.")
	}
	anchor := p.Get("billing_cycle_anchor")
	if anchor == "" {
		anchor = "now"
	}
	sub.Status = "active"
	if anchor == "now" {
		f.moved[sub.Currency] += f.periodTotal(sub)
	}
	return okJSON(f.subscriptionJSON(sub))
}

// updateSubscription changes the prices and quantities of a subscription's
// items (items[i][id] with items[i][price] or items[i][quantity]). As Stripe
// documents, moving to a price with another billing interval, or away from a
// free price, starts a new billing period at once and charges it in full, and
// so does a trial end (trial_end, now or a moment ahead: the billing cycle
// anchor moves there and a full period is invoiced at the items as they are);
// other changes create prorations for the next renewal. add_invoice_items
// (stored prices or price_data, × quantity) are collected by the next invoice.
func (f *FakeStripe) updateSubscription(sub *Subscription, p url.Values) answer {
	var extra int64
	for _, pre := range indexed(p, "add_invoice_items") {
		unit, qty, _, bad := f.lineItemLocked(p, pre)
		if bad != nil {
			return *bad
		}
		extra += unit * qty
	}
	before := f.periodTotal(sub)
	newPeriod := false
	for _, pre := range indexed(p, "items") {
		i := slices.IndexFunc(sub.Items, func(it SubscriptionItem) bool { return it.ID == p.Get(pre+"[id]") })
		if i < 0 {
			return paramErr(pre+"[id]", "No such subscription item: '"+p.Get(pre+"[id]")+"'")
		}
		it := &sub.Items[i]
		if price := p.Get(pre + "[price]"); price != "" {
			if _, ok := f.prices[price]; !ok {
				return paramErr(pre+"[price]", "No such price: '"+price+"'")
			}
			newPeriod = newPeriod || f.interval(price) != f.interval(it.Price) || before == 0
			it.Price = price
		}
		if v := p.Get(pre + "[quantity]"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return paramErr(pre+"[quantity]", "Invalid integer: "+v)
			}
			it.Quantity = n
		}
	}
	if newPeriod || p.Get("trial_end") != "" {
		f.moved[sub.Currency] += f.periodTotal(sub)
	}
	f.moved[sub.Currency] += extra
	return okJSON(f.subscriptionJSON(sub))
}

func (f *FakeStripe) subscriptionJSON(sub *Subscription) map[string]any {
	items := make([]any, 0, len(sub.Items))
	for _, it := range sub.Items {
		items = append(items, map[string]any{"id": it.ID, "object": "subscription_item", "price": priceJSON(f.prices[it.Price], false),
			"quantity": it.Quantity})
	}
	var transfer any
	if sub.Destination != "" {
		transfer = map[string]any{"destination": sub.Destination, "amount_percent": nil}
	}
	return map[string]any{"id": sub.ID, "object": "subscription", "status": sub.Status, "currency": sub.Currency,
		"customer": nullable(sub.Customer), "items": map[string]any{"object": "list", "data": items},
		"transfer_data": transfer, "on_behalf_of": nil}
}

// subscriptionsAnswer answers GET /v1/subscriptions[/{id}]: one subscription,
// or the list of a customer's (?customer=…), in creation order.
func (f *FakeStripe) subscriptionsAnswer(rest []string, p url.Values) answer {
	if len(rest) == 1 {
		sub, ok := f.subs[rest[0]]
		if !ok {
			return notFound("No such subscription: '" + rest[0] + "'")
		}
		return okJSON(f.subscriptionJSON(sub))
	}
	data := []any{}
	ids := slices.Sorted(maps.Keys(f.subs))
	for _, id := range ids {
		if c := p.Get("customer"); c == "" || f.subs[id].Customer == c {
			data = append(data, f.subscriptionJSON(f.subs[id]))
		}
	}
	return okJSON(map[string]any{"object": "list", "url": "/v1/subscriptions", "has_more": false, "data": data})
}

// AddCustomer creates a customer with a currency and a balance of 0 and returns
// its id.
func (f *FakeStripe) AddCustomer(currency string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	id := fmt.Sprintf("cus_fake%06d", f.seq)
	f.customers[id] = map[string]any{"id": id, "object": "customer", "currency": currency, "balance": int64(0)}
	return id
}

// routeBilling executes the billing routes; ok is false for other paths. f.mu is
// held.
func (f *FakeStripe) routeBilling(method, res string, rest []string, p url.Values) (answer, bool) {
	if method == http.MethodGet && res == "subscriptions" && len(rest) <= 1 {
		return f.subscriptionsAnswer(rest, p), true
	}
	if method != http.MethodPost {
		return answer{}, false
	}
	switch {
	case res == "subscriptions" && len(rest) == 0:
		return f.createSubscription(p), true
	case res == "subscription_items" && len(rest) == 1:
		for _, sub := range f.subs {
			for _, it := range sub.Items {
				if it.ID == rest[0] {
					item := url.Values{"items[0][id]": {it.ID}}
					for _, k := range []string{"price", "quantity"} {
						if v := p.Get(k); v != "" {
							item.Set("items[0]["+k+"]", v)
						}
					}
					return f.updateSubscription(sub, item), true
				}
			}
		}
		return notFound("No such subscription item: '" + rest[0] + "'"), true
	case res == "subscriptions" && len(rest) >= 1:
		sub, ok := f.subs[rest[0]]
		switch {
		case !ok:
			return notFound("No such subscription: '" + rest[0] + "'"), true
		case len(rest) == 1:
			return f.updateSubscription(sub, p), true
		case len(rest) == 2 && rest[1] == "resume":
			return f.resumeSubscription(sub, p), true
		}
	case res == "customers" && len(rest) == 1:
		c, ok := f.customers[rest[0]]
		if !ok {
			return notFound("No such customer: '" + rest[0] + "'"), true
		}
		if v := p.Get("balance"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return paramErr("balance", "Invalid integer: "+v), true
			}
			old, _ := c["balance"].(int64)
			if raise := n - max(0, old); raise > 0 {
				f.moved[c["currency"].(string)] += raise
			}
			c["balance"] = n
		}
		return okJSON(c), true
	case res == "customers" && len(rest) == 2 && rest[1] == "balance_transactions":
		c, ok := f.customers[rest[0]]
		if !ok {
			return notFound("No such customer: '" + rest[0] + "'"), true
		}
		amount, bad := signedParam(p, "amount")
		if bad != nil {
			return *bad, true
		}
		cur, bad := currencyParam(p)
		if bad != nil {
			return *bad, true
		}
		old, _ := c["balance"].(int64)
		c["balance"] = old + amount
		if amount > 0 {
			f.moved[cur] += amount
		}
		f.seq++
		return okJSON(map[string]any{"id": fmt.Sprintf("cbtxn_fake%06d", f.seq), "object": "customer_balance_transaction",
			"amount": amount, "currency": cur, "customer": rest[0]}), true
	case res == "payment_links" && len(rest) == 0 && method == http.MethodPost:
		return f.createPaymentLink(p), true
	case res == "payment_links" && len(rest) == 1 && method == http.MethodPost:
		return f.updatePaymentLink(rest[0], p), true
	}
	return answer{}, false
}

// createSubscription starts a subscription whose first period is charged at once.
func (f *FakeStripe) createSubscription(p url.Values) answer {
	var total int64
	cur := ""
	items := indexed(p, "items")
	if len(items) == 0 {
		return paramErr("items", "Missing required param: items.")
	}
	f.seq++
	sub := &Subscription{ID: fmt.Sprintf("sub_fake%06d", f.seq), Customer: p.Get("customer"), Status: "active"}
	for _, pre := range items {
		pr, ok := f.prices[p.Get(pre+"[price]")]
		if !ok {
			return paramErr(pre+"[price]", "No such price: '"+p.Get(pre+"[price]")+"'")
		}
		qty := int64(1)
		if v := p.Get(pre + "[quantity]"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return paramErr(pre+"[quantity]", "Invalid integer: "+v)
			}
			qty = n
		}
		total += pr["unit_amount"].(int64) * qty
		cur = pr["currency"].(string)
		f.seq++
		sub.Items = append(sub.Items, SubscriptionItem{ID: fmt.Sprintf("si_fake%06d", f.seq), Price: p.Get(pre + "[price]"), Quantity: qty})
	}
	f.moved[cur] += total
	sub.Currency = cur
	f.subs[sub.ID] = sub
	return okJSON(f.subscriptionJSON(sub))
}

// signedParam reads a required integer that may be negative.
func signedParam(p url.Values, name string) (int64, *answer) {
	v := p.Get(name)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		a := paramErr(name, "Invalid integer: "+v)
		return 0, &a
	}
	return n, nil
}

// CheckoutSession is a Checkout Session (mode payment) the fake keeps: a
// customer may pay amount_total later, in a browser, without an API request.
type CheckoutSession struct {
	ID       string
	Amount   int64
	Currency string
	Status   string // open, expired, complete
	// Paid: the customer paid it (PayCheckoutSession): payment_status paid.
	Paid bool
	// Recovery: after_expiration[recovery][enabled]. Once the session expires,
	// its recovery URL creates a new session, a copy of it, that the customer
	// can still pay.
	Recovery bool
}

// createCheckoutSession creates a payment-mode session of its line items
// (price_data or a stored price, × quantity). TotalMoved counts it at once: a
// customer may pay it without another request.
func (f *FakeStripe) createCheckoutSession(p url.Values) answer {
	lines := indexed(p, "line_items")
	if len(lines) == 0 {
		return paramErr("line_items", "Missing required param: line_items.")
	}
	f.seq++
	cs := &CheckoutSession{ID: fmt.Sprintf("cs_fake%06d", f.seq), Status: "open",
		Recovery: p.Get("after_expiration[recovery][enabled]") == "true"}
	for _, pre := range lines {
		unit, qty, cur, bad := f.lineItemLocked(p, pre)
		if bad != nil {
			return *bad
		}
		if id := p.Get(pre + "[price]"); id != "" {
			f.localCurrencyLocked(p, id, qty)
		}
		cs.Amount += unit * qty
		cs.Currency = cur
	}
	if p.Get("automatic_tax[enabled]") == "true" || p.Get("managed_payments[enabled]") == "true" {
		// Stripe Tax (which Managed Payments, Stripe as merchant of record,
		// applies itself) adds tax to tax-exclusive prices: 20 % here.
		cs.Amount += cs.Amount / 5
	}
	f.moved[cs.Currency] += cs.Amount
	f.sessions = append(f.sessions, cs)
	return okJSON(f.sessionJSON(cs))
}

// routeCheckout executes the Checkout Session routes; ok is false for other
// paths. f.mu is held.
func (f *FakeStripe) routeCheckout(method string, rest []string, p url.Values) (answer, bool) {
	if len(rest) == 0 || rest[0] != "sessions" {
		return answer{}, false
	}
	if len(rest) == 1 && method == http.MethodPost {
		return f.createCheckoutSession(p), true
	}
	if len(rest) < 2 {
		return answer{}, false
	}
	i := slices.IndexFunc(f.sessions, func(cs *CheckoutSession) bool { return cs.ID == rest[1] })
	if i < 0 {
		return notFound("No such checkout.session: '" + rest[1] + "'"), true
	}
	cs := f.sessions[i]
	switch {
	case len(rest) == 2 && method == http.MethodGet:
		return okJSON(f.sessionJSON(cs)), true
	case len(rest) == 3 && rest[2] == "expire" && method == http.MethodPost:
		if cs.Status != "open" {
			return paramErr("session", "Only an open session can be expired."), true
		}
		cs.Status = "expired"
		if !cs.Recovery {
			f.moved[cs.Currency] -= cs.Amount // it can never be paid now
		}
		return okJSON(f.sessionJSON(cs)), true
	}
	return answer{}, false
}

func (f *FakeStripe) sessionJSON(cs *CheckoutSession) map[string]any {
	paymentStatus := "unpaid"
	if cs.Paid {
		paymentStatus = "paid"
	}
	m := map[string]any{"id": cs.ID, "object": "checkout.session", "mode": "payment", "status": cs.Status,
		"payment_status": paymentStatus, "amount_total": cs.Amount, "currency": cs.Currency, "livemode": false,
		"url": "https://checkout.stripe.com/c/pay/" + cs.ID, "after_expiration": nil}
	if cs.Recovery {
		rec := map[string]any{"enabled": true, "allow_promotion_codes": false, "url": nil, "expires_at": nil}
		if cs.Status == "expired" {
			rec["url"] = "https://buy.stripe.com/r/live_" + cs.ID
		}
		m["after_expiration"] = map[string]any{"recovery": rec}
	}
	return m
}
