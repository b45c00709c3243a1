package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/postgres"
)

// replicaJWTSecret is the JWT secret every replica of these tests shares.
const replicaJWTSecret = "replicas-jwt-secret-replicas-jwt-secret"

// replicaSet is n `keybrake serve` processes on one PostgreSQL database, with
// the same master key and JWT secret, behind a round-robin "load balancer"
// (target) that skips the replicas that are down. Every process is stopped by
// its PID at the end of the test.
type replicaSet struct {
	t       *testing.T
	bin     string
	args    []string
	environ []string

	mu    sync.Mutex
	procs []*child // nil while down
	urls  []string // proxy URL of each replica, "" while down
	turn  atomic.Uint64
}

// MustReplicas builds the binary and starts n replicas of serve on the
// database dbURL, each with a data directory of its own (which holds nothing:
// the store is the database), forwarding to stripeURL, with extra flags.
func MustReplicas(t *testing.T, n int, dbURL, stripeURL, masterText string, extra ...string) *replicaSet {
	t.Helper()
	rs := &replicaSet{
		t:   t,
		bin: MustBuildBinary(t),
		args: append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
			"--stripe-url", stripeURL, "--log-format", "json", "--log-level", "info", "--shutdown-timeout", "20s"}, extra...),
		environ: childEnviron(
			envMasterKey+"="+masterText,
			envJWTSecret+"="+replicaJWTSecret,
			envName("database-url")+"="+dbURL,
		),
		procs: make([]*child, n),
		urls:  make([]string, n),
	}
	t.Cleanup(func() {
		for _, c := range rs.procs {
			if c != nil {
				_ = c.cmd.Process.Kill()
				<-c.exited
			}
		}
	})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { rs.start(i) })
	}
	wg.Wait()
	return rs
}

// start starts replica i and returns once it serves.
func (rs *replicaSet) start(i int) {
	t := rs.t
	c := startChild(t, rs.bin, append(slices.Clone(rs.args), "--data-dir", t.TempDir()), rs.environ)
	rs.mu.Lock()
	rs.procs[i] = c
	rs.mu.Unlock()
	select {
	case addr := <-c.ready:
		rs.mu.Lock()
		rs.urls[i] = "http://" + addr
		rs.mu.Unlock()
	case <-c.exited:
		require.FailNow(t, "keybrake exited during start", "replica %d: %v; logs:\n%s", i, c.exitErr, c.logs())
	case <-time.After(60 * time.Second):
		require.FailNow(t, "keybrake did not start", "replica %d; logs:\n%s", i, c.logs())
	}
}

// kill takes replica i out of the load balancer and SIGKILLs it.
func (rs *replicaSet) kill(i int) {
	rs.mu.Lock()
	c := rs.procs[i]
	rs.urls[i], rs.procs[i] = "", nil
	rs.mu.Unlock()
	_ = c.signalAndWait(rs.t, syscall.SIGKILL, 30*time.Second)
	require.False(rs.t, c.raceSeen.Load(), "data race in replica %d:\n%s", i, c.logs())
}

// stopAll stops every replica with SIGTERM and requires a clean exit.
func (rs *replicaSet) stopAll() {
	for i := range rs.procs {
		rs.mu.Lock()
		c := rs.procs[i]
		rs.urls[i], rs.procs[i] = "", nil
		rs.mu.Unlock()
		if c == nil {
			continue
		}
		require.NoError(rs.t, c.signalAndWait(rs.t, syscall.SIGTERM, 60*time.Second), "replica %d exits cleanly; logs:\n%s", i, c.logs())
		require.False(rs.t, c.raceSeen.Load(), "data race in replica %d:\n%s", i, c.logs())
	}
}

// target is the next replica that is up, in turn ("" when none is).
func (rs *replicaSet) target() string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for range rs.urls {
		if u := rs.urls[int(rs.turn.Add(1)%uint64(len(rs.urls)))]; u != "" {
			return u
		}
	}
	return ""
}

// proxyURL and adminURL are replica i's listeners (it must be up).
func (rs *replicaSet) proxyURL(i int) string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	require.NotEmpty(rs.t, rs.urls[i], "replica %d is up", i)
	return rs.urls[i]
}

func (rs *replicaSet) adminURL(i int) string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	require.NotNil(rs.t, rs.procs[i], "replica %d is up", i)
	return "http://" + *rs.procs[i].admin.Load()
}

