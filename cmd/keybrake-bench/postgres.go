package main

// keybrake on the PostgreSQL store (--database-url): the benchmark creates a
// database of its own on the server, writes the same keys (and seeded records)
// into it through the store's API as it does for bbolt, starts --replicas
// keybrake serve processes on it, and drives them beside bbolt in the same
// run: one replica alone, then every replica with the requests spread over
// them in turn, as a load balancer would. At the end it stops them, checks
// the store against what the fake Stripe executed, and drops the database.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keybrake/keybrake/vault/postgres"
)

// envDatabaseURL backs --database-url: a URL may carry a password, which a
// flag shows to the other users of the machine.
const envDatabaseURL = "KEYBRAKE_BENCH_DATABASE_URL"

// maxReplicas bounds --replicas.
const maxReplicas = 16

// PostgresInfo describes the PostgreSQL side of a run.
type PostgresInfo struct {
	// Server is the server's version() and the settings that decide what a
	// commit costs.
	Server            string `json:"server"`
	FSync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
	SharedBuffers     string `json:"shared_buffers"`
	// Database is the benchmark's own database, dropped at the end.
	Database string `json:"database"`
	Replicas int    `json:"replicas"`
	// StartSeconds is how long the replicas took to listen, one after another.
	StartSeconds float64 `json:"start_seconds"`
}

// PostgresResult is keybrake on the PostgreSQL store at one concurrency,
// through Replicas replicas, compared with the bare proxy and with keybrake
// on bbolt of the same rounds.
type PostgresResult struct {
	Replicas int `json:"replicas"`
	TargetResult
	// Ratio is its throughput over the bare proxy's; VersusBolt over keybrake
	// on bbolt's.
	Ratio      float64 `json:"throughput_ratio"`
	VersusBolt float64 `json:"throughput_vs_bbolt"`
	AddedP50MS float64 `json:"added_p50_ms"`
	AddedP99MS float64 `json:"added_p99_ms"`
}

// validatePostgres reports the PostgreSQL flags' problems.
func (c *Config) validatePostgres() []error {
	var errs []error
	if c.Replicas < 1 || c.Replicas > maxReplicas {
		errs = append(errs, fmt.Errorf("--replicas %d: must be 1..%d", c.Replicas, maxReplicas))
	}
	if c.DatabaseURL != "" {
		// The message never quotes the URL: it may carry a password.
		if u, err := url.Parse(c.DatabaseURL); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			errs = append(errs, errors.New("--database-url: must be a postgres:// URL"))
		}
	}
	return errs
}

// pgBench is the PostgreSQL side of a run.
type pgBench struct {
	serverURL string // --database-url: the server, and a database to connect to
	name      string // the benchmark's own database
	url       string // its URL
	setup     storeSetup
	tokens    []string
	replicas  []*keybrakeChild
}

// budgetTokens are the "Bearer vk_…" of the keys under the budget, on bbolt
// and on PostgreSQL (nil without --budget or --database-url).
func (b *bench) budgetTokens() (bolt, pg []string) {
	for _, t := range b.setup.budgetTokens {
		bolt = append(bolt, "Bearer "+t)
	}
	if b.pg != nil {
		for _, t := range b.pg.setup.budgetTokens {
			pg = append(pg, "Bearer "+t)
		}
	}
	return bolt, pg
}

// pgSecret is keybrake's upstream secret at the fake Stripe when it runs on
// PostgreSQL, tallied apart from bbolt's.
func (b *bench) pgSecret() string {
	return "sk_test_postgres_" + strings.TrimPrefix(b.kbSecret, "sk_test_keybrake_")
}

