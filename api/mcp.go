package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// The MCP endpoint: agents that speak the Model Context Protocol call Stripe
// through keybrake with tools instead of REST.
//
//   - POST /mcp on the proxy listener, MCP's Streamable HTTP transport, stateless:
//     every request stands alone (no session to lose on a restart or to pin to one
//     replica), answers are application/json, and GET is 405 because keybrake
//     never sends a message the client did not ask for.
//   - Every request is authenticated with the vault key, "Authorization: Bearer
//     vk_…", exactly like the agent endpoints: none, unknown, revoked or expired is
//     the transport's 401 with WWW-Authenticate and the reason as text.
//   - tools/list shows the tools whose operation the key's policy allows (read
//     from the store on every call, so a policy change shows at once).
//   - A tool call becomes an in-process HTTP request — the vault key's own
//     Authorization, the arguments as a form body or query, idempotency_key as the
//     Idempotency-Key header (without one, the proxy derives it for a call that
//     moves money: proxy.NewContextDerivingIdempotency) — that runs through the
//     proxy's own http.Handler:
//     the same classification, policy, claim + hold, forwarding and settling as a
//     request from a Stripe SDK, and the same ledger (each event names the tool).
//     Stripe's 2xx answer is the result; a refusal (keybrake's or Stripe's) is a
//     result with isError whose structured content carries the error's code and
//     keybrake's figures (cap, remaining, reset_at, …).

// MCPPath is the path of the MCP endpoint on the proxy listener.
const MCPPath = "/mcp"

// Limits of the MCP endpoint: one request is at most what the proxy reads of a
// request body, and the Stripe answer a tool returns at most what the proxy
// keeps for a replay.
const (
	mcpMaxBodyBytes   = proxy.DefaultMaxBodyBytes
	mcpMaxAnswerBytes = proxy.DefaultMaxResponseBytes
)

// Codes of the MCP endpoint's own refusals, besides the proxy's.
const (
	codeInvalidArguments = "invalid_arguments" // the arguments do not fit the tool: nothing was sent
	codeAnswerTooLarge   = "answer_too_large"  // the request went through; its answer is too large to return
	// codeLivemodeMismatch (mcp_generic.go): livemode is not the mode of the key's Stripe key.
)

// mcpInstructions is what the server tells the agent when it connects.
const mcpInstructions = `This MCP server is keybrake, a spend-cap vault in front of the Stripe API. ` +
	`Every tool that moves money counts against this vault key's caps (daily, period, per request); ` +
	`keybrake refuses a call before it reaches Stripe when a cap would be exceeded, with isError and the ` +
	`code spend_cap_exceeded. A payment without an idempotency_key gets one derived from the call, so the ` +
	`same call repeated moves money once; give your own idempotency_key to make a deliberate second, identical ` +
	`payment. Call get_budget to see what is left, stripe_api_search to find an operation for stripe_api_read ` +
	`and stripe_api_write.`

// mcpEndpoint serves the MCP endpoint.
type mcpEndpoint struct {
	store   vault.Store
	stripe  http.Handler
	log     *slog.Logger
	now     func() time.Time
	handler http.Handler
	idemTTL time.Duration // how long a derived idempotency key replays
}

// newMCP builds the MCP endpoint of cfg: its tools run through cfg.Stripe.
func newMCP(cfg ProxyConfig, logger *slog.Logger) *mcpEndpoint {
	now := cfg.Store.Now // every decision about a key is made at the store's clock
	m := &mcpEndpoint{store: cfg.Store, stripe: cfg.Stripe, log: logger.With(logfield.Component, "mcp"), now: now,
		idemTTL: cfg.IdempotencyTTL}
	if m.idemTTL <= 0 {
		m.idemTTL = vault.DefaultIdempotencyTTL
	}
	version := cfg.Version
	if version == "" {
		version = "dev"
	}
	// The SDK logs every stateless request's session at Info; keybrake's own access
	// line says what matters, so only its warnings and errors pass.
	sdkLog := slog.New(minLevel{Handler: m.log.Handler(), min: slog.LevelWarn})
	srv := mcp.NewServer(&mcp.Implementation{Name: "keybrake", Title: "keybrake", Version: version},
		&mcp.ServerOptions{Instructions: mcpInstructions, Logger: sdkLog})
	for _, t := range mcpTools {
		srv.AddTool(t.defs[0], m.toolHandler(t))
	}
	srv.AddReceivingMiddleware(m.listForKey)
	m.handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Stateless:           true,
		JSONResponse:        true,
		Logger:              sdkLog,
		MaxRequestBodyBytes: mcpMaxBodyBytes,
		// The protection is for local servers without authentication: a page in
		// the user's browser cannot send the vault key, while a reverse proxy on
		// the same host (Host: keybrake.example) must not be refused.
		DisableLocalhostProtection: true,
	})
	return m
}

