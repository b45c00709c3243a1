// Package logfield names the attributes of keybrake's log lines once, so that a
// field means the same thing, in the same unit, on every line: the proxy's
// canonical line of each Stripe request ("stripe request"), the access lines of
// the admin API ("admin request"), the agent endpoints ("agent request") and the
// MCP endpoint ("mcp request"), and the lines logged around them. The "Logs"
// section of docs/operations.md lists them for operators.
package logfield

import (
	"log/slog"
	"time"
)

// Attributes every HTTP surface logs.
const (
	Component   = "component"    // the part of keybrake that logs: proxy, admin, agent, mcp, vault, …
	RequestID   = "request_id"   // keybrake's id of a proxied request (req_kb_…), also in its Request-Id header
	Method      = "method"       // the HTTP method
	Path        = "path"         // the request path (escaped, at most 200 bytes); never on agent and MCP lines
	Route       = "route"        // the route the admin, agent or MCP request matched (/api/v1/keys/:id)
	Status      = "status"       // the HTTP status keybrake answered
	DurationMS  = "duration_ms"  // arrival to answer, in milliseconds (a float, to the microsecond)
	Error       = "error"        // the cause of a failure; never shown to the caller
	KeyID       = "key_id"       // the vault key (its id, never its token)
	KeyName     = "key_name"     // the vault key's name, on the line of a request refused for its key's status
	Tool        = "tool"         // the MCP tool whose call made the request
	RemoteAddr  = "remote_addr"  // the caller's address, on warnings about what it sent
	ClockOffset = "clock_offset" // how far the store's clock is ahead of the process's
)

// Attributes of the proxy's canonical line and of the lines about one request.
const (
	Operation       = "operation"         // the catalogue's name for the Stripe request (charges.create)
	Amount          = "amount"            // what was held, in minor units of currency
	Currency        = "currency"          // the currency of amount
	Decision        = "decision"          // allowed, would_refuse, refused, replayed or resumed
	Reason          = "reason"            // the refusal's code, or what report mode would have refused
	Idempotency     = "idempotency"       // what became of the idempotency key: derived, claimed, resume, replay, …
	UpstreamStatus  = "upstream_status"   // Stripe's status; 0 when nothing was forwarded or no answer came
	StripeRequestID = "stripe_request_id" // Stripe's Request-Id of the answer
	StripeKeyKind   = "stripe_key_kind"   // sk_live, rk_test, …: a Stripe secret key sent as a vault key
	Outcome         = "outcome"           // how a settle ended: commit, release, unknown, abandon
	ObjectID        = "object_id"         // the Stripe money object
	Overrun         = "overrun"           // what Stripe moved beyond what was held, in minor units
	Upstream        = "upstream"          // the name of the registered upstream
	SecretLast4     = "secret_last4"      // the last four characters of the upstream secret, never more
	Kind            = "kind"              // forward or lookup: which upstream request
	Note            = "note"              // why a settle happened where it did
	EventID         = "event_id"          // a Stripe event's id (evt_…)
	EventType       = "event_type"        // a Stripe event's type
)

// Attributes of the admin access line.
const (
	Actor       = "actor"        // the admin token's sub, as the audit log records it
	Role        = "role"         // the admin token's role
	AuthFailure = "auth_failure" // why a token or vault key was refused
)

// Duration is the duration_ms attribute of d.
func Duration(d time.Duration) slog.Attr {
	return slog.Float64(DurationMS, float64(d.Microseconds())/1000)
}
