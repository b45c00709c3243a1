package stripeapi

import (
	"encoding/json"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// notAccountParams are the parameter names of Stripe's API that look like they
// could name a connected account but do not, with the reason. A name that looks
// like one and is in neither this map nor accountParams fails
// TestAccountParamsCoverStripesSpec: decide which it is.
var notAccountParams = map[string]string{
	"account_holder_name":           "a bank account holder's name",
	"account_number":                "a bank account number",
	"account_tax_ids":               "tax ids of the platform's own account (txi_)",
	"default_account_tax_ids":       "tax ids of the platform's own account (txi_)",
	"account_token":                 "a token with account details (ct_), on the account being created or updated",
	"alipay_account":                "a customer's Alipay token",
	"default_alipay_account":        "a customer's Alipay source",
	"bank_account":                  "a bank account token or number",
	"default_bank_account":          "a customer's bank account (ba_)",
	"external_account":              "a payout bank account or card of the account in the path",
	"financial_account":             "a Treasury financial account (fa_)",
	"financial_connections_account": "a Financial Connections account (fca_)",
	"destination_payment_method":    "a PaymentMethod (pm_)",
	"customer_account":              "an Account as a customer: checked against the policy's customers",
	"related_customer_account":      "an Account as a customer, on identity verifications",
	"customer_account_id":           "dispute evidence: the customer's account id at the merchant, free text",
}

// accountLikeName matches parameter names that may name a Stripe account.
var accountLikeName = regexp.MustCompile(`account|destination|on_behalf_of|^source$|recipient|payee|beneficiary|acct`)

// notAccountPaths are the path prefixes whose {account} parameter is not a
// connected account.
var notAccountPaths = []string{"/v1/financial_connections/accounts/", "/v1/linked_accounts/", "/v1/treasury/financial_accounts/"}

// Stripe's own description of its API (the stripe-mock module's spec3.json) is
// the list of places a request can name an account: every string parameter
// whose name looks like an account is either in accountParams or explained in
// notAccountParams, and every path with an {account}-like parameter is an
// account collection or explained in notAccountPaths. A new stripe-mock version
// that adds one makes this test say what to review.
func TestAccountParamsCoverStripesSpec(t *testing.T) {
	t.Parallel()
	spec := stripeSpec(t)
	unexplained := map[string][]string{}
	var walk func(schema map[string]any, name, where string, depth int)
	walk = func(schema map[string]any, name, where string, depth int) {
		if depth > 16 {
			return
		}
		if typ, _ := schema["type"].(string); typ == "string" && name != "" && schema["enum"] == nil &&
			accountLikeName.MatchString(name) {
			_, isAccount := accountParams[name]
			if _, explained := notAccountParams[name]; !isAccount && !explained {
				unexplained[name] = append(unexplained[name], where)
			}
		}
		if props, ok := schema["properties"].(map[string]any); ok {
			for k, v := range props {
				if sub, ok := v.(map[string]any); ok {
					walk(sub, k, where, depth+1)
				}
			}
		}
		for _, key := range []string{"anyOf", "oneOf", "allOf"} {
			list, _ := schema[key].([]any)
			for _, v := range list {
				if sub, ok := v.(map[string]any); ok {
					walk(sub, name, where, depth+1)
				}
			}
		}
		if items, ok := schema["items"].(map[string]any); ok {
			walk(items, name, where, depth+1)
		}
	}
	pathParam := regexp.MustCompile(`\{[a-z_]*account[a-z_]*\}`)
	var badPaths []string
	for path, methods := range spec.Paths {
		if loc := pathParam.FindStringIndex(path); loc != nil {
			prefix := path[:loc[0]]
			known := false
			for _, p := range append(append([]string{}, accountCollections...), notAccountPaths...) {
				known = known || prefix == p
			}
			if !known {
				badPaths = append(badPaths, path)
			}
		}
		for method, op := range methods {
			where := strings.ToUpper(method) + " " + path
			for _, prm := range op.Parameters {
				if prm.In == "query" {
					walk(prm.Schema, prm.Name, where, 0)
				}
			}
			for _, media := range op.RequestBody.Content {
				walk(media.Schema, "", where, 0)
			}
		}
	}
	for name, where := range unexplained {
		sort.Strings(where)
		t.Errorf("parameter %q (%s, …) may name an account: add it to accountParams or notAccountParams", name, where[0])
	}
	sort.Strings(badPaths)
	assert.Empty(t, badPaths, "paths with an account parameter: add the prefix to accountCollections or notAccountPaths")
	for name := range accountParams {
		assert.Regexp(t, accountLikeName, name, "the test must look at every name accountParams holds")
	}
}

// openAPISpec is the part of Stripe's OpenAPI description the test reads.
type openAPISpec struct {
	Paths map[string]map[string]struct {
		Parameters []struct {
			Name   string         `json:"name"`
			In     string         `json:"in"`
			Schema map[string]any `json:"schema"`
		} `json:"parameters"`
		RequestBody struct {
			Content map[string]struct {
				Schema map[string]any `json:"schema"`
			} `json:"content"`
		} `json:"requestBody"`
	} `json:"paths"`
}

// stripeSpec reads Stripe's OpenAPI description from the stripe-mock module.
func stripeSpec(t *testing.T) openAPISpec {
	t.Helper()
	var spec openAPISpec
	require.NoError(t, json.Unmarshal(proxytest.StripeOpenAPIDocument(t), &spec))
	require.NotEmpty(t, spec.Paths)
	return spec
}

// billingPrefixes are the operations on the objects a request can add money to
// that Stripe may pay on to a connected account: subscriptions, their items and
// schedules, invoices, invoice items and customers' balances.
var billingPrefixes = []string{"subscriptions.", "subscription_items.", "subscription_schedules.", "invoices.", "invoiceitems.",
	"customers."}

// TestMoneyAddedToBillingObjectsReadsWhatItPays checks, over every catalogue
// case, that a request adding money to a billing object either reads at Stripe
// the connected accounts that money is paid on to (its lookup's accounts, or
// its payees), or is refused. subscriptions.create makes a new subscription:
// the only account it can pay is one the request names.
func TestMoneyAddedToBillingObjectsReadsWhatItPays(t *testing.T) {
	checked := 0
	for _, tc := range proxytest.CatalogueCases(t) {
		if tc.Method != "POST" || tc.Want.Error != "" || !strings.HasPrefix(tc.Path, "/v1/") {
			continue
		}
		p, err := ParseForm([]byte(tc.Body))
		require.NoError(t, err, tc.Name)
		cls, err := Classify(tc.Method, tc.Path, p)
		require.NoError(t, err, tc.Name)
		billing := false
		for _, pre := range billingPrefixes {
			billing = billing || strings.HasPrefix(cls.Operation, pre)
		}
		refused := !cls.AmountKnown && cls.Lookup == nil
		if !billing || !cls.MovesMoney || refused || cls.Operation == "subscriptions.create" {
			continue
		}
		checked++
		assert.True(t, len(LookupAccounts(cls, p)) > 0 || len(Payees(cls, p, "cus_looked")) > 0,
			"%s (%s) adds money to a billing object without reading the accounts it pays", tc.Name, cls.Operation)
	}
	assert.Positive(t, checked)
	t.Logf("%d money-adding requests on billing objects read the accounts they pay", checked)
}
