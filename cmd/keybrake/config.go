package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/keybrake/keybrake/cmd/internal/loopback"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/postgres"
)

// Config is the configuration of `keybrake serve`. Flags and KEYBRAKE_* environment
// variables fill it (a flag wins over its variable); the fields without a flag are
// for tests and embedders and keep their DefaultConfig values otherwise.
type Config struct {
	// DataDir holds keybrake.db and, in development, the generated secrets.
	DataDir string
	// DatabaseURL, when set (postgres://…), selects the PostgreSQL store, which
	// several replicas may share, instead of bbolt in DataDir.
	DatabaseURL string
	// Listen is the proxy listener's address (Stripe API surface + agent endpoints).
	Listen string
	// AdminListen is the admin API and UI listener's address.
	AdminListen string
	// StripeURL is the upstream base URL; never taken from a request.
	StripeURL string
	// Demo makes the upstream keybrake's built-in fake Stripe (see demo.go).
	Demo bool
	// PublicURL is the proxy base URL handed out with each minted key; derived from
	// the bound proxy address (https when TLS is on) when empty.
	PublicURL string
	// TLSCert and TLSKey, both or neither, serve the proxy listener over TLS.
	TLSCert, TLSKey string
	// AdminTLSCert and AdminTLSKey, both or neither, serve the admin listener over
	// TLS.
	AdminTLSCert, AdminTLSKey string
	// UpstreamTimeout bounds one upstream request.
	UpstreamTimeout time.Duration
	// IdempotencyTTL is how long completed idempotency records replay.
	IdempotencyTTL time.Duration
	// LedgerRetention is how long ledger events are kept; the reaper rolls
	// older ones up into per-window sums.
	LedgerRetention time.Duration
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// LogFormat is json or text.
	LogFormat string

	// ShutdownTimeout bounds how long Close lets in-flight requests finish before it
	// closes their connections.
	ShutdownTimeout time.Duration
	// ReapInterval is how often expired idempotency records and counters are removed.
	ReapInterval time.Duration
	// LeaseMargin is added to UpstreamTimeout for the lease of an in-flight claim, so
	// a claim outlives the request that holds it. With several replicas on one
	// PostgreSQL store it also bounds how long a request a dead replica left in
	// flight waits before a retry resumes it elsewhere.
	LeaseMargin time.Duration
	// OpenTimeout is how long opening the database waits for its file lock: short,
	// so that a second serve on a data directory in use says so at once.
	OpenTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers on both listeners.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request (headers and body) on both listeners.
	ReadTimeout time.Duration
	// AdminWriteTimeout bounds writing an admin response (a streamed backup included).
	AdminWriteTimeout time.Duration
	// IdleTimeout bounds how long a keep-alive connection waits for its next request.
	IdleTimeout time.Duration
	// BootstrapTokenTTL is the lifetime of the admin token printed on first start.
	BootstrapTokenTTL time.Duration
	// TLSReloadCheck is how often, at most, a handshake checks whether the
	// certificate files changed.
	TLSReloadCheck time.Duration
	// MaxClockOffset is how far this process's clock may be off the
	// database's (PostgreSQL) before /readyz fails; 0 checks nothing.
	MaxClockOffset time.Duration
	// ExposureRefreshAfter is how long a money object's exposure stays
	// untouched before the background refresher looks it up at Stripe (0:
	// never).
	ExposureRefreshAfter time.Duration
	// UnsafeClockSkew shifts this process's own clock, for tests of a replica
	// whose clock is wrong: nothing decides a key by it, which is what the
	// tests show. Never set it in production.
	UnsafeClockSkew time.Duration
	// WebhookAllowPrivate lets webhook endpoints be on loopback, private,
	// link-local and metadata addresses, refused otherwise at creation and
	// at every connection.
	WebhookAllowPrivate bool
	// PprofListen, when set, serves Go's profiler (net/http/pprof) on a listener of
	// its own at this loopback address; off ("") by default.
	PprofListen string
}

// DefaultConfig returns the defaults docs/configuration.md documents.
func DefaultConfig() Config {
	return Config{
		DataDir:              "./keybrake-data",
		Listen:               ":8080",
		AdminListen:          "127.0.0.1:8081",
		StripeURL:            "https://api.stripe.com",
		UpstreamTimeout:      80 * time.Second,
		IdempotencyTTL:       24 * time.Hour,
		LedgerRetention:      vault.DefaultLedgerRetention,
		LogLevel:             "info",
		LogFormat:            "json",
		ShutdownTimeout:      90 * time.Second,
		ReapInterval:         5 * time.Minute,
		LeaseMargin:          30 * time.Second,
		OpenTimeout:          500 * time.Millisecond,
		ReadHeaderTimeout:    10 * time.Second,
		ReadTimeout:          60 * time.Second,
		AdminWriteTimeout:    5 * time.Minute,
		IdleTimeout:          120 * time.Second,
		BootstrapTokenTTL:    time.Hour,
		TLSReloadCheck:       5 * time.Second,
		MaxClockOffset:       2 * time.Second,
		ExposureRefreshAfter: time.Hour,
	}
}

