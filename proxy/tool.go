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
