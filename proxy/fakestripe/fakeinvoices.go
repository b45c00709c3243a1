package fakestripe

import (
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// Invoicing in the fake Stripe: invoices, their lines and invoice items, as
// Stripe documents them for API version 2026-08-26.dahlia. An invoice line is an
// invoice item attached to the invoice (line id "il_" + the item's suffix). An
// update changes only what it names: a new unit amount keeps the quantity, a new
// quantity keeps the unit amount.

// Invoice is an invoice the fake keeps.
type Invoice struct {
	ID         string
	Customer   string
	Currency   string
	Status     string // draft, open, paid, void
	AmountPaid int64
	Items      []string // invoice item ids, in order
	Shipping   int64    // shipping_cost: added to what the invoice collects
	// Subscription is the subscription that issued it ("" for none), and
	// BillingReason why (subscription_cycle for a renewal).
	Subscription  string
	BillingReason string
	// AutoAdvance says Stripe finalises and collects the draft by itself
	// (AdvanceInvoices) unless auto_advance=false is set on it.
	AutoAdvance bool
	// counted is what TotalMoved already holds for its lines made through the API.
	counted int64
}

// InvoiceItem is an invoice item (or invoice line) the fake keeps.
type InvoiceItem struct {
	ID         string
	Invoice    string // "" while pending
	Customer   string
	Currency   string
	UnitAmount int64
	Quantity   int64
	Deleted    bool
	Foreign    bool // made outside the API (AddInvoice, AddInvoiceLine)
}

// Amount is unit amount × quantity.
func (it InvoiceItem) Amount() int64 { return it.UnitAmount * it.Quantity }

// AddInvoice creates, as if outside keybrake, an open (finalised) invoice with one
// line per amount, and returns its id.
func (f *FakeStripe) AddInvoice(currency, customer string, lineAmounts ...int64) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	inv := &Invoice{ID: fmt.Sprintf("in_fake%06d", f.seq), Customer: customer, Currency: currency, Status: "open"}
	f.invoices = append(f.invoices, inv)
	for _, a := range lineAmounts {
		f.newItemLocked(inv, customer, currency, a, 1, true)
	}
	return inv.ID
}

// AddDraftInvoice creates, as if outside keybrake, a draft invoice (Stripe does
// not collect it by itself) with one line per amount, and returns its id.
func (f *FakeStripe) AddDraftInvoice(currency, customer string, lineAmounts ...int64) string {
	id := f.AddInvoice(currency, customer, lineAmounts...)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.invoice(id).Status = "draft"
	return id
}

// AddPendingItem creates, as if outside keybrake (by the merchant, or as a
// subscription's proration), a pending invoice item of amount for customer, and
// returns its id.
func (f *FakeStripe) AddPendingItem(currency, customer string, amount int64) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.newItemLocked(nil, customer, currency, amount, 1, true).ID
}

// AddInvoiceLine adds, as if outside keybrake, a line of amount to an invoice.
func (f *FakeStripe) AddInvoiceLine(invoiceID string, amount int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if inv := f.invoice(invoiceID); inv != nil {
		f.newItemLocked(inv, inv.Customer, inv.Currency, amount, 1, true)
	}
}

// Invoices returns copies of the invoices, in creation order.
func (f *FakeStripe) Invoices() []Invoice {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copyAll(f.invoices)
}

// InvoiceItems returns copies of the invoice items, in creation order.
func (f *FakeStripe) InvoiceItems() []InvoiceItem {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copyAll(f.items)
}

func (f *FakeStripe) invoice(id string) *Invoice {
	for _, inv := range f.invoices {
		if inv.ID == id {
			return inv
		}
	}
	return nil
}

// listItems answers GET /v1/invoiceitems with the customer and pending filters
// (one page: every match).
func (f *FakeStripe) listItems(p url.Values) answer {
	data := []any{}
	for _, it := range f.items {
		if it.Deleted || (p.Get("customer") != "" && it.Customer != p.Get("customer")) ||
			(p.Get("pending") == "true" && it.Invoice != "") {
			continue
		}
		data = append(data, itemJSON(it, "invoiceitem"))
	}
	return okJSON(map[string]any{"object": "list", "url": "/v1/invoiceitems", "has_more": false, "data": data})
}

