package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// Seed failure mode 1: Stripe creates the charge, then answers 500.
func TestSeedFailure500AfterCreate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("fresh idempotency key per retry: the cap refuses the duplicate", func(t *testing.T) {
		e := MustEnv(t)
		tok, key := e.MustKey(t, Policy("99.00"))
		sc := e.Client(tok, 2)
		e.Fake.FailNext(proxytest.FailAfterCreate500, 1)

		_, err := sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "uuid-attempt-1"))
		se := StripeErr(t, err)
		assert.Equal(t, http.StatusInternalServerError, se.HTTPStatusCode)
		require.Len(t, e.Fake.Charges(), 1, "Stripe created the charge before failing")

		// The caller's retry loop mints a fresh UUID: the $60 hold of the first
		// attempt is still held (outcome unknown), so a second $60 passes the $99 cap.
		_, err = sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "uuid-attempt-2"))
		se = StripeErr(t, err)
		assert.Equal(t, http.StatusPaymentRequired, se.HTTPStatusCode)
		assert.Equal(t, stripe.ErrorCode("spend_cap_exceeded"), se.Code)
		require.NotNil(t, se.LastResponse)
		assert.Equal(t, "false", se.LastResponse.Header.Get("Stripe-Should-Retry"))

		assert.Len(t, e.Fake.Charges(), 1, "exactly one charge exists at Stripe")
		assert.EqualValues(t, 2, e.Hits.Load(), "stripe-go retried neither answer")

		holds, _, err := e.Store.ListHolds(ctx, vault.HoldUnknown, 10, "")
		require.NoError(t, err)
		require.Len(t, holds, 1)
		assert.Equal(t, key.ID, holds[0].KeyID)
		assert.EqualValues(t, 6000, holds[0].Amount)
	})

	t.Run("same idempotency key: one charge, the retry is answered by Stripe's replay", func(t *testing.T) {
		e := MustEnv(t)
		tok, key := e.MustKey(t, Policy("99.00"))
		sc := e.Client(tok, 2)
		e.Fake.FailNext(proxytest.FailAfterCreate500, 1)

		_, err := sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "order-42"))
		assert.Equal(t, http.StatusInternalServerError, StripeErr(t, err).HTTPStatusCode)

		_, err = sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "order-42"))
		se := StripeErr(t, err)
		assert.Equal(t, http.StatusInternalServerError, se.HTTPStatusCode, "Stripe replays its 500")
		assert.Equal(t, "true", se.LastResponse.Header.Get("Idempotent-Replayed"))

		require.Len(t, e.Fake.Charges(), 1)
		posts := e.Fake.CountWhere(func(r proxytest.Request) bool { return r.Method == http.MethodPost })
		assert.Equal(t, 2, posts, "the unknown record was forwarded again")
		upKey := vault.UpstreamKey(key.ID, "order-42")
		for _, r := range e.Fake.Requests() {
			assert.Equal(t, upKey, r.IdempotencyKey, "every attempt carries the same upstream key")
			assert.NotEqual(t, "order-42", r.IdempotencyKey)
		}
	})
}

// Seed failure mode 2: the connection resets after Stripe created the charge; the
// pool retries with the same key.
func TestSeedFailureResetAfterCreate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	sc := e.Client(tok, 2)
	e.Fake.FailNext(proxytest.FailAfterCreateReset, 1)

	ch, err := sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "pool-1"))
	if err != nil {
		// net/http may itself resend a request with an Idempotency-Key after a
		// reset on a reused connection (then the first call already succeeds);
		// otherwise keybrake answers 502 and the outcome is unknown.
		se := StripeErr(t, err)
		assert.Equal(t, http.StatusBadGateway, se.HTTPStatusCode)
		assert.Equal(t, stripe.ErrorCode("upstream_unavailable"), se.Code)
		assert.Equal(t, stripe.ErrorTypeAPI, se.Type)
		assert.Equal(t, "true", se.LastResponse.Header.Get("Stripe-Should-Retry"))

		ch, err = sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "pool-1"))
	}
	require.NoError(t, err)
	charges := e.Fake.Charges()
	require.Len(t, charges, 1)
	assert.Equal(t, charges[0].ID, ch.ID, "the retry resolves to the original charge")

	again, err := sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "pool-1"))
	require.NoError(t, err)
	assert.Equal(t, ch.ID, again.ID)
	assert.Equal(t, "true", again.LastResponse.Header.Get("Idempotent-Replayed"), "keybrake replays the completed record")
	assert.Len(t, e.Fake.Charges(), 1)

	holds, _, err := e.Store.ListHolds(ctx, vault.HoldCommitted, 10, "")
	require.NoError(t, err)
	require.Len(t, holds, 1)
	assert.EqualValues(t, 6000, holds[0].Amount)
}

