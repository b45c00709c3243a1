package proxy

import (
	"context"
	"errors"
	"fmt"

	"github.com/keybrake/keybrake/policy"
)

// maxPrices bounds the stored prices one request may make keybrake look up (Stripe
// allows 20 line items or subscription items per request).
const maxPrices = 20

// priceTotal looks up the stored prices the request uses (Classification.Prices)
// with the real key and returns the sum of unit_amount × quantity and their
// currency. A price keybrake cannot bound refuses the request with amount_unknown.
func (p *Proxy) priceTotal(ctx context.Context, c *call) (int64, string, error) {
	refs := c.cls.Prices
	if len(refs) == 0 {
		return 0, "", nil
	}
	if len(refs) > maxPrices {
		return 0, "", refuse(CodeAmountUnknown, "The %s request uses more than %d stored prices.", c.cls.Operation, maxPrices)
	}
	type price struct {
		unit     int64
		currency string
	}
	seen := map[string]price{}
	var total int64
	currency := ""
	for _, ref := range refs {
		pr, ok := seen[ref.ID]
		if !ok {
			body, err := p.fetch(ctx, c, "/v1/prices/"+ref.ID)
			var o jsonObject
			if err == nil {
				o = decodeObject(body)
				pr.unit, pr.currency, err = priceUnit(o)
			}
			if err == nil && ref.OneTime && o.str("type") == "recurring" {
				err = errors.New("a recurring price starts a subscription whose renewals keybrake never sees")
			}
			if err != nil {
				rf := refuse(CodeAmountUnknown, "The amount of this %s request could not be read from its stored price %s: %s.",
					c.cls.Operation, clip(ref.ID), errText(err))
				rf.cause = err
				return 0, "", rf
			}
			seen[ref.ID] = pr
		}
		if currency != "" && pr.currency != currency {
			return 0, "", refuse(CodeAmountUnknown, "The %s request uses stored prices in %s and %s.", c.cls.Operation, currency, pr.currency)
		}
		currency = pr.currency
		n, err := mulMinor(pr.unit, ref.Quantity)
		if err == nil {
			total, err = addMinor(total, n)
		}
		if err != nil {
			return 0, "", malformed(err, "The request's amount is too large.")
		}
	}
	return total, currency, nil
}

// priceUnit reads a stored price keybrake can bound: charged per unit (not tiered),
// licensed (not metered by usage), with an integer unit_amount (not a custom amount
// the customer chooses, nor a fractional unit_amount_decimal), in a currency Stripe
// supports. Ignoring transform_quantity can only overcount (it divides).
func priceUnit(o jsonObject) (int64, string, error) {
	switch {
	case o == nil || o.str("object") != "price":
		return 0, "", errors.New("not a price")
	case o.str("billing_scheme") != "" && o.str("billing_scheme") != "per_unit":
		return 0, "", errors.New("a tiered price's amount depends on quantities keybrake does not know")
	case o.object("recurring").str("usage_type") == "metered":
		return 0, "", errors.New("a metered price is billed for usage reported later")
	}
	unit, ok := o.int("unit_amount")
	if !ok {
		return 0, "", errors.New("the price has no integer unit_amount (a custom or fractional amount)")
	}
	cur := o.str("currency")
	if _, ok := policy.Exponent(cur); !ok {
		return 0, "", fmt.Errorf("currency %q not supported", clip(cur))
	}
	return unit, cur, nil
}
