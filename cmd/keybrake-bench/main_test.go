package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault/postgres/pgtest"
)

// TestMain lets the test binary play the bare proxy, as the program does: the
// benchmark starts it again (os.Executable) with the bare proxy's variables set.
func TestMain(m *testing.M) {
	if isBareChild() {
		os.Exit(runBareChild(os.Stdin, os.Stdout, os.Stderr))
	}
	pgtest.Main(m)
}

// MustKeybrake returns the path of keybrake built from this source (with
// -race when the tests run with it, so the build reuses the test build's
// cache). It is built once per test binary, into a directory removed when the
// tests end: linking a race-enabled keybrake costs seconds of CPU, and every
// test runs the same one.
func MustKeybrake(tb testing.TB) string {
	tb.Helper()
	bin, err := keybrakeBinary()
	require.NoError(tb, err)
	return bin
}

var keybrakeBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "keybrake-bench-test-")
	if err != nil {
		return "", err
	}
	pgtest.AtEnd(func() error { return os.RemoveAll(dir) })
	var extra []string
	if raceEnabled {
		extra = append(extra, "-race")
	}
	return BuildKeybrake(context.Background(), dir, extra...)
})

// MustBench runs the benchmark with args and returns its JSON report, decoded
// from what it printed, and stderr.
func MustBench(tb testing.TB, args ...string) (Report, string) {
	tb.Helper()
	var out, errOut bytes.Buffer
	m := NewMain()
	m.Stdout, m.Stderr = &out, &errOut
	require.NoError(tb, m.ParseFlags(append(args, "--json")))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := m.Run(ctx)
	require.NoError(tb, m.Close())
	require.NoError(tb, err, "stdout:\n%s\nstderr:\n%s", &out, &errOut)
	var rep Report
	require.NoError(tb, json.Unmarshal(out.Bytes(), &rep), "the -json report parses: %s", &out)
	return rep, errOut.String()
}

// TestBenchmarkSmoke runs the whole benchmark briefly, at a low concurrency, and
// checks that it measured something sane and that keybrake's store accounts for
// every charge the fake Stripe executed. It asserts nothing about speed.
func TestBenchmarkSmoke(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	const (
		keys    = 3
		records = 40
	)
	profile := t.TempDir() + "/keybrake.pprof"
	rep, stderr := MustBench(t, "--keybrake", MustKeybrake(t),
		"--concurrency", "2,4", "--duration", "500ms", "--rounds", "1", "--warmup", "200ms",
		"--keys", "3", "--seed-records", "40", "--upstream-latency", "1ms", "--response-bytes", "1000",
		"--cpuprofile", profile)
	t.Log(stderr)

	assert.Empty(t, rep.Check.Problems)
	require.Len(t, rep.Results, 2)
	for i, conns := range []int{2, 4} {
		cr := rep.Results[i]
		assert.Equal(t, conns, cr.Concurrency)
		for name, tr := range map[string]TargetResult{"bare": cr.Bare, "keybrake": cr.Keybrake} {
			assert.Positive(t, tr.Requests, name)
			assert.Zero(t, tr.Errors, name)
			assert.Positive(t, tr.RPS, name)

			assert.GreaterOrEqual(t, tr.P50MS, 1.0, "%s: the upstream latency is in every request", name)
			assert.LessOrEqual(t, tr.P50MS, tr.P99MS, name)
			assert.LessOrEqual(t, tr.P99MS, tr.P999MS, name)
			require.Len(t, tr.Rounds, 1, name)
			assert.Equal(t, map[int]int{http.StatusOK: tr.Requests}, tr.Rounds[0].ByStatus, name)
			if runtime.GOOS == "linux" {
				assert.Positive(t, tr.PeakRSS, name)
			}
		}
		assert.Positive(t, cr.Ratio)
		assert.InDelta(t, cr.Keybrake.RPS/cr.Bare.RPS, cr.Ratio, 0.001)
		assert.InDelta(t, cr.Keybrake.P50MS-cr.Bare.P50MS, cr.AddedP50MS, 0.002)
		assert.Positive(t, cr.DBBytes)
		assert.Positive(t, cr.Keybrake.CommitsPerSecond, "read from keybrake's /metrics")
		assert.GreaterOrEqual(t, cr.Keybrake.OpsPerCommit, 1.0)
		assert.Zero(t, cr.Bare.OpsPerCommit, "the bare proxy has no store")
		if runtime.GOOS == "linux" {
			assert.Positive(t, cr.Keybrake.CPUPerRequestUS, "from /proc")
		}
	}

	s := rep.Setup
	assert.Equal(t, keys, s.Keys)
	assert.Equal(t, records, s.SeedRecords)
	assert.Positive(t, s.DBBytesAfterSeed)

	// Every 200 keybrake answered is one charge at the fake Stripe, and the store
	// committed exactly that plus the seeded records, holding nothing.
	k := rep.Check
	assert.Equal(t, int64(records*chargeAmount), k.SeededAmount)
	assert.Positive(t, k.StripeCharges)
	assert.Equal(t, k.StripeCharges, int64(k.Answered200))
	assert.Equal(t, k.StripeCharges*chargeAmount, k.StripeAmount)
	assert.Equal(t, k.SeededAmount+k.StripeAmount, k.Committed)
	assert.Zero(t, k.Held)
	assert.Equal(t, k.BareCharges, int64(k.Bare200))
	measured := 0
	for _, cr := range rep.Results {
		measured += cr.Keybrake.Requests
	}
	assert.GreaterOrEqual(t, k.Answered200, measured, "the warm-up comes on top")

	assert.Equal(t, profile, rep.Profile)
	fi, err := os.Stat(profile)
	require.NoError(t, err)
	assert.Positive(t, fi.Size(), "a CPU profile of keybrake")
}