// MustPostgresVault opens the store at dbURL as one more replica would, for
// the test's own look at it, registers the fake Stripe's secret as the
// upstream "default", and returns it with the master key's text.
func MustPostgresVault(t *testing.T, dbURL, stripeSecret string) (vault.Store, string) {
	t.Helper()
	masterText, err := newMasterKeyText()
	require.NoError(t, err)
	masterKey, err := decodeMasterKey(masterText)
	require.NoError(t, err)
	s, err := postgres.Open(context.Background(), dbURL, postgres.Options{MasterKey: masterKey, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	_, _, err = s.PutUpstream(context.Background(), "test", upstreamDefault, "stripe", stripeSecret)
	require.NoError(t, err)
	return s, masterText
}

// chargeForm is a charge of amount cents carrying callerKey in its metadata.
func chargeForm(amount int64, callerKey string) url.Values {
	return url.Values{"amount": {strconv.FormatInt(amount, 10)}, "currency": {"usd"}, "source": {"tok_visa"},
		"metadata[caller_key]": {callerKey}}
}

// TestThreeReplicasOneDatabase: three keybrake processes on one PostgreSQL
// database enforce one set of caps and idempotency records. 100 concurrent $1
// charges spread over them against a $20 cap: exactly 20 reach Stripe. One
// Idempotency-Key sent to all three at once: one upstream call, the others get
// 409 while it runs and its replay afterwards. A key revoked through one
// replica's admin API is refused by another at once, a read as well as a
// charge.
func TestThreeReplicasOneDatabase(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs three real replicas")
	}
	ctx := context.Background()
	dbURL := migrated.URL(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_replicas")
	store, masterText := MustPostgresVault(t, dbURL, fake.Secret)
	k20, tok20 := MustMintKey(t, store, "cap20", 20)
	k100, tok100 := MustMintKey(t, store, "cap100", 100)
	rs := MustReplicas(t, 3, dbURL, fake.URL, masterText, "--upstream-timeout", "10s")
	client := &http.Client{Timeout: 30 * time.Second}

	// 100 concurrent $1 charges, replica i%3 for charge i.
	statuses := make([]int, 100)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range statuses {
		wg.Go(func() {
			<-start
			ck := fmt.Sprintf("cap-%d", i)
			status, body, err := postForm(ctx, client, rs.proxyURL(i%3)+"/v1/charges", tok20, ck, chargeForm(100, ck))
			if assert.NoError(t, err) && status != http.StatusOK && status != http.StatusPaymentRequired {
				t.Errorf("charge %d: %d %s", i, status, body)
			}
			statuses[i] = status
		})
	}
	close(start)
	wg.Wait()
	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	assert.Equal(t, map[int]int{http.StatusOK: 20, http.StatusPaymentRequired: 80}, count)
	assert.Len(t, fake.Charges(), 20, "exactly 20 charges reached Stripe")
	assert.Equal(t, int64(2000), fake.TotalMoved("usd"))

	// One idempotency key at all three replicas at once. Stripe holds the first
	// request it gets until the other two were answered, so they meet it in
	// flight.
	const same = "same-key"
	release := make(chan struct{})
	fake.SetHook(func(r proxytest.Request) {
		if r.Params.Get("metadata[caller_key]") == same {
			<-release
		}
	})
	type answer struct {
		status   int
		replayed string
		id       string
	}
	send := func(i int) answer {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, rs.proxyURL(i)+"/v1/charges",
			strings.NewReader(chargeForm(700, same).Encode()))
		if !assert.NoError(t, err) {
			return answer{}
		}
		req.Header.Set("Authorization", "Bearer "+tok100)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", same)
		resp, err := client.Do(req)
		if !assert.NoError(t, err) {
			return answer{}
		}
		defer resp.Body.Close()
		var body struct {
			ID    string `json:"id"`
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		assert.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		if resp.StatusCode == http.StatusConflict {
			assert.Equal(t, "idempotency_key_in_use", body.Error.Code)
		}
		return answer{resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), body.ID}
	}
	answers := make(chan answer, 3)
	for i := range 3 {
		go func() { answers <- send(i) }()
	}
	var got []answer
	for range 2 {
		select {
		case a := <-answers:
			got = append(got, a)
		case <-time.After(30 * time.Second):
			close(release)
			require.FailNow(t, "two of the three requests were not answered while the first was in flight")
		}
	}
	close(release)
	got = append(got, <-answers)
	fake.SetHook(nil)
	slices.SortFunc(got, func(a, b answer) int { return a.status - b.status })
	require.Equal(t, []int{http.StatusOK, http.StatusConflict, http.StatusConflict},
		[]int{got[0].status, got[1].status, got[2].status}, "one went through, the others met it in flight")
	chargeID := got[0].id
	require.NotEmpty(t, chargeID)
	for i := range 3 {
		a := send(i)
		assert.Equal(t, answer{http.StatusOK, "true", chargeID}, a, "replica %d replays the one charge", i)
	}
	assert.Equal(t, 1, fake.CountWhere(func(r proxytest.Request) bool {
		return r.Method == http.MethodPost && r.Params.Get("metadata[caller_key]") == same
	}), "one upstream call")

	// Revoked through replica 0's admin API: replica 1 refuses a charge, replica
	// 2 a read (which it served a moment before).
	read := func(i int) (int, []byte) {
		status, body := MustGet(t, rs.proxyURL(i)+"/v1/charges/"+chargeID, tok100)
		return status, body
	}
	status, body := read(2)
	require.Equal(t, http.StatusOK, status, "%s", body)
	admin, err := api.IssueToken([]byte(replicaJWTSecret), "replicas-test", api.RoleAdmin, time.Hour, time.Now())
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodPost, rs.adminURL(0)+"/api/v1/keys/"+k100.ID+"/revoke", admin, nil, nil))
	before := fake.Count()
	status, body, err = postForm(ctx, client, rs.proxyURL(1)+"/v1/charges", tok100, "after-revoke", chargeForm(100, "after-revoke"))
	require.NoError(t, err)
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Contains(t, string(body), "vault_key_revoked")
	status, body = read(2)
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Contains(t, string(body), "vault_key_revoked")
	assert.Equal(t, before, fake.Count(), "nothing reached Stripe after the revocation")

	rs.stopAll()
	fake.WaitIdle(t)
	assertMetered(t, store, k20.ID, 2000)
	assertMetered(t, store, k100.ID, 700)
}

