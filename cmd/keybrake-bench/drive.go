package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// load is one round against one target: conns callers, each on its own
// keep-alive connection with one request in flight, for a duration.
type load struct {
	urls    []string // the target's POST /v1/charges, used in turn
	tokens  []string // "Bearer vk_…", used in turn
	conns   int
	runID   string // makes every Idempotency-Key of the round unique
	timeout time.Duration
}

// roundResult is what one round measured.
type roundResult struct {
	Requests   int         `json:"requests"`
	Errors     int         `json:"errors"`
	ByStatus   map[int]int `json:"by_status"`
	FirstError string      `json:"first_error,omitempty"`
	Elapsed    float64     `json:"elapsed_seconds"`
	RPS        float64     `json:"rps"`
	// CPUSeconds is the CPU time (user + system) the target used in the round.
	CPUSeconds float64 `json:"cpu_seconds"`
	// Written is what the target caused to be written to storage in the round.
	Written int64 `json:"written_bytes"`
	// Commits and Ops are keybrake's group-commit transactions and the store
	// operations they carried in the round.
	Commits int64 `json:"store_commits,omitempty"`
	Ops     int64 `json:"store_ops,omitempty"`
	// latencies of every answered request, sorted.
	latencies []time.Duration
	// ok counts 200 answers.
	ok int
}

// callerTally is one caller's count.
type callerTally struct {
	requests, errors, ok int
	firstErr             string
	byStatus             map[int]int
	latencies            []time.Duration
}

// run drives the target for d and waits for the requests in flight when d ends
// (they count; nothing is cancelled).
func (l *load) run(ctx context.Context, d time.Duration) roundResult {
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxConnsPerHost:     l.conns,
		MaxIdleConnsPerHost: l.conns,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
		// No Proxy: loopback targets are dialled directly, never through HTTP_PROXY.
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: l.timeout}

	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var next atomic.Int64
	tallies := make([]callerTally, l.conns)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range tallies {
		t := &tallies[i]
		t.byStatus = map[int]int{}
		wg.Go(func() {
			for ctx.Err() == nil {
				l.send(client, next.Add(1), t)
			}
		})
	}
	wg.Wait()
	r := roundResult{Elapsed: time.Since(start).Seconds(), ByStatus: map[int]int{}}
	for _, t := range tallies {
		r.Requests += t.requests
		r.Errors += t.errors
		r.ok += t.ok
		if r.FirstError == "" {
			r.FirstError = t.firstErr
		}
		for code, n := range t.byStatus {
			r.ByStatus[code] += n
		}
		r.latencies = append(r.latencies, t.latencies...)
	}
	slices.Sort(r.latencies)
	if r.Elapsed > 0 {
		r.RPS = float64(r.Requests) / r.Elapsed
	}
	return r
}

// send makes charge n. Anything but a 200 counts as an error: the caps never
// refuse and the fake Stripe never fails.
func (l *load) send(client *http.Client, n int64, t *callerTally) {
	t.requests++
	req, err := http.NewRequest(http.MethodPost, l.urls[n%int64(len(l.urls))], strings.NewReader(chargeBody))
	if err != nil {
		t.fail(err.Error())
		return
	}
	req.Header.Set("Authorization", l.tokens[n%int64(len(l.tokens))])
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", l.runID+"-"+strconv.FormatInt(n, 10))
	begin := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.fail(err.Error())
		return
	}
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	if err != nil {
		t.fail("read answer: " + err.Error())
		return
	}
	t.latencies = append(t.latencies, time.Since(begin))
	t.byStatus[resp.StatusCode]++
	if resp.StatusCode == http.StatusOK {
		t.ok++
	} else {
		t.fail("status " + resp.Status)
	}
}

func (t *callerTally) fail(msg string) {
	t.errors++
	if t.firstErr == "" {
		t.firstErr = msg
	}
}

// percentile is the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