func TestTextReport(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	rep := &Report{
		Machine: Machine{CPUs: 2, GOMAXPROCS: 2, GoVersion: "go1.26", Platform: "linux/amd64", LoadAvgStart: "0.10 0.20 0.30",
			PressureEnd: "cpu 12.50%, io 0.80%"},
		Config: ReportConfig{Concurrency: []int{16}, DurationSeconds: 5, Rounds: 2, WarmupSeconds: 1, Keys: 1, KeybrakeLogLevel: "info"},
		Results: []ConcResult{{
			Concurrency: 16,
			Bare: TargetResult{Requests: 80000, RPS: 16000, P50MS: 0.8, P99MS: 2, P999MS: 4, CPUPerRequestUS: 120, PeakRSS: 15 << 20,
				Mem: memStats{RSSAnon: 8 << 20, RSSFile: 7 << 20}, Rounds: []roundResult{{RPS: 16100}, {RPS: 15900}}},
			Keybrake: TargetResult{Requests: 16000, RPS: 3200, P50MS: 5.3, P99MS: 9, P999MS: 14, CPUPerRequestUS: 310, PeakRSS: 48 << 20,
				Mem: memStats{RSSAnon: 12 << 20, RSSFile: 36 << 20}, CommitsPerSecond: 610, OpsPerCommit: 10.5, WrittenPerRequest: 9216,
				Rounds: []roundResult{{RPS: 3150}, {RPS: 3250}}},
			Ratio: 0.2, AddedP50MS: 4.5, AddedP99MS: 7, DBBytes: 80 << 20, DBGrowthPerRequest: 2600,
		}},
		Check: CheckResult{StripeCharges: 17000, StripeAmount: 1700000, Answered200: 17000, Committed: 1700000},
	}
	require.NoError(t, rep.writeText(&out))
	var lines []string // with the columns' padding squeezed to one space
	for line := range strings.Lines(out.String()) {
		lines = append(lines, strings.Join(strings.Fields(line), " "))
	}
	text := strings.Join(lines, "\n")
	for _, want := range []string{
		"2 CPUs (GOMAXPROCS 2)",
		"before the run (other work): load average 0.10 0.20 0.30, pressure n/a; at its end (its own load included): load average n/a, pressure cpu 12.50%, io 0.80%",
		"16 bare 80000 16000 0.80ms 2.00ms 4.00ms 0 120µs 15.0 MiB 8.0 MiB + 7.0 MiB",
		"16 keybrake 16000 3200 5.30ms 9.00ms 14.00ms 0 310µs 48.0 MiB 12.0 MiB + 36.0 MiB",
		"16 0.200 +4.50ms +7.00ms 610 10.5 9.0 KiB 80.0 MiB 2.5 KiB 3150 3250 16100 15900",
		"committed 17000.00 usd", "check: consistent",
	} {
		assert.Contains(t, text, want)
	}
}

