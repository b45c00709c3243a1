// Command keybrake-load measures the throughput and latency of metered charges
// through a real keybrake, bounded in time and count, on loopback only.
//
// By default (--self) it starts, in this process, a minimal fake Stripe and the real
// keybrake pieces wired as `keybrake serve` wires them (vault store, metering proxy,
// proxy and admin listeners) on 127.0.0.1, mints a vault key with a period cap, runs
// the load and then checks that the fake Stripe moved no more than the cap and that
// keybrake metered everything that moved. With --proxy-url and --vault-key it loads
// a running keybrake instead. A broken invariant is reported loudly and exits 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/keybrake/keybrake/cmd/internal/loopback"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	m := NewMain()
	if err := m.ParseFlags(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(exitOK)
		}
		fmt.Fprintln(os.Stderr, "keybrake-load:", err)
		os.Exit(exitUsage)
	}
	err := m.Run(ctx)
	if cerr := m.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "keybrake-load:", err)
		os.Exit(exitError)
	}
}

// Config is the load generator's configuration.
type Config struct {
	// Self starts a fake Stripe and an in-process keybrake (the default when
	// ProxyURL is empty).
	Self bool
	// ProxyURL and VaultKey name a running keybrake and a key to load it with.
	ProxyURL string
	VaultKey string
	// Concurrency is the number of callers, each with one request in flight.
	Concurrency int
	// Duration bounds the run (0: only Requests does).
	Duration time.Duration
	// Requests bounds the number of charges, each with a fresh idempotency key;
	// retries come on top (0: only Duration does).
	Requests int
	// Amount is each charge's amount in minor units of usd.
	Amount int64
	// RetryRatio is the fraction of charges sent a second time with the same
	// idempotency key once the first answer is in.
	RetryRatio float64
	// Cap is the self-minted key's period cap in minor units (0: practically none).
	Cap int64
	// Timeout bounds one HTTP request.
	Timeout time.Duration
	// UnsafeAllowRemote permits a ProxyURL that is not a loopback address.
	UnsafeAllowRemote bool
}

// noCap is the period cap minted when Config.Cap is 0: ten billion dollars.
const noCap = 1_000_000_000_000

// DefaultConfig returns the defaults of every flag.
func DefaultConfig() Config {
	return Config{
		Concurrency: 64,
		Duration:    10 * time.Second,
		Amount:      100,
		RetryRatio:  0.1,
		Timeout:     30 * time.Second,
	}
}

// Validate reports a configuration that cannot run.
func (c *Config) Validate() error {
	switch {
	case c.Self && c.ProxyURL != "":
		return errors.New("--self and --proxy-url exclude each other")
	case !c.Self && c.VaultKey == "":
		return errors.New("--proxy-url needs --vault-key")
	case c.Self && c.VaultKey != "":
		return errors.New("--vault-key needs --proxy-url (self mode mints its own key)")
	case !c.Self && c.Cap != 0:
		return errors.New("--cap applies to self mode only (the key's policy sets the cap)")
	case c.Concurrency < 1:
		return fmt.Errorf("--concurrency %d: must be at least 1", c.Concurrency)
	case c.Duration < 0 || c.Requests < 0:
		return errors.New("--duration and --requests must not be negative")
	case c.Duration == 0 && c.Requests == 0:
		return errors.New("--duration and --requests are both 0: the run would not end")
	case c.Amount < 1 || c.Amount > 99_999_999:
		return fmt.Errorf("--amount %d: must be 1..99999999 minor units", c.Amount)
	case c.RetryRatio < 0 || c.RetryRatio > 1:
		return fmt.Errorf("--retry-ratio %g: must be within [0, 1]", c.RetryRatio)
	case c.Cap < 0:
		return fmt.Errorf("--cap %d: must not be negative", c.Cap)
	case c.Timeout <= 0:
		return errors.New("--timeout must be positive")
	}
	if c.Self {
		return nil
	}
	u, err := url.Parse(c.ProxyURL)
	if err != nil {
		return fmt.Errorf("--proxy-url: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--proxy-url %q: must be an absolute http(s) URL", c.ProxyURL)
	}
	if !loopback.Host(u.Hostname()) && !c.UnsafeAllowRemote {
		return fmt.Errorf("--proxy-url %q is not a loopback address: refusing to load it without --unsafe-allow-remote", c.ProxyURL)
	}
	return nil
}