// minLevel passes on only records of at least min.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{Handler: h.Handler.WithAttrs(attrs), min: h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{Handler: h.Handler.WithGroup(name), min: h.min}
}

// register adds POST (and, answered 405, every other method of) /mcp to e.
func (m *mcpEndpoint) register(e *echo.Echo) {
	e.Any(MCPPath, echo.WrapHandler(m.handler),
		accessLog(m.log, "mcp request", agentLogAttrs), recoverPanic, securityHeaders, m.authenticate)
}

// authenticate admits a request only with an active vault key. Else it answers
// 401 itself, as an MCP client expects of the transport: the reason as text and
// a Bearer challenge.
func (m *mcpEndpoint) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		key, refused, err := authenticateVaultKey(r.Context(), m.store, m.log, r.Header, r.RemoteAddr, m.now())
		switch {
		case err != nil:
			return err
		case refused != "":
			c.Set(ctxKeyAuthFailure, refused)
			challenge := `Bearer realm="keybrake"`
			if r.Header.Get("Authorization") != "" {
				challenge += fmt.Sprintf(`, error="invalid_token", error_description=%q`, refused)
			}
			c.Response().Header().Set("WWW-Authenticate", challenge)
			http.Error(c.Response(), "unauthorized: "+refused, http.StatusUnauthorized)
			return nil
		}
		c.Set(ctxKeyVaultKey, key)
		return next(c)
	}
}

// keyOf authenticates the vault key of the HTTP request that carried an MCP
// message (again: the policy may have changed since the transport checked it).
func (m *mcpEndpoint) keyOf(ctx context.Context, extra *mcp.RequestExtra) (vault.Key, error) {
	if extra == nil {
		return vault.Key{}, errors.New("no HTTP request carries this message: the vault key is unknown")
	}
	// The transport's check has logged a Stripe key already.
	key, refused, err := authenticateVaultKey(ctx, m.store, nil, extra.Header, "", m.now())
	switch {
	case err != nil:
		m.log.LogAttrs(ctx, slog.LevelError, "vault key lookup failed", slog.String(logfield.Error, err.Error()))
		return vault.Key{}, errors.New("internal error")
	case refused != "":
		return vault.Key{}, errors.New(refused)
	}
	return key, nil
}

// listForKey answers tools/list with the tools the calling key's policy allows,
// described for its idempotency mode; the answer is private to the key.
func (m *mcpEndpoint) listForKey(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/list" {
			return next(ctx, method, req)
		}
		key, err := m.keyOf(ctx, req.GetExtra())
		if err != nil {
			return nil, err
		}
		res := &mcp.ListToolsResult{Tools: toolsFor(&key)}
		res.CacheScope = "private"
		return res, nil
	}
}

// toolsFor lists the tools a key sees.
func toolsFor(key *vault.Key) []*mcp.Tool {
	derive := 0
	if key.Policy.Idempotency.Mode == policy.IdempotencyDerive {
		derive = 1
	}
	tools := []*mcp.Tool{}
	for _, t := range mcpTools {
		if t.visibleTo(&key.Policy) {
			tools = append(tools, t.defs[derive])
		}
	}
	return tools
}

// toolHandler runs one tool.
func (m *mcpEndpoint) toolHandler(t *toolSpec) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		switch t.name {
		case toolGetBudget:
			return m.getBudget(ctx, req.Extra)
		case toolRequestRaise:
			return m.requestRaise(ctx, req)
		case toolAPIRead, toolAPIWrite:
			return m.genericCall(ctx, t, req)
		case toolAPISearch:
			return m.search(ctx, t, req)
		case toolAPIDetails:
			return m.details(ctx, t, req)
		case toolAPIAccounts:
			return m.listAccounts(ctx, req)
		}
		call, err := t.request(req.Params.Arguments)
		var bad *argError
		if errors.As(err, &bad) {
			return refusalResult(http.StatusBadRequest, sourceKeybrake, codeInvalidArguments, bad.msg+".", nil), nil
		} else if err != nil {
			return nil, err
		}
		var header http.Header
		if req.Extra != nil {
			header = req.Extra.Header
		}
		return m.run(ctx, t.name, call, header), nil
	}
}

