// Command keybrake-bench measures what keybrake costs next to a bare reverse
// proxy, side by side in one run, on loopback.
//
// It starts a fake Stripe (in this process, with an optional added latency), a
// tuned bare httputil.ReverseProxy (this program re-run as a child process) and
// the real `keybrake serve` (the binary built from ./cmd/keybrake, a child
// process, durable store), then drives the two proxies alternately — bare,
// keybrake, bare, keybrake — with C keep-alive connections for D seconds each.
// Every request is a money-moving POST /v1/charges with a unique Idempotency-Key
// under one of the vault keys, whose caps never refuse. It prints, per target and
// concurrency: requests per second, latency percentiles, errors, keybrake's share
// of the bare proxy's throughput, the latency keybrake adds, peak RSS and the size
// of the database after the run (--json for a machine-readable report). At the end
// it checks that what the fake Stripe executed for keybrake is exactly what
// keybrake committed, and exits 1 if not.
//
// Keys, and completed idempotency records that make the database look like one in
// production (--seed-records), are written before keybrake starts, through the
// store's API in this process: a million records through the proxy would take far
// longer than the benchmark.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	if isBareChild() {
		os.Exit(runBareChild(os.Stdin, os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	m := NewMain()
	if err := m.ParseFlags(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(exitOK)
		}
		fmt.Fprintln(os.Stderr, "keybrake-bench:", err)
		os.Exit(exitUsage)
	}
	err := m.Run(ctx)
	if cerr := m.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "keybrake-bench:", err)
		os.Exit(exitError)
	}
}

// Config is the benchmark's configuration.
type Config struct {
	// Concurrency lists the numbers of keep-alive connections to measure with, in
	// order; each is measured against both targets.
	Concurrency []int
	// Duration is how long one target is driven in one round.
	Duration time.Duration
	// Rounds is how many times each target is driven at each concurrency,
	// alternately (bare, keybrake, bare, keybrake…); the figures pool the rounds.
	Rounds int
	// Warmup drives each target this long, unmeasured, before the first round.
	Warmup time.Duration
	// Keys is the number of vault keys; requests go to them in turn.
	Keys int
	// SeedRecords is the number of completed idempotency records (charges, with
	// their holds committed and their events) written through the store before
	// keybrake starts, spread over the keys.
	SeedRecords int
	// UpstreamLatency is added by the fake Stripe to every charge.
	UpstreamLatency time.Duration
	// ResponseBytes pads the fake Stripe's charge to about this size (0: a minimal
	// charge of about 200 bytes; a real Stripe charge is about 3 KB).
	ResponseBytes int
	// Keybrake is a keybrake binary to run; empty: build ./cmd/keybrake with the go
	// command, which needs this module's source.
	Keybrake string
	// LogLevel is keybrake's --log-level (info, serve's default, writes one line
	// per request, to a file in the data directory).
	LogLevel string
	// CPUProfile, when set, is where a CPU profile of keybrake during its first
	// round at the highest concurrency is written (taken through serve's
	// --pprof-listen).
	CPUProfile string
	// TempDir is where the temporary directory with keybrake's data directory
	// goes (os.TempDir() when empty); its file system decides what an fsync costs.
	TempDir string
	// DatabaseURL, when set, names a PostgreSQL server: the benchmark creates a
	// database of its own there (dropped at the end) and measures keybrake on
	// the PostgreSQL store too, through one replica and through Replicas (see
	// postgres.go).
	DatabaseURL string
	// Replicas is how many keybrake replicas share the PostgreSQL store.
	Replicas int
	// Budget mints Keys more keys under one shared budget, in the same stores,
	// and drives them beside the independent keys, target for target, in the
	// same run (see budget.go).
	Budget bool
	// JSON prints the report as JSON instead of a table.
	JSON bool
	// Timeout bounds one request.
	Timeout time.Duration
}

