package stripeapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/proxy/stripeapi"
)

// specSchema is the part of a parameter's schema the table keeps: its type.
type specSchema struct {
	Type  string        `json:"type"`
	AnyOf []*specSchema `json:"anyOf"`
	Enum  []any         `json:"enum"`
}

// typeName is the JSON type of a parameter: "string", "integer", "object", or
// alternatives joined by "|" ("object|string" for metadata, which "" unsets).
func (s *specSchema) typeName() string {
	if s == nil {
		return ""
	}
	if s.Type != "" {
		return s.Type
	}
	seen := map[string]bool{}
	var types []string
	for _, a := range s.AnyOf {
		if t := a.typeName(); t != "" && !seen[t] {
			seen[t] = true
			types = append(types, t)
		}
	}
	sort.Strings(types)
	return strings.Join(types, "|")
}

// htmlTag matches the tags of the description's HTML.
var htmlTag = regexp.MustCompile(`<[^>]+>`)

// shortText is the first sentence of an HTML description, at most 160 characters.
func shortText(s string) string {
	s = strings.Join(strings.Fields(html.UnescapeString(htmlTag.ReplaceAllString(s, " "))), " ")
	if i := strings.Index(s, ". "); i >= 0 {
		s = s[:i+1]
	}
	if len(s) > 160 {
		cut := strings.LastIndexByte(s[:157], ' ')
		if cut < 0 {
			cut = 157
		}
		s = s[:cut] + "…"
	}
	return s
}

// buildSpecTable makes the table of operations from Stripe's OpenAPI description:
// every v1 GET, POST and DELETE the catalogue knows, with its path parameters,
// a GET's query parameters and a POST's top-level form parameters (expand left
// out: every operation has it).
func buildSpecTable(t *testing.T, raw []byte, mock string) stripeapi.SpecTable {
	type param struct {
		In          string      `json:"in"`
		Name        string      `json:"name"`
		Required    bool        `json:"required"`
		Description string      `json:"description"`
		Schema      *specSchema `json:"schema"`
	}
	var doc struct {
		Info struct {
			Version string `json:"version"`
		} `json:"info"`
		Paths map[string]map[string]struct {
			OperationID string  `json:"operationId"`
			Summary     string  `json:"summary"`
			Description string  `json:"description"`
			Parameters  []param `json:"parameters"`
			RequestBody struct {
				Content map[string]struct {
					Schema struct {
						Properties map[string]struct {
							specSchema
							Description string `json:"description"`
						} `json:"properties"`
						Required []string `json:"required"`
					} `json:"schema"`
				} `json:"content"`
			} `json:"requestBody"`
		} `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	table := stripeapi.SpecTable{APIVersion: doc.Info.Version, StripeMock: mock}
	for path, ops := range doc.Paths {
		if !strings.HasPrefix(path, "/v1/") {
			continue
		}
		for method, op := range ops {
			method = strings.ToUpper(method)
			if method != "GET" && method != "POST" && method != "DELETE" {
				continue
			}
			cls, err := stripeapi.Classify(method, stripeapi.SpecSamplePath(path), nil)
			if err != nil || !cls.Known {
				continue
			}
			summary := op.Summary
			if d := shortText(op.Description); d != "" && d != summary {
				summary = strings.TrimSuffix(summary, ".") + ". " + d
			}
			so := stripeapi.SpecOperation{ID: op.OperationID, Method: method, Path: path, Summary: summary}
			for _, p := range op.Parameters {
				if p.Name == "expand" || (p.In != "path" && p.In != "query") {
					continue
				}
				so.Params = append(so.Params, stripeapi.SpecParam{Name: p.Name, In: p.In, Type: p.Schema.typeName(),
					Required: p.Required || p.In == "path", Description: shortText(p.Description)})
			}
			if method == "POST" {
				body := op.RequestBody.Content["application/x-www-form-urlencoded"].Schema
				names := make([]string, 0, len(body.Properties))
				for name := range body.Properties {
					if name != "expand" {
						names = append(names, name)
					}
				}
				sort.Strings(names)
				for _, name := range names {
					p := body.Properties[name]
					so.Params = append(so.Params, stripeapi.SpecParam{Name: name, In: "body", Type: p.typeName(),
						Required: contains(body.Required, name), Description: shortText(p.Description)})
				}
			}
			table.Operations = append(table.Operations, so)
		}
	}
	sort.Slice(table.Operations, func(i, j int) bool { return table.Operations[i].ID < table.Operations[j].ID })
	return table
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestSpecOperationsFollowTheSpec checks that the embedded table of Stripe's
// operations is what the pinned OpenAPI description says; -update rewrites it.
func TestSpecOperationsFollowTheSpec(t *testing.T) {
	t.Parallel()
	spec := proxytest.StripeOpenAPI(t)
	table := buildSpecTable(t, proxytest.StripeOpenAPIDocument(t), spec.MockVersion)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	require.NoError(t, enc.Encode(table))
	if *update {
		require.NoError(t, os.WriteFile(stripeapi.SpecFile, buf.Bytes(), 0o644))
		return
	}
	got, err := os.ReadFile(stripeapi.SpecFile)
	require.NoError(t, err)
	require.Equal(t, buf.String(), string(got), "%s is out of date: go test ./proxy/stripeapi -run TestSpecOperationsFollowTheSpec -update", stripeapi.SpecFile)
}

func TestSpecOperationByID(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]string{
		"PostRefunds":                     "POST /v1/refunds refunds.create true",
		"GetCustomersCustomer":            "GET /v1/customers/{customer} customers.read false",
		"PostPaymentIntentsIntentCapture": "POST /v1/payment_intents/{intent}/capture payment_intents.capture true",
		"DeleteCustomersCustomer":         "DELETE /v1/customers/{customer} customers.delete false",
		"PostCharges":                     "POST /v1/charges charges.create true",
	} {
		op, ok := stripeapi.SpecOperationByID(id)
		require.True(t, ok, id)
		assert.Equal(t, want, fmt.Sprintf("%s %s %s %v", op.Method, op.Path, op.Operation, op.MovesMoney), id)
	}
	_, ok := stripeapi.SpecOperationByID("PostNothing")
	assert.False(t, ok)
	op, _ := stripeapi.SpecOperationByID("GetCustomersCustomer")
	assert.Equal(t, []string{"customer"}, op.PathParams())
}
