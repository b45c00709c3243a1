package proxy_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Holes found by the third adversarial review: Stripe objects that recur moved
// money far past the caps, or paid a connected account outside the key's
// scope. The fake Stripe behaves as Stripe documents each case; the harness's
// cleanup checks that it never moved more than the caps allow.

// recurringLink is a Payment Link for five payers of a 10.00 line whose inline
// price recurs every interval ("" for a one-time price).
func recurringLink(interval string) map[string][]string {
	f := form("line_items[0][price_data][currency]", "usd", "line_items[0][price_data][product]", "prod_1",
		"line_items[0][price_data][unit_amount]", "1000", "line_items[0][quantity]", "1",
		"restrictions[completed_sessions][limit]", "5")
	if interval != "" {
		f.Set("line_items[0][price_data][recurring][interval]", interval)
	}
	return f
}

// Hole: a Payment Link's inline recurring price (price_data[recurring]) was
// metered as a one-off sale: 50.00 committed for five payers, each of whom then
// starts a daily subscription that renews unseen (1,550.00 in 30 days against a
// 100.00 cap). Only stored recurring prices were refused.
func TestPaymentLinkInlineRecurringPriceIsRefused(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("100.00", everything))

	refusedUnknown(t, e.Post(t, "/v1/payment_links", tok, "link-daily", recurringLink("day")), "price_data[recurring]")
	assert.Zero(t, postsTo(e, "/v1/payment_links"), "the link never reached Stripe")
	assert.Zero(t, e.Fake.TotalMoved("usd"))

	// The same link sold once per payer is metered as before.
	r := e.Post(t, "/v1/payment_links", tok, "link-once", recurringLink(""))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, h := usage(t, e, key.ID)
	assert.EqualValues(t, 5000, c+h)
}

// Hole: subscriptions.update with trial_end a minute ahead moves the billing
// cycle anchor there, and Stripe then invoices a full period at the items as
// they are: with items[0][quantity]=1000 of a 10.00 price, 10,000.00 against a
// 100.00 cap, on a moment the caller picks. Only trial_end=now was refused.
func TestSubscriptionTrialEndAheadIsRefused(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("100.00", everything))
	monthly := e.Fake.AddRecurringPrice(1000, "usd")
	sub, item := e.Fake.AddSubscription(e.Fake.AddCustomer("usd"), monthly, 1, "active")
	ahead := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)

	refusedUnknown(t, e.Post(t, "/v1/subscriptions/"+sub, tok, "trial-ahead",
		form("items[0][id]", item, "items[0][quantity]", "1000", "trial_end", ahead)), "subscriptions.create with trial_end")
	refusedUnknown(t, e.Post(t, "/v1/subscriptions/"+sub, tok, "trial-plan", form("trial_from_plan", "true")), "trial end")
	refusedUnknown(t, e.Post(t, "/v1/subscriptions/"+sub, tok, "pending-interval",
		form("pending_invoice_item_interval[interval]", "day")), "pending_invoice_item_interval")
	assert.Zero(t, postsTo(e, "/v1/subscriptions/"+sub), "none reached Stripe")
	assert.Zero(t, e.Fake.TotalMoved("usd"))

	// A quantity change still waits for the subscription's own renewal.
	r := e.Post(t, "/v1/subscriptions/"+sub, tok, "qty", form("items[0][id]", item, "items[0][quantity]", "2"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
}

// Hole: a subscription with transfer_data[destination] pays each invoice on to
// that connected account, items someone else added included. A key without
// stripe_accounts added invoice items to such a subscription (metered, within
// its cap), and Stripe transferred them to the account at invoicing. A pending
// invoice item, or a raised customer balance, reaches it the same way through
// the customer's next invoice. The subscriptions are read before forwarding.
func TestMoneyAddedToASubscriptionPayingAConnectedAccount(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("100.00", everything))
	once := e.Fake.AddPrice(1000, "usd")
	monthly := e.Fake.AddRecurringPrice(1000, "usd")
	paying := e.Fake.AddCustomer("usd")
	sub, _ := e.Fake.AddSubscription(paying, monthly, 1, "active")
	e.Fake.SetSubscriptionDestination(sub, "acct_other")

	for name, r := range map[string]reply{
		"add_invoice_items": e.Post(t, "/v1/subscriptions/"+sub, tok, "add",
			form("add_invoice_items[0][price]", once, "add_invoice_items[0][quantity]", "1")),
		"pending item": e.Post(t, "/v1/invoiceitems", tok, "item",
			form("customer", paying, "currency", "usd", "amount", "1000")),
		"balance": e.Post(t, "/v1/customers/"+paying, tok, "balance", form("balance", "1000")),
	} {
		AssertRefusal(t, r, http.StatusForbidden, "account_not_allowed")
		assert.Contains(t, r.ErrMessage(), "acct_other", name)
	}
	assert.Zero(t, postsTo(e, "/v1/subscriptions/"+sub)+postsTo(e, "/v1/invoiceitems")+postsTo(e, "/v1/customers/"+paying))
	c, h := usage(t, e, key.ID)
	assert.Zero(t, c+h)

	// A subscription that pays no connected account takes the items, metered.
	plain, _ := e.Fake.AddSubscription(e.Fake.AddCustomer("usd"), monthly, 1, "active")
	r := e.Post(t, "/v1/subscriptions/"+plain, tok, "add-plain",
		form("add_invoice_items[0][price]", once, "add_invoice_items[0][quantity]", "1"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	c, h = usage(t, e, key.ID)
	assert.EqualValues(t, 1000, c+h)
}

// Lead: invoices.add_lines with lines[][invoice_item] assigns an existing pending
// invoice item to the invoice. The item may be a proration Stripe made from a
// subscription change, which keybrake never metered (a quantity change waits
// for the renewal, unmetered): attached to a self-collecting invoice it is
// charged at once. Attaching was counted as adding nothing; it is refused.
func TestAttachingAnUnmeteredInvoiceItemIsRefused(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("50.00", everything))
	cus := e.Fake.AddCustomer("usd")
	proration := e.Fake.AddPendingItem("usd", cus, 50000)
	draft := e.Fake.AddDraftInvoice("usd", cus)

	refusedUnknown(t, e.Post(t, "/v1/invoices/"+draft+"/add_lines", tok, "attach", form("lines[0][invoice_item]", proration)),
		"existing invoice item")
	assert.Zero(t, postsTo(e, "/v1/invoices/"+draft+"/add_lines"))

	// A line with its own amount is metered on the invoice.
	r := e.Post(t, "/v1/invoices/"+draft+"/add_lines", tok, "line", form("lines[0][amount]", "1000"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
}