// Seed failure mode 3: Stripe is still working when keybrake's upstream timeout
// fires; the retry (with the same key) resolves to the original charge.
func TestSeedFailureUpstreamTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t, withUpstreamTimeout(time.Second))
	tok, _ := e.MustKey(t, Policy("99.00"))
	sc := e.Client(tok, 0)
	e.Fake.SetFailDelay(time.Hour) // until keybrake gives up
	e.Fake.FailNext(proxytest.FailAfterCreateDelay, 1)

	_, err := sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "lb-1"))
	se := StripeErr(t, err)
	assert.Equal(t, http.StatusGatewayTimeout, se.HTTPStatusCode)
	assert.Equal(t, stripe.ErrorCode("upstream_unavailable"), se.Code)
	assert.Equal(t, "true", se.LastResponse.Header.Get("Stripe-Should-Retry"))
	require.Len(t, e.Fake.Charges(), 1)

	// A fresh key cannot get a second $60 through while the first is unknown.
	_, err = sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "lb-other"))
	assert.Equal(t, http.StatusPaymentRequired, StripeErr(t, err).HTTPStatusCode)

	e.Fake.WaitIdle(t) // Stripe finished the first request
	ch, err := sc.V1Charges.Create(ctx, chargeParams(6000, "usd", "lb-1"))
	require.NoError(t, err)
	charges := e.Fake.Charges()
	require.Len(t, charges, 1)
	assert.Equal(t, charges[0].ID, ch.ID)
	assert.Equal(t, "39.00", ch.LastResponse.Header.Get("Keybrake-Remaining-Daily"))

	holds, _, err := e.Store.ListHolds(ctx, vault.HoldCommitted, 10, "")
	require.NoError(t, err)
	require.Len(t, holds, 1)
}

// 100 concurrent $1 charges with distinct keys against a $20 cap
// (KEYBRAKE_LONG=1: 2000 against $400).
func TestConcurrentChargesAgainstCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, capDollars := 100, 20
	if os.Getenv("KEYBRAKE_LONG") == "1" {
		n, capDollars = 2000, 400
	}
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy(fmt.Sprintf("%d.00", capDollars)))
	sc := e.Client(tok, 2) // default retries: the 402s must still not be retried

	type result struct {
		ch  *stripe.Charge
		err error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ch, err := sc.V1Charges.Create(ctx, chargeParams(100, "usd", fmt.Sprintf("dollar-%03d", i)))
			results[i] = result{ch, err}
		})
	}
	wg.Wait()

	var ok, refused int
	for _, r := range results {
		if r.err == nil {
			ok++
			continue
		}
		se := StripeErr(t, r.err)
		if assert.Equal(t, http.StatusPaymentRequired, se.HTTPStatusCode, "%v", r.err) {
			refused++
		}
		assert.Equal(t, stripe.ErrorCode("spend_cap_exceeded"), se.Code)
		assert.Equal(t, "false", se.LastResponse.Header.Get("Stripe-Should-Retry"))
	}
	assert.Equal(t, capDollars, ok)
	assert.Equal(t, n-capDollars, refused)
	assert.Len(t, e.Fake.Charges(), capDollars, "exactly as many as the cap allows reached Stripe")
	assert.Equal(t, capDollars, e.Fake.Count())
	assert.EqualValues(t, n, e.Hits.Load(), "stripe-go retried none of the refusals")
	assert.EqualValues(t, capDollars*100, e.Fake.TotalCharged("usd"))
}

