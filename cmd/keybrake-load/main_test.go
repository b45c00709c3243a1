package main

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// MustRun parses args, runs the load and closes, returning the summary and the
// report.
func MustRun(tb testing.TB, args ...string) (Summary, string) {
	tb.Helper()
	var out, errOut bytes.Buffer
	m := NewMain()
	m.Stdout, m.Stderr = &out, &errOut
	require.NoError(tb, m.ParseFlags(args))
	tb.Cleanup(func() { assert.NoError(tb, m.Close()) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(tb, m.Run(ctx), "stdout:\n%s\nstderr:\n%s", &out, &errOut)
	return m.Summary, out.String()
}

func TestSelfModeRefusesOverCapAndAddsUp(t *testing.T) {
	t.Parallel()
	const (
		charges  = 300
		amount   = 100
		capMinor = 200 * amount // room for exactly 200 charges
	)
	s, report := MustRun(t, "--requests", "300", "--concurrency", "8", "--duration", "30s",
		"--amount", "100", "--cap", "20000", "--retry-ratio", "0.1")
	t.Log("\n" + report)

	require.NotNil(t, s.Upstream)
	assert.Empty(t, s.Violations)
	assert.Equal(t, charges, s.Charges, "a short bounded run sends every charge")
	assert.Equal(t, charges/10, s.Retries, "retry ratio 0.1")
	assert.Equal(t, s.Charges+s.Retries, s.Requests)
	assert.Zero(t, s.Errors)

	sum := 0
	for code, n := range s.ByStatus {
		sum += n
		assert.Contains(t, []int{http.StatusOK, http.StatusPaymentRequired}, code, "only charges and cap refusals")
	}
	assert.Equal(t, s.Requests, sum+s.Errors, "every request is counted once")

	// The cap lets exactly 200 charges through, each executed once at Stripe; the
	// other 100 are refused with 402 and never reach it.
	assert.Equal(t, int64(capMinor), s.Upstream.Amount, "the fake Stripe moved exactly the cap")
	assert.LessOrEqual(t, s.Upstream.Amount, s.Upstream.Cap)
	assert.Equal(t, int64(200), s.Upstream.Charges)
	assert.Equal(t, s.Upstream.Charges*amount, s.Upstream.Amount)
	assert.Equal(t, 200, s.Fresh200, "one fresh 200 per charge executed")
	assert.Equal(t, s.Fresh200+s.Replays, s.ByStatus[http.StatusOK])
	assert.Equal(t, s.Requests-s.ByStatus[http.StatusOK], s.ByStatus[http.StatusPaymentRequired])
	assert.Positive(t, s.Replays, "retries of successful charges are replayed")
	assert.LessOrEqual(t, s.Replays, s.Retries)
	assert.Equal(t, s.Upstream.Amount, s.Upstream.Committed, "keybrake metered what moved")
	assert.Zero(t, s.Upstream.Held)

	assert.Positive(t, s.Throughput())
	assert.Positive(t, s.P50)
	assert.LessOrEqual(t, s.P50, s.P90)
	assert.LessOrEqual(t, s.P90, s.P99)
	assert.LessOrEqual(t, s.P99, s.Max)
	assert.Contains(t, report, "invariants    ok")
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args []string
		ok   bool
	}{
		"self by default":         {nil, true},
		"external loopback":       {[]string{"--proxy-url", "http://127.0.0.1:8080", "--vault-key", "vk_x"}, true},
		"external localhost":      {[]string{"--proxy-url", "http://localhost:8080", "--vault-key", "vk_x"}, true},
		"external ipv6 loopback":  {[]string{"--proxy-url", "http://[::1]:8080", "--vault-key", "vk_x"}, true},
		"remote refused":          {[]string{"--proxy-url", "https://keybrake.example", "--vault-key", "vk_x"}, false},
		"remote allowed unsafely": {[]string{"--proxy-url", "https://keybrake.example", "--vault-key", "vk_x", "--unsafe-allow-remote"}, true},
		"external needs a key":    {[]string{"--proxy-url", "http://127.0.0.1:8080"}, false},
		"self and proxy url":      {[]string{"--self", "--proxy-url", "http://127.0.0.1:8080", "--vault-key", "vk_x"}, false},
		"cap is self only":        {[]string{"--proxy-url", "http://127.0.0.1:8080", "--vault-key", "vk_x", "--cap", "100"}, false},
		"unbounded":               {[]string{"--duration", "0"}, false},
		"bad retry ratio":         {[]string{"--retry-ratio", "1.5"}, false},
		"no callers":              {[]string{"--concurrency", "0"}, false},
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
}

func TestRetriedIsTheRatio(t *testing.T) {
	t.Parallel()
	for _, r := range []float64{0, 0.1, 0.25, 1} {
		l := loader{cfg: Config{RetryRatio: r}}
		n := 0
		for i := int64(1); i <= 1000; i++ {
			if l.retried(i) {
				n++
			}
		}
		assert.Equal(t, int(r*1000), n, "ratio %g", r)
	}
}

func TestExternalModeAgainstARunningKeybrake(t *testing.T) {
	t.Parallel()
	st, err := startSelf(context.Background(), 1_000_000, &bytes.Buffer{})
	t.Cleanup(func() { assert.NoError(t, st.Close()) })
	require.NoError(t, err)

	s, report := MustRun(t, "--proxy-url", st.proxyURL, "--vault-key", st.vaultKey,
		"--requests", "50", "--concurrency", "4", "--retry-ratio", "0.2")
	t.Log("\n" + report)
	assert.Nil(t, s.Upstream, "external mode cannot see Stripe")
	assert.Equal(t, 60, s.Requests)
	assert.Equal(t, 60, s.ByStatus[http.StatusOK])
	assert.Equal(t, 10, s.Replays)
	charges, amount := st.fake.totals()
	assert.Equal(t, int64(50), charges)
	assert.Equal(t, int64(5000), amount)
}

func TestCheckReportsMoneyThatMovedPastKeybrake(t *testing.T) {
	t.Parallel()
	st, err := startSelf(context.Background(), 1000, &bytes.Buffer{})
	t.Cleanup(func() { assert.NoError(t, st.Close()) })
	require.NoError(t, err)

	// Stripe moved 15.00 that keybrake never answered for nor metered.
	st.fake.charges, st.fake.amount = 3, 1500
	var s Summary
	require.NoError(t, st.check(context.Background(), &s))
	require.Len(t, s.Violations, 3, "%q", s.Violations)
	assert.Contains(t, s.Violations[0], "OVER CAP")
	assert.Contains(t, s.Violations[1], "UNMETERED")
	assert.Contains(t, s.Violations[2], "executed 3 charges")
}
