// Package api holds keybrake's HTTP surfaces, built with echo v4: the admin REST API
// (JWT auth, problem+json errors, OpenAPI document) on the admin listener, and the
// agent endpoints plus the mounted Stripe proxy on the proxy listener.
package api

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// AdminConfig configures the admin listener's handler.
type AdminConfig struct {
	Store     *vault.Store
	Logger    *slog.Logger
	JWTSecret []byte
	// PublicURL is the proxy base URL handed out with each minted key (base_url).
	PublicURL string
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// NewAdmin returns the admin listener's handler: /api/v1/*, /healthz.
func NewAdmin(cfg AdminConfig) http.Handler { panic("unimplemented") }

// ProxyConfig configures the proxy listener's handler.
type ProxyConfig struct {
	Store  *vault.Store
	Logger *slog.Logger
	// Stripe serves /v1/* and /v2/* (the metering proxy).
	Stripe http.Handler
	Now    func() time.Time
}

// NewProxyListener returns the proxy listener's handler: /v1/*, /v2/* (Stripe),
// /keybrake/v1/* (agent endpoints), /healthz.
func NewProxyListener(cfg ProxyConfig) http.Handler { panic("unimplemented") }

// Roles a JWT may carry.
const (
	RoleAdmin  = "admin"
	RoleViewer = "viewer"
)

// IssueToken signs an admin-API JWT (HS256, iss keybrake, aud keybrake-admin) for sub
// with role, valid from now for ttl.
func IssueToken(secret []byte, sub, role string, ttl time.Duration, now time.Time) (string, error) {
	panic("unimplemented")
}