func TestConsistencyNamesEveryMismatch(t *testing.T) {
	t.Parallel()
	ok := CheckResult{StripeCharges: 3, StripeAmount: 300, Answered200: 3, SeededAmount: 1000, Committed: 1300, BareCharges: 5, Bare200: 5}
	assert.Empty(t, ok.consistency())

	bad := ok
	bad.Committed, bad.Held, bad.Answered200, bad.Bare200 = 1200, 100, 2, 4
	problems := bad.consistency()
	require.Len(t, problems, 4, "%q", problems)
	assert.Contains(t, problems[0], "keybrake committed 12.00 usd; the fake Stripe executed 3.00 usd for it, plus 10.00 usd seeded")
	assert.Contains(t, problems[1], "1.00 usd is still held")
	assert.Contains(t, problems[2], "executed 3 charges for keybrake, which answered 2")
	assert.Contains(t, problems[3], "executed 5 charges for the bare proxy, which answered 4")
}

func TestFakeStripe(t *testing.T) {
	t.Parallel()
	f := newFakeStripe(0, 500, "sk_test_a", "sk_test_b")
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	charge := func(secret, key string) (int, string, http.Header) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(chargeBody))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body bytes.Buffer
		_, err = body.ReadFrom(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, body.String(), resp.Header
	}

	status, first, _ := charge("sk_test_a", "k1")
	require.Equal(t, http.StatusOK, status, first)
	assert.Len(t, first, 500, "padded to the response size (charge 1 of 100)")
	var ch map[string]any
	require.NoError(t, json.Unmarshal([]byte(first), &ch))
	assert.Equal(t, "ch_bench1", ch["id"])
	assert.EqualValues(t, chargeAmount, ch["amount_captured"])

	status, again, h := charge("sk_test_a", "k1")
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, first, again, "the same key replays the same charge")
	assert.Equal(t, "true", h.Get("Idempotent-Replayed"))

	status, _, _ = charge("sk_test_b", "k1")
	assert.Equal(t, http.StatusOK, status, "keys are per secret")
	status, _, _ = charge("sk_test_c", "k2")
	assert.Equal(t, http.StatusUnauthorized, status)

	assert.Equal(t, int64(1), f.tally("sk_test_a").charges.Load())
	assert.Equal(t, int64(chargeAmount), f.tally("sk_test_a").amount.Load())
	assert.Equal(t, int64(1), f.tally("sk_test_b").charges.Load())

	f.forget()
	status, _, h = charge("sk_test_a", "k1")
	assert.Equal(t, http.StatusOK, status)
	assert.Empty(t, h.Get("Idempotent-Replayed"), "forgotten keys execute again")
	assert.Equal(t, int64(2), f.tally("sk_test_a").charges.Load())
}

func TestBareProxyReplacesTheKey(t *testing.T) {
	t.Parallel()
	f := newFakeStripe(0, 0, "sk_test_bare")
	upstream := httptest.NewServer(f)
	t.Cleanup(upstream.Close)
	u, err := url.Parse(upstream.URL)
	require.NoError(t, err)
	bare := httptest.NewServer(newBareProxy(u, "sk_test_bare"))
	t.Cleanup(bare.Close)

	req, err := http.NewRequest(http.MethodPost, bare.URL+"/v1/charges", strings.NewReader(chargeBody))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer vk_whatever")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := bare.Client().Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, int64(1), f.tally("sk_test_bare").charges.Load())
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args []string
		ok   bool
	}{
		"defaults":              {nil, true},
		"a list of conns":       {[]string{"--concurrency", "1, 16,64"}, true},
		"everything":            {[]string{"--keys", "10000", "--seed-records", "1000000", "--upstream-latency", "20ms", "--response-bytes", "3000", "--json"}, true},
		"no conns":              {[]string{"--concurrency", "0"}, false},
		"not a list":            {[]string{"--concurrency", "16;64"}, false},
		"no duration":           {[]string{"--duration", "0s"}, false},
		"no rounds":             {[]string{"--rounds", "0"}, false},
		"no keys":               {[]string{"--keys", "0"}, false},
		"negative seed":         {[]string{"--seed-records", "-1"}, false},
		"negative latency":      {[]string{"--upstream-latency", "-1ms"}, false},
		"bad log level":         {[]string{"--keybrake-log-level", "loud"}, false},
		"a positional argument": {[]string{"now"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			m := NewMain()
			m.Stderr = &bytes.Buffer{}
			err := m.ParseFlags(tc.args)
			if tc.ok {
				assert.NoError(t, err)
			} else {
				assert.Error(t, err)
			}
		})
	}
	m := NewMain()
	require.NoError(t, m.ParseFlags([]string{"--concurrency", "1, 16,64"}))
	assert.Equal(t, []int{1, 16, 64}, m.Config.Concurrency)
	assert.Equal(t, 64, m.Config.maxConcurrencyOf())
}

