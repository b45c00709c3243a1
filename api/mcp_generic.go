package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// The generic tools: the shape of Stripe's hosted MCP server, so that an agent
// configured for it works against keybrake unchanged. stripe_api_read and
// stripe_api_write name an operation by the operationId of the OpenAPI
// description keybrake pins (stripeapi.SpecOperationByID), its path parameters
// inside parameters; the call is then a toolCall like any other tool's and runs
// through the proxy (m.run). stripe_api_search and stripe_api_details describe
// the operations; list_available_accounts_or_orgs lists the accounts the key may
// act on. Read is GET only and write everything else, so a client that trusts
// stripe_api_read as harmless is right to.

// Names of the generic tools.
const (
	toolAPIRead     = "stripe_api_read"
	toolAPIWrite    = "stripe_api_write"
	toolAPISearch   = "stripe_api_search"
	toolAPIDetails  = "stripe_api_details"
	toolAPIAccounts = "list_available_accounts_or_orgs"
)

// Arguments of the generic tools.
const (
	argOperationID   = "stripe_api_operation_id"
	argParameters    = "parameters"
	argStripeContext = "stripe_context"
	argLivemode      = "livemode"
)

// codeLivemodeMismatch refuses a call whose livemode is not the upstream's.
const codeLivemodeMismatch = "livemode_mismatch"

// Bounds of stripe_api_search's answer.
const (
	searchDefaultLimit = 5
	searchMaxLimit     = 25
)

// genericCallArgs are the arguments stripe_api_read and stripe_api_write share.
func genericCallArgs(write bool) []toolArg {
	verb := "GET operation (a read)"
	if write {
		verb = "POST or DELETE operation (a write)"
	}
	args := []toolArg{
		{name: argOperationID, kind: argString, required: true, control: true,
			desc: "The operationId of the " + verb + " in Stripe's OpenAPI description, e.g. " +
				map[bool]string{false: "GetCustomersCustomer or GetBalance", true: "PostRefunds or PostPaymentIntents"}[write] +
				". Call stripe_api_search to find it."},
		{name: argParameters, kind: argObject, control: true, schema: map[string]any{"type": "object"},
			desc: "The operation's parameters as nested JSON, path parameters included (e.g. {\"customer\": \"cus_123\"} for " +
				"GetCustomersCustomer). Amounts are integers in the currency's minor unit."},
		{name: argStripeContext, kind: argID, control: true,
			desc: "The connected account to act on (acct_…), as Stripe-Account; this vault key's policy must allow it " +
				"(list_available_accounts_or_orgs). Omit it for the platform account."},
		{name: argLivemode, kind: argBoolean, control: true,
			desc: "Whether the call is meant for live mode (true) or test mode (false); it is refused unless it matches " +
				"the mode of the Stripe key behind this vault key."},
	}
	return args // mustTools adds idempotency_key and reason to the write
}

// The table rows of the generic tools (in mcpTools).
var (
	apiReadTool = &toolSpec{name: toolAPIRead, title: "Stripe API read", args: genericCallArgs(false),
		desc: "Read from the Stripe API: any GET operation this vault key's policy allows, named by its operationId " +
			"(e.g. GetCustomersCustomer with parameters {\"customer\": \"cus_123\"}). It never moves money."}
	apiWriteTool = &toolSpec{name: toolAPIWrite, title: "Stripe API write", args: genericCallArgs(true),
		desc: "Write to the Stripe API: any POST or DELETE operation this vault key's policy allows, named by its " +
			"operationId (e.g. PostRefunds with parameters {\"payment_intent\": \"pi_123\", \"amount\": 500}). A write " +
			"that moves money counts against this vault key's caps and is refused before Stripe when a cap would be " +
			"exceeded (call get_budget to see what is left); without an idempotency_key it gets one derived from the " +
			"call, so a retry of the same call moves money once."}
	apiSearchTool = &toolSpec{name: toolAPISearch, title: "Search Stripe API operations",
		desc: "Find the Stripe API operations this vault key's policy allows, by words (e.g. \"refund\", " +
			"\"list customers\"): each with its operationId, the tool to call it with (stripe_api_read or " +
			"stripe_api_write), whether it moves money, and its parameters.",
		args: []toolArg{
			{name: "query", kind: argString, required: true, control: true,
				desc: "Words that name what you want to do, e.g. \"refund a payment\"."},
			{name: "limit", kind: argInteger, min: 1, max: searchMaxLimit, control: true,
				desc: fmt.Sprintf("How many operations to return at most (default %d).", searchDefaultLimit)},
		}}
	apiDetailsTool = &toolSpec{name: toolAPIDetails, title: "Stripe API operation details",
		desc: "Describe one Stripe API operation by its operationId: method, path, what it does, its parameters, " +
			"whether it moves money and whether this vault key's policy allows it.",
		args: []toolArg{
			{name: argOperationID, kind: argString, required: true, control: true,
				desc: "The operationId, e.g. PostRefunds."},
		}}
	apiAccountsTool = &toolSpec{name: toolAPIAccounts, title: "List available accounts",
		desc: "List the Stripe accounts this vault key may act on: the platform account (no stripe_context) and " +
			"the connected accounts its policy allows (pass one as stripe_context), with the mode (livemode) of " +
			"the Stripe key behind it."}
)

