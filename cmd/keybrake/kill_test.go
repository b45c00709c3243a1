package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// envRunMain makes this test binary run keybrake's own main instead of the
// tests: the end-to-end tests start it as their `keybrake` child.
const envRunMain = "KEYBRAKE_TEST_RUN_MAIN"

// runMainWhenAsked runs keybrake's main and exits when this test binary was
// started as a child by MustBuildBinary's callers; otherwise it returns.
// TestMain calls it first, before any test or server of the tests starts.
func runMainWhenAsked() {
	if os.Getenv(envRunMain) != "1" {
		return
	}
	os.Unsetenv(envRunMain)
	main()
	os.Exit(exitOK)
}

// MustBuildBinary returns the path of a keybrake program for the tests to start:
// this test binary itself, which runs main (and nothing of the tests) when its
// environment has envRunMain, as childEnviron's does. It is built with the
// same flags as the tests (-race when they run with it), from the same code,
// so no test pays for a `go build` and its link; the name is kept for the
// tests that call it.
func MustBuildBinary(tb testing.TB) string {
	tb.Helper()
	bin, err := os.Executable()
	require.NoError(tb, err, "find this test binary")
	return bin
}

// childEnviron is this process's environment without any KEYBRAKE_ or STRIPE_
// variable, plus envRunMain (the child is this binary, running main) and extra:
// a child's configuration is exactly what the test gives it.
func childEnviron(extra ...string) []string {
	var environ []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KEYBRAKE_") && !strings.HasPrefix(kv, "STRIPE_") {
			environ = append(environ, kv)
		}
	}
	return append(append(environ, envRunMain+"=1"), extra...)
}

// child is one `keybrake serve` process.
type child struct {
	cmd      *exec.Cmd
	ready    chan string // the proxy's address, once logged
	exited   chan struct{}
	exitErr  error
	logMu    sync.Mutex
	log      strings.Builder
	raceSeen atomic.Bool
	admin    atomic.Pointer[string] // the admin listener's address, once logged
}

