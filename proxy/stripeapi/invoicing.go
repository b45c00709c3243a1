package stripeapi

// Invoicing in the catalogue: invoice items, the lines of an invoice, and the
// invoice settings that add tax. The decisions are summed up at the top of
// catalogue.go; the invoice an item or a line is added to is the money object its
// amount is counted on (Classification.Target), so paying that invoice draws on it
// instead of counting the same money twice.

// itemUnitFields are the ways an invoice item or line states its unit amount
// ("unit_amount" is an older API version's name, still read because
// Stripe-Version can select it).
var itemUnitFields = []string{"unit_amount", "unit_amount_decimal", "price_data[unit_amount]", "price_data[unit_amount_decimal]"}

// itemQuantityFactors and itemUnitFactors are where an invoice item keeps the
// factor an update does not carry: its quantity (quantity_decimal first: it is
// the exact one) and its unit amount (in pricing since API version 2025-03-31,
// top level before).
var (
	itemQuantityFactors = []string{"quantity_decimal", "quantity"}
	itemUnitFactors     = []string{"pricing.unit_amount_decimal", "unit_amount_decimal", "unit_amount"}
)

// itemPricing is what one invoice item, or one invoice line (under prefix), says
// about its amount.
type itemPricing struct {
	pricing           // unit amount × quantity, when priced by a unit amount
	ways     int      // ways of pricing given: amount, a unit amount, a stored price
	amount   int64    // the "amount" parameter, when given
	byAmount bool     //
	price    string   // a stored price ("pricing[price]", or the older "price")
	present  bool     // names an amount, a quantity or a pricing
	taxed    bool     // tax_rates or tax_amounts: Stripe adds tax keybrake cannot bound
	currency string   // "currency" (items only) or price_data[currency]
	priceRef PriceRef // the stored price × quantity, when the quantity is exact
}

// readItemPricing reads an invoice item (prefix "") or line (prefix "lines[0]").
func readItemPricing(p *Params, prefix string) (itemPricing, error) {
	var ip itemPricing
	key := func(k string) string { return nested(prefix, k) }
	var err error
	if ip.pricing, ip.ways, err = unitPricing(p, prefix, itemUnitFields); err != nil {
		return ip, err
	}
	ip.currency = ip.pricing.currency
	if prefix == "" {
		cur, _, err := currencyParam(p, "currency")
		if err != nil {
			return ip, err
		}
		if cur != "" && ip.currency != "" && cur != ip.currency {
			return ip, formErr("currency %q and price_data[currency] %q differ", cur, ip.currency)
		}
		if cur != "" {
			ip.currency = cur
		}
	}
	if ip.amount, ip.byAmount, err = minorParam(p, key("amount")); err != nil {
		return ip, err
	}
	for _, f := range []string{"pricing[price]", "price"} {
		id, ok, err := idParam(p, key(f))
		if err != nil {
			return ip, err
		}
		if ok {
			ip.ways++
			ip.price = id
		}
	}
	ip.ways += boolInt(ip.byAmount)
	ip.present = ip.ways > 0 || ip.qtyGiven || p.Has(key("pricing"))
	ip.taxed = hasValue(p, key("tax_rates")) || hasValue(p, key("tax_amounts"))
	if ip.price != "" && ip.qtyExact {
		ip.priceRef = PriceRef{ID: ip.price, Quantity: ip.quantity}
	}
	return ip, nil
}

// hasValue reports whether key holds anything but an empty value (posting an empty
// value clears a list).
func hasValue(p *Params, key string) bool {
	if p.IsContainer(key) {
		return true
	}
	v, ok := p.Get(key)
	return ok && v != ""
}

// added is the amount a new invoice item or line adds: exact, or a stored price to
// look up; ok is false when it cannot be known.
func (ip itemPricing) added() (amount int64, price *PriceRef, ok bool) {
	switch {
	case ip.taxed || ip.ways != 1:
		return 0, nil, false
	case ip.byAmount:
		return ip.amount, nil, true
	case ip.price != "":
		if ip.priceRef.ID == "" {
			return 0, nil, false
		}
		return 0, &ip.priceRef, true
	default:
		return ip.pricing.amount, nil, ip.pricing.known
	}
}

// replaced is the new total of an invoice item or line whose update states all of
// it: an amount, or a unit amount or stored price with its quantity. ok is false
// when the update changes only one factor of unit × quantity (the other is the
// object's), or cannot be known.
func (ip itemPricing) replaced() (amount int64, price *PriceRef, ok bool) {
	if ip.byAmount || ip.qtyGiven {
		return ip.added()
	}
	return 0, nil, false
}

