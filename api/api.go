// Package api holds keybrake's HTTP surfaces, built with echo v4: the admin REST API
// (JWT auth, problem+json errors, OpenAPI document) on the admin listener, and the
// agent endpoints plus the mounted Stripe proxy on the proxy listener.
package api

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/vault"
)

// AdminConfig configures the admin listener's handler.
type AdminConfig struct {
	Store     vault.Store
	Logger    *slog.Logger
	JWTSecret []byte
	// PublicURL is the proxy base URL handed out with each minted key (base_url).
	PublicURL string
	// Now is the clock of admin tokens (their expiry); time.Now when nil.
	// Everything about a key — its status, the defaults of a policy — is at
	// the store's clock (vault.Store.Now).
	Now func() time.Time
	// Metrics is what GET /metrics serves: the registry `serve` owns, on which
	// NewMetrics, Metrics.WatchStore and the proxy registered their collectors.
	// Without one /metrics answers an empty exposition.
	Metrics prometheus.Gatherer
	// MaxClockOffset is how far the process's clock may be off the store's
	// (PostgreSQL: the database's) before GET /readyz answers 503; 0 checks
	// nothing.
	MaxClockOffset time.Duration
	// Stripe is the metering proxy, which looks money objects up at Stripe for
	// an operator's refresh (POST /api/v1/keys/{id}/exposures/{object_id}/refresh);
	// without it that route answers 503.
	Stripe *proxy.Proxy
	// Demo says the upstream is keybrake's built-in fake Stripe (serve --demo):
	// the overview and the upstreams say so, and the dashboard shows it on every page.
	Demo bool
	// WebhookAllowPrivate lets webhook endpoints be on loopback, private and
	// link-local addresses (serve --webhook-allow-private).
	WebhookAllowPrivate bool
}

// ProxyConfig configures the proxy listener's handler.
type ProxyConfig struct {
	// Store serves the agent endpoints (/keybrake/v1/*) and, with Stripe, the MCP
	// endpoint (/mcp); without one they are not mounted.
	Store  vault.Store
	Logger *slog.Logger
	// Stripe serves /v1/* and /v2/* (the metering proxy); the MCP endpoint runs
	// its tool calls through it in process.
	Stripe http.Handler
	Now    func() time.Time
	// MaxClockOffset is how far the process's clock may be off the store's
	// (PostgreSQL: the database's) before GET /readyz answers 503; 0 checks
	// nothing.
	MaxClockOffset time.Duration
	// AgentMaxBodyBytes is the agent endpoints' request body limit
	// (DefaultMaxBodyBytes when zero).
	AgentMaxBodyBytes int64
	// Version is the build's version, which the MCP endpoint reports to clients.
	Version string
	// IdempotencyTTL is how long the store replays a completed idempotency
	// record (vault.DefaultIdempotencyTTL when zero): for that long an MCP call
	// repeated without an idempotency_key is a retry, as its result says.
	IdempotencyTTL time.Duration
}

// Roles a JWT may carry.
const (
	RoleAdmin  = "admin"
	RoleViewer = "viewer"
)