// TestBenchmarkPostgresSmoke runs the benchmark briefly with the PostgreSQL
// store beside bbolt: two replicas, measured through one and through both. It
// checks that each was measured, without errors, that the PostgreSQL store
// accounts for every charge the fake Stripe executed for it, and that the
// benchmark's database is gone afterwards. It asserts nothing about speed.
func TestBenchmarkPostgresSmoke(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	server := pgtest.URL(t)
	rep, stderr := MustBench(t, "--keybrake", MustKeybrake(t),
		"--concurrency", "2", "--duration", "300ms", "--rounds", "1", "--warmup", "100ms",
		"--keys", "2", "--seed-records", "10", "--database-url", server, "--replicas", "2", "--budget")
	t.Log(stderr)
	assert.Empty(t, rep.Check.Problems)

	require.NotNil(t, rep.Postgres)
	assert.Contains(t, rep.Postgres.Server, "PostgreSQL")
	assert.Equal(t, 2, rep.Postgres.Replicas)
	require.Len(t, rep.Results, 1)
	cr := rep.Results[0]
	require.Len(t, cr.Postgres, 2)
	for i, pr := range cr.Postgres {
		assert.Equal(t, i+1, pr.Replicas)
		assert.Positive(t, pr.Requests)
		assert.Zero(t, pr.Errors)
		require.Len(t, pr.Rounds, 1)
		assert.Equal(t, map[int]int{http.StatusOK: pr.Requests}, pr.Rounds[0].ByStatus)
		assert.InDelta(t, pr.RPS/cr.Bare.RPS, pr.Ratio, 0.001)
		assert.InDelta(t, pr.RPS/cr.Keybrake.RPS, pr.VersusBolt, 0.001)
		assert.InDelta(t, pr.P50MS-cr.Bare.P50MS, pr.AddedP50MS, 0.002)
		assert.Positive(t, pr.CommitsPerSecond, "read from the replicas' /metrics")
		if runtime.GOOS == "linux" {
			assert.Positive(t, pr.CPUPerRequestUS, "from /proc")
		}
	}

	// --budget: each keybrake target again with the keys under one budget.
	require.Len(t, cr.Budget, 3)
	for i, br := range cr.Budget {
		assert.Equal(t, []string{"bbolt", "postgres", "postgres"}[i], br.Store)
		assert.Equal(t, []int{1, 1, 2}[i], br.Replicas)
		assert.Positive(t, br.Requests)
		assert.Zero(t, br.Errors)
		assert.Equal(t, []float64{cr.Keybrake.RPS, cr.Postgres[0].RPS, cr.Postgres[1].RPS}[i], br.Independent)
		assert.InDelta(t, br.RPS/br.Independent, br.VersusIndependent, 0.001)
	}

	k := rep.Check.Postgres
	require.NotNil(t, k)
	assert.Positive(t, k.StripeCharges)
	assert.Equal(t, k.StripeCharges, int64(k.Answered200))
	assert.Equal(t, int64(10*chargeAmount), k.SeededAmount)
	assert.Equal(t, k.SeededAmount+k.StripeAmount, k.Committed)
	assert.Zero(t, k.Held)

	var n int
	require.NoError(t, pgtest.NewPool(t, server).QueryRow(context.Background(),
		"SELECT count(*) FROM pg_database WHERE datname = $1", rep.Postgres.Database).Scan(&n))
	assert.Zero(t, n, "the benchmark's database was dropped")
}
