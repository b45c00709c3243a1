package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxAnswerBytes bounds how much of an answer is read.
const maxAnswerBytes = 1 << 20

// maxViolations bounds the problems one run lists.
const maxViolations = 20

// Summary is what one run measured.
type Summary struct {
	Mode string
	// Charges is the number of charges sent (each with a fresh idempotency key);
	// Retries the second sends of some of them; Requests both.
	Charges, Retries, Requests int
	// ByStatus counts answers by HTTP status; Errors counts requests with no answer.
	ByStatus map[int]int
	Errors   int
	FirstErr string
	// Fresh200 counts 200 answers not marked Idempotent-Replayed; Replays those
	// marked.
	Fresh200, Replays  int
	Elapsed            time.Duration
	P50, P90, P99, Max time.Duration
	// Upstream is the fake Stripe's and the store's view (self mode only).
	Upstream *UpstreamStats
	// Violations lists broken invariants; a run with any exits 1.
	Violations []string
}

// UpstreamStats is what the fake Stripe executed and what keybrake metered.
type UpstreamStats struct {
	Charges, Amount, Cap int64 // minor units
	Committed, Held      int64 // the key's period window in the store
}

// Throughput is requests per second over the run.
func (s *Summary) Throughput() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Requests) / s.Elapsed.Seconds()
}

func (s *Summary) violate(format string, args ...any) {
	if len(s.Violations) < maxViolations {
		s.Violations = append(s.Violations, fmt.Sprintf(format, args...))
	}
}

// print writes the human-readable report.
func (s *Summary) print(w io.Writer, cfg Config) {
	var statuses []string
	for _, code := range slices.Sorted(maps.Keys(s.ByStatus)) {
		statuses = append(statuses, fmt.Sprintf("%d: %d", code, s.ByStatus[code]))
	}
	fmt.Fprintf(w, "mode          %s\n", s.Mode)
	fmt.Fprintf(w, "load          concurrency %d, duration %s, requests %d, amount %d, retry ratio %g\n",
		cfg.Concurrency, cfg.Duration, cfg.Requests, cfg.Amount, cfg.RetryRatio)
	fmt.Fprintf(w, "requests      %d (%d charges + %d retries with the same Idempotency-Key)\n", s.Requests, s.Charges, s.Retries)
	fmt.Fprintf(w, "by status     %s\n", strings.Join(statuses, ", "))
	fmt.Fprintf(w, "replays       %d (Idempotent-Replayed: true)\n", s.Replays)
	if s.Errors > 0 {
		fmt.Fprintf(w, "no answer     %d (first: %s)\n", s.Errors, s.FirstErr)
	}
	fmt.Fprintf(w, "elapsed       %s\n", s.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "throughput    %.0f req/s\n", s.Throughput())
	fmt.Fprintf(w, "latency       p50 %s, p90 %s, p99 %s, max %s\n", ms(s.P50), ms(s.P90), ms(s.P99), ms(s.Max))
	if u := s.Upstream; u != nil {
		fmt.Fprintf(w, "fake stripe   %d charges executed, total %d (cap %d, minor units)\n", u.Charges, u.Amount, u.Cap)
		fmt.Fprintf(w, "keybrake      committed %d, held %d (period window, minor units)\n", u.Committed, u.Held)
	}
	if len(s.Violations) == 0 {
		fmt.Fprintln(w, "invariants    ok")
	} else {
		fmt.Fprintf(w, "invariants    VIOLATED (%d)\n", len(s.Violations))
	}
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64) + "ms"
}

// loader sends the charges.
type loader struct {
	cfg    Config
	url    string
	auth   string
	body   string
	runID  string
	client *http.Client
	next   atomic.Int64
}

// tally is one caller's count, merged into the Summary at the end.
type tally struct {
	charges, retries, errors, fresh200, replays int
	firstErr                                    string
	byStatus                                    map[int]int
	latencies                                   []time.Duration
	violations                                  []string
}

// answer is what one request got.
type answer struct {
	status   int // 0: no answer
	replayed bool
	chargeID string
}

