// Package proxy is keybrake's metering proxy in front of Stripe's API: Proxy is
// an http.Handler that serves Stripe's /v1/* and /v2/* byte for byte to callers
// that hold a vault key instead of a Stripe secret.
//
// For each request it authenticates the vault key, reads the request exactly as
// Stripe will (package stripeapi), authorises it against the key's policy, takes
// its idempotency key, works out the amount it can move, and claims the key and
// places the hold in one vault.Store.Reserve — or refuses, before anything is
// forwarded, with a Stripe-shaped error that writeStripeError alone writes. It
// then forwards with httputil.ReverseProxy (the upstream's real secret, an
// idempotency key derived for Stripe), settles the hold in one vault.Store.Settle
// from Stripe's answer or its absence, and writes one canonical log line and its
// metrics. Each step is a file, in the order prepare runs them.
//
// docs/ARCHITECTURE.md follows a request through the steps and says how
// Stripe's answers settle a hold; docs/proxy-errors.md lists every refusal
// and docs/metering.md what is metered.
package proxy

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// Defaults of Config.
const (
	DefaultUpstreamTimeout  = 80 * time.Second
	DefaultMaxBodyBytes     = 1 << 20
	DefaultMaxResponseBytes = 16 << 20
	DefaultSecretCacheTTL   = 5 * time.Second
)

// RecommendedLease is the bolt.Options.Lease to use with an upstream timeout: a
// claim must outlive the upstream request it covers plus its Settle, or a retry
// could take it over (Resume) while the first attempt is still waiting for Stripe.
// Amount lookups run before the claim and do not count.
func RecommendedLease(upstreamTimeout time.Duration) time.Duration {
	return upstreamTimeout + settleTimeout
}

// Config configures the proxy.
type Config struct {
	// Store is the vault. Required.
	Store vault.Store
	// Upstream is Stripe's base URL (https://api.stripe.com); never taken from a request.
	Upstream *url.URL
	// UpstreamTimeout bounds one upstream request (default 80s).
	UpstreamTimeout time.Duration
	// Transport overrides the upstream transport (tests); cloned from
	// http.DefaultTransport with explicit timeouts when nil.
	Transport http.RoundTripper
	// Logger receives the canonical line of every request; slog.Default() when nil.
	Logger *slog.Logger
	// Now is the clock of the request's timing and of the secret cache;
	// time.Now when nil. Whether a key is expired or not yet valid is decided
	// at the store's clock (vault.Store.Now), as every decision about a key.
	Now func() time.Time
	// MaxBodyBytes is the largest request body read (default 1 MiB); larger is 413.
	MaxBodyBytes int64
	// MaxResponseBytes is the largest Stripe answer buffered for replay (default
	// 16 MiB); a larger answer to a recorded request settles as outcome unknown.
	MaxResponseBytes int64
	// SecretCacheTTL is how long an unsealed upstream secret is reused (default
	// 5s), and only for keys authenticated with the upstream version it was
	// read under (vault.Key.UpstreamVersion), so a replaced secret is used from
	// the next request on; negative disables the cache. A store that keeps its secrets in
	// memory itself, forgetting them on every change (vault.SecretKeeper:
	// bbolt), is asked every time instead, so that a new secret is used from
	// the next request on.
	SecretCacheTTL time.Duration
	// Registerer receives the proxy's Prometheus collectors (see metrics.go); when
	// nil they count but are exposed nowhere.
	Registerer prometheus.Registerer
	// ApprovalPoll is how often a request that waits for an approval's
	// decision reads it from the store (default DefaultApprovalPoll).
	ApprovalPoll time.Duration
}

// DefaultConfig returns a Config with every default filled in except Store and
// Upstream (which point at https://api.stripe.com).
func DefaultConfig() Config {
	u, _ := url.Parse("https://api.stripe.com")
	return Config{
		Upstream:         u,
		UpstreamTimeout:  DefaultUpstreamTimeout,
		MaxBodyBytes:     DefaultMaxBodyBytes,
		MaxResponseBytes: DefaultMaxResponseBytes,
		SecretCacheTTL:   DefaultSecretCacheTTL,
	}
}