// run sends the tool's request through the proxy in process and turns its
// answer into the tool's result. A call that moves money without an
// idempotency_key gets a derived one, and the result says so.
func (m *mcpEndpoint) run(ctx context.Context, tool string, call toolCall, h http.Header) *mcp.CallToolResult {
	var derived proxy.DerivedIdempotency
	ctx = proxy.NewContextDerivingIdempotency(ctx, &derived)
	target, body, contentType := call.path, []byte(nil), ""
	switch {
	case call.jsonBody != nil:
		body, contentType = call.jsonBody, "application/json"
	case call.method == http.MethodPost:
		body, contentType = []byte(call.params.Encode()), "application/x-www-form-urlencoded"
	case len(call.params) > 0:
		target += "?" + call.params.Encode()
	}
	r, err := http.NewRequestWithContext(proxy.NewContextWithTool(ctx, tool), call.method, target, bytes.NewReader(body))
	if err != nil {
		return refusalResult(http.StatusBadRequest, sourceKeybrake, codeInvalidArguments, "The path is not a valid URL path.", nil)
	}
	r.Header["Authorization"] = h.Values("Authorization")
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	if call.idempotencyKey != "" {
		r.Header.Set("Idempotency-Key", call.idempotencyKey)
	}
	if call.stripeAccount != "" {
		r.Header.Set("Stripe-Account", call.stripeAccount)
	}
	if call.approvalReason != "" {
		r.Header.Set("Keybrake-Approval-Reason", call.approvalReason)
	}
	rec := &answerRecorder{header: http.Header{}, limit: mcpMaxAnswerBytes}
	m.stripe.ServeHTTP(rec, r)
	res := rec.result()
	if derived.Key != "" {
		if flat, ok := res.StructuredContent.(map[string]any); ok && res.IsError {
			flat["idempotency_key"] = derived.Key
		}
		res.Content = append(res.Content, &mcp.TextContent{Text: derivedNote(derived.Key, m.idemTTL)})
	}
	return res
}

// getBudget answers get_budget: what GET /keybrake/v1/me says.
func (m *mcpEndpoint) getBudget(ctx context.Context, extra *mcp.RequestExtra) (*mcp.CallToolResult, error) {
	key, err := m.keyOf(ctx, extra)
	if err != nil {
		return nil, err
	}
	v, err := loadMeView(ctx, m.store, key.ID, m.now())
	if err != nil {
		m.log.LogAttrs(ctx, slog.LevelError, "get_budget failed", slog.String(logfield.KeyID, key.ID),
			slog.String(logfield.Error, err.Error()))
		return nil, errors.New("internal error")
	}
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode budget: %w", err)
	}
	return &mcp.CallToolResult{
		Content: []mcp.Content{
			&mcp.TextContent{Text: budgetText(v)},
			&mcp.TextContent{Text: string(body)},
		},
		StructuredContent: json.RawMessage(body),
	}, nil
}

// budgetText says in one line what is left of each window.
func budgetText(v meView) string {
	var parts []string
	for _, w := range []struct {
		name string
		view *windowView
	}{{"daily", v.Windows.Daily}, {"period", v.Windows.Period}} {
		if w.view == nil {
			continue
		}
		if w.view.Cap == nil {
			parts = append(parts, fmt.Sprintf("%s: no cap (%s committed, %s held)", w.name, w.view.Committed, w.view.Held))
			continue
		}
		resets := "never resets"
		if w.view.ResetAt != nil {
			resets = "resets at " + w.view.ResetAt.Format(time.RFC3339)
		}
		parts = append(parts, fmt.Sprintf("%s: %s of %s %s left (%s committed, %s held for requests in flight, unknown outcomes and money objects that can still move money), %s",
			w.name, *w.view.Remaining, *w.view.Cap, v.Currency, w.view.Committed, w.view.Held, resets))
	}
	if c := v.Windows.PerRequest.Cap; c != nil {
		parts = append(parts, fmt.Sprintf("per request: at most %s %s", *c, v.Currency))
	}
	text := "Budget of vault key " + v.Name + " (" + v.Status + "): " + strings.Join(parts, "; ") + "."
	for _, a := range v.PendingApprovals {
		text += fmt.Sprintf(" Pending approval %s: %s %s %s (idempotency key %q), held until a person decides or %s.",
			a.ID, a.Operation, a.Amount, a.Currency, a.IdempotencyKey, a.ExpiresAt.Format(time.RFC3339))
	}
	return text
}