// genericCall runs stripe_api_read or stripe_api_write.
func (m *mcpEndpoint) genericCall(ctx context.Context, t *toolSpec, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	call, err := t.request(req.Params.Arguments)
	if err == nil {
		err = m.genericRequest(ctx, t.name == toolAPIWrite, req, &call)
	}
	var bad *argError
	var mismatch *livemodeError
	switch {
	case errors.As(err, &bad):
		return refusalResult(http.StatusBadRequest, sourceKeybrake, codeInvalidArguments, bad.msg+".", nil), nil
	case errors.As(err, &mismatch):
		return refusalResult(http.StatusBadRequest, sourceKeybrake, codeLivemodeMismatch, mismatch.msg, nil), nil
	case err != nil:
		return nil, err
	}
	var header http.Header
	if req.Extra != nil {
		header = req.Extra.Header
	}
	return m.run(ctx, t.name, call, header), nil
}

// livemodeError is a livemode that is not the upstream's.
type livemodeError struct{ msg string }

func (e *livemodeError) Error() string { return e.msg }

// genericRequest fills call, whose idempotency key and reason t.request took,
// with the operation named by the arguments.
func (m *mcpEndpoint) genericRequest(ctx context.Context, write bool, req *mcp.CallToolRequest, call *toolCall) error {
	args, err := decodeArgs(req.Params.Arguments)
	if err != nil {
		return err
	}
	id := args[argOperationID].(string)
	op, ok := stripeapi.SpecOperationByID(id)
	if !ok {
		return argErrorf("unknown %s %q: it is not an operation of Stripe's API that keybrake knows; call %s with "+
			"words that name what you want (e.g. \"refund\") to find its operationId", argOperationID, clipArg(id), toolAPISearch)
	}
	switch isRead := op.Method == http.MethodGet; {
	case write && isRead:
		return argErrorf("%s is a read (%s %s): call %s with it", id, op.Method, op.Path, toolAPIRead)
	case !write && !isRead:
		return argErrorf("%s is a write (%s %s): %s only reads; call %s with it", id, op.Method, op.Path, toolAPIRead, toolAPIWrite)
	}
	params := map[string]any{}
	if p, ok := args[argParameters].(map[string]any); ok {
		for k, v := range p {
			params[k] = v
		}
	}
	path := op.Path
	for _, name := range op.PathParams() {
		v, ok := params[name].(string)
		if !ok || !idText.MatchString(v) {
			return argErrorf("parameters.%s is required and must be an id (letters, digits, _ and -): it fills {%s} in %s",
				name, name, op.Path)
		}
		path = strings.Replace(path, "{"+name+"}", v, 1)
		delete(params, name)
	}
	if op.Method == http.MethodDelete && len(params) > 0 {
		return argErrorf("%s takes no parameters besides its path parameters", id)
	}
	call.method, call.path, call.params = op.Method, path, url.Values{}
	for _, name := range sortedKeys(params) {
		if err := formEncode(name, params[name], call.params); err != nil {
			return err
		}
	}
	call.stripeAccount, _ = args[argStripeContext].(string)
	if live, ok := args[argLivemode].(bool); ok {
		mode, err := m.upstreamMode(ctx, req.Extra)
		if err != nil {
			return err
		}
		if want := map[bool]string{true: "live", false: "test"}[live]; mode != want {
			return &livemodeError{msg: livemodeText(live, mode)}
		}
	}
	return nil
}

// livemodeText says why a call's livemode was refused.
func livemodeText(live bool, mode string) string {
	if mode == "" {
		return fmt.Sprintf("livemode is %v, but the Stripe key behind this vault key is neither a live nor a test key, so "+
			"keybrake cannot tell which mode the call would run in: nothing was sent. Omit livemode to call anyway.", live)
	}
	return fmt.Sprintf("livemode is %v, but this vault key acts in %s mode (its Stripe key is a %s key): nothing was sent. "+
		"Call again with livemode %v, or use a vault key for the other mode.", live, mode, mode, mode == "live")
}

