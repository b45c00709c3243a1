// Package proxy is keybrake's Stripe-facing request pipeline: the strict form parser,
// the Stripe operation catalogue, idempotency handling, the metering reverse proxy
// and Stripe-shaped errors.
package proxy

import (
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// Config configures the proxy.
type Config struct {
	Store *vault.Store
	// Upstream is Stripe's base URL (https://api.stripe.com); never taken from a request.
	Upstream *url.URL
	// UpstreamTimeout bounds one upstream request (default 80s).
	UpstreamTimeout time.Duration
	// Transport overrides the upstream transport (tests); cloned from
	// http.DefaultTransport with explicit timeouts when nil.
	Transport http.RoundTripper
	Logger    *slog.Logger
	Now       func() time.Time
}

// Proxy serves Stripe's API surface (/v1/*, /v2/*) with metering.
type Proxy struct{}

// New builds a Proxy.
func New(cfg Config) (*Proxy, error) { panic("unimplemented") }

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { panic("unimplemented") }