// answerRecorder is the ResponseWriter of an in-process proxy request: it keeps
// the status, the headers and up to limit bytes of the body.
type answerRecorder struct {
	header    http.Header
	status    int
	body      bytes.Buffer
	limit     int
	truncated bool
}

func (a *answerRecorder) Header() http.Header { return a.header }

func (a *answerRecorder) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

func (a *answerRecorder) Write(p []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	n := len(p)
	if room := a.limit - a.body.Len(); n > room {
		a.truncated = true
		p = p[:max(room, 0)]
	}
	a.body.Write(p)
	return n, nil
}

// Flush does nothing: the whole answer is used once the proxy returns.
func (a *answerRecorder) Flush() {}

// result turns the recorded answer into the tool's result.
func (a *answerRecorder) result() *mcp.CallToolResult {
	status := a.status
	if status == 0 {
		status = http.StatusOK
	}
	body := a.body.Bytes()
	if a.truncated {
		return refusalResult(status, sourceKeybrake, codeAnswerTooLarge, fmt.Sprintf("Stripe's answer (status %d) is larger "+
			"than %d bytes and is not shown; the request itself went through.", status, a.limit), nil)
	}
	if status < 200 || status > 299 {
		return errorResult(status, body)
	}
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(body)}}}
	if isJSONObject(body) {
		res.StructuredContent = json.RawMessage(body)
	}
	var notes []string
	if a.header.Get("Idempotent-Replayed") == "true" {
		notes = append(notes, "this is the stored answer of the first call with this idempotency key: nothing ran again")
	}
	for _, w := range []struct{ header, name string }{
		{"Keybrake-Remaining-Daily", "daily"}, {"Keybrake-Remaining-Period", "period"},
	} {
		if v := a.header.Get(w.header); v != "" {
			notes = append(notes, fmt.Sprintf("%s left in the %s window", v, w.name))
		}
	}
	if len(notes) > 0 {
		res.Content = append(res.Content, &mcp.TextContent{Text: "keybrake: " + strings.Join(notes, "; ") + "."})
	}
	return res
}

