package proxy

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// Step 3 of the pipeline (see prepare): the policy's operation, customer and
// connected accounts, before any amount is known (caps are Store.Reserve's).

// authorise checks the operation, customer and accounts with amount 0; caps are
// checked by Store.Reserve inside its write transaction.
func (p *Proxy) authorise(c *call) error {
	pol := &c.key.Policy
	if !c.cls.Known && c.method != http.MethodGet {
		return reasonRefusal(policy.Decision{Reason: policy.ReasonOperationNotAllowed,
			Message: "This endpoint is not in keybrake's catalogue: only reads of unknown endpoints can pass."}, "")
	}
	if c.cls.MovesMoney && c.method != http.MethodPost {
		return malformed(nil, "A %s request that moves money cannot be metered.", c.method)
	}
	if field, ok := stripeapi.RevealedSecret(c.params); ok {
		// A card number or an account number spends money outside any request
		// keybrake sees, whatever the policy allows: never forwarded.
		return reasonRefusal(policy.Decision{Reason: policy.ReasonOperationNotAllowed, Message: fmt.Sprintf(
			"keybrake does not forward requests that reveal card numbers, CVCs, account numbers or stored secrets (expand %s).",
			stripeapi.Clip(field))}, "")
	}
	d := policy.Decide(pol, nil, c.policyRequest(0, ""), p.store.Now())
	if !d.Allowed {
		return reasonRefusal(d, "")
	}
	if d.WouldRefuse {
		c.decision, c.reason = decisionWouldRefuse, codeOf(d.Reason)
	}
	if err := checkAccounts(pol, stripeapi.Accounts(c.account, c.stripeContext, c.path, c.cls.Operation, c.params)); err != nil {
		return err
	}
	// A default Stripe changed between API versions: read as classified only
	// under a version that has the new one (never relaxed, like amount_unknown).
	if v := c.cls.MinVersion; v != "" && !stripeapi.VersionAtLeast(c.stripeVersion, v) {
		return refuse(CodeAmountUnknown, "This %s request cannot be metered: %s.", c.cls.Operation, c.cls.Unknown)
	}
	return nil
}

// checkAccounts refuses the first touched account the policy does not allow.
// The refusal is never relaxed, not even in report mode.
func checkAccounts(pol *policy.Policy, accounts []stripeapi.AccountRef) error {
	for _, a := range accounts {
		if a.ID != "" && pol.AllowsAccount(a.ID) {
			continue
		}
		msg := fmt.Sprintf("The connected account %s named by %s is not allowed for this vault key.", stripeapi.Clip(a.ID), a.Where)
		if a.ID == "" {
			msg = fmt.Sprintf("The %s must name one connected account, as a plain value.", a.Where)
		}
		return reasonRefusal(policy.Decision{Reason: policy.ReasonAccountNotAllowed, Message: msg}, "")
	}
	return nil
}

// policyRequest is the policy.Request of this call for amount in currency.
func (c *call) policyRequest(amount int64, currency string) policy.Request {
	customer := c.cls.Customer
	if customer == "" && c.method == http.MethodGet && c.params != nil && c.cls.ObjectID == "" && !strings.HasSuffix(c.path, "/search") {
		// A list filtered by customer (GET /v1/charges?customer=cus_…) touches it;
		// a customer parameter on a read of one object, or on a search (whose
		// query selects), proves nothing.
		customer, _ = c.params.Get("customer")
	}
	return policy.Request{
		Operation: c.cls.Operation,
		Amount:    amount,
		Currency:  currency,
		Customer:  customer,
		Account:   c.account,
	}
}