// Validate reports a Config that cannot work: no store, an upstream that is not
// an absolute http(s) URL without query or fragment, negative limits.
func (c *Config) Validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("store is required"))
	}
	if c.Upstream == nil {
		errs = append(errs, errors.New("upstream URL is required"))
	} else if (c.Upstream.Scheme != "http" && c.Upstream.Scheme != "https") || c.Upstream.Host == "" ||
		c.Upstream.RawQuery != "" || c.Upstream.Fragment != "" || c.Upstream.User != nil {
		errs = append(errs, fmt.Errorf("upstream URL %q must be http(s)://host[:port][/path] without query, fragment or user", c.Upstream.Redacted()))
	}
	if c.UpstreamTimeout < 0 || c.MaxBodyBytes < 0 || c.MaxResponseBytes < 0 {
		errs = append(errs, errors.New("timeouts and limits must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("proxy config: %w", err)
	}
	return nil
}

// Proxy serves Stripe's API surface (/v1/*, /v2/*) with metering. It is an
// http.Handler, safe for concurrent use.
type Proxy struct {
	store       vault.Store
	upstream    *url.URL
	timeout     time.Duration
	maxBody     int64
	maxResponse int64
	log         *slog.Logger
	now         func() time.Time
	rp          *httputil.ReverseProxy
	lookups     *http.Client
	secrets     secretCache
	metrics     *metrics
	unknown     unknownRefusals
	// approvalPoll: see Config.ApprovalPoll.
	approvalPoll time.Duration
	refusals     pendingRefusals
}

var _ http.Handler = (*Proxy)(nil)

// New builds a Proxy. Zero fields of cfg take the defaults of DefaultConfig.
func New(cfg Config) (*Proxy, error) {
	def := DefaultConfig()
	if cfg.Upstream == nil {
		cfg.Upstream = def.Upstream
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = def.UpstreamTimeout
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = def.MaxBodyBytes
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = def.MaxResponseBytes
	}
	if cfg.SecretCacheTTL == 0 {
		cfg.SecretCacheTTL = def.SecretCacheTTL
	}
	if k, ok := cfg.Store.(vault.SecretKeeper); ok && k.KeepsSecrets() {
		cfg.SecretCacheTTL = -1
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("proxy metrics: %w", err)
	}
	up := *cfg.Upstream
	p := &Proxy{
		store:       cfg.Store,
		upstream:    &up,
		timeout:     cfg.UpstreamTimeout,
		maxBody:     cfg.MaxBodyBytes,
		maxResponse: cfg.MaxResponseBytes,
		log:         cfg.Logger.With(logfield.Component, "proxy"),
		now:         cfg.Now,
		secrets:     secretCache{ttl: cfg.SecretCacheTTL, entries: map[string]cachedSecret{}},
		metrics:     m,
	}
	p.approvalPoll = cmp.Or(cfg.ApprovalPoll, DefaultApprovalPoll)
	p.unknown.Since = p.now()
	p.refusals.interval, p.refusals.byKey = refusalFlushInterval, map[string]vault.KeyRefusal{}
	transport := cfg.Transport
	if transport == nil {
		transport = newTransport(cfg.UpstreamTimeout)
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      newTimedTransport(transport, upstreamForward, m),
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		BufferPool:     newBufferPool(),
		ErrorLog:       slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
	p.lookups = &http.Client{
		Transport: newTimedTransport(transport, upstreamLookup, m),
		Timeout:   cfg.UpstreamTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return p, nil
}

// ServeHTTP implements http.Handler: the whole pipeline of the package
// documentation for one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := &call{start: p.now(), began: time.Now(), requestID: newRequestID(), method: r.Method,
		tool: ToolFromContext(r.Context())}
	defer p.logCall(c)
	r = r.WithContext(withCall(r.Context(), c)) // amount lookups add their wait to c
	if err := p.prepare(r.Context(), w, r, c); err != nil {
		p.writeRefusal(w, c, err)
		return
	}
	if c.replay != nil {
		p.writeReplay(r.Context(), w, c)
		return
	}
	p.forward(w, r, c)
}
