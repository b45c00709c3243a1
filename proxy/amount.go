package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"

	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// Step 6 of the pipeline (see prepare), for a request that can move money: the
// amount to hold, from the request, Stripe's objects and the key's exposure on
// them.

// resolveAmount works out the hold of a money-moving request (see "What is
// metered"), in steps: what the key already counts on the money object the
// request acts on, the stored prices it uses, its amount (by the case of its
// Classification), the connected accounts the objects that collect it pay on
// to, its currency, and last the object's exposure taken off — leaving
// c.amount to hold and c.objectTotal for the per-request cap.
func (p *Proxy) resolveAmount(ctx context.Context, c *call) error {
	if !c.metered() {
		return nil
	}
	if err := p.readExposure(ctx, c); err != nil {
		return err
	}
	prices, pricesCurrency, multi, err := p.priceTotal(ctx, c)
	if err != nil {
		return err
	}
	amount, err := p.requestAmount(ctx, c, prices, pricesCurrency)
	if err != nil {
		return err
	}
	if err := p.checkPayees(ctx, c); err != nil {
		return err
	}
	if err := p.checkNoPendingItems(ctx, c); err != nil {
		return err
	}
	if c.currency, err = c.moneyCurrency(pricesCurrency, multi); err != nil {
		return err
	}
	c.amount = c.drawOnExposure(amount)
	return nil
}

// readExposure reads what the key counts on the money object the request acts
// on (Classification.Target), if any.
func (p *Proxy) readExposure(ctx context.Context, c *call) error {
	if c.cls.Target == "" {
		return nil
	}
	exp, _, err := p.store.ObjectExposure(ctx, c.key.ID, c.cls.Target)
	if err != nil {
		return internalError(fmt.Errorf("object exposure %s: %w", c.cls.Target, err))
	}
	c.exposure = exp
	return nil
}

// requestAmount is the money the request can move, before the exposure is taken
// off: the request's own amount plus its stored prices, a raise's new total
// less what is already counted, or the looked-up amount.
func (p *Proxy) requestAmount(ctx context.Context, c *call, prices int64, pricesCurrency string) (int64, error) {
	cls := c.cls
	amount, err := stripeapi.AddMinor(cls.Amount, prices)
	if err != nil {
		return 0, malformed(err, "The request's amount is too large.")
	}
	switch {
	case cls.AmountKnown && cls.NewTotal:
		return p.raisedAmount(ctx, c, amount, prices)
	case cls.AmountKnown:
		// An object the money is counted on is read too: what it has moved so far
		// tells what this request moves, and its currency is the request's.
		if (cls.Currency == "" && (cls.Lookup != nil || pricesCurrency == "")) || (cls.Target != "" && cls.Lookup != nil) {
			if err := p.lookUpAmount(ctx, c); err != nil {
				return 0, err
			}
			if c.lookedInOtherCurrency() {
				return 0, refuse(CodeAmountUnknown, "The %s request names currency %s but acts on an object in %s.",
					cls.Operation, cls.Currency, stripeapi.Clip(c.looked.Currency))
			}
		}
		return amount, nil
	default:
		if err := p.lookUpAmount(ctx, c); err != nil {
			return 0, err
		}
		if c.lookedInOtherCurrency() && cls.Operation != "payment_intents.update" {
			// The amount is the object's, so it is in the object's currency (a
			// stored price); only a PaymentIntent update changes the currency of
			// the amount it keeps. Keybrake does not guess which one Stripe uses.
			return 0, refuse(CodeAmountUnknown, "The %s request names currency %s but its amount comes from an object in %s.",
				cls.Operation, cls.Currency, stripeapi.Clip(c.looked.Currency))
		}
		return c.looked.Amount, nil
	}
}

// raisedAmount is what a raise (a new total: payment_intents.update,
// increment_authorization, invoiceitems.update) adds to what is counted. The
// object is always looked up: its currency decides whether its current total
// counts at all. It sets c.objectTotal to the new total.
func (p *Proxy) raisedAmount(ctx context.Context, c *call, total, prices int64) (int64, error) {
	if err := p.lookUpAmount(ctx, c); err != nil {
		return 0, err
	}
	if len(c.cls.Lookup.Factors) > 0 {
		// The update changes one factor; the object keeps the other.
		n, err := stripeapi.MulMinor(c.cls.Amount, c.looked.Factor)
		if err == nil {
			total, err = stripeapi.AddMinor(n, prices)
		}
		if err != nil {
			return 0, malformed(err, "The request's new total is too large.")
		}
	}
	// The current total is not this key's to count, unless the key created the
	// object: then its exposure already counts it.
	base := c.looked.Amount
	if c.exposure.Own {
		base = c.exposure.Held
	}
	if c.lookedInOtherCurrency() {
		// A new currency: the current total is in another currency's minor units,
		// and the whole new total is new money.
		base = 0
	}
	c.objectTotal = total
	return max(0, total-base), nil
}

