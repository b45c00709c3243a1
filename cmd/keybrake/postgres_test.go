package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/postgres"
	"github.com/keybrake/keybrake/vault/postgres/pgtest"
)

func TestMain(m *testing.M) {
	runMainWhenAsked()
	parallelForWaiting()
	pgtest.Main(m)
}

// parallelForWaiting runs twice as many of this package's parallel tests at
// once as -parallel's default (GOMAXPROCS), unless -parallel was given. Most
// of them wait rather than compute — on a child process, a PostgreSQL lock
// timeout, a browser — so two at a time on 2 cores left a core idle for much
// of the package's run; four at a time took it from 80 to 58 s of wall time
// for the same CPU.
func parallelForWaiting() {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(2*runtime.GOMAXPROCS(0)))
	}
}

// migrated is a database with keybrake's schema, prepared once per test
// binary, for the tests whose replicas start on a database a first replica
// already migrated (serve's first start on a new database has tests of its
// own, here and in vault/postgres).
var migrated = pgtest.NewTemplate("schema", func(ctx context.Context, url string) error {
	_, err := postgres.Migrate(ctx, url)
	return err
})

// TestServeOnPostgreSQL: two serve processes' worth of Main on one database,
// selected by KEYBRAKE_DATABASE_URL, share keys and usage: a key minted
// through one meters a charge through the other. keybrake backup, rekey and
// compact say that they do not apply to a PostgreSQL store.
func TestServeOnPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fake := proxytest.NewFakeStripe(t, "sk_test_pg")
	dbURL := pgtest.URL(t)
	e := env{
		envStripeKey:            fake.Secret,
		envMasterKey:            base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef")),
		envJWTSecret:            base64.StdEncoding.EncodeToString([]byte("a jwt secret shared by replicas.")),
		envName("database-url"): dbURL,
	}
	a := MustServe(t, t.TempDir(), fake.URL, e)
	b := MustServe(t, t.TempDir(), fake.URL, e)

	adminToken := strings.TrimSpace(MustRunCommand(t, e, "token", "--data-dir", t.TempDir(), "--sub", "pg"))
	mint := map[string]any{
		"name": "shared", "upstream": "default",
		"policy": map[string]any{"vendor": "stripe", "currency": "usd", "daily_cap": "50.00",
			"expires_at": "2099-01-01T00:00:00Z"},
	}
	var minted struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	require.Equal(t, http.StatusCreated, adminDo(t, http.MethodPost, a.AdminURL()+"/api/v1/keys", adminToken, mint, &minted))

	sc := MustStripeClient(t, b.ProxyURL(), minted.Token)
	_, err := sc.V1Charges.Create(ctx, &stripe.ChargeCreateParams{Amount: stripe.Int64(4000), Currency: stripe.String("usd"),
		Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")}})
	require.NoError(t, err)
	_, err = MustStripeClient(t, a.ProxyURL(), minted.Token).V1Charges.Create(ctx, &stripe.ChargeCreateParams{
		Amount: stripe.Int64(2000), Currency: stripe.String("usd"), Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")}})
	var serr *stripe.Error
	require.ErrorAs(t, err, &serr, "40 + 20 passes the cap of 50, whichever replica is asked")
	assert.Equal(t, "spend_cap_exceeded", string(serr.Code))
	assert.Len(t, fake.Charges(), 1)

	var usage usageAnswer
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, a.AdminURL()+"/api/v1/keys/"+minted.ID+"/usage", adminToken, nil, &usage))
	assertMoney(t, "40", usage.Daily.Committed)

	for _, m := range []testMain{a, b} {
		status, body := MustGet(t, m.ProxyURL()+"/readyz", "")
		assert.Equal(t, http.StatusOK, status, string(body))
	}
	status, body := MustGet(t, a.AdminURL()+"/metrics", "")
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, string(body), "keybrake_store_size_bytes ")
	status, body = MustGet(t, a.AdminURL()+"/api/v1/backup", adminToken)
	assert.Equal(t, http.StatusNotImplemented, status)
	assert.Contains(t, string(body), "pg_dump")

	_, err = runCommand(e, "backup", "--out", filepath.Join(t.TempDir(), "x.db"))
	assert.ErrorContains(t, err, "pg_dump")
	_, err = runCommand(env{}, "compact", "--admin-url", a.AdminURL(), "--token", adminToken)
	assert.ErrorContains(t, err, "501", "a running server on PostgreSQL answers that it does not compact")
	assert.ErrorContains(t, err, "autovacuum")
	_, err = runCommand(e, "rekey", "--new-master-key", base64.StdEncoding.EncodeToString(make([]byte, 32)))
	assert.ErrorContains(t, err, "cannot rekey a PostgreSQL store")
	_, err = runCommand(env{}, "serve", "--database-url", "mysql://x")
	assert.ErrorContains(t, err, "postgres://")
}