// ProxyWriteTimeout is the proxy listener's write timeout. A proxied request may
// make two upstream calls (an amount lookup, then the forward), each bounded by
// UpstreamTimeout, after waiting up to proxy.MaxApprovalWait for an
// approval's decision (Keybrake-Approval-Wait); the margin covers the store's
// group commit and writing the answer back, so the server never cuts a
// response Stripe already gave.
func (c Config) ProxyWriteTimeout() time.Duration {
	return proxy.MaxApprovalWait + 2*c.UpstreamTimeout + c.LeaseMargin
}

// Lease is the lease of an in-flight idempotency claim: longer than one upstream
// request, so a live request is never taken over by a retry.
func (c Config) Lease() time.Duration {
	return c.UpstreamTimeout + c.LeaseMargin
}

// Validate returns every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if strings.TrimSpace(c.DataDir) == "" {
		errs = append(errs, errors.New("data-dir: must not be empty"))
	}
	if err := validateDatabaseURL(c.DatabaseURL); err != nil {
		errs = append(errs, fmt.Errorf("database-url: %w", err))
	}
	for _, a := range []struct{ name, addr string }{{"listen", c.Listen}, {"admin-listen", c.AdminListen}} {
		if _, port, err := net.SplitHostPort(a.addr); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("%s: %q is not host:port", a.name, a.addr))
		}
	}
	if err := validateBaseURL(c.StripeURL); err != nil {
		errs = append(errs, fmt.Errorf("stripe-url: %w", err))
	}
	if c.PublicURL != "" {
		if err := validateBaseURL(c.PublicURL); err != nil {
			errs = append(errs, fmt.Errorf("public-url: %w", err))
		}
	}
	for _, p := range []struct{ flag, cert, key string }{
		{"tls", c.TLSCert, c.TLSKey},
		{"admin-tls", c.AdminTLSCert, c.AdminTLSKey},
	} {
		if (p.cert == "") != (p.key == "") {
			errs = append(errs, fmt.Errorf("--%s-cert and --%s-key: give both or neither", p.flag, p.flag))
		}
	}
	if c.PprofListen != "" {
		if host, _, err := net.SplitHostPort(c.PprofListen); err != nil || !loopback.Host(host) {
			errs = append(errs, fmt.Errorf("pprof-listen: %q must be a loopback host:port (the profiler shows the program's internals)", c.PprofListen))
		}
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("log-level: %w", err))
	}
	if c.MaxClockOffset < 0 {
		errs = append(errs, fmt.Errorf("max-clock-offset: must not be negative, got %s", c.MaxClockOffset))
	}
	if c.ExposureRefreshAfter < 0 {
		errs = append(errs, fmt.Errorf("exposure-refresh-after: must not be negative, got %s", c.ExposureRefreshAfter))
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("log-format: %q is not json or text", c.LogFormat))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"upstream-timeout", c.UpstreamTimeout},
		{"idempotency-ttl", c.IdempotencyTTL},
		{"ledger-retention", c.LedgerRetention},
		{"shutdown-timeout", c.ShutdownTimeout},
		{"reap-interval", c.ReapInterval},
		{"lease margin", c.LeaseMargin},
		{"open timeout", c.OpenTimeout},
		{"read header timeout", c.ReadHeaderTimeout},
		{"read timeout", c.ReadTimeout},
		{"admin write timeout", c.AdminWriteTimeout},
		{"idle timeout", c.IdleTimeout},
		{"bootstrap token ttl", c.BootstrapTokenTTL},
		{"tls reload check", c.TLSReloadCheck},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive, got %s", d.name, d.v))
		}
	}
	return errors.Join(errs...)
}

// validateBaseURL accepts an absolute http(s) URL with a host and nothing after
// the path.
func validateBaseURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("parse %q: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: scheme must be http or https", s)
	}
	if u.Host == "" {
		return fmt.Errorf("%q: no host", s)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q: must not carry user info, query or fragment", s)
	}
	return nil
}

// validateDatabaseURL accepts "" (bbolt) or a postgres:// (postgresql://) URL.
// The error never quotes the URL: it may carry a password.
func validateDatabaseURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("does not parse as a URL (postgres://user:password@host:port/database?sslmode=…)")
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return fmt.Errorf("scheme %q: must be postgres:// or postgresql://", u.Scheme)
	}
	return nil
}

// redactedDatabaseURL is the URL without any of its secrets (the password,
// wherever it is, sslpassword, passfile), for logs and messages.
func redactedDatabaseURL(s string) string { return postgres.RedactURL(s) }

// parseLevel maps a log level name to its slog level.
func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q is not debug, info, warn or error", s)
	}
	return l, nil
}

