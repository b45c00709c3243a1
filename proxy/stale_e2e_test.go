package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
)

// frozenClock stands still until a test moves it: the store's, the proxy's
// and the refresher's clock at once.
type frozenClock struct {
	mu sync.Mutex
	t  time.Time
	// settled, when set, runs before the clock moves (see staleEnv).
	settled func()
}

func newFrozenClock() *frozenClock { return &frozenClock{t: time.Now().UTC()} }

func (c *frozenClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *frozenClock) Advance(d time.Duration) {
	if c.settled != nil {
		c.settled()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// staleEnv is a proxy on a frozen clock and its refresher, with refresh-after
// an hour. The proxy answers before its settle commits (SettleQueued), and
// the store stamps the settle with its clock at the commit: the object is
// born, and last touched, then. So the clock moves only once every settle
// queued so far is durable — a read of the whole vault waits for them —
// else a settle that rides the commit after the move would create its
// object hours after its answer, which no real clock does.
func staleEnv(t *testing.T, opts ...func(*envOptions)) (*env, *frozenClock, *proxy.Refresher) {
	t.Helper()
	clock := newFrozenClock()
	e := MustEnv(t, append(opts, withClocks(clock.Now, clock.Now))...)
	clock.settled = func() {
		_, _, err := e.Store.ListHolds(context.Background(), "", 1, "")
		require.NoError(t, err, "waiting for the queued settles")
	}
	return e, clock, e.Proxy.NewRefresher(proxy.RefresherConfig{After: time.Hour, Now: clock.Now})
}

// lookupsOf counts the requests that reached the fake for path.
func lookupsOf(e *env, method, path string) int {
	return e.Fake.CountWhere(func(r proxytest.Request) bool { return r.Method == method && r.Path == path })
}

func heldOn(t *testing.T, e *env, keyID, objectID string) int64 {
	t.Helper()
	exp, ok, err := e.Store.ObjectExposure(context.Background(), keyID, objectID)
	require.NoError(t, err)
	require.True(t, ok)
	return exp.Held
}

// operationsOn is the ledger operations of the key's events about objectID
// that changed what it holds, oldest first.
func operationsOn(t *testing.T, e *env, keyID, objectID string) []string {
	t.Helper()
	events, _, err := e.Store.ListEvents(context.Background(), keyID, 500, "")
	require.NoError(t, err)
	var out []string
	for i := len(events) - 1; i >= 0; i-- {
		if ev := events[i]; ev.ObjectID == objectID && ev.HeldDelta < 0 {
			out = append(out, ev.Operation+":"+ev.Reason)
		}
	}
	return out
}

// A Checkout Session nobody paid expires at Stripe, with no request through
// keybrake: an hour after its exposure was last touched, the refresher looks
// it up and frees its budget, with no operator.
func TestStaleExpiredCheckoutSessionFreesItsBudget(t *testing.T) {
	t.Parallel()
	e, clock, r := staleEnv(t)
	tok, key := e.MustKey(t, Policy("50.00", everything))
	cs := e.Post(t, "/v1/checkout/sessions", tok, "cs-1", form("mode", "payment",
		"success_url", "https://example.test/ok", "line_items[0][quantity]", "1",
		"line_items[0][price_data][currency]", "usd", "line_items[0][price_data][unit_amount]", "4000",
		"line_items[0][price_data][product_data][name]", "Order 42"))
	require.Equal(t, http.StatusOK, cs.Status, "%s", cs.Raw)
	id := cs.Body["id"].(string)
	require.EqualValues(t, 4000, heldOn(t, e, key.ID, id))
	require.True(t, e.Fake.ExpireSession(id), "Stripe expires it by itself")
	path := "/v1/checkout/sessions/" + id

	clock.Advance(time.Hour)
	assert.Equal(t, proxy.PassResult{}, r.Pass(context.Background()), "touched an hour ago, not more: left alone")
	assert.Zero(t, lookupsOf(e, http.MethodGet, path))
	assert.EqualValues(t, 4000, heldOn(t, e, key.ID, id))

	clock.Advance(time.Minute)
	assert.Equal(t, proxy.PassResult{Looked: 1}, r.Pass(context.Background()))
	assert.Equal(t, 1, lookupsOf(e, http.MethodGet, path))
	assert.Zero(t, heldOn(t, e, key.ID, id), "Stripe's word: expired, it can move no money")
	assert.Equal(t, []string{"refresh:release"}, operationsOn(t, e, key.ID, id), "the ledger names the cause")

	clock.Advance(2 * time.Hour)
	assert.Equal(t, proxy.PassResult{}, r.Pass(context.Background()), "settled: never looked up again")
	assert.Equal(t, 1, lookupsOf(e, http.MethodGet, path))
}

// A live object the refresher looked up stays held, and is not looked up
// again before another hour passes: the lookup itself counts as a touch.
func TestStaleLiveObjectStaysHeld(t *testing.T) {
	t.Parallel()
	e, clock, r := staleEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	pi := e.Post(t, "/v1/payment_intents", tok, "pi", form("amount", "4200", "currency", "usd"))
	require.Equal(t, http.StatusOK, pi.Status, "%s", pi.Raw)
	id := pi.Body["id"].(string)
	clock.Advance(61 * time.Minute)
	assert.Equal(t, 1, r.Pass(context.Background()).Looked)
	assert.EqualValues(t, 4200, heldOn(t, e, key.ID, id), "still awaiting payment: held")
	clock.Advance(30 * time.Minute)
	assert.Zero(t, r.Pass(context.Background()).Looked)
	clock.Advance(31 * time.Minute)
	assert.Equal(t, 1, r.Pass(context.Background()).Looked)
	assert.Equal(t, 2, lookupsOf(e, http.MethodGet, "/v1/payment_intents/"+id))
	assert.Empty(t, operationsOn(t, e, key.ID, id))
}

// failingKeyReads is the store with GetKey failing while fail is set.
type failingKeyReads struct {
	vault.Store
	fail atomic.Bool
}

func (s *failingKeyReads) GetKey(ctx context.Context, id string) (vault.Key, error) {
	if s.fail.Load() {
		return vault.Key{}, fmt.Errorf("read key %s: %w", id, vault.ErrStorage)
	}
	return s.Store.GetKey(ctx, id)
}

// A stale exposure whose key cannot be read for a moment is not claimed, and
// the skip is logged: the next pass looks it up, not one After later.
func TestStaleKeyReadFailureDoesNotPostponeTheLookup(t *testing.T) {
	t.Parallel()
	store := &failingKeyReads{}
	e, clock, r := staleEnv(t, func(o *envOptions) {
		o.wrapStore = func(s vault.Store) vault.Store { store.Store = s; return store }
	})
	tok, _ := e.MustKey(t, Policy("99.00"))
	pi := e.Post(t, "/v1/payment_intents", tok, "pi", form("amount", "4200", "currency", "usd"))
	require.Equal(t, http.StatusOK, pi.Status, "%s", pi.Raw)
	path := "/v1/payment_intents/" + pi.Body["id"].(string)

	clock.Advance(2 * time.Hour)
	store.fail.Store(true)
	assert.Equal(t, proxy.PassResult{}, r.Pass(context.Background()), "its key unreadable: not looked up")
	assert.Zero(t, lookupsOf(e, http.MethodGet, path))
	assert.Contains(t, e.Logs.String(), "reading its key failed")

	store.fail.Store(false)
	assert.Equal(t, proxy.PassResult{Looked: 1}, r.Pass(context.Background()), "not claimed: still stale")
	assert.Equal(t, 1, lookupsOf(e, http.MethodGet, path))
}

// Many stale exposures on one upstream are looked up at most five a second
// of the refresher's clock, however often it ticks, and all of them in the end.
func TestStaleRefreshIsRateLimitedPerUpstream(t *testing.T) {
	t.Parallel()
	e, clock, r := staleEnv(t)
	tok, _ := e.MustKey(t, Policy("999.00"))
	const n = 17
	for i := range n {
		pi := e.Post(t, "/v1/payment_intents", tok, "pi-"+string(rune('a'+i)), form("amount", "100", "currency", "usd"))
		require.Equal(t, http.StatusOK, pi.Status, "%s", pi.Raw)
	}
	var (
		mu    sync.Mutex
		times []time.Time
	)
	e.Fake.SetHook(func(req proxytest.Request) {
		if req.Method == http.MethodGet && strings.HasPrefix(req.Path, "/v1/payment_intents/") {
			mu.Lock()
			times = append(times, clock.Now())
			mu.Unlock()
		}
	})
	clock.Advance(2 * time.Hour)
	for range 60 { // six seconds, ticking every 100ms
		r.Pass(context.Background())
		clock.Advance(100 * time.Millisecond)
	}
	e.Fake.WaitIdle(t)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, times, n, "every one looked up, once")
	for i := range times {
		in := 0
		for _, u := range times[i:] {
			if u.Sub(times[i]) < time.Second {
				in++
			}
		}
		assert.LessOrEqual(t, in, proxy.DefaultRefreshRate, "lookups in the second from %s", times[i].Sub(times[0]))
	}
	assert.Equal(t, 5, countWithin(times, times[0], time.Second), "five in the first second: the limit is used")
}

func countWithin(times []time.Time, from time.Time, d time.Duration) int {
	n := 0
	for _, u := range times {
		if !u.Before(from) && u.Sub(from) < d {
			n++
		}
	}
	return n
}

// objects.cancel_unconfirmed_after: a PaymentIntent the key created and nobody
// confirmed is cancelled at Stripe once it is that old, and released; one that
// was confirmed (authorised, waiting for capture) is left alone, as is an
// unconfirmed one of a key without the setting.
func TestUnconfirmedPaymentIntentIsCancelled(t *testing.T) {
	t.Parallel()
	e, clock, r := staleEnv(t)
	cancels := func(p *policy.Policy) { p.Objects = &policy.Objects{CancelUnconfirmedAfter: 24 * time.Hour} }
	tok, key := e.MustKey(t, Policy("999.00", cancels))
	plainTok, plain := e.MustKey(t, Policy("999.00"))

	abandoned := e.Post(t, "/v1/payment_intents", tok, "pi-abandoned", form("amount", "4200", "currency", "usd"))
	require.Equal(t, http.StatusOK, abandoned.Status, "%s", abandoned.Raw)
	confirmed := e.Post(t, "/v1/payment_intents", tok, "pi-confirmed", form("amount", "3000", "currency", "usd",
		"capture_method", "manual", "payment_method", "pm_card_visa", "confirm", "true"))
	require.Equal(t, http.StatusOK, confirmed.Status, "%s", confirmed.Raw)
	require.Equal(t, "requires_capture", confirmed.Body["status"])
	other := e.Post(t, "/v1/payment_intents", plainTok, "pi-other", form("amount", "1000", "currency", "usd"))
	require.Equal(t, http.StatusOK, other.Status, "%s", other.Raw)
	aID, cID, oID := abandoned.Body["id"].(string), confirmed.Body["id"].(string), other.Body["id"].(string)

	clock.Advance(2 * time.Hour)
	assert.Equal(t, 3, r.Pass(context.Background()).Looked)
	assert.Zero(t, lookupsOf(e, http.MethodPost, "/v1/payment_intents/"+aID+"/cancel"), "two hours old: not yet")

	clock.Advance(22 * time.Hour)
	assert.Equal(t, 3, r.Pass(context.Background()).Looked)
	cancelReqs := e.Fake.RequestsFrom(0)
	var cancel []proxytest.Request
	for _, q := range cancelReqs {
		if strings.HasSuffix(q.Path, "/cancel") {
			cancel = append(cancel, q)
		}
	}
	require.Len(t, cancel, 1, "only the abandoned one is cancelled")
	assert.Equal(t, "/v1/payment_intents/"+aID+"/cancel", cancel[0].Path)
	assert.Equal(t, "keybrake-auto-cancel-"+aID, cancel[0].IdempotencyKey, "a key of the object's own")
	got, ok := e.Fake.PaymentIntent(aID)
	require.True(t, ok)
	assert.Equal(t, "canceled", got.Status)
	assert.Zero(t, heldOn(t, e, key.ID, aID))
	assert.Equal(t, []string{"auto_cancel:release"}, operationsOn(t, e, key.ID, aID))

	assert.EqualValues(t, 3000, heldOn(t, e, key.ID, cID), "confirmed: the money is on its way, keep it")
	got, _ = e.Fake.PaymentIntent(cID)
	assert.Equal(t, "requires_capture", got.Status)
	assert.EqualValues(t, 1000, heldOn(t, e, plain.ID, oID), "no cancel_unconfirmed_after: opt-in")
	got, _ = e.Fake.PaymentIntent(oID)
	assert.Equal(t, "requires_payment_method", got.Status)
}