// isJSONObject reports whether body is one JSON object.
func isJSONObject(body []byte) bool {
	b := bytes.TrimSpace(body)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// errorResult is the result of an answer that is not 2xx: keybrake's refusal
// (its error carries a "keybrake" member) or Stripe's error, passed on.
func errorResult(status int, body []byte) *mcp.CallToolResult {
	var env struct {
		Error map[string]any `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&env); err != nil || env.Error == nil {
		if len(body) > 500 {
			body = append(body[:500:500], "…"...)
		}
		return refusalResult(status, sourceStripe, "", fmt.Sprintf("Stripe answered %d: %s", status, body), nil)
	}
	msg, _ := env.Error["message"].(string)
	code, _ := env.Error["code"].(string)
	source := sourceStripe
	if _, ours := env.Error["keybrake"]; ours {
		source = sourceKeybrake
	}
	return refusalResult(status, source, code, msg, env.Error)
}

// Sources of a refusal: keybrake answered instead of Stripe, or Stripe answered.
const (
	sourceKeybrake = "keybrake"
	sourceStripe   = "stripe"
)

// refusalResult is a result with isError: text a model can act on, and as
// structured content the error flattened — status, source, code and message,
// the other members of a Stripe error (type, param, decline_code, …) and those of
// keybrake's refusal (reason, scope — the key or budget that refused —, cap,
// currency, limit, committed, held, requested, remaining, reset_at, count,
// per, retry_at, request_id).
func refusalResult(status int, source, code, msg string, stripeErr map[string]any) *mcp.CallToolResult {
	flat := map[string]any{}
	for k, v := range stripeErr {
		if k != "keybrake" {
			flat[k] = v
		}
	}
	if kb, ok := stripeErr["keybrake"].(map[string]any); ok {
		for k, v := range kb {
			flat[k] = v
		}
	}
	if code != "" {
		flat["code"] = code
	}
	flat["message"], flat["status"], flat["source"] = msg, status, source
	// Every refusal starts as Stripe's own MCP server writes an error, so an
	// agent written against it recognises one.
	text := "Stripe API error: "
	switch {
	case source == sourceKeybrake:
		text += fmt.Sprintf("keybrake refused this call (%s): %s", code, strings.TrimSuffix(msg, "."))
		advice := refusalAdvice[proxy.ErrorCode(code)]
		switch {
		case proxy.ErrorCode(code) == proxy.CodeSpendCapExceeded && flat["cap"] == string(policy.WindowPerRequest):
			advice = perRequestAdvice
		case proxy.ErrorCode(code) == proxy.CodeIdemKeyRequired && flat["field"] != nil:
			// A derive-mode key: the message names the parameter the key is derived from.
			advice = "Nothing reached Stripe; add that argument and call again."
		}
		text += "."
		if advice != "" {
			text += " " + advice
		}
	case code != "":
		typ, _ := flat["type"].(string)
		text += fmt.Sprintf("%s (Stripe answered %d %s, code %s)", msg, status, typ, code)
	default:
		text += msg
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: flat}
}

// perRequestAdvice is what to do about a payment above the per-request cap.
const perRequestAdvice = "Nothing reached Stripe. No retry can pass the per-request cap: a larger payment needs a " +
	"human to raise the cap."

// refusalAdvice tells a model what to do about a refusal.
var refusalAdvice = map[proxy.ErrorCode]string{
	proxy.CodeSpendCapExceeded: "Nothing reached Stripe. Do not retry before the window resets, with this or " +
		"any other idempotency key; call get_budget to see what is left.",
	proxy.CodeVelocityExceeded: "Nothing reached Stripe: too many payments in too short a time for the limit named in scope. " +
		"Wait until retry_at, then call again with the same arguments and idempotency_key.",
	proxy.CodeOperationNotAllowed: "Nothing reached Stripe: this vault key's policy does not allow it, so a retry cannot help.",
	proxy.CodeCustomerNotAllowed:  "Nothing reached Stripe: this vault key's policy does not allow it, so a retry cannot help.",
	proxy.CodeAccountNotAllowed:   "Nothing reached Stripe: this vault key's policy does not allow it, so a retry cannot help.",
	proxy.CodeCurrencyNotAllowed:  "Nothing reached Stripe: this vault key's policy does not allow it, so a retry cannot help.",
	proxy.CodeAmountUnknown:       "Nothing reached Stripe: keybrake must know the amount before money can move; name it.",
	proxy.CodeIdemKeyRequired:     "Pass an idempotency_key argument naming this unit of work (e.g. order-42), and the same one if you retry.",
	codeLivemodeMismatch:          "Nothing reached Stripe.",
	proxy.CodeIdemKeyInvalid:      "The idempotency_key must be 1 to 255 printable ASCII characters.",
	proxy.CodeIdemKeyReused: "This idempotency_key was used for a different call: repeat that call's exact arguments, " +
		"or use a new key for a new payment.",
	proxy.CodeIdemKeyInUse: "The first call with this idempotency_key is still running: call again with the same " +
		"arguments and key in a second.",
	proxy.CodeUpstreamUnavailable: "Call again with the same arguments and idempotency_key (never a new key): " +
		"keybrake then learns from Stripe what the first attempt did.",
	proxy.CodeStoreUnavailable: "Nothing reached Stripe: keybrake's store is unavailable for a moment. Call again " +
		"with the same arguments and idempotency_key in a few seconds.",
	proxy.CodeApprovalRequired: "Nothing reached Stripe; its amount is held. A person must approve it in keybrake " +
		"(approval_id above): once approved, call again with the same arguments and the same idempotency_key, " +
		"before expires_at. get_budget lists the key's pending approvals.",
	proxy.CodeApprovalDeclined: "Nothing reached Stripe: a person declined this payment. Do not retry it.",
	proxy.CodeApprovalExpired: "Nothing reached Stripe: nobody approved it in time, or it was not called again in time " +
		"after approval. A new idempotency_key asks again.",
	codeInvalidArguments: "Nothing reached Stripe; fix the arguments and call again.",
	codeAnswerTooLarge:   "Ask for less, e.g. a smaller limit.",
}