// runLoad charges through the proxy at baseURL with vaultKey until ctx ends,
// cfg.Duration passes or cfg.Requests charges were sent, then waits for the
// requests in flight (they are not cancelled) and summarises.
func runLoad(ctx context.Context, cfg Config, baseURL, vaultKey string) (Summary, error) {
	id := make([]byte, 6)
	if _, err := rand.Read(id); err != nil {
		return Summary{}, fmt.Errorf("run id: %w", err)
	}
	transport := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          2 * cfg.Concurrency,
		MaxIdleConnsPerHost:   2 * cfg.Concurrency,
		IdleConnTimeout:       30 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: cfg.Timeout,
		// No Proxy: the target is addressed directly, never through HTTP_PROXY.
	}
	defer transport.CloseIdleConnections()
	l := &loader{
		cfg:    cfg,
		url:    strings.TrimRight(baseURL, "/") + "/v1/charges",
		auth:   "Bearer " + vaultKey,
		body:   chargeForm(cfg.Amount),
		runID:  "kbload-" + hex.EncodeToString(id),
		client: &http.Client{Transport: transport, Timeout: cfg.Timeout},
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}

	tallies := make([]tally, cfg.Concurrency)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range tallies {
		wg.Go(func() { l.caller(ctx, &tallies[i]) })
	}
	wg.Wait()
	s := Summary{Elapsed: time.Since(start), ByStatus: map[int]int{}}

	var lat []time.Duration
	for _, t := range tallies {
		s.Charges += t.charges
		s.Retries += t.retries
		s.Errors += t.errors
		s.Fresh200 += t.fresh200
		s.Replays += t.replays
		if s.FirstErr == "" {
			s.FirstErr = t.firstErr
		}
		for code, n := range t.byStatus {
			s.ByStatus[code] += n
		}
		for _, v := range t.violations {
			s.violate("%s", v)
		}
		lat = append(lat, t.latencies...)
	}
	s.Requests = s.Charges + s.Retries
	slices.Sort(lat)
	s.P50, s.P90, s.P99 = percentile(lat, 0.50), percentile(lat, 0.90), percentile(lat, 0.99)
	if len(lat) > 0 {
		s.Max = lat[len(lat)-1]
	}
	return s, nil
}

// chargeForm is the charge's form body.
func chargeForm(amount int64) string {
	return "amount=" + strconv.FormatInt(amount, 10) + "&currency=usd&source=tok_visa"
}

// percentile is the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// retried reports whether charge n (from 1) is sent twice: exactly the fraction
// RetryRatio of charges is, spread evenly.
func (l *loader) retried(n int64) bool {
	r := l.cfg.RetryRatio
	return int64(float64(n)*r) != int64(float64(n-1)*r)
}

// caller sends charges one after the other until the run ends.
func (l *loader) caller(ctx context.Context, t *tally) {
	t.byStatus = map[int]int{}
	for ctx.Err() == nil {
		n := l.next.Add(1)
		if l.cfg.Requests > 0 && n > int64(l.cfg.Requests) {
			return
		}
		key := l.runID + "-" + strconv.FormatInt(n, 10)
		retry := l.retried(n)
		first := l.send(key, retry, t)
		t.charges++
		if !retry {
			continue
		}
		again := l.send(key, true, t)
		t.retries++
		// A retry of a charge that succeeded must replay that charge: anything
		// else answered 200 means money may have moved twice.
		if first.status == http.StatusOK && again.status == http.StatusOK &&
			(!again.replayed || again.chargeID != first.chargeID) {
			t.violations = append(t.violations, fmt.Sprintf(
				"retry of %s answered 200 with charge %q (replayed=%t), the first answer was charge %q",
				key, again.chargeID, again.replayed, first.chargeID))
		}
	}
}

// send makes one charge request; the request is not tied to the run's context so
// that the requests in flight when the run ends still count.
func (l *loader) send(key string, wantID bool, t *tally) answer {
	req, err := http.NewRequest(http.MethodPost, l.url, strings.NewReader(l.body))
	if err != nil {
		t.noAnswer(err)
		return answer{}
	}
	req.Header.Set("Authorization", l.auth)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", key)

	begin := time.Now()
	resp, err := l.client.Do(req)
	if err != nil {
		t.noAnswer(err)
		return answer{}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	_ = resp.Body.Close()
	if err != nil {
		t.noAnswer(fmt.Errorf("read answer: %w", err))
		return answer{}
	}
	t.latencies = append(t.latencies, time.Since(begin))

	a := answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	t.byStatus[a.status]++
	switch {
	case a.replayed:
		t.replays++
	case a.status == http.StatusOK:
		t.fresh200++
	}
	if wantID && a.status == http.StatusOK {
		var ch struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(body, &ch); err != nil || ch.ID == "" {
			t.violations = append(t.violations, fmt.Sprintf("200 answer to %s is not a charge: %.200q", key, body))
		}
		a.chargeID = ch.ID
	}
	return a
}

func (t *tally) noAnswer(err error) {
	t.errors++
	if t.firstErr == "" {
		t.firstErr = err.Error()
	}
}