func (f *FakeStripe) item(id string) *InvoiceItem {
	for _, it := range f.items {
		if it.ID == id || "il_"+strings.TrimPrefix(it.ID, "ii_") == id {
			return it
		}
	}
	return nil
}

// amountDue is what the invoice's live lines and its shipping add up to.
func (f *FakeStripe) amountDue(inv *Invoice) int64 {
	n := inv.Shipping
	for _, id := range inv.Items {
		if it := f.item(id); it != nil && !it.Deleted {
			n += it.Amount()
		}
	}
	return n
}

func (f *FakeStripe) newItemLocked(inv *Invoice, customer, currency string, unit, qty int64, foreign bool) *InvoiceItem {
	f.seq++
	it := &InvoiceItem{ID: fmt.Sprintf("ii_fake%06d", f.seq), Customer: customer, Currency: currency,
		UnitAmount: unit, Quantity: qty, Foreign: foreign}
	f.items = append(f.items, it)
	if inv != nil {
		f.attachLocked(inv, it)
	}
	if !foreign {
		f.moved[currency] += it.Amount()
	}
	return it
}

// attachLocked puts an item on an invoice; an item made through the API is then
// covered by what the invoice's payment would move.
func (f *FakeStripe) attachLocked(inv *Invoice, it *InvoiceItem) {
	it.Invoice = inv.ID
	inv.Items = append(inv.Items, it.ID)
	if !it.Foreign {
		inv.counted += it.Amount()
	}
}

// repriceLocked sets an item's unit amount and quantity, counting a raise made
// through the API.
func (f *FakeStripe) repriceLocked(it *InvoiceItem, unit, qty int64) {
	before := it.Amount()
	it.UnitAmount, it.Quantity = unit, qty
	if raise := it.Amount() - before; raise > 0 && !it.Foreign {
		f.moved[it.Currency] += raise
		if inv := f.invoice(it.Invoice); inv != nil {
			inv.counted += raise
		}
	}
}

// routeInvoicing executes the invoicing routes; ok is false for other paths.
// f.mu is held.
func (f *FakeStripe) routeInvoicing(method, res string, rest []string, p url.Values) (answer, bool) {
	switch {
	case res == "invoices" && len(rest) == 0 && method == http.MethodPost:
		return f.createInvoice(p), true
	case res == "invoices" && len(rest) >= 1:
		inv := f.invoice(rest[0])
		if inv == nil {
			return notFound("No such invoice: '" + rest[0] + "'"), true
		}
		return f.invoiceAction(method, inv, rest[1:], p), true
	case res == "invoiceitems" && len(rest) == 0 && method == http.MethodPost:
		return f.createItem(p), true
	case res == "invoiceitems" && len(rest) == 0 && method == http.MethodGet:
		return f.listItems(p), true
	case res == "invoiceitems" && len(rest) == 1:
		it := f.item(rest[0])
		if it == nil || it.Deleted {
			return notFound("No such invoiceitem: '" + rest[0] + "'"), true
		}
		switch method {
		case http.MethodGet:
			return okJSON(itemJSON(it, "invoiceitem")), true
		case http.MethodDelete:
			if inv := f.invoice(it.Invoice); inv != nil && inv.Status != "draft" {
				return paramErr("invoiceitem", "This invoice item is on a finalized invoice."), true
			}
			it.Deleted = true
			if !it.Foreign && it.Invoice == "" {
				f.moved[it.Currency] -= it.Amount()
			}
			return okJSON(map[string]any{"id": it.ID, "object": "invoiceitem", "deleted": true}), true
		case http.MethodPost:
			if a := f.updateItem(it, p, ""); a != nil {
				return *a, true
			}
			return okJSON(itemJSON(it, "invoiceitem")), true
		}
	}
	return answer{}, false
}

