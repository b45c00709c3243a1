package webhooks

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// Defaults of a Deliverer.
const (
	// AttemptTimeout is how long an endpoint has to answer 2xx.
	AttemptTimeout = 15 * time.Second
	// DefaultLease is how long a claimed delivery is kept from other
	// deliverers: the attempt's timeout and a margin.
	DefaultLease = time.Minute
	// DefaultPoll is how often the outbox is looked at for due deliveries.
	DefaultPoll = 200 * time.Millisecond
	// DefaultWorkers is how many attempts run at once.
	DefaultWorkers = 8
	// maintenanceEvery is how often expiring keys are looked for and old
	// deliveries pruned.
	maintenanceEvery = 5 * time.Minute
)

// Deliverer drains the store's outbox: it claims due deliveries under a
// lease, sends each once, signed, and records the outcome. One runs in every
// serve process; on a shared store (PostgreSQL) the leases keep replicas from
// sending one delivery at the same moment, and a crashed one's lease lapses.
type Deliverer struct {
	Store  vault.Store
	Log    *slog.Logger
	Client *http.Client
	// Now is the clock of the webhook-timestamp header.
	Now     func() time.Time
	Lease   time.Duration
	Poll    time.Duration
	Workers int
	// UserAgent is sent with every attempt.
	UserAgent string

	// observe, when set, learns each finished attempt (metrics).
	Observe func(job vault.DeliveryJob, res vault.DeliveryResult, took time.Duration)
}

// NewClient returns the HTTP client of deliveries: a 15 s deadline, no
// redirects followed (a 3xx is a failure), no proxy from the environment,
// and a dialer that refuses internal addresses unless g allows them.
func NewClient(g Guard) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: g.Control}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: AttemptTimeout,
	}
	return &http.Client{
		Transport:     tr,
		Timeout:       AttemptTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func (d *Deliverer) defaults() {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	if d.Client == nil {
		d.Client = NewClient(Guard{})
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Lease <= 0 {
		d.Lease = DefaultLease
	}
	if d.Poll <= 0 {
		d.Poll = DefaultPoll
	}
	if d.Workers <= 0 {
		d.Workers = DefaultWorkers
	}
	if d.UserAgent == "" {
		d.UserAgent = "keybrake-webhooks"
	}
}

// Run delivers until ctx ends; the attempts under way finish first (each
// within AttemptTimeout).
func (d *Deliverer) Run(ctx context.Context) {
	d.defaults()
	tick := time.NewTicker(d.Poll)
	defer tick.Stop()
	var lastMaintenance time.Time
	for {
		if time.Since(lastMaintenance) >= maintenanceEvery {
			lastMaintenance = time.Now()
			d.maintain(ctx)
		}
		for d.Drain(ctx) > 0 && ctx.Err() == nil {
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// maintain emits key.expiring and prunes old deliveries.
func (d *Deliverer) maintain(ctx context.Context) {
	if n, err := d.Store.NoticeExpiringKeys(ctx); err != nil && ctx.Err() == nil {
		d.Log.Warn("look for expiring keys", slog.String("error", err.Error()))
	} else if n > 0 {
		d.Log.Info("keys expiring soon", slog.Int("events", n))
	}
	if n, err := d.Store.PruneDeliveries(ctx); err != nil && ctx.Err() == nil {
		d.Log.Warn("prune deliveries", slog.String("error", err.Error()))
	} else if n > 0 {
		d.Log.Info("pruned deliveries", slog.Int("removed", n))
	}
}

// Drain claims the deliveries due now (at most Workers×4), sends them, and
// returns how many it attempted. A read first says whether anything is due,
// so an idle outbox costs no write transaction.
func (d *Deliverer) Drain(ctx context.Context) int {
	d.defaults()
	next, err := d.Store.NextDeliveryAt(ctx)
	if err != nil || next.IsZero() || next.After(d.Store.Now()) {
		if err != nil && ctx.Err() == nil {
			d.Log.Warn("read the outbox", slog.String("error", err.Error()))
		}
		return 0
	}
	jobs, err := d.Store.ClaimDeliveries(ctx, d.Workers*4, d.Lease)
	if err != nil {
		if ctx.Err() == nil {
			d.Log.Warn("claim deliveries", slog.String("error", err.Error()))
		}
		return 0
	}
	sem := make(chan struct{}, d.Workers)
	var wg sync.WaitGroup
	for _, job := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			start := time.Now()
			res := d.Attempt(ctx, job)
			// The outcome is recorded even when ctx ended meanwhile: the
			// attempt was made.
			if err := d.Store.FinishDelivery(context.WithoutCancel(ctx), job, res); err != nil {
				d.Log.Warn("record a delivery", slog.String("delivery", job.ID), slog.String("error", err.Error()))
			}
			if d.Observe != nil {
				d.Observe(job, res, time.Since(start))
			}
		})
	}
	wg.Wait()
	return len(jobs)
}

// Attempt sends job once and says what came back.
func (d *Deliverer) Attempt(ctx context.Context, job vault.DeliveryJob) vault.DeliveryResult {
	d.defaults()
	ts := d.Now()
	sig, err := Sign(job.Secrets, job.EventID, ts, job.Body)
	if err != nil {
		return vault.DeliveryResult{Err: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, AttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, job.URL, bytes.NewReader(job.Body))
	if err != nil {
		return vault.DeliveryResult{Err: "bad url"}
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", d.UserAgent)
	h[HeaderID] = []string{job.EventID}
	h[HeaderTimestamp] = []string{formatUnix(ts)}
	h[HeaderSignature] = []string{sig}
	resp, err := d.Client.Do(req)
	if err != nil {
		return vault.DeliveryResult{Err: attemptError(err)}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	res := vault.DeliveryResult{Status: resp.StatusCode}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		res.Err = "redirects are not followed (" + resp.Status + ")"
	default:
		res.Err = resp.Status
	}
	return res
}

// attemptError says why an attempt got no answer, without the URL (which
// may carry a token in its query).
func attemptError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	switch {
	case errors.Is(err, ErrForbiddenAddress):
		return "refused: the endpoint resolves to an internal address"
	case errors.Is(err, context.DeadlineExceeded):
		return "no answer within 15 s"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "no answer within 15 s"
	}
	return err.Error()
}

func formatUnix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