// discountsWhy is why a change of discounts on an invoice, an invoice item or a
// line cannot be metered.
const discountsWhy = "changing discounts can raise what an invoice collects, by an amount keybrake cannot bound"

// taxWhy is why an invoice item or line with tax cannot be metered.
const taxWhy = "tax rates and tax amounts make Stripe collect more than the line says, by an amount keybrake cannot bound"

// invoiceItemCreate: see the catalogue documentation. An item added to an invoice
// ("invoice") is counted on that invoice; a pending one on itself.
func invoiceItemCreate(r *catRequest, c *Classification) error {
	ip, err := readItemPricing(r.params, "")
	if err != nil {
		return err
	}
	inv, hasInv, err := idParam(r.params, "invoice")
	if err != nil {
		return err
	}
	if hasInv {
		c.Target = inv
	}
	c.Currency = ip.currency
	if ip.taxed {
		unknownBecause(c, taxWhy)
		return nil
	}
	amount, price, ok := ip.added()
	switch {
	case !ok:
		unknownAmount(c)
	case price != nil:
		c.AmountKnown, c.Prices = true, []PriceRef{*price}
	case c.Currency == "":
		// The customer's default currency would apply: keybrake does not guess it.
		unknownAmount(c)
	default:
		c.Amount, c.AmountKnown = amount, true
	}
	if c.AmountKnown && hasInv {
		c.Lookup = &Lookup{Path: "/v1/invoices/" + inv, Field: "amount_due"}
	}
	return nil
}

// invoiceItemUpdate: a change of amount, quantity or pricing is the item's new
// total. When the update changes only the unit amount or only the quantity, the
// other factor is the item's, read at Stripe (Lookup.Factors); the item keeps its
// currency unless the request names one.
func invoiceItemUpdate(r *catRequest, c *Classification) error {
	ip, err := readItemPricing(r.params, "")
	if err != nil {
		return err
	}
	if r.params.Has("discounts") {
		unknownBecause(c, discountsWhy)
		return nil
	}
	if !ip.present && !ip.taxed {
		c.MovesMoney = false
		return nil
	}
	c.Currency = ip.currency
	lk := &Lookup{Path: "/v1/invoiceitems/" + r.ids[0], Field: "amount"}
	if ip.taxed {
		unknownBecause(c, taxWhy)
		return nil
	}
	if amount, price, ok := ip.replaced(); ok {
		c.Amount, c.AmountKnown, c.NewTotal, c.Lookup = amount, true, true, lk
		if price != nil {
			c.Prices = []PriceRef{*price}
		}
		return nil
	}
	switch {
	case ip.ways == 1 && !ip.byAmount && ip.price == "" && ip.unitKnown && !ip.qtyGiven:
		// A new unit amount: the item keeps its quantity.
		lk.Factors = itemQuantityFactors
		c.Amount = ip.unit
	case ip.ways == 0 && ip.qtyGiven && ip.qtyExact:
		// A new quantity: the item keeps its unit amount.
		lk.Factors = itemUnitFactors
		c.Amount = ip.quantity
	default:
		unknownAmount(c)
		return nil
	}
	c.AmountKnown, c.NewTotal, c.Lookup = true, true, lk
	return nil
}

// invoiceLines: invoices.add_lines, invoices.update_lines and
// /v1/invoices/{id}/lines/{line} add lines to an invoice or reprice them, like
// invoiceitems.create and .update; their amount is counted on the invoice. A new
// line adds its amount; a repriced line is counted at its whole new total (a single
// line cannot be looked up, so what it was is not subtracted: counting it in full
// can only overcount); a line that attaches an existing pending invoice item
// (lines[i][invoice_item]) is refused: the item may be one keybrake never metered
// (a proration Stripe made from a subscription change, an item made outside
// keybrake), and the invoice then collects it; a line update that changes only
// one factor of unit × quantity cannot be known. The currency is the invoice's.
func invoiceLines(add bool, single bool) moneyFunc {
	return func(r *catRequest, c *Classification) error {
		p := r.params
		prefixes := []string{""}
		if !single {
			keys := p.Keys("lines")
			if p.Has("lines") && keys == nil {
				return formErr("parameter lines must be indexed (lines[0][…])")
			}
			prefixes = prefixes[:0]
			for _, k := range keys {
				if !isDigits(k) {
					return formErr("parameter lines[%s] is not indexed by a number", clipText(k))
				}
				prefixes = append(prefixes, "lines["+k+"]")
			}
		}
		var total int64
		var prices []PriceRef
		cur, moves := "", false
		for _, pre := range prefixes {
			ip, err := readItemPricing(p, pre)
			if err != nil {
				return err
			}
			if ip.currency != "" {
				if cur != "" && cur != ip.currency {
					return formErr("line currencies differ (%q, %q)", cur, ip.currency)
				}
				cur = ip.currency
			}
			if add && p.Has(nested(pre, "invoice_item")) {
				unknownBecause(c, "attaching an existing invoice item adds an amount keybrake may never have metered "+
					"(Stripe's prorations, items made outside keybrake); add the line with its own amount or price_data instead")
				return nil
			}
			if !add && p.Has(nested(pre, "discounts")) {
				unknownBecause(c, discountsWhy)
				return nil
			}
			if !ip.present && !ip.taxed {
				continue // a description, a period, or a pending item attached as it is
			}
			moves = true
			if ip.taxed {
				unknownBecause(c, taxWhy)
				return nil
			}
			amount, price, ok := ip.added()
			if !add && !p.Has(nested(pre, "invoice_item")) {
				amount, price, ok = ip.replaced()
			}
			if !ok {
				unknownBecause(c, "a line's new total depends on what it states and what it keeps; state its amount, or its unit amount with its quantity")
				return nil
			}
			if price != nil {
				prices = append(prices, *price)
			}
			if total, err = AddMinor(total, amount); err != nil {
				return err
			}
		}
		if !moves {
			c.MovesMoney = false
			return nil
		}
		c.Amount, c.AmountKnown, c.Currency, c.Prices = total, true, cur, prices
		c.Lookup = &Lookup{Path: "/v1/invoices/" + r.ids[0], Field: "amount_due"}
		return nil
	}
}

