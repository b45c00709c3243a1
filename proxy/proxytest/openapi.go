package proxytest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
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
}

// OpenAPISpec is what the tests read of Stripe's OpenAPI description.
type OpenAPISpec struct {
	Version    string          // the API version it describes (info.version)
	Operations []SpecOperation // every v1 POST operation, sorted by path
}

// moneyName matches parameter names that carry money: amount, amount_* and
// *_amount (amount_to_capture, unit_amount, application_fee_amount, …), *_decimal
// (unit_amount_decimal, quantity_decimal), and balance.
var moneyName = regexp.MustCompile(`^(amount|amount_.+|.+_amount|.+_decimal|balance)$`)

// MoneyParamName reports whether a parameter's last name segment says it carries
// money.
func MoneyParamName(name string) bool { return moneyName.MatchString(name) }

// StripeOpenAPI reads Stripe's OpenAPI description (embedded/openapi/spec3.json)
// from the stripe-mock module of StripeMockVersion in the Go module cache,
// downloading the module with `go mod download` when it is not there. When it
// cannot be had the test is skipped, or fails when CI is "true".
func StripeOpenAPI(tb testing.TB) *OpenAPISpec {
	tb.Helper()
	path, err := stripeSpecPath()
	if err != nil {
		stripeMockUnavailable(tb, err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		stripeMockUnavailable(tb, err)
	}
	spec, err := parseOpenAPI(raw)
	if err != nil {
		tb.Fatalf("stripe OpenAPI description %s: %v", path, err)
	}
	return spec
}

// stripeSpecPath finds spec3.json in the module cache, downloading the module
// first when needed.
func stripeSpecPath() (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("find the go command: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), stripeMockInstallTime)
	defer cancel()
	out, err := exec.CommandContext(ctx, goBin, "env", "GOMODCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE: %w", err)
	}
	rel := filepath.Join("github.com", "stripe", "stripe-mock@"+StripeMockVersion, "embedded", "openapi", "spec3.json")
	path := filepath.Join(strings.TrimSpace(string(out)), rel)
	if isFile(path) {
		return path, nil
	}
	tmp, err := os.MkdirTemp("", "keybrake-spec-")
	if err != nil {
		return "", fmt.Errorf("create a directory for go mod download: %w", err)
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, goBin, "mod", "download", "-json", stripeMockModule+"@"+StripeMockVersion)
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	dl, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w", stripeMockModule, StripeMockVersion, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(dl, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: no module directory in %q", stripeMockModule, StripeMockVersion, clipOutput(string(dl)))
	}
	path = filepath.Join(mod.Dir, "embedded", "openapi", "spec3.json")
	if !isFile(path) {
		return "", fmt.Errorf("%s is not in the stripe-mock module", path)
	}
	return path, nil
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
		seen := map[string]bool{}
		if form, ok := op.RequestBody.Content["application/x-www-form-urlencoded"]; ok {
			walkParams(form.Schema, "", 0, func(p string) {
				if !seen[p] {
					seen[p] = true
					so.MoneyParams = append(so.MoneyParams, p)
				}
			})
		}
		sort.Strings(so.MoneyParams)
		spec.Operations = append(spec.Operations, so)
	}
	if len(spec.Operations) == 0 {
		return nil, fmt.Errorf("no v1 POST operations")
	}
	sort.Slice(spec.Operations, func(i, j int) bool { return spec.Operations[i].Path < spec.Operations[j].Path })
	return spec, nil
}

// walkParams calls money for every money-named parameter under s. The request
// schemas are inline (a $ref points at a response object, never at parameters).
func walkParams(s *schema, prefix string, depth int, money func(string)) {
	if s == nil || s.Ref != "" || depth > 12 {
		return
	}
	for _, alts := range [][]*schema{s.AnyOf, s.OneOf, s.AllOf} {
		for _, a := range alts {
			walkParams(a, prefix, depth+1, money)
		}
	}
	for name, sub := range s.Properties {
		full := name
		if prefix != "" {
			full = prefix + "." + name
		}
		if MoneyParamName(name) {
			money(full)
		}
		walkParams(sub, full, depth+1, money)
	}
	if s.Items != nil {
		walkParams(s.Items, prefix+"[]", depth+1, money)
	}
}
