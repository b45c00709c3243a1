package stripeapi_test

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/proxy/stripeapi"
)

var update = flag.Bool("update", false, "rewrite golden files from what the code does now")

// specParam replaces an OpenAPI path parameter ({charge}) with an id.
var specParam = regexp.MustCompile(`\{[^}]+\}`)

// stripeAPIGolden is where the reviewed summary of Stripe's POST operations lives.
const stripeAPIGolden = "stripe-openapi.golden"

// verdict is what keybrake does with one POST operation of Stripe's API.
func verdict(op proxytest.SpecOperation, reasons map[string]string) (string, error) {
	path := specParam.ReplaceAllString(op.Path, "x_123")
	cls, err := stripeapi.Classify("POST", path, nil)
	if err != nil {
		return "", fmt.Errorf("POST %s (%s): keybrake cannot classify the path: %v", op.Path, op.ID, err)
	}
	switch {
	case !cls.Known:
		return "refused", nil
	case routeMoves(cls.Operation, path):
		return "metered " + cls.Operation, nil
	}
	why := reasons[cls.Operation]
	if len(op.MoneyParams) > 0 && why == "" {
		return "", fmt.Errorf("POST %s (%s) is %s, forwarded unmetered, but takes money-named parameters %s: meter it, refuse it, "+
			"or say in the catalogue why they move no money", op.Path, op.ID, cls.Operation, strings.Join(op.MoneyParams, ", "))
	}
	return "unmetered " + cls.Operation, nil
}

// routeMoves reports whether the catalogue entry that path matches can move money.
func routeMoves(op, path string) bool {
	for _, rt := range stripeapi.Routes() {
		if rt.Operation == op && rt.MovesMoney && specParam.ReplaceAllString(strings.ReplaceAll(rt.Path, "{id}", "x_123"), "x_123") == path {
			return true
		}
	}
	return false
}

// TestCatalogueCoversStripesAPI reads Stripe's own description of its API (the
// OpenAPI document in the stripe-mock module the tests install) and checks every
// v1 POST operation against the catalogue: each is metered, refused, or forwarded
// unmetered with a documented reason when it takes money-named parameters
// (amount, unit_amount, amount_to_capture, *_decimal, balance, …). The verdicts
// are kept in testdata/catalogue/stripe-openapi.golden: when a new stripe-mock
// brings a new description, the test lists what changed for review; refresh the
// file with -update once each change is handled.
func TestCatalogueCoversStripesAPI(t *testing.T) {
	t.Parallel()
	spec := proxytest.StripeOpenAPI(t)
	reasons := map[string]string{}
	for _, rt := range stripeapi.Routes() {
		if rt.Unmetered != "" {
			reasons[rt.Operation] = rt.Unmetered
		}
	}
	var lines, problems []string
	counts, laterCounts := map[string]int{}, map[string]int{}
	usedRules := map[int]bool{}
	for _, op := range spec.Operations {
		v, err := verdict(op, reasons)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		f := strings.Fields(v)
		counts[f[0]]++
		line := fmt.Sprintf("POST %s %s %s", op.Path, op.ID, v)
		if len(op.MoneyParams) > 0 {
			line += " money=" + strings.Join(op.MoneyParams, ",")
		}
		if f[0] == "refused" {
			laterCounts["refused with the operation"] += len(op.LaterParams)
		} else if len(op.LaterParams) > 0 {
			later, missing := laterVerdicts(f[1], op.LaterParams, usedRules, laterCounts)
			for _, p := range missing {
				problems = append(problems, fmt.Sprintf("POST %s (%s) is %s, forwarded, and takes %s, which can make Stripe move "+
					"money later or again: refuse it, meter the bound it implies, or add a rule with a reason (stripeapi.LaterRules)",
					op.Path, op.ID, f[1], p))
			}
			line += " later=" + strings.Join(later, ",")
		}
		lines = append(lines, line)
	}
	for i, r := range stripeapi.LaterRules() {
		if !usedRules[i] {
			problems = append(problems, fmt.Sprintf("later rule %v %s matches no parameter of Stripe's description", r.Ops, r.Param))
		}
	}
	// And the other way round: every catalogue entry is an operation Stripe has.
	described := map[string]bool{}
	for _, op := range spec.Operations {
		described[specParam.ReplaceAllString(op.Path, "{id}")] = true
	}
	for _, rt := range stripeapi.Routes() {
		if !described[rt.Path] {
			problems = append(problems, fmt.Sprintf("catalogue entry POST %s (%s) is not in Stripe's description", rt.Path, rt.Operation))
		}
	}
	require.Empty(t, problems, "operations that take money-named parameters must be metered, refused or explained")
	t.Logf("Stripe API %s: %d v1 POST operations: %d metered, %d forwarded unmetered, %d refused",
		spec.Version, len(spec.Operations), counts["metered"], counts["unmetered"], counts["refused"])
	t.Logf("time- and recurrence-shaped parameters: %d refused, %d metered, %d with a reason, %d of refused operations",
		laterCounts[string(stripeapi.LaterRefused)], laterCounts[string(stripeapi.LaterMetered)],
		laterCounts[string(stripeapi.LaterReason)], laterCounts["refused with the operation"])

	header := fmt.Sprintf("# Stripe API %s (stripe-mock %s): what keybrake does with every v1 POST operation.\n"+
		"# metered OP: counted against the caps; unmetered OP: forwarded when a policy names it, moving no money\n"+
		"# (with money-named parameters, the catalogue says why); refused: not in the catalogue.\n"+
		"# later=param:class: what keybrake does with each parameter that can make Stripe move money later or again\n"+
		"# (refused, metered with the bound it implies, or reason: see stripeapi.LaterRules).\n"+
		"# Written by go test ./proxy/stripeapi -run TestCatalogueCoversStripesAPI -update, after review.\n",
		spec.Version, spec.MockVersion)
	got := header + strings.Join(lines, "\n") + "\n"
	path := filepath.Join(proxytest.TestdataDir(t), "catalogue", stripeAPIGolden)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to write %s", stripeAPIGolden)
	if string(want) == got {
		return
	}
	t.Errorf("Stripe's API description or the catalogue changed; review each difference "+
		"(what can the operation move? meter it, refuse it, or document why it moves nothing), "+
		"then refresh with -update:\n%s", lineDiff(string(want), got))
}