// clipArg shortens an argument for an error message.
func clipArg(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// upstreamMode is "live" or "test" by the calling key's upstream secret, "" when
// it is neither.
func (m *mcpEndpoint) upstreamMode(ctx context.Context, extra *mcp.RequestExtra) (string, error) {
	key, err := m.keyOf(ctx, extra)
	if err != nil {
		return "", err
	}
	secret, err := m.store.UpstreamSecret(ctx, key.Upstream)
	if err != nil {
		m.log.LogAttrs(ctx, slog.LevelError, "upstream secret for livemode", slog.String(logfield.KeyID, key.ID),
			slog.String(logfield.Error, err.Error()))
		return "", errors.New("internal error: the mode of this vault key's Stripe key is unknown")
	}
	return secretMode(secret), nil
}

// specView is an operation as the search and details tools describe it.
type specView struct {
	ID         string                `json:"stripe_api_operation_id"`
	Tool       string                `json:"tool"`
	Method     string                `json:"method"`
	Path       string                `json:"path"`
	Summary    string                `json:"summary"`
	Operation  string                `json:"policy_operation"`
	MovesMoney bool                  `json:"moves_money"`
	Allowed    *bool                 `json:"allowed,omitempty"`
	Params     []stripeapi.SpecParam `json:"parameters"`
}

func newSpecView(op stripeapi.SpecOperation) specView {
	tool := toolAPIWrite
	if op.Method == http.MethodGet {
		tool = toolAPIRead
	}
	params := op.Params
	if params == nil {
		params = []stripeapi.SpecParam{}
	}
	return specView{ID: op.ID, Tool: tool, Method: op.Method, Path: op.Path, Summary: op.Summary,
		Operation: op.Operation, MovesMoney: op.MovesMoney, Params: params}
}

// allowsSpec says whether a key with policy p may call op.
func allowsSpec(p *policy.Policy, op stripeapi.SpecOperation) bool {
	return p.EffectiveMode() == policy.ModeReport || p.AllowsOperation(op.Operation)
}

// searchWords splits a query into lower-case words.
func searchWords(q string) []string {
	return strings.FieldsFunc(strings.ToLower(q), func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < '0' || r > '9')
	})
}

// searchSpecs returns the operations policy p allows that match every word of
// query (in the operationId, the path, the policy operation or the summary;
// a word matches its plural and singular alike), best first: matches in the
// operationId and path count more than those in the summary, then the shorter
// path (the plain create or list before nested operations) wins.
func searchSpecs(p *policy.Policy, query string) []stripeapi.SpecOperation {
	words := searchWords(query)
	type hit struct {
		op    stripeapi.SpecOperation
		score int
	}
	var hits []hit
	for _, op := range stripeapi.SpecOperations().Operations {
		if !allowsSpec(p, op) {
			continue
		}
		name := strings.ToLower(op.ID + " " + strings.ReplaceAll(op.Path, "_", " ") + " " + op.Operation)
		summary := strings.ToLower(op.Summary)
		score := 0
		for _, w := range words {
			stem := strings.TrimSuffix(w, "s")
			if stem == "" {
				continue
			}
			if strings.Contains(name, stem) {
				score += 3
			} else if strings.Contains(summary, stem) {
				score++
			} else {
				score = 0
				break
			}
		}
		if score > 0 {
			hits = append(hits, hit{op, score})
		}
	}
	sort.SliceStable(hits, func(i, j int) bool {
		if hits[i].score != hits[j].score {
			return hits[i].score > hits[j].score
		}
		if len(hits[i].op.Path) != len(hits[j].op.Path) {
			return len(hits[i].op.Path) < len(hits[j].op.Path)
		}
		return hits[i].op.ID < hits[j].op.ID
	})
	out := make([]stripeapi.SpecOperation, len(hits))
	for i, h := range hits {
		out[i] = h.op
	}
	return out
}

// jsonResult is a result whose text says what it is, with v as JSON text and
// structured content.
func jsonResult(summary string, v any) (*mcp.CallToolResult, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode result: %w", err)
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: summary}, &mcp.TextContent{Text: string(body)}},
		StructuredContent: json.RawMessage(body),
	}, nil
}

