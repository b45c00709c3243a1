package proxytest

import (
	"fmt"
	"net/http"
	"net/url"
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
	if method != http.MethodPost {
		return answer{}, false
	}
	switch {
	case res == "subscriptions" && len(rest) == 0:
		return f.createSubscription(p), true
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
	}
	f.moved[cur] += total
	f.seq++
	return okJSON(map[string]any{"id": fmt.Sprintf("sub_fake%06d", f.seq), "object": "subscription", "status": "active",
		"currency": cur, "customer": nullable(p.Get("customer"))})
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