// laterVerdicts classifies the time- and recurrence-shaped parameters of the
// operation op by the first rule that matches each ("param:class"), marking
// the rules used and counting the classes; missing are those no rule covers.
func laterVerdicts(op string, params []string, used map[int]bool, counts map[string]int) (out, missing []string) {
	rules := stripeapi.LaterRules()
	for _, p := range params {
		i := slices.IndexFunc(rules, func(r stripeapi.LaterRule) bool { return r.Matches(op, p) })
		if i < 0 {
			missing = append(missing, p)
			continue
		}
		used[i] = true
		counts[string(rules[i].Class)]++
		out = append(out, p+":"+string(rules[i].Class))
	}
	return out, missing
}

// laterBases are requests each operation with refused or metered later rules
// meters (or lets through moving nothing): a rule's Sample is set over it.
// "" is an operation that is refused whatever it says.
var laterBases = map[string]string{
	"subscriptions.create":          "customer=cus_1&items[0][price]=price_1",
	"subscriptions.update":          "add_invoice_items[0][price]=price_1",
	"subscriptions.resume":          "billing_cycle_anchor=unchanged",
	"subscription_items.update":     "quantity=2",
	"subscription_items.create":     "",
	"subscription_schedules.create": "metadata[k]=v",
	"subscription_schedules.update": "metadata[k]=v",
	"checkout.sessions.create": "line_items[0][price_data][currency]=usd&line_items[0][price_data][product]=prod_1&" +
		"line_items[0][price_data][unit_amount]=100&line_items[0][quantity]=1&mode=payment&success_url=https://example.com/ok",
	"checkout.sessions.update": "metadata[k]=v",
	"payment_links.create": "line_items[0][price_data][currency]=usd&line_items[0][price_data][product]=prod_1&" +
		"line_items[0][price_data][unit_amount]=100&line_items[0][quantity]=1&restrictions[completed_sessions][limit]=1",
	"payment_links.update": "metadata[k]=v",
	"invoices.update":      "description=x",
}

// TestLaterRulesHold checks every refused or metered rule's Sample against the
// catalogue: set over a request the operation meters, the parameter makes
// Classify refuse it with a reason (refused), or still meter it (metered).
func TestLaterRulesHold(t *testing.T) {
	paths := map[string]string{}
	for _, rt := range stripeapi.Routes() {
		if _, ok := paths[rt.Operation]; !ok {
			paths[rt.Operation] = strings.ReplaceAll(rt.Path, "{id}", "x_123")
		}
	}
	classify := func(op string, body url.Values) stripeapi.Classification {
		t.Helper()
		p, err := stripeapi.ParseForm([]byte(body.Encode()))
		require.NoError(t, err, "%s %s", op, body.Encode())
		cls, err := stripeapi.Classify("POST", paths[op], p)
		require.NoError(t, err, "%s %s", op, body.Encode())
		return cls
	}
	metered := func(c stripeapi.Classification) bool {
		return c.Unknown == "" && (!c.MovesMoney || c.AmountKnown || c.Lookup != nil)
	}
	for _, r := range stripeapi.LaterRules() {
		if r.Class == stripeapi.LaterReason {
			assert.Empty(t, r.Sample, "a reason needs no sample: %s", r.Param)
			assert.NotEmpty(t, r.Why, "rule %v %s", r.Ops, r.Param)
			continue
		}
		if r.Sample == "" {
			assert.Equal(t, stripeapi.LaterMetered, r.Class, "a refused rule needs a sample: %v %s", r.Ops, r.Param)
			continue
		}
		require.NotEmpty(t, r.Ops, "a rule with a sample names its operations: %s", r.Param)
		sample, err := url.ParseQuery(r.Sample)
		require.NoError(t, err)
		for _, op := range r.Ops {
			base, ok := laterBases[op]
			require.True(t, ok, "no base request for %s", op)
			body, err := url.ParseQuery(base)
			require.NoError(t, err)
			if base != "" {
				require.True(t, metered(classify(op, body)), "the base request of %s is metered", op)
			}
			for k, v := range sample {
				body[k] = v
			}
			got := classify(op, body)
			if r.Class == stripeapi.LaterRefused {
				assert.True(t, got.MovesMoney && !got.AmountKnown && got.Lookup == nil && got.Unknown != "",
					"%s with %s is refused with a reason: %+v", op, r.Sample, got)
			} else {
				assert.True(t, got.MovesMoney && metered(got), "%s with %s is metered: %+v", op, r.Sample, got)
			}
		}
	}
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if !g[l] {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if !w[l] {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}
