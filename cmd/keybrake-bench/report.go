package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keybrake/keybrake/policy"
)

// Report is what one benchmark run measured; --json prints it as is.
type Report struct {
	Machine Machine      `json:"machine"`
	Config  ReportConfig `json:"config"`
	Results []ConcResult `json:"results"`
	Setup   SetupResult  `json:"setup"`
	// Postgres describes the PostgreSQL server and replicas (--database-url).
	Postgres *PostgresInfo `json:"postgres,omitempty"`
	Check    CheckResult   `json:"check"`
	Notes    []string      `json:"notes,omitempty"`
	Profile  string        `json:"cpu_profile,omitempty"`
	Started  time.Time     `json:"started"`
}

// Machine describes where the run happened, and how busy it was: the load
// average and pressure before the run are other work; at its end they include
// the benchmark's own processes.
type Machine struct {
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"go_version"`
	Platform   string `json:"platform"`
	// FileSystem holds keybrake's database.
	FileSystem   string `json:"file_system,omitempty"`
	LoadAvgStart string `json:"loadavg_start,omitempty"`
	LoadAvgEnd   string `json:"loadavg_end,omitempty"`
	// PressureStart and PressureEnd: the share of the minute before in which
	// tasks waited for a CPU and for I/O.
	PressureStart string `json:"pressure_start,omitempty"`
	PressureEnd   string `json:"pressure_end,omitempty"`
}

// ReportConfig is the configuration the run used.
type ReportConfig struct {
	Concurrency       []int   `json:"concurrency"`
	DurationSeconds   float64 `json:"duration_seconds"`
	Rounds            int     `json:"rounds"`
	WarmupSeconds     float64 `json:"warmup_seconds"`
	Keys              int     `json:"keys"`
	Budget            bool    `json:"budget,omitempty"`
	SeedRecords       int     `json:"seed_records"`
	UpstreamLatencyMS float64 `json:"upstream_latency_ms"`
	ResponseBytes     int     `json:"response_bytes"`
	KeybrakeLogLevel  string  `json:"keybrake_log_level"`
}

// ConcResult compares the two targets at one concurrency.
type ConcResult struct {
	Concurrency int          `json:"concurrency"`
	Bare        TargetResult `json:"bare"`
	Keybrake    TargetResult `json:"keybrake"`
	// Postgres is keybrake on the PostgreSQL store, through one replica and
	// through all (--database-url).
	Postgres []PostgresResult `json:"postgres,omitempty"`
	// Budget is the keys under one budget beside the independent keys, on
	// each store (--budget).
	Budget []BudgetResult `json:"budget,omitempty"`
	// Ratio is keybrake's throughput over the bare proxy's.
	Ratio float64 `json:"throughput_ratio"`
	// AddedP50MS and AddedP99MS are keybrake's latency percentiles minus the bare
	// proxy's.
	AddedP50MS float64 `json:"added_p50_ms"`
	AddedP99MS float64 `json:"added_p99_ms"`
	// DBBytes is the database file's size after keybrake's last round at this
	// concurrency; DBGrowthPerRequest its growth over these rounds per request
	// (bbolt grows the file in steps of many pages, so short runs read coarse).
	DBBytes            int64   `json:"db_bytes"`
	DBGrowthPerRequest float64 `json:"db_growth_bytes_per_request"`
}

// TargetResult is one target's rounds at one concurrency, pooled.
type TargetResult struct {
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	RPS      float64 `json:"rps"`
	P50MS    float64 `json:"p50_ms"`
	P99MS    float64 `json:"p99_ms"`
	P999MS   float64 `json:"p99_9_ms"`
	// CPUPerRequestUS is the target process's CPU time per request, in µs.
	CPUPerRequestUS float64 `json:"cpu_per_request_us"`
	// WrittenPerRequest is what the process wrote to storage per request, in
	// bytes (for keybrake: the pages of its commits, the log).
	WrittenPerRequest float64 `json:"written_per_request_bytes"`
	// CommitsPerSecond and OpsPerCommit describe keybrake's group commit: its
	// write transactions (each with its fsyncs) and how many operations (a
	// Reserve or a Settle each) share one.
	CommitsPerSecond float64 `json:"store_commits_per_second,omitempty"`
	OpsPerCommit     float64 `json:"store_ops_per_commit,omitempty"`
	// PeakRSS is the largest VmHWM of the process over these rounds (reset before
	// each round where the kernel allows, else the peak since it started).
	PeakRSS int64         `json:"peak_rss_bytes"`
	Mem     memStats      `json:"memory_after"`
	Rounds  []roundResult `json:"rounds"`
	ok      int
}

// memStats is a process's memory from /proc/PID/status, in bytes. RSSFile is
// file pages mapped into the process: for keybrake mostly its database.
type memStats struct {
	PeakRSS int64 `json:"peak_rss"`
	RSS     int64 `json:"rss"`
	RSSAnon int64 `json:"rss_anon"`
	RSSFile int64 `json:"rss_file"`
}

// SetupResult is what the offline setup wrote.
type SetupResult struct {
	Keys               int     `json:"keys"`
	SeedRecords        int     `json:"seed_records"`
	SeedSeconds        float64 `json:"seed_seconds"`
	DBBytesAfterSeed   int64   `json:"db_bytes_after_seed"`
	DBBytesAfterWarmup int64   `json:"db_bytes_after_warmup"`
	// KeybrakeStartSeconds is how long serve took to listen (opening the store
	// includes recovering the records left in flight).
	KeybrakeStartSeconds float64 `json:"keybrake_start_seconds"`
}

// CheckResult compares what the fake Stripe executed with what keybrake's store
// committed, after keybrake stopped. Amounts in minor units of usd.
type CheckResult struct {
	StripeCharges int64 `json:"stripe_charges"`
	StripeAmount  int64 `json:"stripe_amount"`
	Answered200   int   `json:"keybrake_200"`
	SeededAmount  int64 `json:"seeded_amount"`
	Committed     int64 `json:"committed"`
	Held          int64 `json:"held"`
	BareCharges   int64 `json:"bare_stripe_charges"`
	Bare200       int   `json:"bare_200"`
	// Problems lists every inconsistency and failed request; a run with any exits 1.
	Problems []string `json:"problems"`
	// Postgres is the same check of keybrake on PostgreSQL (its bare fields
	// unused; its problems are in Problems too).
	Postgres *CheckResult `json:"postgres,omitempty"`
}

// pool merges rounds into one TargetResult.
func pool(rounds []roundResult) TargetResult {
	var t TargetResult
	var lat []time.Duration
	var elapsed, cpu float64
	var commits, ops, written int64
	for _, r := range rounds {
		t.Requests += r.Requests
		t.Errors += r.Errors
		t.ok += r.ok
		elapsed += r.Elapsed
		cpu += r.CPUSeconds
		written += r.Written
		commits += r.Commits
		ops += r.Ops
		lat = append(lat, r.latencies...)
	}
	t.Rounds = rounds
	if elapsed > 0 {
		t.RPS = float64(t.Requests) / elapsed
		t.CommitsPerSecond = math.Round(float64(commits) / elapsed)
	}
	if t.Requests > 0 {
		t.CPUPerRequestUS = math.Round(cpu / float64(t.Requests) * 1e6)
		t.WrittenPerRequest = math.Round(float64(written) / float64(t.Requests))
	}
	if commits > 0 {
		t.OpsPerCommit = round3(float64(ops) / float64(commits))
	}
	slices.Sort(lat)
	t.P50MS, t.P99MS, t.P999MS = msOf(percentile(lat, 0.50)), msOf(percentile(lat, 0.99)), msOf(percentile(lat, 0.999))
	return t
}

// compare fills the comparison fields of c from its two targets.
func (c *ConcResult) compare() {
	if c.Bare.RPS > 0 {
		c.Ratio = round3(c.Keybrake.RPS / c.Bare.RPS)
	}
	c.AddedP50MS = round3(c.Keybrake.P50MS - c.Bare.P50MS)
	c.AddedP99MS = round3(c.Keybrake.P99MS - c.Bare.P99MS)
}

func msOf(d time.Duration) float64 { return round3(float64(d) / float64(time.Millisecond)) }

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

func (r *Report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// writeText prints the report as tables.
func (r *Report) writeText(w io.Writer) error {
	c := r.Config
	m := r.Machine
	fmt.Fprintf(w, "keybrake-bench: %d CPUs (GOMAXPROCS %d), %s %s, database on %s\n",
		m.CPUs, m.GOMAXPROCS, m.GoVersion, m.Platform, orNA(m.FileSystem))
	fmt.Fprintf(w, "before the run (other work): load average %s, pressure %s; at its end (its own load included): load average %s, pressure %s\n",
		orNA(m.LoadAvgStart), orNA(m.PressureStart), orNA(m.LoadAvgEnd), orNA(m.PressureEnd))
	fmt.Fprintf(w, "load: POST /v1/charges, a unique Idempotency-Key each, over %d vault key(s), %d seeded records; "+
		"upstream latency %s, %d-byte answers; %s x %d rounds per target and concurrency, alternating, after a %s warm-up\n\n",
		c.Keys, c.SeedRecords, time.Duration(c.UpstreamLatencyMS*float64(time.Millisecond)), r.answerBytes(),
		seconds(c.DurationSeconds), c.Rounds, seconds(c.WarmupSeconds))

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "conns\ttarget\trequests\treq/s\tp50\tp99\tp99.9\terrors\tCPU/request\tpeak RSS\tRSS after: anon + file\t")
	for _, cr := range r.Results {
		for _, t := range []struct {
			name string
			res  TargetResult
		}{{"bare", cr.Bare}, {"keybrake", cr.Keybrake}} {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%.0f\t%s\t%s\t%s\t%d\t%.0fµs\t%s\t%s + %s\t\n", cr.Concurrency, t.name, t.res.Requests, t.res.RPS,
				fmtMS(t.res.P50MS), fmtMS(t.res.P99MS), fmtMS(t.res.P999MS), t.res.Errors, t.res.CPUPerRequestUS,
				fmtBytes(t.res.PeakRSS), fmtBytes(t.res.Mem.RSSAnon), fmtBytes(t.res.Mem.RSSFile))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "conns\tkeybrake/bare\tadded p50\tadded p99\tcommits/s\tops/commit\twritten/request\tdatabase after\tgrowth/request\tkeybrake req/s by round\tbare req/s by round\t")
	for _, cr := range r.Results {
		fmt.Fprintf(tw, "%d\t%.3f\t%+.2fms\t%+.2fms\t%.0f\t%.1f\t%s\t%s\t%s\t%s\t%s\t\n", cr.Concurrency, cr.Ratio, cr.AddedP50MS, cr.AddedP99MS,
			cr.Keybrake.CommitsPerSecond, cr.Keybrake.OpsPerCommit, fmtBytes(int64(cr.Keybrake.WrittenPerRequest)),
			fmtBytes(cr.DBBytes), fmtBytes(int64(cr.DBGrowthPerRequest)), roundRates(cr.Keybrake.Rounds), roundRates(cr.Bare.Rounds))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if err := r.writePostgresText(w); err != nil {
		return err
	}
	if err := r.writeBudgetText(w); err != nil {
		return err
	}
	s := r.Setup
	if s.SeedRecords > 0 {
		fmt.Fprintf(w, "setup: %d keys and %d seeded records written through the store in %.1fs; database %s after seeding\n",
			s.Keys, s.SeedRecords, s.SeedSeconds, fmtBytes(s.DBBytesAfterSeed))
	}
	fmt.Fprintf(w, "keybrake serve took %.2fs to start listening\n", s.KeybrakeStartSeconds)
	k := r.Check
	fmt.Fprintf(w, "check: the fake Stripe executed %d charges (%s usd) for keybrake, which answered %d of them 200; "+
		"keybrake committed %s usd (%s seeded), %s held\n",
		k.StripeCharges, usd(k.StripeAmount), k.Answered200, usd(k.Committed), usd(k.SeededAmount), usd(k.Held))
	if len(k.Problems) == 0 {
		fmt.Fprintln(w, "check: consistent")
	}
	for _, p := range k.Problems {
		fmt.Fprintln(w, "check: PROBLEM:", p)
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	if r.Profile != "" {
		fmt.Fprintln(w, "cpu profile of keybrake:", r.Profile)
	}
	return nil
}

// answerBytes is the size of the fake Stripe's charge.
func (r *Report) answerBytes() int {
	return max(r.Config.ResponseBytes, len(chargeJSON(0, chargeAmount, "")))
}

func roundRates(rounds []roundResult) string {
	s := make([]string, len(rounds))
	for i, r := range rounds {
		s[i] = strconv.FormatFloat(r.RPS, 'f', 0, 64)
	}
	return strings.Join(s, " ")
}

func fmtMS(ms float64) string { return strconv.FormatFloat(ms, 'f', 2, 64) + "ms" }

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func orNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}

// fmtBytes is a size in KiB, MiB or GiB.
func fmtBytes(n int64) string {
	switch {
	case n <= 0:
		return "n/a"
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
}

// usd formats minor units of usd.
func usd(minor int64) string { return policy.FormatMinor("usd", minor) }