// The same idempotency key from 20 goroutines: one upstream call.
func TestSameKeyConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	sc := e.Client(tok, 0)
	// Hold Stripe's answer briefly so that most of the goroutines find the key in flight.
	e.Fake.SetFailDelay(200 * time.Millisecond)
	e.Fake.FailNext(proxytest.FailAfterCreateDelay, 1)

	const n = 20
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ch, err := sc.V1Charges.Create(ctx, chargeParams(1500, "usd", "same-key"))
			errs[i] = err
			if err == nil {
				ids[i] = ch.ID
			}
		})
	}
	wg.Wait()

	require.Len(t, e.Fake.Charges(), 1)
	assert.Equal(t, 1, e.Fake.Count(), "one upstream call")
	chargeID := e.Fake.Charges()[0].ID
	var ok int
	for i := range n {
		if errs[i] == nil {
			ok++
			assert.Equal(t, chargeID, ids[i])
			continue
		}
		se := StripeErr(t, errs[i])
		assert.Equal(t, http.StatusConflict, se.HTTPStatusCode)
		assert.Equal(t, stripe.ErrorCode("idempotency_key_in_use"), se.Code)
		assert.Equal(t, "true", se.LastResponse.Header.Get("Stripe-Should-Retry"))
		assert.NotEmpty(t, se.LastResponse.Header.Get("Retry-After"))
	}
	assert.GreaterOrEqual(t, ok, 1)

	// After the dust settles every retry replays the one charge.
	ch, err := sc.V1Charges.Create(ctx, chargeParams(1500, "usd", "same-key"))
	require.NoError(t, err)
	assert.Equal(t, chargeID, ch.ID)
	assert.Equal(t, 1, e.Fake.Count())
}