func (f *FakeStripe) invoiceAction(method string, inv *Invoice, rest []string, p url.Values) answer {
	editable := func() *answer {
		if inv.Status != "draft" {
			a := paramErr("invoice", "You can only change the lines of a draft invoice.")
			return &a
		}
		return nil
	}
	switch {
	case len(rest) == 0 && method == http.MethodGet:
		return okJSON(f.invoiceJSON(inv))
	case len(rest) == 0 && method == http.MethodPost:
		if a := f.invoiceSettingsLocked(inv, p); a != nil {
			return *a
		}
		return okJSON(f.invoiceJSON(inv))
	case len(rest) == 1 && rest[0] == "add_lines" && method == http.MethodPost:
		if a := editable(); a != nil {
			return *a
		}
		for _, pre := range indexed(p, "lines") {
			if id := p.Get(pre + "[invoice_item]"); id != "" {
				it := f.item(id)
				if it == nil || it.Invoice != "" {
					return paramErr(pre+"[invoice_item]", "No such pending invoice item: '"+id+"'")
				}
				f.attachLocked(inv, it)
				continue
			}
			unit, qty, a := linePrice(p, pre, 0, 1)
			if a != nil {
				return *a
			}
			f.newItemLocked(inv, inv.Customer, inv.Currency, unit, qty, false)
		}
		return okJSON(f.invoiceJSON(inv))
	case len(rest) == 1 && rest[0] == "update_lines" && method == http.MethodPost:
		if a := editable(); a != nil {
			return *a
		}
		for _, pre := range indexed(p, "lines") {
			it := f.item(p.Get(pre + "[id]"))
			if it == nil || it.Invoice != inv.ID {
				return paramErr(pre+"[id]", "No such line on this invoice.")
			}
			if a := f.updateItem(it, p, pre); a != nil {
				return *a
			}
		}
		return okJSON(f.invoiceJSON(inv))
	case len(rest) == 2 && rest[0] == "lines" && method == http.MethodPost:
		if a := editable(); a != nil {
			return *a
		}
		it := f.item(rest[1])
		if it == nil || it.Invoice != inv.ID {
			return notFound("No such line: '" + rest[1] + "'")
		}
		if a := f.updateItem(it, p, ""); a != nil {
			return *a
		}
		return okJSON(itemJSON(it, "line_item"))
	case len(rest) == 1 && rest[0] == "finalize" && method == http.MethodPost:
		if inv.Status != "draft" {
			return paramErr("invoice", "This invoice is already finalized.")
		}
		inv.Status = "open"
		return okJSON(f.invoiceJSON(inv))
	case len(rest) == 1 && rest[0] == "pay" && method == http.MethodPost:
		if inv.Status == "draft" {
			inv.Status = "open" // paying a draft finalises it first
		}
		if inv.Status != "open" {
			return paramErr("invoice", "Invoice is already "+inv.Status+".")
		}
		if declined(p) {
			// The invoice stays open; Stripe retries it on its own schedule.
			return declinedAnswer(nil)
		}
		remaining := f.amountDue(inv) - inv.AmountPaid
		inv.AmountPaid += remaining
		inv.Status = "paid"
		if extra := inv.AmountPaid - inv.counted; extra > 0 {
			f.moved[inv.Currency] += extra // lines made outside the API, paid through it
			inv.counted += extra
		}
		return okJSON(f.invoiceJSON(inv))
	case len(rest) == 1 && rest[0] == "void" && method == http.MethodPost:
		if inv.Status != "open" {
			return paramErr("invoice", "You can only void an open invoice.")
		}
		inv.Status = "void"
		f.moved[inv.Currency] -= inv.counted - inv.AmountPaid
		return okJSON(f.invoiceJSON(inv))
	}
	return notFound("Unrecognized request URL (" + method + ": /v1/invoices/" + inv.ID + "/" + strings.Join(rest, "/") + ").")
}

// pendingItemsDefaultExclude is the API version from which invoices.create
// leaves the customer's pending invoice items out unless asked
// (pending_invoice_items_behavior); before it, the default was
// include_and_require.
const pendingItemsDefaultExclude = "2022-08-01"

