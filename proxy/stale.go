package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// The background refresher: exposures nobody touched for a while are looked
// up at Stripe through the operator's refresh's own lookup
// (lookUpMoneyObject) and applied as a read through keybrake would be
// (vault.Store.ObserveObject), so that an abandoned Checkout Session that
// expired, or a PaymentIntent cancelled in the Stripe Dashboard, frees its
// budget without an operator. A key whose policy sets
// objects.cancel_unconfirmed_after has keybrake cancel its own PaymentIntents
// still unconfirmed after that long. See docs/metering.md, "Stale exposure".

// The ledger operations of the background refresher's changes: the cause a
// ledger reader sees.
const (
	OperationRefresh    = "refresh"
	OperationAutoCancel = "auto_cancel"
)

// DefaultRefreshRate is how many lookups a second the refresher makes at most
// per upstream.
const DefaultRefreshRate = 5

// refreshListLimit is how many stale exposures one pass reads.
const refreshListLimit = 500

// unconfirmed are the PaymentIntent statuses cancel_unconfirmed_after cancels:
// nobody has confirmed it (or finished its authentication), so no money is on
// its way.
var unconfirmed = map[string]bool{"requires_payment_method": true, "requires_confirmation": true, "requires_action": true}

// RefresherConfig configures the background refresher.
type RefresherConfig struct {
	// After is how long an exposure stays untouched before it is looked up
	// (--exposure-refresh-after); it must be positive.
	After time.Duration
	// Rate is the most lookups a second per upstream (0: DefaultRefreshRate).
	Rate int
	// Now is the clock of the rate limit (nil: time.Now). Ages of exposures
	// are the store's clock's, as every decision about a key.
	Now func() time.Time
}

// Refresher looks stale exposures up at Stripe; Run drives it from a ticker,
// Pass is one tick's work. It is not safe for concurrent passes.
type Refresher struct {
	p       *Proxy
	after   time.Duration
	rate    int
	now     func() time.Time
	recent  map[string][]time.Time // per upstream: the times of its lookups in the last second
	idleTil time.Time              // a pass that found nothing waits until then
}

// NewRefresher returns the background refresher of p.
func (p *Proxy) NewRefresher(cfg RefresherConfig) *Refresher {
	r := &Refresher{p: p, after: cfg.After, rate: cfg.Rate, now: cfg.Now, recent: map[string][]time.Time{}}
	if r.rate <= 0 {
		r.rate = DefaultRefreshRate
	}
	if r.now == nil {
		r.now = time.Now
	}
	return r
}

// Run runs a pass at each tick until ctx is done. A nil tick is a ticker of
// one tick per 1/Rate second, so that an upstream's lookups spread over the
// second.
func (r *Refresher) Run(ctx context.Context, tick <-chan time.Time) {
	if tick == nil {
		t := time.NewTicker(time.Second / time.Duration(r.rate))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			r.Pass(ctx)
		}
	}
}

// PassResult is what one pass did.
type PassResult struct {
	// Looked is how many objects it looked up at Stripe (cancels not counted).
	Looked int
	// Throttled is how many stale objects waited for their upstream's rate.
	Throttled int
}

// Pass reads the stale exposures, oldest first, and looks up each one whose
// upstream has had fewer than Rate lookups in the last second and that this
// replica claims (vault.Store.ClaimStaleExposure: another replica's claim, or
// a touch since it was listed, skips it). A lookup that fails leaves the
// exposure as it was; the claim touched it, so it is tried again After later.
// One whose key cannot be read (but for a key that is gone), or whose claim
// fails, is not claimed: the next pass tries it again. Each skip is logged,
// at Warn for a failure, at Debug otherwise.
func (r *Refresher) Pass(ctx context.Context) PassResult {
	var res PassResult
	now := r.now()
	if now.Before(r.idleTil) {
		return res
	}
	list, err := r.p.store.StaleExposures(ctx, r.after, refreshListLimit)
	if err != nil {
		r.p.log.LogAttrs(ctx, slog.LevelWarn, "listing stale exposure failed", slog.Any(logfield.Error, err))
		return res
	}
	if len(list) == 0 {
		r.idleTil = now.Add(min(r.after, time.Minute))
		return res
	}
	keys := map[string]*vault.Key{}
	keyFailed := map[string]bool{} // logged once a pass
	for _, e := range list {
		if ctx.Err() != nil {
			return res
		}
		if keyFailed[e.KeyID] {
			continue
		}
		key, ok := keys[e.KeyID]
		if !ok {
			k, err := r.p.store.GetKey(ctx, e.KeyID)
			switch {
			case err == nil:
				key = &k
			case !errors.Is(err, vault.ErrNotFound):
				// Not claimed: the claim would touch it, and one failed
				// read would make it wait another After.
				keyFailed[e.KeyID] = true
				r.skipped(ctx, slog.LevelWarn, "reading its key failed", e, err)
				continue
			}
			keys[e.KeyID] = key
		}
		upstream := ""
		if key != nil {
			upstream = key.Upstream
		}
		if !r.allow(upstream, now) {
			res.Throttled++
			continue
		}
		exp, claimed, err := r.p.store.ClaimStaleExposure(ctx, e.KeyID, e.ObjectID, r.after)
		switch {
		case err != nil:
			r.skipped(ctx, slog.LevelWarn, "claiming it failed", e, err)
			continue
		case !claimed:
			r.skipped(ctx, slog.LevelDebug, "touched since it was listed, or settled", e, nil)
			continue
		case key == nil:
			r.skipped(ctx, slog.LevelDebug, "its key is gone; the claim moved it to the back of the list", e, nil)
			continue
		}
		r.recent[upstream] = append(r.recent[upstream], now)
		res.Looked++
		r.refresh(ctx, *key, e.ObjectID, exp)
	}
	return res
}

