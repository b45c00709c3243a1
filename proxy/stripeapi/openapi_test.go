package stripeapi_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

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
	counts := map[string]int{}
	for _, op := range spec.Operations {
		v, err := verdict(op, reasons)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		counts[strings.Fields(v)[0]]++
		line := fmt.Sprintf("POST %s %s %s", op.Path, op.ID, v)
		if len(op.MoneyParams) > 0 {
			line += " money=" + strings.Join(op.MoneyParams, ",")
		}
		lines = append(lines, line)
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

	header := fmt.Sprintf("# Stripe API %s (stripe-mock %s): what keybrake does with every v1 POST operation.\n"+
		"# metered OP: counted against the caps; unmetered OP: forwarded when a policy names it, moving no money\n"+
		"# (with money-named parameters, the catalogue says why); refused: not in the catalogue.\n"+
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
