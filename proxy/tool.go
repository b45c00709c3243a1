package proxy

import "context"

// toolKey is the context key of the MCP tool that made a request.
type toolKey struct{}

// NewContextWithTool returns ctx carrying the name of the MCP tool whose call is
// the request. The MCP endpoint runs each tool call through Proxy.ServeHTTP as an
// in-process request with this context, so the tool reaches the canonical log line
// and every ledger event the request writes. A request from the network never
// carries one: only code in this process can set it.
func NewContextWithTool(ctx context.Context, tool string) context.Context {
	return context.WithValue(ctx, toolKey{}, tool)
}

// ToolFromContext returns the MCP tool of NewContextWithTool, or "" when ctx has none.
func ToolFromContext(ctx context.Context) string {
	tool, _ := ctx.Value(toolKey{}).(string)
	return tool
}

// DerivedIdempotency is what the proxy says back to an in-process caller that
// lets it derive a missing idempotency key (NewContextDerivingIdempotency).
type DerivedIdempotency struct {
	// Key is the idempotency key the proxy derived for the request, or "" when
	// it derived none (the caller gave one, or the request moves no money).
	Key string
}

// derivationKey is the context key of NewContextDerivingIdempotency.
type derivationKey struct{}

// NewContextDerivingIdempotency returns ctx under which a money-moving POST that
// carries no Idempotency-Key is not refused: the proxy derives its key from the
// vault key, the operation and the request's fingerprint (DeriveCallIdempotencyKey)
// and writes it to d. The MCP endpoint sets it, because agents retry tool calls
// without thinking of keys; a request from the network never carries it.
func NewContextDerivingIdempotency(ctx context.Context, d *DerivedIdempotency) context.Context {
	return context.WithValue(ctx, derivationKey{}, d)
}

// derivationFrom returns the DerivedIdempotency of ctx, nil for none.
func derivationFrom(ctx context.Context) *DerivedIdempotency {
	d, _ := ctx.Value(derivationKey{}).(*DerivedIdempotency)
	return d
}