// createInvoice creates a draft invoice. As Stripe documents: it draws in the
// customer's pending invoice items with pending_invoice_items_behavior include
// or include_and_require — the default before API version 2022-08-01 —, only
// those of subscription when it names one; from_invoice copies the lines of
// another invoice (a revision); then the settings of invoiceSettingsLocked.
func (f *FakeStripe) createInvoice(p url.Values) answer {
	cur := p.Get("currency")
	if cur == "" {
		cur = "usd"
	}
	f.seq++
	inv := &Invoice{ID: fmt.Sprintf("in_fake%06d", f.seq), Customer: p.Get("customer"), Currency: cur, Status: "draft"}
	behavior := p.Get("pending_invoice_items_behavior")
	if behavior == "" {
		behavior = "exclude"
		if f.version < pendingItemsDefaultExclude {
			behavior = "include_and_require"
		}
	}
	if behavior != "exclude" {
		var pending []*InvoiceItem
		for _, it := range f.items {
			if it.Invoice == "" && !it.Deleted && it.Customer == inv.Customer && it.Currency == cur {
				pending = append(pending, it)
			}
		}
		if behavior == "include_and_require" && len(pending) == 0 {
			return paramErr("pending_invoice_items_behavior", "Nothing to invoice for customer")
		}
		for _, it := range pending {
			f.attachLocked(inv, it)
		}
	}
	if from := p.Get("from_invoice[invoice]"); from != "" {
		old := f.invoice(from)
		if old == nil {
			return paramErr("from_invoice[invoice]", "No such invoice: '"+from+"'")
		}
		for _, id := range old.Items {
			if it := f.item(id); it != nil && !it.Deleted {
				f.newItemLocked(inv, it.Customer, it.Currency, it.UnitAmount, it.Quantity, true)
			}
		}
	}
	f.invoices = append(f.invoices, inv)
	if a := f.invoiceSettingsLocked(inv, p); a != nil {
		return *a
	}
	return okJSON(f.invoiceJSON(inv))
}

// invoiceSettingsLocked applies the settings of invoices.create and .update
// that change what the invoice collects: shipping_cost (a fixed amount) adds to
// it, and auto_advance=true (or automatically_finalizes_at) makes Stripe
// finalise and collect the invoice by itself, without another request — which
// the fake does at once.
func (f *FakeStripe) invoiceSettingsLocked(inv *Invoice, p url.Values) *answer {
	if v := p.Get("shipping_cost[shipping_rate_data][fixed_amount][amount]"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			a := paramErr("shipping_cost[shipping_rate_data][fixed_amount][amount]", "Invalid integer: "+v)
			return &a
		}
		inv.Shipping = n
	}
	if p.Get("auto_advance") == "false" {
		inv.AutoAdvance = false
	}
	if p.Get("auto_advance") == "true" || p.Get("automatically_finalizes_at") != "" {
		f.collectLocked(inv)
	}
	return nil
}

// collectLocked is Stripe's automatic collection of an invoice: finalised and
// paid in full, without an API request.
func (f *FakeStripe) collectLocked(inv *Invoice) {
	if inv.Status != "draft" && inv.Status != "open" {
		return
	}
	inv.AmountPaid = f.amountDue(inv)
	inv.Status = "paid"
	if extra := inv.AmountPaid - inv.counted; extra > 0 {
		f.moved[inv.Currency] += extra // what the key did not add through the API
		inv.counted += extra
	}
}

func (f *FakeStripe) createItem(p url.Values) answer {
	cur := p.Get("currency")
	if !reCurrency.MatchString(cur) {
		return paramErr("currency", "Missing required param: currency.")
	}
	var inv *Invoice
	if id := p.Get("invoice"); id != "" {
		if inv = f.invoice(id); inv == nil || inv.Status != "draft" {
			return paramErr("invoice", "No such draft invoice: '"+id+"'")
		}
	}
	unit, qty, a := linePrice(p, "", 0, 1)
	if a != nil {
		return *a
	}
	it := f.newItemLocked(inv, p.Get("customer"), cur, unit, qty, false)
	return okJSON(itemJSON(it, "invoiceitem"))
}

// updateItem applies an update under prefix: only what it names changes.
func (f *FakeStripe) updateItem(it *InvoiceItem, p url.Values, prefix string) *answer {
	unit, qty, a := linePrice(p, prefix, it.UnitAmount, it.Quantity)
	if a != nil {
		return a
	}
	f.repriceLocked(it, unit, qty)
	return nil
}