// TestKill9ReplicaUnderLoad: three replicas on one database serve callers that
// retry each charge with its idempotency key, on whichever replica the load
// balancer picks, while one replica after another is SIGKILLed and started
// again. In each cycle a charge is in flight at Stripe on the replica that
// dies, and its caller never retries it. The replicas that live keep
// answering; at the end Stripe moved no more than the cap, no idempotency key
// moved money twice, the dead replicas' abandoned charges are outcome-unknown
// holds once their lease lapsed (a lease of seconds here), the store meters
// all that moved and its invariant holds.
func TestKill9ReplicaUnderLoad(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds, runs and kills real replicas")
	}
	kills, seed := killSchedule(t, 3, 12)
	rng := rand.New(rand.NewPCG(seed, 2))
	ctx := context.Background()

	dbURL := migrated.URL(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_kill9_replicas")
	store, masterText := MustPostgresVault(t, dbURL, fake.Secret)
	// The cap is reached part way through the run, so kills land both while
	// money moves and while requests are refused. The abandoned charges have a
	// key of their own, whose cap they never reach.
	capDollars := int64(kills) * 300
	capCents := capDollars * 100
	key, vaultKey := MustMintKey(t, store, "kill9-replicas", capDollars)
	abandonedKey, abandonedToken := MustMintKey(t, store, "kill9-abandoned", 1000)
	// Lease: 4 s + 1 s. The reaper runs every half second on each replica.
	rs := MustReplicas(t, 3, dbURL, fake.URL, masterText,
		"--upstream-timeout", "4s", "--lease-margin", "1s", "--reap-interval", "500ms")

	// The abandoned charges: Stripe holds each until its replica is dead, then
	// executes it; the answer goes nowhere.
	var (
		hookMu   sync.Mutex
		arrived  = map[string]chan struct{}{}
		released = map[string]chan struct{}{}
	)
	abandoned := func(ck string) (arrive, release chan struct{}) {
		hookMu.Lock()
		defer hookMu.Unlock()
		arrived[ck], released[ck] = make(chan struct{}), make(chan struct{})
		return arrived[ck], released[ck]
	}
	fake.SetHook(func(r proxytest.Request) {
		hookMu.Lock()
		arrive, release := arrived[r.Params.Get("metadata[caller_key]")], released[r.Params.Get("metadata[caller_key]")]
		hookMu.Unlock()
		if arrive != nil {
			close(arrive)
			<-release
		}
	})

	stats := newLoadStats()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	const callers = 6
	var capHit [callers]atomic.Bool
	var answered atomic.Int64 // definitive answers
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 15 * time.Second}
	for g := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)+100))
			for n := 0; loadCtx.Err() == nil; n++ {
				ck := fmt.Sprintf("kill9r-c%d-n%d", g, n)
				switch chargeUntilDefinitive(loadCtx, client, rs.target, vaultKey, ck, 100*(1+r.Int64N(5)), stats) {
				case http.StatusPaymentRequired:
					capHit[g].Store(true)
					answered.Add(1)
				case http.StatusOK:
					answered.Add(1)
				}
				sleep(loadCtx, time.Duration(5+r.IntN(20))*time.Millisecond)
			}
		})
	}

	var abandonedKeys []string
	for i := range kills {
		victim := rng.IntN(3)
		ck := fmt.Sprintf("abandoned-%d", i)
		abandonedKeys = append(abandonedKeys, ck)
		arrive, release := abandoned(ck)
		go func() { // a caller that dies with the replica: it never retries
			_, _, _ = postForm(ctx, client, rs.proxyURL(victim)+"/v1/charges", abandonedToken, ck, chargeForm(100, ck))
		}()
		select {
		case <-arrive:
		case <-time.After(30 * time.Second):
			require.FailNow(t, "the abandoned charge did not reach Stripe")
		}
		time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		rs.kill(victim)
		close(release)

		// The other two keep answering while the victim is down.
		before := answered.Load()
		require.Eventually(t, func() bool { return answered.Load() > before }, 30*time.Second, 10*time.Millisecond,
			"the live replicas answer while replica %d is down", victim)
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		rs.start(victim)
		t.Logf("kill %d/%d of replica %d: charges at the fake so far %d (%s, the cap %s)", i+1, kills, victim,
			len(fake.Charges()), fmtCents(fake.TotalMoved("usd")), fmtCents(capCents))
	}

	// Run until every caller has been refused for the cap (or a guard).
	require.Eventually(t, func() bool {
		for g := range callers {
			if !capHit[g].Load() {
				return false
			}
		}
		return true
	}, 90*time.Second, 20*time.Millisecond, "every caller reaches the cap")
	stopLoad()
	wg.Wait()

	// The abandoned charges become outcome unknown once their lease lapsed,
	// their holds kept: the reaper of a live replica does it.
	unknownKeys := func() []string {
		holds, _, err := store.ListHolds(ctx, vault.HoldUnknown, 500, "")
		require.NoError(t, err)
		var keys []string
		for _, h := range holds {
			if slices.Contains(abandonedKeys, h.IdempotencyKey) {
				assert.EqualValues(t, 100, h.Amount, "hold of %s", h.IdempotencyKey)
				keys = append(keys, h.IdempotencyKey)
			}
		}
		return keys
	}
	require.Eventually(t, func() bool { return len(unknownKeys()) == len(abandonedKeys) }, 30*time.Second, 100*time.Millisecond,
		"each abandoned charge is an outcome-unknown hold (got %v of %v)", unknownKeys(), abandonedKeys)
	rs.stopAll()
	fake.WaitIdle(t)

	stats.mu.Lock()
	defer stats.mu.Unlock()
	t.Logf("load: %d charges succeeded, %d refused for the cap, %d retries (by status, 0 for no answer: %v); fake: %d charges, %d replays, %s moved (%d abandoned included), the cap %s",
		len(stats.succeeded), stats.refused, stats.retries, stats.retried, len(fake.Charges()),
		fake.CountWhere(func(r proxytest.Request) bool { return r.Replayed }),
		fmtCents(fake.TotalMoved("usd")), len(abandonedKeys), fmtCents(capCents))
	assert.Empty(t, stats.unexpected, "every answer is a charge, a cap refusal or retryable")
	require.NotEmpty(t, stats.succeeded, "money moved during the run")
	for _, ck := range abandonedKeys {
		assert.Equal(t, 1, fake.CountWhere(func(r proxytest.Request) bool { return r.Params.Get("metadata[caller_key]") == ck }),
			"the abandoned charge %s reached Stripe once", ck)
	}
	abandonedMoved := int64(100 * len(abandonedKeys))
	moved := fake.TotalMoved("usd") - abandonedMoved
	assert.LessOrEqual(t, moved, capCents, "Stripe moved no more than the cap")
	assertEachCallerKeyMovedOnce(t, fake, stats)
	assertMetered(t, store, key.ID, moved)
	assertMetered(t, store, abandonedKey.ID, abandonedMoved)
}