// lookUpAmount reads the Classification's Lookup at Stripe into c.looked, or
// refuses: amount_unknown when there is nothing to look up or the answer cannot
// be read, Stripe's own failure (no answer, the secret refused) as it is.
func (p *Proxy) lookUpAmount(ctx context.Context, c *call) error {
	cls := c.cls
	if cls.Lookup == nil {
		if cls.Unknown != "" {
			return refuse(CodeAmountUnknown, "The amount of this %s request cannot be known before it reaches Stripe: %s.", cls.Operation, cls.Unknown)
		}
		return refuse(CodeAmountUnknown, "The amount of this %s request cannot be known before it reaches Stripe.", cls.Operation)
	}
	l := *cls.Lookup
	l.Accounts = stripeapi.LookupAccounts(cls, c.params)
	res, err := p.lookup(ctx, c, l)
	var rf *refusal
	if errors.As(err, &rf) {
		return rf // Stripe refused keybrake's secret or gave no answer: not the amount's fault
	}
	if err != nil {
		rf = refuse(CodeAmountUnknown, "The amount of this %s request could not be read from Stripe.", cls.Operation)
		rf.cause = err
		return rf
	}
	c.looked = &res
	// The connected accounts the object moves this money to or from are touched
	// like accounts the request names.
	refs := make([]stripeapi.AccountRef, len(res.Accounts))
	for i, a := range res.Accounts {
		refs[i] = stripeapi.AccountRef{ID: a, Where: "the object at " + stripeapi.Clip(l.Path)}
	}
	return checkAccounts(&c.key.Policy, refs)
}

// checkPayees reads the subscriptions whose invoices pay the request's money on
// to a connected account (stripeapi.Payees) and checks those accounts like the
// ones the request names: a key cannot add money to what a connected account is
// paid by naming only the subscription or the customer.
func (p *Proxy) checkPayees(ctx context.Context, c *call) error {
	customer := ""
	if c.looked != nil {
		customer = c.looked.Customer
	}
	for _, py := range stripeapi.Payees(c.cls, c.params, customer) {
		path, query := py.Request()
		if path == "" {
			return refuse(CodeAmountUnknown, "The %s request's customer is not known, so the connected accounts its "+
				"subscriptions pay cannot be checked.", c.cls.Operation)
		}
		body, err := p.fetch(ctx, c, path, query)
		var accounts []string
		if err == nil {
			accounts, err = stripeapi.ReadPayeeAccounts(body)
		}
		var rf *refusal
		if errors.As(err, &rf) {
			return rf // Stripe refused keybrake's secret or gave no answer
		}
		if err != nil {
			rf = refuse(CodeAmountUnknown, "The connected accounts that %s pays this %s request's money on to could not be read from Stripe: %s.",
				py.Where(), c.cls.Operation, errText(err))
			rf.cause = err
			return rf
		}
		refs := make([]stripeapi.AccountRef, len(accounts))
		for i, a := range accounts {
			refs[i] = stripeapi.AccountRef{ID: a, Where: py.Where()}
		}
		if err := checkAccounts(&c.key.Policy, refs); err != nil {
			return err
		}
	}
	return nil
}

// lookedInOtherCurrency reports whether the request names a currency and the
// looked-up object is in another one.
func (c *call) lookedInOtherCurrency() bool {
	cur := c.cls.Currency
	return cur != "" && c.looked.Currency != "" && c.looked.Currency != cur
}

// moneyCurrency is the currency of the request's money: the request's, else the
// looked-up object's, else its stored prices'; none, or prices in another
// currency, refuse it. So does a multi-currency stored price (multi) when
// neither the request nor an object fixes the currency: Stripe would then charge
// the amount of the customer's local currency, which can be any other.
func (c *call) moneyCurrency(pricesCurrency string, multi bool) (string, error) {
	currency := c.cls.Currency
	if currency == "" && c.looked != nil {
		currency = c.looked.Currency
	}
	if currency == "" && multi {
		return "", refuse(CodeAmountUnknown, "The %s request uses a stored price with amounts in several currencies "+
			"(currency_options) and does not fix the currency: Stripe may charge another currency's amount. "+
			"State currency=%s.", c.cls.Operation, pricesCurrency)
	}
	if currency == "" {
		currency = pricesCurrency
	}
	if currency == "" {
		return "", refuse(CodeAmountUnknown, "The currency of this %s request cannot be known.", c.cls.Operation)
	}
	if pricesCurrency != "" && pricesCurrency != currency {
		return "", refuse(CodeAmountUnknown, "The %s request uses a stored price in %s, not in %s.", c.cls.Operation, pricesCurrency, currency)
	}
	return currency, nil
}