// startChild starts the binary and collects its stderr.
func startChild(tb testing.TB, bin string, args, environ []string) *child {
	tb.Helper()
	c := &child{ready: make(chan string, 1), exited: make(chan struct{})}
	c.cmd = exec.Command(bin, args...)
	c.cmd.Env = environ
	c.cmd.Stdout = io.Discard
	stderr, err := c.cmd.StderrPipe()
	require.NoError(tb, err)
	require.NoError(tb, c.cmd.Start())
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			c.logMu.Lock()
			if c.log.Len() < 1<<20 {
				c.log.WriteString(line + "\n")
			}
			c.logMu.Unlock()
			if strings.Contains(line, "WARNING: DATA RACE") {
				c.raceSeen.Store(true)
			}
			var rec struct {
				Msg   string `json:"msg"`
				Proxy string `json:"proxy"`
				Admin string `json:"admin"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "keybrake serving" && rec.Proxy != "" {
				c.admin.Store(&rec.Admin)
				select {
				case c.ready <- rec.Proxy:
				default:
				}
			}
		}
		c.exitErr = c.cmd.Wait()
		close(c.exited)
	}()
	return c
}

// waitReady waits until the child logs that it serves and returns its proxy
// listener's address; a child that exits first, or takes over a minute, fails
// the test.
func (c *child) waitReady(tb testing.TB) string {
	tb.Helper()
	select {
	case addr := <-c.ready:
		return addr
	case <-c.exited:
		require.FailNow(tb, "keybrake exited during start", "%v; logs:\n%s", c.exitErr, c.logs())
	case <-time.After(60 * time.Second):
		require.FailNow(tb, "keybrake did not start", "logs:\n%s", c.logs())
	}
	return ""
}

// logs returns what the child wrote to stderr.
func (c *child) logs() string {
	c.logMu.Lock()
	defer c.logMu.Unlock()
	return c.log.String()
}

// signalAndWait sends sig to the child by its PID and waits for it to exit.
func (c *child) signalAndWait(tb testing.TB, sig syscall.Signal, within time.Duration) error {
	tb.Helper()
	select {
	case <-c.exited:
		return c.exitErr
	default:
	}
	require.NoError(tb, c.cmd.Process.Signal(sig))
	select {
	case <-c.exited:
		return c.exitErr
	case <-time.After(within):
		_ = c.cmd.Process.Kill()
		<-c.exited
		require.FailNow(tb, "child did not exit", "after %s on %s; logs:\n%s", within, sig, c.logs())
		return nil
	}
}

// loadStats counts what the load generator saw.
type loadStats struct {
	mu         sync.Mutex
	succeeded  map[string]string // caller idempotency key -> charge id answered
	refused    int               // 402
	retries    int               // transport errors, 409 and 5xx, retried
	retried    map[int]int       // the retried answers by status (0: no answer)
	unexpected []string
}

// killSchedule returns how many kills a test makes (long of them with
// KEYBRAKE_LONG, else short) and the seed of their schedule (KEYBRAKE_SEED,
// else the clock), and logs both.
func killSchedule(t *testing.T, short, long int) (kills int, seed uint64) {
	t.Helper()
	kills = short
	if os.Getenv("KEYBRAKE_LONG") != "" {
		kills = long
	}
	seed = uint64(time.Now().UnixNano())
	if s := os.Getenv("KEYBRAKE_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("kills=%d seed=%d (KEYBRAKE_SEED reproduces the schedule)", kills, seed)
	return kills, seed
}

func TestKill9UnderLoad(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and kills the real binary")
	}
	kills, seed := killSchedule(t, 3, 20)
	rng := rand.New(rand.NewPCG(seed, 1))

	bin := MustBuildBinary(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_kill9")
	dataDir := t.TempDir()
	dbPath := filepath.Join(dataDir, databaseFile)
	masterText, err := newMasterKeyText()
	require.NoError(t, err)
	masterKey, err := decodeMasterKey(masterText)
	require.NoError(t, err)

	// The cap is reached part way through the run, so kills land both while money
	// moves and while requests are refused. It is the cap of an organisation's
	// budget that three keys draw from: two through a team's budget under it,
	// one directly; each key's own cap is as high, so the budget is what runs
	// out and every hold moves counters on two or three scopes at once.
	capDollars := int64(kills) * 70
	capCents := capDollars * 100
	var keyIDs, vaultKeys []string
	var budgetIDs []string
	func() {
		s, err := bolt.Open(dbPath, bolt.Options{MasterKey: masterKey})
		require.NoError(t, err)
		defer s.Close()
		_, _, err = s.PutUpstream(context.Background(), "test", upstreamDefault, "stripe", fake.Secret)
		require.NoError(t, err)
		org := mustCreateBudget(t, s, "org", "", capDollars)
		team := mustCreateBudget(t, s, "team", org.ID, capDollars*2/3)
		budgetIDs = []string{org.ID, team.ID}
		for i, under := range []string{team.ID, team.ID, org.ID} {
			k, token := MustMintKeyUnder(t, s, fmt.Sprintf("kill9-%d", i), capDollars, under)
			keyIDs, vaultKeys = append(keyIDs, k.ID), append(vaultKeys, token)
		}
	}()

	environ := childEnviron(
		envMasterKey+"="+masterText,
		envJWTSecret+"=kill9-jwt-secret-kill9-jwt-secret-kill9",
		envStripeKey+"="+fake.Secret,
	)
	args := []string{"serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--stripe-url", fake.URL, "--log-format", "json", "--log-level", "info",
		"--upstream-timeout", "10s", "--shutdown-timeout", "20s"}

	var current atomic.Pointer[child]
	var proxyURL atomic.Pointer[string]
	target := func() string {
		if u := proxyURL.Load(); u != nil {
			return *u
		}
		return ""
	}
	t.Cleanup(func() {
		if c := current.Load(); c != nil {
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	})
	start := func(waitReady bool) *child {
		c := startChild(t, bin, args, environ)
		current.Store(c)
		if !waitReady {
			return c
		}
		u := "http://" + c.waitReady(t)
		proxyURL.Store(&u)
		return c
	}

	// Load: callers charge with their own idempotency keys and retry each key until
	// they get a definitive answer, across kills and restarts; some send a
	// charge again after its answer.
	stats := newLoadStats()
	loadCtx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	const callers = 6
	var capHit [callers]atomic.Bool
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 15 * time.Second}
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(g)+100))
			for n := 0; loadCtx.Err() == nil; n++ {
				callerKey := fmt.Sprintf("kill9-c%d-n%d", g, n)
				amount := 100 * (1 + r.Int64N(5))
				vaultKey := vaultKeys[g%len(vaultKeys)]
				status := chargeUntilDefinitive(loadCtx, client, target, vaultKey, callerKey, amount, stats)
				if status == http.StatusPaymentRequired {
					capHit[g].Store(true)
				}
				if status == http.StatusOK && r.IntN(3) == 0 {
					// The caller sends the charge again, as one that lost the
					// answer would: keybrake may have died since it answered,
					// before the settle was on disk. The retry must get the
					// same charge, and move no money.
					stats.mu.Lock()
					first := stats.succeeded[callerKey]
					stats.mu.Unlock()
					if chargeUntilDefinitive(loadCtx, client, target, vaultKey, callerKey, amount, stats) == http.StatusOK {
						stats.mu.Lock()
						if again := stats.succeeded[callerKey]; again != first {
							stats.unexpected = append(stats.unexpected, fmt.Sprintf("%s: retried after its answer, got charge %s instead of %s", callerKey, again, first))
						}
						stats.mu.Unlock()
					}
				}
				sleep(loadCtx, time.Duration(10+r.IntN(30))*time.Millisecond)
			}
		}()
	}

	for i := range kills {
		var c *child
		if rng.IntN(4) == 0 {
			// Sometimes during start-up: recovery, opening, binding.
			c = start(false)
			time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		} else {
			c = start(true)
			time.Sleep(time.Duration(100+rng.IntN(600)) * time.Millisecond)
		}
		_ = c.signalAndWait(t, syscall.SIGKILL, 30*time.Second)
		require.False(t, c.raceSeen.Load(), "data race in the child:\n%s", c.logs())
		t.Logf("kill %d/%d: charges at the fake so far %d (%s of %s)", i+1, kills,
			len(fake.Charges()), fmtCents(fake.TotalMoved("usd")), fmtCents(capCents))
	}

	// Last start: run until every caller has been refused for the cap (or a guard).
	last := start(true)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		all := true
		for g := range callers {
			all = all && capHit[g].Load()
		}
		if all {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopLoad()
	wg.Wait()
	err = last.signalAndWait(t, syscall.SIGTERM, 60*time.Second)
	require.NoError(t, err, "graceful exit on SIGTERM; logs:\n%s", last.logs())
	require.False(t, last.raceSeen.Load(), "data race in the child:\n%s", last.logs())
	fake.WaitIdle(t)

	stats.mu.Lock()
	defer stats.mu.Unlock()
	t.Logf("load: %d charges succeeded, %d refused for the cap, %d retries; fake: %d charges, %d replays, %s moved of %s",
		len(stats.succeeded), stats.refused, stats.retries, len(fake.Charges()),
		fake.CountWhere(func(r proxytest.Request) bool { return r.Replayed }),
		fmtCents(fake.TotalMoved("usd")), fmtCents(capCents))
	assert.Empty(t, stats.unexpected, "every answer is a charge, a cap refusal or retryable")
	require.NotEmpty(t, stats.succeeded, "money moved during the run")
	for g := range callers {
		assert.True(t, capHit[g].Load(), "caller %d reached the cap", g)
	}

	// Money at the fake never passed the cap, and each caller key moved money at
	// most once.
	moved := fake.TotalMoved("usd")
	assert.LessOrEqual(t, moved, capCents, "Stripe moved no more than the cap")
	assertEachCallerKeyMovedOnce(t, fake, stats)

	// The store meters everything that moved and never passed a cap, on
	// every key's windows and every budget's.
	s := MustOpenStore(t, dbPath, masterKey)
	assertChainMetered(t, s, keyIDs, budgetIDs, moved)
}

// mustCreateBudget creates a usd budget with a daily and a period cap of
// capDollars, its period starting now, under parent ("" for a root).
func mustCreateBudget(tb testing.TB, s vault.Store, name, parent string, capDollars int64) vault.Budget {
	tb.Helper()
	c := decimal.NewFromInt(capDollars)
	b, err := s.CreateBudget(context.Background(), "test", vault.BudgetSpec{Name: name, Parent: parent, Currency: "usd",
		Timezone: "UTC", DailyCap: &c, PeriodCap: &c, PeriodStart: time.Now().UTC().Truncate(time.Second)})
	require.NoError(tb, err)
	return b
}

// MustMintKeyUnder is MustMintKey for a key that draws from budget.
func MustMintKeyUnder(tb testing.TB, s vault.Store, name string, capDollars int64, budget string) (vault.Key, string) {
	tb.Helper()
	p := MustPolicy(tb, capDollars)
	p.Budget = budget
	k, token, err := s.MintKey(context.Background(), "test", vault.MintRequest{Name: name, Upstream: upstreamDefault, Policy: p})
	require.NoError(tb, err)
	return k, token
}

// assertChainMetered checks committed + held <= cap on every window of the
// keys and of the budgets, that the first budget's period window (the root
// every key draws from) counts at least moved, and that the store is
// consistent (its own check covers every key and budget window).
func assertChainMetered(t *testing.T, s vault.Store, keyIDs, budgetIDs []string, moved int64) {
	t.Helper()
	ctx := context.Background()
	for _, id := range keyIDs {
		_, windows, usage, err := s.KeyUsage(ctx, id)
		require.NoError(t, err)
		for _, w := range windows {
			cnt := usage[w.ID]
			assert.LessOrEqual(t, cnt.Committed+cnt.Held, w.Cap, "key %s: committed + held <= cap on %s", id, w.ID)
		}
	}
	for i, id := range budgetIDs {
		chain, err := s.BudgetChain(ctx, id)
		require.NoError(t, err)
		for _, w := range chain[0].Windows {
			cnt := chain[0].Usage[w.ID]
			assert.LessOrEqual(t, cnt.Committed+cnt.Held, w.Cap, "budget %s: committed + held <= cap on %s", id, w.ID)
			if i == 0 && w.Kind == policy.WindowPeriod {
				assert.LessOrEqual(t, moved, cnt.Committed+cnt.Held, "everything Stripe moved is metered on the root budget")
				t.Logf("store: root budget period committed %s, held %s", fmtCents(cnt.Committed), fmtCents(cnt.Held))
			}
		}
	}
	assert.NoError(t, s.CheckInvariant(ctx))
}

// assertEachCallerKeyMovedOnce checks, for every charge at the fake that
// carries metadata[caller_key], that its caller key reached Stripe under one
// upstream key and moved money once, and that each charge a caller was
// answered with is that one charge. The caller holds stats.mu.
func assertEachCallerKeyMovedOnce(t *testing.T, fake *proxytest.FakeStripe, stats *loadStats) {
	t.Helper()
	upstreamOf := map[string]map[string]bool{} // caller key -> upstream keys
	callerOf := map[string]string{}            // upstream key -> caller key
	for _, r := range fake.Requests() {
		ck := r.Params.Get("metadata[caller_key]")
		if r.Method != http.MethodPost || ck == "" {
			continue
		}
		if upstreamOf[ck] == nil {
			upstreamOf[ck] = map[string]bool{}
		}
		upstreamOf[ck][r.IdempotencyKey] = true
		callerOf[r.IdempotencyKey] = ck
	}
	for ck, ups := range upstreamOf {
		assert.Len(t, ups, 1, "caller key %s reached Stripe under one upstream key", ck)
	}
	chargesOf := map[string][]string{} // caller key -> charge ids
	for _, ch := range fake.Charges() {
		require.NotEmpty(t, ch.IdempotencyKey, "every charge was created with an upstream key")
		ck := callerOf[ch.IdempotencyKey]
		require.NotEmpty(t, ck, "charge %s belongs to a caller key", ch.ID)
		chargesOf[ck] = append(chargesOf[ck], ch.ID)
	}
	for ck, ids := range chargesOf {
		assert.Len(t, ids, 1, "caller key %s moved money once", ck)
	}
	for ck, id := range stats.succeeded {
		assert.Equal(t, []string{id}, chargesOf[ck], "caller key %s was answered with the one charge made for it", ck)
	}
}

// assertMetered checks that the key's windows hold committed + held <= cap and
// that its period window counts (committed or held) at least moved, and that
// the store is consistent.
func assertMetered(t *testing.T, s vault.Store, keyID string, moved int64) {
	t.Helper()
	_, windows, usage, err := s.KeyUsage(context.Background(), keyID)
	require.NoError(t, err)
	var period *policy.Window
	for i, w := range windows {
		cnt := usage[w.ID]
		assert.LessOrEqual(t, cnt.Committed+cnt.Held, w.Cap, "committed + held <= cap on %s", w.ID)
		if w.Kind == policy.WindowPeriod {
			period = &windows[i]
		}
	}
	require.NotNil(t, period)
	pc := usage[period.ID]
	assert.LessOrEqual(t, moved, pc.Committed+pc.Held, "everything Stripe moved is metered (committed or held)")
	t.Logf("store: period committed %s, held %s", fmtCents(pc.Committed), fmtCents(pc.Held))
	assert.NoError(t, s.CheckInvariant(context.Background()))
}

// newLoadStats returns empty counts.
func newLoadStats() *loadStats {
	return &loadStats{succeeded: map[string]string{}, retried: map[int]int{}}
}

// chargeUntilDefinitive POSTs one charge under callerKey until it gets an answer
// that is not worth retrying, and returns its status (0 when the load stopped).
// Each attempt goes to the proxy target names ("" while there is none).
func chargeUntilDefinitive(ctx context.Context, client *http.Client, target func() string,
	vaultKey, callerKey string, amount int64, stats *loadStats) int {
	form := url.Values{
		"amount":               {strconv.FormatInt(amount, 10)},
		"currency":             {"usd"},
		"source":               {"tok_visa"},
		"metadata[caller_key]": {callerKey},
	}
	for ctx.Err() == nil {
		base := target()
		if base == "" {
			sleep(ctx, 20*time.Millisecond)
			continue
		}
		status, body, err := postForm(ctx, client, base+"/v1/charges", vaultKey, callerKey, form)
		switch {
		case err != nil || status == http.StatusConflict || status >= 500:
			stats.mu.Lock()
			stats.retries++
			stats.retried[status]++
			stats.mu.Unlock()
			sleep(ctx, 20*time.Millisecond)
			continue
		case status == http.StatusOK:
			var ch struct {
				ID string `json:"id"`
			}
			_ = json.Unmarshal(body, &ch)
			stats.mu.Lock()
			stats.succeeded[callerKey] = ch.ID
			stats.mu.Unlock()
		case status == http.StatusPaymentRequired:
			stats.mu.Lock()
			stats.refused++
			stats.mu.Unlock()
		default:
			stats.mu.Lock()
			stats.unexpected = append(stats.unexpected, fmt.Sprintf("%s: %d %s", callerKey, status, body))
			stats.mu.Unlock()
		}
		return status
	}
	return 0
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// fmtCents formats minor units as dollars for messages.
func fmtCents(c int64) string { return fmt.Sprintf("$%d.%02d", c/100, c%100) }