// pendingItemsExcludedSince is the API version from which invoices.create leaves
// the customer's pending invoice items out unless pending_invoice_items_behavior
// asks for them; before it the default was include_and_require.
const pendingItemsExcludedSince = "2022-08-01"

// invoiceSettings: invoices.create and invoices.update move no money by
// themselves (the invoice collects items and lines, each counted when added),
// except as follows.
//
//   - Automatic tax and default tax rates make Stripe collect more than the lines
//     add up to, and shipping_cost adds a shipping amount, by amounts keybrake
//     does not meter as lines: refused (add shipping as an invoice item).
//   - invoices.create drawing in what no line request metered — the customer's
//     pending items (pending_invoice_items_behavior other than exclude, the
//     default include_and_require of API versions before 2022-08-01, a
//     subscription's pending items), or another invoice's lines (from_invoice) —
//     adds an amount keybrake cannot know before the answer: refused. Without
//     pending_invoice_items_behavior the request is read as classified only under
//     a Stripe-Version of 2022-08-01 or later (MinVersion).
//   - invoices.update that hands the invoice to Stripe's automatic collection
//     (auto_advance=true, automatically_finalizes_at) moves money on it like
//     invoices.finalize: its amount_remaining (looked up) is held on it. Changing
//     its discounts can raise what it collects by an amount keybrake cannot
//     bound: refused.
func invoiceSettings(r *catRequest, c *Classification) error {
	p := r.params
	create := len(r.ids) == 0
	behavior, hasBehavior := p.Get("pending_invoice_items_behavior")
	switch {
	case isTrue(p, "automatic_tax[enabled]") || hasValue(p, "default_tax_rates"):
		unknownBecause(c, "automatic tax and default tax rates make Stripe collect more than the invoice's lines, by an amount keybrake cannot bound")
	case hasValue(p, "shipping_cost"):
		unknownBecause(c, "shipping on an invoice adds to what it collects without a line keybrake meters; add the shipping as an invoice item instead")
	case create && (p.IsContainer("pending_invoice_items_behavior") || (hasBehavior && behavior != "exclude") ||
		(!hasBehavior && p.Has("subscription"))):
		unknownBecause(c, "it draws in pending invoice items, whose total keybrake cannot know before Stripe answers; "+
			"create it with pending_invoice_items_behavior=exclude and add the items to the invoice instead")
	case create && p.Has("from_invoice"):
		unknownBecause(c, "a revision copies another invoice's lines, whose total keybrake cannot know before Stripe answers")
	case create:
		c.MovesMoney = false
		if !hasBehavior {
			c.MinVersion = pendingItemsExcludedSince
			c.Unknown = "under API versions before " + pendingItemsExcludedSince + " (or without a Stripe-Version header) " +
				"it draws in the customer's pending invoice items; send pending_invoice_items_behavior=exclude"
		}
	case p.Has("discounts"):
		unknownBecause(c, discountsWhy)
	case isTrue(p, "auto_advance") || hasValue(p, "automatically_finalizes_at"):
		// Stripe finalises and collects the invoice by itself from now on.
		c.Target = r.ids[0]
		c.Lookup = &Lookup{Path: "/v1/invoices/" + r.ids[0], Field: "amount_remaining"}
	default:
		c.MovesMoney = false
	}
	return nil
}