// search answers stripe_api_search.
func (m *mcpEndpoint) search(ctx context.Context, t *toolSpec, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key, args, res, err := m.describeArgs(ctx, t, req)
	if res != nil || err != nil {
		return res, err
	}
	limit := searchDefaultLimit
	if n, ok := args["limit"].(json.Number); ok {
		i, _ := n.Int64()
		limit = int(i)
	}
	hits := searchSpecs(&key.Policy, args["query"].(string))
	views := []specView{}
	for _, op := range hits[:min(limit, len(hits))] {
		views = append(views, newSpecView(op))
	}
	ids := make([]string, len(views))
	for i, v := range views {
		ids[i] = v.ID
	}
	summary := fmt.Sprintf("%d operations this vault key's policy allows match %q", len(hits), args["query"])
	switch {
	case len(hits) == 0:
		summary += ": none. Try other words; an operation the policy does not allow is not listed."
	case len(hits) > len(views):
		summary += fmt.Sprintf("; the first %d: %s.", len(views), strings.Join(ids, ", "))
	default:
		summary += ": " + strings.Join(ids, ", ") + "."
	}
	return jsonResult(summary, map[string]any{"operations": views, "total": len(hits)})
}

// details answers stripe_api_details.
func (m *mcpEndpoint) details(ctx context.Context, t *toolSpec, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key, args, res, err := m.describeArgs(ctx, t, req)
	if res != nil || err != nil {
		return res, err
	}
	id := args[argOperationID].(string)
	op, ok := stripeapi.SpecOperationByID(id)
	if !ok {
		return refusalResult(http.StatusBadRequest, sourceKeybrake, codeInvalidArguments, fmt.Sprintf(
			"Unknown %s %q; call %s with words that name what you want to find its operationId.", argOperationID,
			clipArg(id), toolAPISearch), nil), nil
	}
	v := newSpecView(op)
	v.Allowed = ptr(allowsSpec(&key.Policy, op))
	summary := fmt.Sprintf("%s: %s %s (%s), call it with %s.", op.ID, op.Method, op.Path, op.Operation, v.Tool)
	if !*v.Allowed {
		summary += " This vault key's policy does not allow it: a call is refused (operation_not_allowed)."
	}
	return jsonResult(summary, v)
}

// describeArgs authenticates the caller of a describing tool and checks its
// arguments; res is the refusal of arguments that do not fit.
func (m *mcpEndpoint) describeArgs(ctx context.Context, t *toolSpec, req *mcp.CallToolRequest) (vault.Key, map[string]any, *mcp.CallToolResult, error) {
	key, err := m.keyOf(ctx, req.Extra)
	if err != nil {
		return vault.Key{}, nil, nil, err
	}
	if _, err := t.request(req.Params.Arguments); err != nil {
		var bad *argError
		if errors.As(err, &bad) {
			return key, nil, refusalResult(http.StatusBadRequest, sourceKeybrake, codeInvalidArguments, bad.msg+".", nil), nil
		}
		return key, nil, nil, err
	}
	args, err := decodeArgs(req.Params.Arguments)
	return key, args, nil, err
}

// accountView is one account a key may act on.
type accountView struct {
	StripeContext *string `json:"stripe_context"` // null for the platform account
	Kind          string  `json:"kind"`           // platform or connected_account
}

// listAccounts answers list_available_accounts_or_orgs.
func (m *mcpEndpoint) listAccounts(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key, err := m.keyOf(ctx, req.Extra)
	if err != nil {
		return nil, err
	}
	mode, err := m.upstreamMode(ctx, req.Extra)
	if err != nil {
		return nil, err
	}
	accounts := []accountView{{Kind: "platform"}}
	for _, a := range key.Policy.StripeAccounts {
		accounts = append(accounts, accountView{StripeContext: ptr(a), Kind: "connected_account"})
	}
	v := map[string]any{"accounts": accounts}
	summary := "This vault key acts on its platform account (omit stripe_context)"
	if len(key.Policy.StripeAccounts) > 0 {
		summary += " and on the connected accounts " + strings.Join(key.Policy.StripeAccounts, ", ") + " (pass one as stripe_context)"
	} else {
		summary += " only: its policy allows no connected account"
	}
	if mode != "" {
		v["livemode"] = mode == "live"
		summary += fmt.Sprintf(", in %s mode (livemode %v)", mode, mode == "live")
	}
	return jsonResult(summary+".", v)
}

// derivedNote says that keybrake derived the call's idempotency key, and what
// that means for a retry and for a deliberate second payment.
func derivedNote(key string, ttl time.Duration) string {
	return fmt.Sprintf("keybrake: no idempotency_key was given, so keybrake derived %s from this vault key, the operation "+
		"and its parameters: the same call again within %s is a retry and moves no money. To make a deliberate second, "+
		"identical payment, pass an idempotency_key of your own (e.g. order-42-second).", key, ttlText(ttl))
}

// ttlText writes a duration in hours when it is whole hours ("24 h").
func ttlText(d time.Duration) string {
	if d%time.Hour == 0 {
		return fmt.Sprintf("%d h", d/time.Hour)
	}
	return d.String()
}