// When the store cannot record Stripe's answer, the caller still gets it, and the
// record stays in progress, to be recovered as outcome unknown (hold kept).
func TestSettleFailureStillAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := MustEnv(t, withOwnStoreChecks())
	tok, key := e.MustKey(t, Policy("99.00"))
	e.Fake.SetHook(func(r proxytest.Request) {
		if r.Method == http.MethodPost {
			// Stripe is executing the charge; keybrake's store goes away.
			assert.NoError(t, e.Store.Close())
		}
	})
	r := e.Post(t, "/v1/charges", tok, "k", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	assert.Equal(t, http.StatusOK, r.Status, "Stripe's answer reaches the caller: %s", r.Raw)
	require.Len(t, e.Fake.Charges(), 1)
	assert.Equal(t, e.Fake.Charges()[0].ID, r.Body["id"])
	assert.Contains(t, e.Logs.String(), `"level":"ERROR","msg":"settle failed`)

	reopened, err := bolt.Open(e.DBPath, bolt.Options{MasterKey: e.Master})
	require.NoError(t, err)
	defer reopened.Close()
	holds, _, err := reopened.ListHolds(ctx, vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	require.Len(t, holds, 1, "recovered as outcome unknown: the hold stays")
	assert.Equal(t, key.ID, holds[0].KeyID)
	assert.EqualValues(t, 6000, holds[0].Amount)
	assert.NoError(t, reopened.CheckInvariant(ctx))
}

// TestStoreUnavailableFailsClosed: a request that meets a store it cannot use
// (here closed; a PostgreSQL server that is down gives the same ErrStorage
// family) is answered 503 store_unavailable — Stripe-shaped, retryable, and
// nothing reaches Stripe: neither a charge, which would need its hold first,
// nor a read, whose vault key cannot be checked.
func TestStoreUnavailableFailsClosed(t *testing.T) {
	t.Parallel()
	e := MustEnv(t, withOwnStoreChecks())
	tok, _ := e.MustKey(t, Policy("99.00"))
	charge := form("amount", "600", "currency", "usd", "source", "tok_visa")
	require.Equal(t, http.StatusOK, e.Post(t, "/v1/charges", tok, "before", charge).Status)
	require.NoError(t, e.Store.Close())
	before := e.Fake.Count()

	for name, r := range map[string]reply{
		"charge": e.Post(t, "/v1/charges", tok, "during", charge),
		"read":   e.MustSend(t, http.MethodGet, "/v1/charges", tok, nil, ""),
	} {
		AssertRefusal(t, r, http.StatusServiceUnavailable, "store_unavailable")
		assert.Equal(t, "api_error", r.ErrType(), name)
		assert.Equal(t, "true", r.Header.Get("Stripe-Should-Retry"), name)
		assert.Equal(t, "1", r.Header.Get("Retry-After"), name)
		assert.Contains(t, r.ErrMessage(), "not sent to Stripe", name)
	}
	assert.Equal(t, before, e.Fake.Count(), "nothing reached Stripe")
	assert.Equal(t, 2.0, MetricValue(t, e.Metrics, "keybrake_proxy_refusals_total", "reason", "store_unavailable", "mode", "enforce"))
}

// offsetClock is time.Now shifted by an adjustable offset.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) Advance(d time.Duration) { c.off.Add(int64(d)) }

// An unknown outcome older than the vault's retry limit (23 h) is not forwarded
// again: Stripe may have pruned its idempotency key. An operator resolves it.
func TestStaleUnknownIsRefused(t *testing.T) {
	t.Parallel()
	clock := &offsetClock{}
	e := MustEnv(t, withClocks(clock.Now, clock.Now))
	tok, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) {
		pc := decimal.RequireFromString("500.00")
		p.PeriodCap = &pc
	}))
	e.Fake.FailNext(proxytest.FailAfterCreate500, 1)
	body := form("amount", "6000", "currency", "usd", "source", "tok_visa")
	first := e.Post(t, "/v1/charges", tok, "old", body)
	require.Equal(t, http.StatusInternalServerError, first.Status)

	clock.Advance(24 * time.Hour)
	r := e.Post(t, "/v1/charges", tok, "old", body)
	AssertRefusal(t, r, http.StatusConflict, "idempotency_key_outcome_unknown")
	assert.Equal(t, "idempotency_error", r.ErrType())
	assert.Equal(t, "false", r.Header.Get("Stripe-Should-Retry"))
	assert.Equal(t, 1, e.Fake.Count(), "not forwarded again")
	assert.Equal(t, "439.00", e.Post(t, "/v1/charges", tok, "new", form("amount", "100", "currency", "usd", "source", "tok_visa")).Header.Get("Keybrake-Remaining-Period"),
		"the unknown $60 stays held on the period")
}

// A retry of a request whose unknown outcome an operator resolved is told what
// the operator decided — a Stripe-shaped 409 that no SDK retries — and never
// reaches Stripe again.
func TestResolvedHoldIsReplayedAsTheOperatorsDecision(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("99.00"))
	e.Fake.FailNext(proxytest.FailAfterCreate500, 1)
	body := form("amount", "6000", "currency", "usd", "source", "tok_visa")
	first := e.Post(t, "/v1/charges", tok, "lost", body)
	require.Equal(t, http.StatusInternalServerError, first.Status)
	hold := vault.HoldID(key.ID, "lost")
	_, err := e.Store.ResolveHold(context.Background(), "op", hold, vault.HoldCommitted)
	require.NoError(t, err)

	for range 2 {
		r := e.Post(t, "/v1/charges", tok, "lost", body)
		require.Equal(t, http.StatusConflict, r.Status, "%s", r.Raw)
		assert.Equal(t, "idempotency_error", r.ErrType())
		assert.Equal(t, "idempotency_key_resolved", r.ErrCode())
		assert.Equal(t, "false", r.Header.Get("Stripe-Should-Retry"))
		assert.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
		assert.Equal(t, "committed", r.Keybrake()["outcome"])
		assert.Equal(t, hold, r.Keybrake()["hold_id"])
		// Like every answer keybrake writes itself: the reason and this request's id.
		assert.Equal(t, "idempotency_key_resolved", r.Keybrake()["reason"])
		assert.Equal(t, r.Header.Get("Request-Id"), r.Keybrake()["request_id"])
		assert.True(t, strings.HasPrefix(r.Header.Get("Request-Id"), "req_kb_"))
		assert.Contains(t, r.ErrMessage(), "an operator resolved it as committed")
	}
	assert.Equal(t, 1, e.Fake.Count(), "never forwarded again")
}