// startPostgres creates the benchmark's database, writes its keys and
// records, and starts the replicas; nothing without --database-url.
func (b *bench) startPostgres(ctx context.Context, rep *Report, bin, stripeURL string) error {
	cfg := b.cfg
	if cfg.DatabaseURL == "" {
		return nil
	}
	pg := &pgBench{serverURL: cfg.DatabaseURL, name: "keybrake_" + strings.ReplaceAll(b.runID, "-", "_")}
	b.pg = pg
	info, err := pg.createDatabase(ctx)
	if err != nil {
		return err
	}
	info.Replicas, info.Database = cfg.Replicas, pg.name
	rep.Postgres = info
	fmt.Fprintf(b.progress, "postgres: database %s on %s; writing %d keys and %d records through the store…\n",
		pg.name, info.Server, cfg.Keys, cfg.SeedRecords)
	s, err := postgres.Open(ctx, pg.url, postgres.Options{MasterKey: b.secrets.masterKey, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	pg.setup, err = fillStore(ctx, s, storeOptions{
		masterKey: b.secrets.masterKey, secret: b.pgSecret(), keys: cfg.Keys, records: cfg.SeedRecords, budget: cfg.Budget,
		body:     func(n int64) []byte { return []byte(chargeJSON(n, chargeAmount, b.fake.pad)) },
		progress: b.progress,
	})
	if cerr := s.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return fmt.Errorf("postgres: prepare the store: %w", err)
	}
	for _, t := range pg.setup.tokens {
		pg.tokens = append(pg.tokens, "Bearer "+t)
	}
	started := time.Now()
	for i := range cfg.Replicas {
		dir := filepath.Join(b.dir, fmt.Sprintf("postgres-%d", i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("postgres: replica directory: %w", err)
		}
		r, err := startKeybrake(ctx, bin, dir, stripeURL, cfg.LogLevel, b.secrets, cfg.CPUProfile != "" && i == 0, "KEYBRAKE_DATABASE_URL="+pg.url)
		if r != nil {
			pg.replicas = append(pg.replicas, r)
		}
		if err != nil {
			return fmt.Errorf("postgres: replica %d: %w", i, err)
		}
	}
	info.StartSeconds = round3(time.Since(started).Seconds())
	return nil
}

// createDatabase creates the benchmark's database on the server and reads
// what the report says of the server.
func (pg *pgBench) createDatabase(ctx context.Context) (*PostgresInfo, error) {
	u, err := url.Parse(pg.serverURL)
	if err != nil {
		return nil, errors.New("postgres: --database-url does not parse")
	}
	conn, err := pgx.Connect(ctx, pg.serverURL)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect to %s: %w", postgres.RedactURL(u.String()), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	info := &PostgresInfo{}
	err = conn.QueryRow(ctx, "SELECT 'PostgreSQL ' || current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit'), current_setting('shared_buffers')").
		Scan(&info.Server, &info.FSync, &info.SynchronousCommit, &info.SharedBuffers)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{pg.name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("postgres: create database %s (the role needs CREATEDB): %w", pg.name, err)
	}
	u.Path, u.RawPath = "/"+pg.name, ""
	pg.url = u.String()
	return info, nil
}

// close stops the replicas still running and drops the database.
func (pg *pgBench) close() error {
	errs := pg.stopReplicas()
	if pg.url == "" {
		return errors.Join(errs...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.serverURL)
	if err == nil {
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{pg.name}.Sanitize()+" WITH (FORCE)")
		_ = conn.Close(ctx)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("postgres: drop database %s: %w", pg.name, err))
	}
	pg.url = ""
	return errors.Join(errs...)
}

// stopReplicas stops the replicas gracefully.
func (pg *pgBench) stopReplicas() []error {
	var errs []error
	for _, r := range pg.replicas {
		if err := r.stop(); err != nil {
			errs = append(errs, fmt.Errorf("postgres: %w", err))
		}
	}
	pg.replicas = nil
	return errs
}

// postgresTargets are keybrake on PostgreSQL through its first replica and,
// with more than one, through all of them.
func (b *bench) postgresTargets() []target {
	if b.pg == nil {
		return nil
	}
	counts := []int{1}
	if n := len(b.pg.replicas); n > 1 {
		counts = append(counts, n)
	}
	var out []target
	for _, n := range counts {
		t := target{name: fmt.Sprintf("postgres-x%d", n), tokens: b.pg.tokens}
		for _, r := range b.pg.replicas[:n] {
			t.urls, t.pids, t.kbs = append(t.urls, r.url), append(t.pids, r.pid()), append(t.kbs, r)
		}
		out = append(out, t)
	}
	return out
}

// postgresResults compares the PostgreSQL targets' pooled rounds with the
// bare proxy's and with keybrake's on bbolt.
func postgresResults(targets []target, results []TargetResult, bare, bolt TargetResult) []PostgresResult {
	var out []PostgresResult
	for i, t := range targets {
		r := PostgresResult{Replicas: len(t.pids), TargetResult: results[i],
			AddedP50MS: round3(results[i].P50MS - bare.P50MS), AddedP99MS: round3(results[i].P99MS - bare.P99MS)}
		if bare.RPS > 0 {
			r.Ratio = round3(r.RPS / bare.RPS)
		}
		if bolt.RPS > 0 {
			r.VersusBolt = round3(r.RPS / bolt.RPS)
		}
		out = append(out, r)
	}
	return out
}

// checkPostgres stops the replicas, reads what the store committed and
// compares it with what the fake Stripe executed for it, as check does for
// bbolt.
func (b *bench) checkPostgres(ctx context.Context, k *CheckResult) error {
	pg := b.pg
	if pg == nil {
		return nil
	}
	answered := 0
	for _, target := range b.postgresTargets() {
		answered += b.ok[target.name] + b.ok[target.name+budgetSuffix]
	}
	if errs := pg.stopReplicas(); len(errs) > 0 {
		return errors.Join(errs...)
	}
	s, err := postgres.Open(ctx, pg.url, postgres.Options{MasterKey: b.secrets.masterKey, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fmt.Errorf("postgres: read keybrake's totals: %w", err)
	}
	totals, err := sumTotals(ctx, s, pg.setup.keyIDs)
	if cerr := s.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return fmt.Errorf("postgres: read keybrake's totals: %w", err)
	}
	t := b.fake.tally(b.pgSecret())
	c := &CheckResult{StripeCharges: t.charges.Load(), StripeAmount: t.amount.Load(), SeededAmount: pg.setup.seeded,
		Committed: totals.Committed, Held: totals.Held, Answered200: answered}
	c.Problems = c.consistency()
	k.Postgres = c
	for _, p := range c.Problems {
		k.Problems = append(k.Problems, "on PostgreSQL: "+p)
	}
	return nil
}

// readMems sums the memory figures of pids.
func readMems(pids []int) (memStats, error) {
	var sum memStats
	for _, pid := range pids {
		m, err := readMem(pid)
		if err != nil {
			return memStats{}, err
		}
		sum.PeakRSS, sum.RSS, sum.RSSAnon, sum.RSSFile = sum.PeakRSS+m.PeakRSS, sum.RSS+m.RSS, sum.RSSAnon+m.RSSAnon, sum.RSSFile+m.RSSFile
	}
	return sum, nil
}

// writePostgresText prints keybrake on PostgreSQL beside the bare proxy and
// keybrake on bbolt.
func (r *Report) writePostgresText(w io.Writer) error {
	if r.Postgres == nil {
		return nil
	}
	p := r.Postgres
	fmt.Fprintf(w, "keybrake on PostgreSQL (%s; fsync %s, synchronous_commit %s, shared_buffers %s), %d replicas, started in %.2fs; "+
		"CPU/request counts keybrake's processes, not the server's\n",
		p.Server, p.FSync, p.SynchronousCommit, p.SharedBuffers, p.Replicas, p.StartSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "conns\ttarget\treq/s\tp50\tp99\tp99.9\terrors\tCPU/request\tvs bare\tvs bbolt\tadded p50\tadded p99\tcommits/s\treq/s by round\t")
	for _, cr := range r.Results {
		fmt.Fprintf(tw, "%d\tbbolt\t%.0f\t%s\t%s\t%s\t%d\t%.0fµs\t%.3f\t1\t%+.2fms\t%+.2fms\t%.0f\t%s\t\n", cr.Concurrency,
			cr.Keybrake.RPS, fmtMS(cr.Keybrake.P50MS), fmtMS(cr.Keybrake.P99MS), fmtMS(cr.Keybrake.P999MS), cr.Keybrake.Errors,
			cr.Keybrake.CPUPerRequestUS, cr.Ratio, cr.AddedP50MS, cr.AddedP99MS, cr.Keybrake.CommitsPerSecond, roundRates(cr.Keybrake.Rounds))
		for _, pr := range cr.Postgres {
			fmt.Fprintf(tw, "%d\tpostgres ×%d\t%.0f\t%s\t%s\t%s\t%d\t%.0fµs\t%.3f\t%.3f\t%+.2fms\t%+.2fms\t%.0f\t%s\t\n", cr.Concurrency,
				pr.Replicas, pr.RPS, fmtMS(pr.P50MS), fmtMS(pr.P99MS), fmtMS(pr.P999MS), pr.Errors, pr.CPUPerRequestUS,
				pr.Ratio, pr.VersusBolt, pr.AddedP50MS, pr.AddedP99MS, pr.CommitsPerSecond, roundRates(pr.Rounds))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if k := r.Check.Postgres; k != nil {
		fmt.Fprintf(w, "check on PostgreSQL: the fake Stripe executed %d charges (%s usd) for it, which answered %d of them 200; "+
			"committed %s usd (%s seeded), %s held\n",
			k.StripeCharges, usd(k.StripeAmount), k.Answered200, usd(k.Committed), usd(k.SeededAmount), usd(k.Held))
	}
	_, err := fmt.Fprintln(w)
	return err
}