// bindFlags registers serve's flags on fs, writing into c.
func (c *Config) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory holding keybrake.db (and the generated development secrets)")
	fs.StringVar(&c.DatabaseURL, "database-url", c.DatabaseURL, "postgres://… URL: use the PostgreSQL store, which several replicas may share, instead of bbolt in --data-dir (prefer KEYBRAKE_DATABASE_URL or PGPASSWORD to keep a password off the command line)")
	fs.StringVar(&c.Listen, "listen", c.Listen, "proxy listener address (Stripe API surface)")
	fs.StringVar(&c.AdminListen, "admin-listen", c.AdminListen, "admin API listener address")
	fs.StringVar(&c.StripeURL, "stripe-url", c.StripeURL, "upstream Stripe API base URL")
	fs.BoolVar(&c.Demo, "demo", c.Demo, "try keybrake without a Stripe account: the upstream is a built-in fake Stripe (not Stripe: no money moves), the data directory ./keybrake-demo unless --data-dir")
	fs.StringVar(&c.PublicURL, "public-url", c.PublicURL, "proxy base URL handed out with minted keys (default: derived from --listen; https with --tls-cert)")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM certificate (chain) of the proxy listener; serves TLS 1.2+ (reloaded on SIGHUP or when the file changes)")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM private key of --tls-cert")
	fs.StringVar(&c.AdminTLSCert, "admin-tls-cert", c.AdminTLSCert, "PEM certificate (chain) of the admin listener")
	fs.StringVar(&c.AdminTLSKey, "admin-tls-key", c.AdminTLSKey, "PEM private key of --admin-tls-cert")
	fs.DurationVar(&c.UpstreamTimeout, "upstream-timeout", c.UpstreamTimeout, "timeout of one upstream request")
	fs.DurationVar(&c.IdempotencyTTL, "idempotency-ttl", c.IdempotencyTTL, "how long completed idempotency records replay")
	fs.DurationVar(&c.LedgerRetention, "ledger-retention", c.LedgerRetention, "how long ledger events are kept (older ones are summed per window)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level: debug, info, warn, error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log format: json or text")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "how long in-flight requests may finish on shutdown")
	fs.DurationVar(&c.ReapInterval, "reap-interval", c.ReapInterval, "how often expired idempotency records are removed")
	fs.DurationVar(&c.LeaseMargin, "lease-margin", c.LeaseMargin, "added to --upstream-timeout for the lease of a request in flight: how long a request a dead process left in flight waits before a retry may resume it and the reaper makes it outcome unknown")
	fs.DurationVar(&c.MaxClockOffset, "max-clock-offset", c.MaxClockOffset, "with --database-url: /readyz fails while this replica's clock is further than this off the database's, by which every key is decided (0: no check)")
	fs.DurationVar(&c.ExposureRefreshAfter, "exposure-refresh-after", c.ExposureRefreshAfter, "look a money object's exposure up at Stripe in the background once nobody touched it for this long, at most 5 lookups a second per upstream (0: never)")
	fs.BoolVar(&c.WebhookAllowPrivate, "webhook-allow-private", c.WebhookAllowPrivate, "let webhook endpoints be on loopback, private, link-local and metadata addresses (refused by default)")
	fs.DurationVar(&c.UnsafeClockSkew, "unsafe-clock-skew", c.UnsafeClockSkew, "for tests only: shift this process's own clock (a replica whose clock is wrong)")
	fs.StringVar(&c.PprofListen, "pprof-listen", c.PprofListen, "serve Go's profiler (/debug/pprof/) on this loopback address (default: off)")
}

// envName is the environment variable that backs a flag: KEYBRAKE_ + the flag's
// name in upper case with dashes as underscores.
func envName(flagName string) string {
	return "KEYBRAKE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag of fs named in flagNames (all flags when flagNames is
// nil) that was not given on the command line from its environment variable
// (envName, or the name mapped in flagNames). Empty variables count as unset.
func applyEnv(fs *flag.FlagSet, getenv func(string) string, flagNames map[string]string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		name := envName(f.Name)
		if flagNames != nil {
			mapped, ok := flagNames[f.Name]
			if !ok {
				return
			}
			name = mapped
		}
		v := getenv(name)
		if v == "" {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	})
	return errors.Join(errs...)
}

// derivePublicURL turns a bound listener address into the base URL callers use:
// an unspecified host (":8080", "0.0.0.0:8080", "[::]:8080") becomes localhost;
// the scheme is https when the listener serves TLS.
func derivePublicURL(addr string, tls bool) string { return listenerURL(addr, "localhost", tls) }

// dialableURL turns a bound listener address into a URL this machine can dial:
// an unspecified host becomes 127.0.0.1.
func dialableURL(addr net.Addr, tls bool) string {
	return listenerURL(addr.String(), "127.0.0.1", tls)
}

// listenerURL is the http(s) URL of a listener address, with an unspecified host
// replaced by host.
func listenerURL(addr, host string, tls bool) string {
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	h, port, err := net.SplitHostPort(addr)
	if err != nil {
		return scheme + addr
	}
	if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
		h = host
	}
	return scheme + net.JoinHostPort(h, port)
}
