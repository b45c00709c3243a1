package stripeapi

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// Stripe's operations by operationId: the v1 operations of the OpenAPI
// description keybrake pins (the stripe-mock module of go.mod) that the catalogue
// knows, each with its method, path, summary and parameters, so that an MCP
// client written against Stripe's own server ("PostRefunds",
// "GetCustomersCustomer") can name them. spec_operations.json is written from
// the description by go test ./proxy/stripeapi -run TestSpecOperationsFollowTheSpec
// -update; the test fails when it is out of date.

// SpecFile is the name of the embedded table of Stripe's operations.
const SpecFile = "spec_operations.json"

//go:embed spec_operations.json
var specOperationsJSON []byte

// SpecTable is the embedded table: the API version it describes and its operations.
type SpecTable struct {
	APIVersion string          `json:"api_version"`
	StripeMock string          `json:"stripe_mock"`
	Operations []SpecOperation `json:"operations"`
}

// SpecOperation is one operation of Stripe's API as its OpenAPI description
// names it, with what the catalogue makes of it.
type SpecOperation struct {
	ID      string      `json:"id"`     // operationId: PostRefunds
	Method  string      `json:"method"` // GET, POST or DELETE
	Path    string      `json:"path"`   // with {name} for each path parameter: /v1/customers/{customer}
	Summary string      `json:"summary"`
	Params  []SpecParam `json:"params,omitempty"`

	// Operation is the catalogue's name of the request ("refunds.create") and
	// MovesMoney whether it can move money (stripeapi.Classify of the path).
	Operation  string `json:"-"`
	MovesMoney bool   `json:"-"`
}

// SpecParam is one parameter of an operation: a path parameter, a query
// parameter of a GET, or a top-level form parameter of a POST.
type SpecParam struct {
	Name        string `json:"name"`
	In          string `json:"in"` // path, query or body
	Type        string `json:"type,omitempty"`
	Required    bool   `json:"required,omitempty"`
	Description string `json:"description,omitempty"`
}

var specOps = sync.OnceValues(func() (*SpecTable, error) {
	var t SpecTable
	if err := json.Unmarshal(specOperationsJSON, &t); err != nil {
		return nil, fmt.Errorf("%s: %w", SpecFile, err)
	}
	for i := range t.Operations {
		op := &t.Operations[i]
		cls, err := Classify(op.Method, SpecSamplePath(op.Path), nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %s %s: %w", SpecFile, op.Method, op.Path, err)
		}
		op.Operation, op.MovesMoney = cls.Operation, cls.MovesMoney
	}
	sort.Slice(t.Operations, func(i, j int) bool { return t.Operations[i].ID < t.Operations[j].ID })
	return &t, nil
})

// SpecOperations returns Stripe's operations keybrake knows, sorted by id. It
// panics when the embedded table cannot be read, which every test catches.
func SpecOperations() *SpecTable {
	t, err := specOps()
	if err != nil {
		panic(err)
	}
	return t
}

// SpecOperationByID returns the operation of Stripe's operationId id.
func SpecOperationByID(id string) (SpecOperation, bool) {
	ops := SpecOperations().Operations
	i := sort.Search(len(ops), func(i int) bool { return ops[i].ID >= id })
	if i < len(ops) && ops[i].ID == id {
		return ops[i], true
	}
	return SpecOperation{}, false
}

// specPathParam matches a path parameter of the description ({customer}).
var specPathParam = regexp.MustCompile(`\{[^}]+\}`)

// SpecSamplePath fills the path's parameters with an id, to classify it.
func SpecSamplePath(path string) string { return specPathParam.ReplaceAllString(path, "x_123") }

// PathParams returns the names of the operation's path parameters, in order.
func (op SpecOperation) PathParams() []string {
	var names []string
	for _, m := range specPathParam.FindAllString(op.Path, -1) {
		names = append(names, strings.Trim(m, "{}"))
	}
	return names
}