// DefaultConfig returns the defaults of every flag.
func DefaultConfig() Config {
	return Config{
		Concurrency: []int{16, 64},
		Duration:    5 * time.Second,
		Rounds:      2,
		Warmup:      time.Second,
		Keys:        1,
		LogLevel:    "info",
		Replicas:    3,
		Timeout:     30 * time.Second,
	}
}

// Bounds of the flags: the benchmark is bounded in time and in size.
const (
	maxConcurrency   = 4096
	maxKeys          = 1_000_000
	maxSeedRecords   = 100_000_000
	maxResponseBytes = 1 << 20
	maxDuration      = time.Hour
)

// Validate reports a configuration that cannot run.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Concurrency) == 0 {
		errs = append(errs, errors.New("--concurrency: at least one value"))
	}
	for _, n := range c.Concurrency {
		if n < 1 || n > maxConcurrency {
			errs = append(errs, fmt.Errorf("--concurrency %d: must be 1..%d", n, maxConcurrency))
		}
	}
	if c.Duration <= 0 || c.Duration > maxDuration {
		errs = append(errs, fmt.Errorf("--duration %s: must be positive and at most %s", c.Duration, maxDuration))
	}
	if c.Rounds < 1 || c.Rounds > 100 {
		errs = append(errs, fmt.Errorf("--rounds %d: must be 1..100", c.Rounds))
	}
	if c.Warmup < 0 || c.Warmup > maxDuration {
		errs = append(errs, fmt.Errorf("--warmup %s: must be 0..%s", c.Warmup, maxDuration))
	}
	if c.Keys < 1 || c.Keys > maxKeys {
		errs = append(errs, fmt.Errorf("--keys %d: must be 1..%d", c.Keys, maxKeys))
	}
	if c.SeedRecords < 0 || c.SeedRecords > maxSeedRecords {
		errs = append(errs, fmt.Errorf("--seed-records %d: must be 0..%d", c.SeedRecords, maxSeedRecords))
	}
	if c.UpstreamLatency < 0 || c.UpstreamLatency > time.Minute {
		errs = append(errs, fmt.Errorf("--upstream-latency %s: must be 0..1m", c.UpstreamLatency))
	}
	if c.ResponseBytes < 0 || c.ResponseBytes > maxResponseBytes {
		errs = append(errs, fmt.Errorf("--response-bytes %d: must be 0..%d", c.ResponseBytes, maxResponseBytes))
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		errs = append(errs, fmt.Errorf("--keybrake-log-level %q: debug, info, warn or error", c.LogLevel))
	}
	if c.Timeout <= 0 {
		errs = append(errs, errors.New("--timeout must be positive"))
	}
	errs = append(errs, c.validatePostgres()...)
	return errors.Join(errs...)
}

// maxConcurrencyOf is the highest concurrency of the run (the profiled one).
func (c *Config) maxConcurrencyOf() int { return slices.Max(c.Concurrency) }

// intList is a flag.Value for a comma-separated list of integers.
type intList struct{ p *[]int }

func (l intList) String() string {
	if l.p == nil {
		return ""
	}
	s := make([]string, len(*l.p))
	for i, n := range *l.p {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func (l intList) Set(v string) error {
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("%q is not a list of integers", v)
		}
		out = append(out, n)
	}
	*l.p = out
	return nil
}

// Main is the keybrake-bench program: ParseFlags reads the command line, Run
// measures and prints the report, Close stops whatever Run started.
type Main struct {
	Config Config
	// Report is the last run's result, set by Run (even when the check failed).
	Report *Report
	// Stdout receives the report; Stderr progress and problems.
	Stdout io.Writer
	Stderr io.Writer

	bench *bench
}

// NewMain returns a Main with the default configuration on the standard streams.
func NewMain() *Main {
	return &Main{Config: DefaultConfig(), Stdout: os.Stdout, Stderr: os.Stderr}
}