// skipped logs why Pass did not look up a stale exposure listed.
func (r *Refresher) skipped(ctx context.Context, level slog.Level, why string, e vault.StaleExposure, err error) {
	attrs := []slog.Attr{slog.String(logfield.KeyID, e.KeyID), slog.String(logfield.ObjectID, e.ObjectID),
		slog.String(logfield.Reason, why)}
	if err != nil {
		attrs = append(attrs, slog.Any(logfield.Error, err))
	}
	r.p.log.LogAttrs(ctx, level, "a stale exposure was not looked up", attrs...)
}

// allow reports whether upstream has had fewer than rate lookups in the
// second before now, forgetting the older ones.
func (r *Refresher) allow(upstream string, now time.Time) bool {
	times := r.recent[upstream]
	i := 0
	for i < len(times) && !times[i].After(now.Add(-time.Second)) {
		i++
	}
	times = times[i:]
	r.recent[upstream] = times
	return len(times) < r.rate
}

// refresh looks one claimed object up and applies Stripe's answer, or cancels
// the PaymentIntent when the key's policy says so.
func (r *Refresher) refresh(ctx context.Context, key vault.Key, objectID string, exp vault.ExposedObject) {
	p := r.p
	read, err := p.lookUpMoneyObject(ctx, key, objectID, exp.Exposure)
	if err != nil {
		return // logged by refreshFailed; the claim retries it After later
	}
	operation := OperationRefresh
	if r.cancels(key, exp, read) {
		if cancelled, err := p.cancelUnconfirmed(ctx, read, objectID); err == nil {
			read, operation = cancelled, OperationAutoCancel
		}
	}
	if _, err := p.store.ObserveObject(ctx, key.ID, objectID, read.observation(operation)); err != nil {
		p.log.LogAttrs(ctx, slog.LevelWarn, "applying Stripe's answer about a stale exposure failed",
			slog.String(logfield.KeyID, key.ID), slog.String(logfield.ObjectID, objectID), slog.Any(logfield.Error, err))
	}
}

// cancels reports whether the object is a PaymentIntent the key created that
// is still unconfirmed past its policy's cancel_unconfirmed_after, by the
// store's clock from when the key first counted it.
func (r *Refresher) cancels(key vault.Key, exp vault.ExposedObject, read moneyObjectRead) bool {
	after := key.Policy.CancelUnconfirmedAfter()
	return after > 0 && read.kind == "payment_intent" && exp.Own && !exp.CreatedAt.IsZero() &&
		unconfirmed[read.object.Get("status")] && !r.p.store.Now().Before(exp.CreatedAt.Add(after))
}

// cancelUnconfirmed cancels the PaymentIntent at Stripe, under an
// idempotency key of the object's own (a retry, or another replica's cancel,
// is the same request), and reads the answer.
func (p *Proxy) cancelUnconfirmed(ctx context.Context, read moneyObjectRead, objectID string) (moneyObjectRead, error) {
	c := read.c
	body, err := p.send(ctx, c, http.MethodPost, "/v1/payment_intents/"+objectID+"/cancel",
		nil, url.Values{"cancellation_reason": {"abandoned"}}, "keybrake-auto-cancel-"+objectID)
	if err == nil {
		read, err = p.readMoneyAnswer(ctx, c, read.kind, objectID, body)
	}
	if err == nil && !read.money.Terminal {
		err = errors.New("the answer to the cancel is not a cancelled PaymentIntent")
	}
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelWarn, "cancelling an unconfirmed PaymentIntent at Stripe failed; its exposure stays counted",
			slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID),
			slog.String(logfield.ObjectID, objectID), slog.Any(logfield.Error, err))
		return moneyObjectRead{}, err
	}
	p.log.LogAttrs(ctx, slog.LevelInfo, "cancelled a PaymentIntent left unconfirmed past the key's cancel_unconfirmed_after",
		slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.String(logfield.ObjectID, objectID))
	return read, nil
}
