package proxytest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// SpecOperation is one POST operation of Stripe's OpenAPI description.
type SpecOperation struct {
	Path string // as the description writes it: /v1/charges/{charge}/capture
	ID   string // operationId: PostChargesChargeCapture
	// MoneyParams are the form parameters (nested ones as a.b, arrays as a[].b)
	// whose names say they carry money: see MoneyParamName.
	MoneyParams []string
	// LaterParams are those whose names say they make Stripe move money later
	// or again: see LaterParamName.
	LaterParams []string
}

// OpenAPISpec is what the tests read of Stripe's OpenAPI description.
type OpenAPISpec struct {
	Version     string          // the API version it describes (info.version)
	MockVersion string          // the stripe-mock module it comes from (go.mod's tool)
	Operations  []SpecOperation // every v1 POST operation, sorted by path
}

// moneyName matches parameter names that carry money: amount, amount_* and
// *_amount (amount_to_capture, unit_amount, application_fee_amount, …), *_decimal
// (unit_amount_decimal, quantity_decimal), and balance.
var moneyName = regexp.MustCompile(`^(amount|amount_.+|.+_amount|.+_decimal|balance)$`)

// MoneyParamName reports whether a parameter's last name segment says it carries
// money.
func MoneyParamName(name string) bool { return moneyName.MatchString(name) }

// laterName matches parameter names shaped like time or recurrence: a recurring
// price and its interval, trials, billing cycle anchors and schedules, cancel
// and pause settings, prorations, backdates, intervals and durations, a
// schedule's phases and end, and dates (*_at, *_date, *_days).
var laterName = regexp.MustCompile(`^(recurring|interval|interval_count|iterations|phases|end_behavior|pause_collection|` +
	`trial_.+|billing_cycle_anchor.*|billing_schedules|bill_until|cancel_at.*|proration_.+|backdate_.+|.+_interval|` +
	`duration.*|.+_days|.+_at|.+_date)$`)

// LaterParamName reports whether a parameter's last name segment says it can
// make Stripe move money later or again.
func LaterParamName(name string) bool { return laterName.MatchString(name) }

// StripeOpenAPI reads Stripe's OpenAPI description (see StripeOpenAPIDocument).
func StripeOpenAPI(tb testing.TB) *OpenAPISpec {
	tb.Helper()
	raw, version := stripeOpenAPI(tb)
	spec, err := parseOpenAPI(raw)
	if err != nil {
		tb.Fatalf("Stripe's OpenAPI description: %v", err)
	}
	spec.MockVersion = version
	return spec
}

// StripeOpenAPIDocument returns Stripe's OpenAPI description of its API,
// embedded/openapi/spec3.json of the stripe-mock module that go.mod's tool
// directive pins, read from the Go module cache (go mod download fetches the
// module first if need be). When it cannot be had the test is skipped, or fails
// when CI is "true".
func StripeOpenAPIDocument(tb testing.TB) []byte {
	tb.Helper()
	raw, _ := stripeOpenAPI(tb)
	return raw
}

// stripeOpenAPI reads spec3.json and says which stripe-mock it comes from.
func stripeOpenAPI(tb testing.TB) ([]byte, string) {
	tb.Helper()
	mod, err := findStripeMockModule()
	if err != nil {
		stripeMockUnavailable(tb, err)
	}
	raw, err := os.ReadFile(filepath.Join(mod.Dir, "embedded", "openapi", "spec3.json"))
	if err != nil {
		stripeMockUnavailable(tb, err)
	}
	return raw, mod.Version
}

// schema is the part of an OpenAPI schema the parameter walk needs.
type schema struct {
	Ref        string             `json:"$ref"`
	Type       string             `json:"type"`
	Properties map[string]*schema `json:"properties"`
	Items      *schema            `json:"items"`
	AnyOf      []*schema          `json:"anyOf"`
	OneOf      []*schema          `json:"oneOf"`
	AllOf      []*schema          `json:"allOf"`
}

func parseOpenAPI(raw []byte) (*OpenAPISpec, error) {
	var doc struct {
		Info struct {
			Version string `json:"version"`
		} `json:"info"`
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
			RequestBody struct {
				Content map[string]struct {
					Schema *schema `json:"schema"`
				} `json:"content"`
			} `json:"requestBody"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	spec := &OpenAPISpec{Version: doc.Info.Version}
	for path, ops := range doc.Paths {
		op, ok := ops["post"]
		if !ok || !strings.HasPrefix(path, "/v1/") {
			continue
		}
		so := SpecOperation{Path: path, ID: op.OperationID}
		money, later := map[string]bool{}, map[string]bool{}
		if form, ok := op.RequestBody.Content["application/x-www-form-urlencoded"]; ok {
			walkParams(form.Schema, "", 0, func(name, full string) {
				if MoneyParamName(name) && !money[full] {
					money[full] = true
					so.MoneyParams = append(so.MoneyParams, full)
				}
				if LaterParamName(name) && !later[full] {
					later[full] = true
					so.LaterParams = append(so.LaterParams, full)
				}
			})
		}
		sort.Strings(so.MoneyParams)
		sort.Strings(so.LaterParams)
		spec.Operations = append(spec.Operations, so)
	}
	if len(spec.Operations) == 0 {
		return nil, fmt.Errorf("no v1 POST operations")
	}
	sort.Slice(spec.Operations, func(i, j int) bool { return spec.Operations[i].Path < spec.Operations[j].Path })
	return spec, nil
}

// walkParams calls visit with the name and the full name of every parameter
// under s. The request schemas are inline (a $ref points at a response object,
// never at parameters).
func walkParams(s *schema, prefix string, depth int, visit func(name, full string)) {
	if s == nil || s.Ref != "" || depth > 12 {
		return
	}
	for _, alts := range [][]*schema{s.AnyOf, s.OneOf, s.AllOf} {
		for _, a := range alts {
			walkParams(a, prefix, depth+1, visit)
		}
	}
	for name, sub := range s.Properties {
		full := name
		if prefix != "" {
			full = prefix + "." + name
		}
		visit(name, full)
		walkParams(sub, full, depth+1, visit)
	}
	if s.Items != nil {
		walkParams(s.Items, prefix+"[]", depth+1, visit)
	}
}