// linePrice reads the amount of an item or line under prefix: "amount" (a
// quantity of 1), or a unit amount (unit_amount_decimal, price_data[unit_amount])
// and "quantity"; what is not named keeps its value from unit and qty.
func linePrice(p url.Values, prefix string, unit, qty int64) (int64, int64, *answer) {
	key := func(k string) string { return k }
	if prefix != "" {
		p, key = under(p, prefix), func(k string) string { return prefix + "[" + strings.Replace(k, "[", "][", 1) + "]" }
	}
	if v := p.Get("amount"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			a := paramErr(key("amount"), "Invalid integer: "+v)
			return 0, 0, &a
		}
		return n, 1, nil
	}
	for _, k := range []string{"unit_amount_decimal", "price_data[unit_amount]", "price_data[unit_amount_decimal]"} {
		if v := p.Get(k); v != "" {
			n, err := strconv.ParseInt(strings.TrimSuffix(v, ".0"), 10, 64)
			if err != nil || n < 0 {
				a := paramErr(key(k), "Invalid amount: "+v)
				return 0, 0, &a
			}
			unit = n
		}
	}
	if v := p.Get("quantity"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			a := paramErr(key("quantity"), "Invalid integer: "+v)
			return 0, 0, &a
		}
		qty = n
	}
	return unit, qty, nil
}

// under returns the parameters nested under prefix with the prefix taken off:
// under(p, "lines[0]") turns lines[0][price_data][currency] into
// price_data[currency].
func under(p url.Values, prefix string) url.Values {
	out := url.Values{}
	for k, vs := range p {
		rest, ok := strings.CutPrefix(k, prefix+"[")
		if !ok {
			continue
		}
		name, tail, ok := strings.Cut(rest, "]")
		if ok {
			out[name+tail] = vs
		}
	}
	return out
}

// indexed returns the prefixes "name[0]", "name[1]", … present in p, in order.
func indexed(p url.Values, name string) []string {
	seen := map[int]bool{}
	for k := range p {
		rest, ok := strings.CutPrefix(k, name+"[")
		if !ok {
			continue
		}
		i, _, _ := strings.Cut(rest, "]")
		if n, err := strconv.Atoi(i); err == nil {
			seen[n] = true
		}
	}
	var idx []int
	for n := range seen {
		idx = append(idx, n)
	}
	sort.Ints(idx)
	out := make([]string, len(idx))
	for i, n := range idx {
		out[i] = fmt.Sprintf("%s[%d]", name, n)
	}
	return out
}

func (f *FakeStripe) invoiceJSON(inv *Invoice) map[string]any {
	due := f.amountDue(inv)
	remaining := max(0, due-inv.AmountPaid)
	if inv.Status == "void" || inv.Status == "paid" {
		remaining = 0
	}
	m := map[string]any{"id": inv.ID, "object": "invoice", "currency": inv.Currency, "customer": nullable(inv.Customer),
		"status": inv.Status, "amount_due": due, "amount_paid": inv.AmountPaid, "amount_remaining": remaining,
		"livemode": false, "metadata": map[string]any{}, "auto_advance": inv.AutoAdvance,
		"billing_reason": nullable(inv.BillingReason), "parent": nil}
	if inv.Subscription != "" {
		// API 2025-03-31.basil and later: the subscription under parent.
		m["parent"] = map[string]any{"type": "subscription_details", "quote_details": nil,
			"subscription_details": map[string]any{"subscription": inv.Subscription, "metadata": map[string]any{}}}
	}
	return m
}

// InvoiceObject is the invoice id as Stripe shows it (an event's data.object),
// nil when there is none.
func (f *FakeStripe) InvoiceObject(id string) map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	inv := f.invoice(id)
	if inv == nil {
		return nil
	}
	return f.invoiceJSON(inv)
}

// itemJSON is an invoice item (object "invoiceitem") or an invoice line (object
// "line_item", id il_…) as API version 2026-08-26.dahlia shows it: the unit
// amount under pricing, the quantity also as quantity_decimal.
func itemJSON(it *InvoiceItem, object string) map[string]any {
	id := it.ID
	if object == "line_item" {
		id = "il_" + strings.TrimPrefix(it.ID, "ii_")
	}
	return map[string]any{"id": id, "object": object, "amount": it.Amount(), "currency": it.Currency,
		"quantity": it.Quantity, "quantity_decimal": strconv.FormatInt(it.Quantity, 10),
		"pricing": map[string]any{"type": "price_details", "unit_amount_decimal": strconv.FormatInt(it.UnitAmount, 10)},
		"invoice": nullable(it.Invoice), "customer": nullable(it.Customer), "livemode": false, "metadata": map[string]any{}}
}