// Expiry and not-yet-valid are decided at the store's clock, never the
// proxy's process's: a replica whose own clock is 31 days slow refuses an
// expired key (reads too, which move no money), and one whose clock is 3 days
// fast refuses a key valid only from tomorrow.
func TestKeyDecisionsFollowTheStoreClock(t *testing.T) {
	t.Parallel()
	storeClock, processClock := &offsetClock{}, &offsetClock{}
	e := MustEnv(t, withClocks(storeClock.Now, processClock.Now))
	tok, _ := e.MustKey(t, Policy("99.00"))
	future, _ := e.MustKey(t, Policy("99.00", func(p *policy.Policy) {
		p.PeriodStart = time.Now().Add(24 * time.Hour).Truncate(time.Second)
	}))
	charge := form("amount", "100", "currency", "usd", "source", "tok_visa")

	processClock.Advance(72 * time.Hour) // a fast replica
	r := e.Post(t, "/v1/charges", future, "early", charge)
	AssertRefusal(t, r, http.StatusForbidden, "vault_key_not_yet_valid")

	storeClock.Advance(31 * 24 * time.Hour)
	processClock.Advance(-72 * time.Hour) // a slow replica: 31 days behind the store
	r = e.Post(t, "/v1/charges", tok, "late", charge)
	AssertRefusal(t, r, http.StatusUnauthorized, "vault_key_expired")
	r = e.MustSend(t, http.MethodGet, "/v1/charges", tok, nil, "")
	AssertRefusal(t, r, http.StatusUnauthorized, "vault_key_expired")
	assert.Zero(t, e.Fake.Count(), "nothing reached Stripe")
}

// The caller hanging up does not cancel the upstream request: Stripe's answer is
// still recorded, and the caller's retry gets it replayed.
func TestCallerHangsUp(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, _ := e.MustKey(t, Policy("99.00"))
	// Stripe holds its answer until the test has retried once while keybrake
	// still has the first attempt in flight.
	e.Fake.SetFailDelay(time.Minute)
	release := e.Fake.HoldDelayed()
	defer release()
	e.Fake.FailNext(proxytest.FailAfterCreateDelay, 1)
	body := form("amount", "6000", "currency", "usd", "source", "tok_visa").Encode()

	ctx, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	e.Fake.SetHook(func(r proxytest.Request) {
		if r.Method == http.MethodPost {
			hangUp() // while Stripe is working on the charge
		}
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL+"/v1/charges", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "hangup")
	_, err = http.DefaultClient.Do(req)
	require.ErrorIs(t, err, context.Canceled, "the caller gave up first")
	e.Fake.SetHook(nil)

	// Retry like a client would, while keybrake still has the first attempt in
	// flight: refused as in use; then once Stripe has answered, replayed.
	r := e.Post(t, "/v1/charges", tok, "hangup", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
	require.Equal(t, http.StatusConflict, r.Status, "%s", r.Raw)
	assert.Equal(t, "idempotency_key_in_use", r.ErrCode())
	release()
	for range 200 {
		r = e.Post(t, "/v1/charges", tok, "hangup", form("amount", "6000", "currency", "usd", "source", "tok_visa"))
		if r.Status != http.StatusConflict {
			break
		}
		assert.Equal(t, "idempotency_key_in_use", r.ErrCode())
		time.Sleep(25 * time.Millisecond)
	}
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "true", r.Header.Get("Idempotent-Replayed"), "replayed by keybrake from its record")
	assert.True(t, strings.HasPrefix(r.Header.Get("Request-Id"), "req_kb_"))
	require.Len(t, e.Fake.Charges(), 1)
	assert.Equal(t, e.Fake.Charges()[0].ID, r.Body["id"])
	assert.Equal(t, 1, e.Fake.Count(), "the retry never reached Stripe")
}