// ParseFlags parses args into m.Config and validates it. It returns flag.ErrHelp
// after printing help.
func (m *Main) ParseFlags(args []string) error {
	c := &m.Config
	fs := flag.NewFlagSet("keybrake-bench", flag.ContinueOnError)
	fs.SetOutput(m.Stderr)
	fs.Usage = func() {
		fmt.Fprint(m.Stderr, "Usage: keybrake-bench [flags]\n\n"+
			"Drives a bare reverse proxy and keybrake serve alternately against a fake Stripe\n"+
			"on loopback and reports keybrake's throughput, added latency, memory and database size.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.Var(intList{&c.Concurrency}, "concurrency", "comma-separated numbers of keep-alive connections to measure with")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "how long each target is driven in each round")
	fs.IntVar(&c.Rounds, "rounds", c.Rounds, "rounds per concurrency: bare, keybrake, bare, keybrake…")
	fs.DurationVar(&c.Warmup, "warmup", c.Warmup, "unmeasured load on each target before the first round")
	fs.IntVar(&c.Keys, "keys", c.Keys, "vault keys; requests are spread over them in turn")
	fs.IntVar(&c.SeedRecords, "seed-records", c.SeedRecords, "completed idempotency records written through the store before keybrake starts")
	fs.DurationVar(&c.UpstreamLatency, "upstream-latency", c.UpstreamLatency, "latency the fake Stripe adds to every charge")
	fs.IntVar(&c.ResponseBytes, "response-bytes", c.ResponseBytes, "pad the fake Stripe's charge to about this many bytes (0: minimal; a real charge is about 3000)")
	fs.StringVar(&c.Keybrake, "keybrake", c.Keybrake, "keybrake binary to run (default: go build ./cmd/keybrake)")
	fs.StringVar(&c.LogLevel, "keybrake-log-level", c.LogLevel, "keybrake's --log-level; its log goes to a file")
	fs.StringVar(&c.CPUProfile, "cpuprofile", c.CPUProfile, "write a CPU profile of keybrake during its first round at the highest concurrency to this file (and of the first PostgreSQL replica of each PostgreSQL target to FILE.TARGET)")
	fs.StringVar(&c.TempDir, "tmp-dir", c.TempDir, "where keybrake's data directory is made (default: the system's temporary directory); use a disk, not tmpfs")
	fs.StringVar(&c.DatabaseURL, "database-url", c.DatabaseURL, "postgres:// URL of a server (its role may create databases): measure keybrake on the PostgreSQL store too, in a database of its own (default: "+envDatabaseURL+")")
	fs.IntVar(&c.Replicas, "replicas", c.Replicas, "keybrake replicas sharing the PostgreSQL store, driven round-robin; measured through one and through all")
	fs.BoolVar(&c.Budget, "budget", c.Budget, "also mint --keys keys under one shared budget and measure them beside the independent keys, on every store")
	fs.BoolVar(&c.JSON, "json", c.JSON, "print the report as JSON")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "timeout of one request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.DatabaseURL == "" {
		c.DatabaseURL = os.Getenv(envDatabaseURL)
	}
	return c.Validate()
}

// lockedWriter serialises writes to w: progress lines come from several
// goroutines and from the bare proxy's stderr.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// errInconsistent is returned by Run when keybrake's store does not account for
// what the fake Stripe executed, or a request failed.
var errInconsistent = errors.New("the run is not consistent")

// Run sets up, measures, checks and prints the report.
func (m *Main) Run(ctx context.Context) error {
	b := &bench{cfg: m.Config, progress: &lockedWriter{w: m.Stderr}}
	m.bench = b
	rep, err := b.run(ctx)
	m.Report = rep
	if err != nil {
		return err
	}
	if m.Config.JSON {
		err = rep.writeJSON(m.Stdout)
	} else {
		err = rep.writeText(m.Stdout)
	}
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if problems := rep.Check.Problems; len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(m.Stderr, "keybrake-bench: INCONSISTENT:", p)
		}
		return fmt.Errorf("%d problems: %w", len(problems), errInconsistent)
	}
	return nil
}

// Close stops the child processes and the fake Stripe and removes the temporary
// directory.
func (m *Main) Close() error {
	if m.bench == nil {
		return nil
	}
	err := m.bench.close()
	m.bench = nil
	return err
}
