package proxy

import (
	"context"
	"errors"

	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// maxPrices bounds the stored prices one request may make keybrake look up (Stripe
// allows 20 line items or subscription items per request).
const maxPrices = 20

// priceTotal looks up the stored prices the request uses (stripeapi.Classification.Prices)
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
	seen := map[string]stripeapi.Price{}
	var total int64
	currency := ""
	for _, ref := range refs {
		pr, ok := seen[ref.ID]
		if !ok {
			body, err := p.fetch(ctx, c, "/v1/prices/"+ref.ID)
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
				return 0, "", rf
			}
			seen[ref.ID] = pr
		}
		if currency != "" && pr.Currency != currency {
			return 0, "", refuse(CodeAmountUnknown, "The %s request uses stored prices in %s and %s.", c.cls.Operation, currency, pr.Currency)
		}
		currency = pr.Currency
		n, err := stripeapi.MulMinor(pr.Unit, ref.Quantity)
		if err == nil {
			total, err = stripeapi.AddMinor(total, n)
		}
		if err != nil {
			return 0, "", malformed(err, "The request's amount is too large.")
		}
	}
	return total, currency, nil
}