// drawOnExposure is the hold of amount once the money object's exposure is
// taken into account, and sets c.objectTotal (what the object can move in all,
// for the per-request cap).
func (c *call) drawOnExposure(amount int64) int64 {
	cls, exp := c.cls, c.exposure
	switch {
	case cls.Target != "" && cls.Creates:
		// Lines added to an object: new money on top of what it counts.
		c.objectTotal = exp.Committed + exp.Held + amount
	case cls.Target != "" && !cls.NewTotal:
		// Money moved on an object: what its exposure already counts (its
		// creation, a raise) is not counted again; anything beyond is, in full.
		c.objectTotal = exp.Committed + max(exp.Held, amount)
		amount = max(0, amount-exp.Held)
	}
	return amount
}

// maxPrices bounds the stored prices one request may make keybrake look up (Stripe
// allows 20 line items or subscription items per request).
const maxPrices = 20

// priceTotal looks up the stored prices the request uses (stripeapi.Classification.Prices)
// with the real key and returns the sum of unit_amount × quantity, their
// currency, and whether any has amounts in other currencies too. A price
// keybrake cannot bound refuses the request with amount_unknown.
func (p *Proxy) priceTotal(ctx context.Context, c *call) (total int64, currency string, multi bool, err error) {
	refs := c.cls.Prices
	if len(refs) == 0 {
		return 0, "", false, nil
	}
	if len(refs) > maxPrices {
		return 0, "", false, refuse(CodeAmountUnknown, "The %s request uses more than %d stored prices.", c.cls.Operation, maxPrices)
	}
	seen := map[string]stripeapi.Price{}
	for _, ref := range refs {
		pr, ok := seen[ref.ID]
		if !ok {
			body, err := p.fetch(ctx, c, "/v1/prices/"+ref.ID, url.Values{"expand[]": {stripeapi.PriceExpand}})
			if err == nil {
				pr, err = stripeapi.ReadPrice(body)
			}
			if err == nil && ref.OneTime && pr.Recurring {
				err = errors.New("a recurring price starts a subscription whose renewals keybrake never sees")
			}
			if err != nil {
				rf := refuse(CodeAmountUnknown, "The amount of this %s request could not be read from its stored price %s: %s.",
					c.cls.Operation, stripeapi.Clip(ref.ID), errText(err))
				rf.cause = err
				return 0, "", false, rf
			}
			seen[ref.ID] = pr
		}
		if currency != "" && pr.Currency != currency {
			return 0, "", false, refuse(CodeAmountUnknown, "The %s request uses stored prices in %s and %s.", c.cls.Operation, currency, pr.Currency)
		}
		currency, multi = pr.Currency, multi || pr.MultiCurrency
		n, err := stripeapi.MulMinor(pr.Unit, ref.Quantity)
		if err == nil {
			total, err = stripeapi.AddMinor(total, n)
		}
		if err != nil {
			return 0, "", false, malformed(err, "The request's amount is too large.")
		}
	}
	return total, currency, multi, nil
}

// checkNoPendingItems refuses a request that draws the customer's pending
// invoice items into its invoice (Classification.NoPendingItems) when the
// customer has any: keybrake cannot tell those it metered from those made
// outside it, and cannot bound the latter. A customer keybrake cannot name is
// refused too.
func (p *Proxy) checkNoPendingItems(ctx context.Context, c *call) error {
	if !c.cls.NoPendingItems {
		return nil
	}
	op := c.cls.Operation
	if c.cls.Customer == "" {
		return refuse(CodeAmountUnknown, "This %s request cannot be metered: it draws the customer's pending invoice items into its first invoice, "+
			"and keybrake reads them only for a customer named by the customer parameter.", op)
	}
	body, err := p.fetch(ctx, c, "/v1/invoiceitems", url.Values{"customer": {c.cls.Customer}, "pending": {"true"}, "limit": {"1"}})
	var rf *refusal
	if errors.As(err, &rf) {
		return rf // Stripe refused keybrake's secret or gave no answer
	}
	if err != nil {
		rf = refuse(CodeAmountUnknown, "This %s request cannot be metered: keybrake could not read the customer's pending invoice items from Stripe.", op)
		rf.cause = err
		return rf
	}
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return refuse(CodeAmountUnknown, "This %s request cannot be metered: Stripe's list of the customer's pending invoice items is unreadable.", op)
	}
	if len(list.Data) > 0 {
		return refuse(CodeAmountUnknown, "This %s request cannot be metered: customer %s has pending invoice items, which Stripe would add to the "+
			"subscription's first invoice by an amount keybrake cannot bound. Invoice or delete them first, "+
			"or pass one-time charges as add_invoice_items.", op, stripeapi.Clip(c.cls.Customer))
	}
	return nil
}