// Main is the keybrake-load program: ParseFlags reads the command line, Run starts
// the target (in self mode), runs the load and prints the summary, Close stops
// what Run started.
type Main struct {
	Config Config
	// Summary is the last run's result, set by Run.
	Summary Summary
	// Stdout receives the summary; Stderr usage, keybrake's errors and violations.
	Stdout io.Writer
	Stderr io.Writer

	self *selfTarget
}

// NewMain returns a Main with the default configuration on the standard streams.
func NewMain() *Main {
	return &Main{Config: DefaultConfig(), Stdout: os.Stdout, Stderr: os.Stderr}
}

// ParseFlags parses args into m.Config and validates it. It returns flag.ErrHelp
// after printing help.
func (m *Main) ParseFlags(args []string) error {
	c := &m.Config
	fs := flag.NewFlagSet("keybrake-load", flag.ContinueOnError)
	fs.SetOutput(m.Stderr)
	fs.Usage = func() {
		fmt.Fprint(m.Stderr, "Usage: keybrake-load [--self | --proxy-url URL --vault-key vk_...] [flags]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.BoolVar(&c.Self, "self", c.Self, "run against an in-process keybrake and fake Stripe (the default without --proxy-url)")
	fs.StringVar(&c.ProxyURL, "proxy-url", c.ProxyURL, "base URL of a running keybrake proxy listener")
	fs.StringVar(&c.VaultKey, "vault-key", c.VaultKey, "vault key (vk_...) to charge with, with --proxy-url")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "concurrent callers")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "how long to run (0: until --requests)")
	fs.IntVar(&c.Requests, "requests", c.Requests, "charges to send, each with a fresh idempotency key; retries on top (0: until --duration)")
	fs.Int64Var(&c.Amount, "amount", c.Amount, "amount of each charge in minor units of usd")
	fs.Float64Var(&c.RetryRatio, "retry-ratio", c.RetryRatio, "fraction of charges retried with the same Idempotency-Key")
	fs.Int64Var(&c.Cap, "cap", c.Cap, "self mode: the vault key's period cap in minor units (0: practically none)")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "timeout of one HTTP request")
	fs.BoolVar(&c.UnsafeAllowRemote, "unsafe-allow-remote", c.UnsafeAllowRemote, "allow a --proxy-url that is not a loopback address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.ProxyURL == "" {
		c.Self = true
	}
	return c.Validate()
}

// errViolation is returned by Run when an invariant broke.
var errViolation = errors.New("invariant violated")

// Run runs the load and prints the summary to Stdout. It returns an error wrapping
// errViolation when the summary shows a broken invariant.
func (m *Main) Run(ctx context.Context) error {
	cfg := m.Config
	target, key, mode := cfg.ProxyURL, cfg.VaultKey, "external "+cfg.ProxyURL
	if cfg.Self {
		capMinor := cfg.Cap
		if capMinor == 0 {
			capMinor = noCap
		}
		st, err := startSelf(ctx, capMinor, m.Stderr)
		m.self = st // Close stops whatever started, even on error
		if err != nil {
			return fmt.Errorf("start self target: %w", err)
		}
		target, key, mode = st.proxyURL, st.vaultKey, "self (in-process keybrake, fake Stripe)"
	}
	s, err := runLoad(ctx, cfg, target, key)
	if err != nil {
		return err
	}
	s.Mode = mode
	if m.self != nil {
		// An interrupt ends the load, not the check of what it did.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := m.self.check(cctx, &s)
		cancel()
		if err != nil {
			return err
		}
	}
	m.Summary = s
	s.print(m.Stdout, cfg)
	if len(s.Violations) > 0 {
		for _, v := range s.Violations {
			fmt.Fprintln(m.Stderr, "keybrake-load: VIOLATION:", v)
		}
		return fmt.Errorf("%d problems: %w", len(s.Violations), errViolation)
	}
	return nil
}

// Close stops the self target, if any, and removes its data directory.
func (m *Main) Close() error {
	if m.self == nil {
		return nil
	}
	err := m.self.Close()
	m.self = nil
	return err
}