// TestPostgreSQLRestartUnderLoad: serve on a PostgreSQL server that is
// stopped, then crashed, under load. While the server is down requests fail
// closed — 503 store_unavailable, Stripe-shaped and retryable, never a 500 —
// and /readyz says why; nothing reaches Stripe without a hold committed before
// the outage; once the server is back keybrake serves again without a
// restart, and every retried charge moved money once.
func TestPostgreSQLRestartUnderLoad(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stops and crashes a PostgreSQL server under load")
	}
	ctx := context.Background()
	cluster := pgtest.NewCluster(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_pg_restart")
	e := env{
		envStripeKey:            fake.Secret,
		envMasterKey:            base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef")),
		envJWTSecret:            replicaJWTSecret,
		envName("database-url"): cluster.URL(t),
	}
	m := MustServe(t, t.TempDir(), fake.URL, e, "--upstream-timeout", "4s", "--lease-margin", "1s", "--reap-interval", "500ms")
	key, vaultKey := MustMintKey(t, m.Store(), "restart", 1000)

	// When each request reached Stripe, by caller key.
	var arrivalsMu sync.Mutex
	arrivals := map[string][]time.Time{}
	fake.SetHook(func(r proxytest.Request) {
		if ck := r.Params.Get("metadata[caller_key]"); ck != "" {
			arrivalsMu.Lock()
			arrivals[ck] = append(arrivals[ck], time.Now())
			arrivalsMu.Unlock()
		}
	})

	stats := newLoadStats()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var answered atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 15 * time.Second}
	for g := range 4 {
		wg.Go(func() {
			for n := 0; loadCtx.Err() == nil; n++ {
				ck := fmt.Sprintf("restart-c%d-n%d", g, n)
				if chargeUntilDefinitive(loadCtx, client, m.ProxyURL, vaultKey, ck, 100, stats) == http.StatusOK {
					answered.Add(1)
				}
			}
		})
	}
	refused := func() int {
		stats.mu.Lock()
		defer stats.mu.Unlock()
		return stats.retried[http.StatusServiceUnavailable]
	}
	progress := func(what string) {
		before := answered.Load()
		require.Eventually(t, func() bool { return answered.Load() >= before+20 }, 60*time.Second, 10*time.Millisecond, what)
	}

	type outage struct {
		name     string
		down, up time.Time
		downAt   int // fake.Count() once the server was down
		upAt     int // and before it started again
		stop     func(testing.TB)
	}
	outages := []*outage{{name: "stop", stop: cluster.Stop}, {name: "crash", stop: cluster.Crash}}
	for _, o := range outages {
		progress("charges go through before the " + o.name)
		o.stop(t)
		o.down, o.downAt = time.Now(), fake.Count()
		refusedBefore := refused()

		status, body := MustGet(t, m.ProxyURL()+"/readyz", "")
		assert.Equal(t, http.StatusServiceUnavailable, status, "%s", body)
		assert.JSONEq(t, `{"status": "not_ready", "reason": "the store cannot write"}`, string(body))
		status, body, err := postForm(ctx, client, m.ProxyURL()+"/v1/charges", vaultKey, "probe-"+o.name, chargeForm(100, "probe-"+o.name))
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, status)
		var refusal struct {
			Error struct{ Type, Code string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal(body, &refusal), "%s", body)
		assert.Equal(t, "api_error", refusal.Error.Type)
		assert.Equal(t, "store_unavailable", refusal.Error.Code)
		require.Eventually(t, func() bool { return refused() >= refusedBefore+4 }, 60*time.Second, 10*time.Millisecond,
			"the callers keep trying during the %s, and meet it as 503s", o.name)

		o.upAt, o.up = fake.Count(), time.Now()
		cluster.Start(t)
		require.Eventually(t, func() bool {
			status, _ := MustGet(t, m.ProxyURL()+"/readyz", "")
			return status == http.StatusOK
		}, 30*time.Second, 50*time.Millisecond, "ready again after the %s, without a restart", o.name)
		progress("charges go through after the " + o.name)
	}
	stopLoad()
	wg.Wait()
	fake.WaitIdle(t)
	fake.SetHook(nil)

	// Every request that reached Stripe had its hold first: a hold created
	// before it arrived and, when it arrived during an outage, before the
	// outage began.
	holds := map[string]vault.Hold{}
	for cursor := ""; ; {
		page, next, err := m.Store().ListHolds(ctx, "", 500, cursor)
		require.NoError(t, err)
		for _, h := range page {
			holds[h.IdempotencyKey] = h
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	arrivalsMu.Lock()
	defer arrivalsMu.Unlock()
	for ck, times := range arrivals {
		h, ok := holds[ck]
		if !assert.True(t, ok, "%s reached Stripe with a hold", ck) {
			continue
		}
		for _, at := range times {
			assert.True(t, h.CreatedAt.Before(at), "%s: hold created at %s, before Stripe got it at %s", ck, h.CreatedAt, at)
			for _, o := range outages {
				if at.After(o.down) && at.Before(o.up) {
					assert.True(t, h.CreatedAt.Before(o.down), "%s reached Stripe during the %s with a hold from before it", ck, o.name)
				}
			}
		}
	}
	for _, o := range outages {
		t.Logf("%s: %d requests reached Stripe while PostgreSQL was down (their holds committed before)", o.name, o.upAt-o.downAt)
		assert.NotContains(t, arrivals, "probe-"+o.name, "the refused probe never reached Stripe")
	}

	stats.mu.Lock()
	defer stats.mu.Unlock()
	t.Logf("load: %d charges succeeded, %d retries (by status, 0 for no answer: %v); fake: %d charges",
		len(stats.succeeded), stats.retries, stats.retried, len(fake.Charges()))
	assert.Empty(t, stats.unexpected)
	assert.Zero(t, stats.retried[http.StatusInternalServerError], "no 500 during the outages")
	assert.Positive(t, stats.retried[http.StatusServiceUnavailable], "the callers met the outages as 503s")
	assertEachCallerKeyMovedOnce(t, fake, stats)
	assertMetered(t, m.Store(), key.ID, fake.TotalMoved("usd"))
}
