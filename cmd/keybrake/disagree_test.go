package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/postgres/pgtest"
)

// The replicas that disagree: admin writes of two replicas that race, a
// replica whose clock is off, a replica frozen holding a key's lock, and the
// secrets of the database URL. Each test runs real `keybrake serve`
// processes on one PostgreSQL database (MustReplicas).

// longRounds is n, or long under KEYBRAKE_LONG=1.
func longRounds(n, long int) int {
	if os.Getenv("KEYBRAKE_LONG") != "" {
		return long
	}
	return n
}

// replicaAdminToken is an admin token every replica of MustReplicas accepts.
func replicaAdminToken(t *testing.T) string {
	t.Helper()
	tok, err := api.IssueToken([]byte(replicaJWTSecret), "disagree-test", api.RoleAdmin, time.Hour, time.Now())
	require.NoError(t, err)
	return tok
}

// adminSend sends a request with a raw body to an admin API and returns the
// status, the body and the ETag.
func adminSend(t *testing.T, method, u, token, body string, header ...string) (int, string, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/merge-patch+json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(data), resp.Header.Get("ETag")
}

// TestReplicasConcurrentPatchesLoseNothing: in each round two replicas patch
// one key at the same moment, one its daily cap, the other a label. Both
// answer 200 and the key has both changes afterwards, every round; then a
// charge above the lowered cap is refused by a third replica, and a PATCH
// against an ETag another replica's change made stale is 412.
func TestReplicasConcurrentPatchesLoseNothing(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs real replicas")
	}
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_patches")
	store, masterText := MustPostgresVault(t, dbURL, fake.Secret)
	k, tok := MustMintKey(t, store, "patched", 50)
	rs := MustReplicas(t, 3, dbURL, fake.URL, masterText)
	admin := replicaAdminToken(t)
	keyURL := func(i int) string { return rs.adminURL(i) + "/api/v1/keys/" + k.ID }

	rounds := longRounds(100, 500)
	lost := 0
	for i := range rounds {
		capCents := 1000 + i // another cap each round, so that a lost one shows
		capText := fmt.Sprintf("%d.%02d", capCents/100, capCents%100)
		var wg sync.WaitGroup
		var capStatus, labelStatus int
		start := make(chan struct{})
		wg.Go(func() {
			<-start
			capStatus, _, _ = adminSend(t, http.MethodPatch, keyURL(0), admin, `{"policy":{"daily_cap":"`+capText+`"}}`)
		})
		wg.Go(func() {
			<-start
			labelStatus, _, _ = adminSend(t, http.MethodPatch, keyURL(1), admin, fmt.Sprintf(`{"labels":{"round":"%d"}}`, i))
		})
		close(start)
		wg.Wait()
		require.Equal(t, http.StatusOK, capStatus, "round %d", i)
		require.Equal(t, http.StatusOK, labelStatus, "round %d", i)
		got, err := store.GetKey(ctx, k.ID)
		require.NoError(t, err)
		if got.Policy.DailyCap.StringFixed(2) != capText || got.Labels["round"] != fmt.Sprint(i) {
			lost++
			t.Logf("round %d: daily_cap %s (sent %s), label round %q", i, got.Policy.DailyCap.StringFixed(2), capText, got.Labels["round"])
		}
	}
	assert.Zero(t, lost, "rounds of %d that lost a patch", rounds)

	// The last cap was lowered below $20: a $20 charge through the third
	// replica is refused, and nothing reaches Stripe.
	status, body, err := postForm(ctx, http.DefaultClient, rs.proxyURL(2)+"/v1/charges", tok, "over-cap", chargeForm(2000, "over-cap"))
	require.NoError(t, err)
	assert.Equal(t, http.StatusPaymentRequired, status, "%s", body)
	assert.Zero(t, fake.Count(), "nothing reached Stripe")

	// ETag: read on replica 0, changed on replica 1, the stale ETag is refused on replica 2.
	status, _, etag := adminSend(t, http.MethodGet, keyURL(0), admin, "")
	require.Equal(t, http.StatusOK, status)
	status, _, _ = adminSend(t, http.MethodPatch, keyURL(1), admin, `{"labels":{"by":"one"}}`, "If-Match", etag)
	require.Equal(t, http.StatusOK, status)
	status, body2, _ := adminSend(t, http.MethodPatch, keyURL(2), admin, `{"policy":{"daily_cap":"99.00"}}`, "If-Match", etag)
	assert.Equal(t, http.StatusPreconditionFailed, status, body2)
	got, err := store.GetKey(ctx, k.ID)
	require.NoError(t, err)
	assert.NotEqual(t, "99.00", got.Policy.DailyCap.StringFixed(2), "the stale patch changed nothing")
	rs.stopAll()
}

// TestNoSecretOfTheDatabaseURLInAnyLogLine: a replica given a database URL
// whose password, sslpassword and passfile are in the query (and whose
// password is the real one) serves, is scraped, shows its dashboard, refuses
// a request and stops, and none of those secrets is in any line it logged,
// in /metrics or in the dashboard.
func TestNoSecretOfTheDatabaseURLInAnyLogLine(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs a real replica")
	}
	dbURL := pgtest.URL(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_redact")
	_, masterText := MustPostgresVault(t, dbURL, fake.Secret)

	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	password, ok := u.User.Password()
	require.True(t, ok, "pgtest's URL has a password")
	secrets := []string{password, "sslpassword-Zq81xT", "passfile-Kc55rP"}
	q := u.Query()
	q.Set("password", password)
	q.Set("sslpassword", secrets[1])
	q.Set("passfile", "/nonexistent/"+secrets[2])
	u.User = url.User(u.User.Username())
	u.RawQuery = q.Encode()

	rs := MustReplicas(t, 1, u.String(), fake.URL, masterText)
	admin := replicaAdminToken(t)
	var pages []string
	for _, path := range []string{"/metrics", "/readyz", api.UIPath, "/api/v1/overview"} {
		status, body, _ := adminSend(t, http.MethodGet, rs.adminURL(0)+path, admin, "")
		require.Equal(t, http.StatusOK, status, "%s: %s", path, body)
		pages = append(pages, body)
	}
	status, _ := MustGet(t, rs.proxyURL(0)+"/v1/charges", "vk_not_a_key")
	require.Equal(t, http.StatusUnauthorized, status)
	logs := rs.procs[0].logs()
	rs.stopAll()

	require.Contains(t, logs, `"store opened"`)
	for _, secret := range secrets {
		for i, line := range strings.Split(logs, "\n") {
			assert.NotContains(t, line, secret, "log line %d", i+1)
		}
		for _, page := range pages {
			assert.NotContains(t, page, secret)
		}
	}
}

// TestFrozenLockHolderCostsTheOthersLockTimeoutAnd503: a session holds a
// key's row lock and does nothing more, as a replica SIGSTOPped inside its
// transaction does. Charges of that key sent at once through the two live
// replicas each wait lock_timeout (3 s here, from the replicas' database URL;
// keybrake's default is 10 s), not one after the other's, and are answered
// 503 store_unavailable with Stripe-Should-Retry: true, nothing reaching
// Stripe; another key is served meanwhile. Once the frozen session ends the
// key is served again.
func TestFrozenLockHolderCostsTheOthersLockTimeoutAnd503(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs real replicas")
	}
	const lockTimeout = 3 * time.Second
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_frozen")
	store, masterText := MustPostgresVault(t, dbURL, fake.Secret)
	held, heldTok := MustMintKey(t, store, "held", 50)
	_, freeTok := MustMintKey(t, store, "free", 50)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("lock_timeout", lockTimeout.String())
	u.RawQuery = q.Encode()
	rs := MustReplicas(t, 2, u.String(), fake.URL, masterText)

	// The frozen replica: its transaction holds the key's row and goes idle.
	// The test ends its session once the others have waited on it (the server
	// would end it after 45 s idle, as it ends keybrake's own sessions after
	// idle_in_transaction_session_timeout; waiting for that proves nothing of
	// keybrake's).
	frozen, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = frozen.Close(context.Background()) })
	_, err = frozen.Exec(ctx, "SET idle_in_transaction_session_timeout = '45s'")
	require.NoError(t, err)
	_, err = frozen.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = frozen.Exec(ctx, "SELECT 1 FROM keybrake_keys WHERE k = $1 FOR UPDATE", []byte(held.ID))
	require.NoError(t, err)

	client := &http.Client{Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, rs.proxyURL(i)+"/v1/charges",
				strings.NewReader(chargeForm(100, fmt.Sprintf("frozen-%d", i)).Encode()))
			if !assert.NoError(t, err) {
				return
			}
			req.Header.Set("Authorization", "Bearer "+heldTok)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Idempotency-Key", fmt.Sprintf("frozen-%d", i))
			start := time.Now()
			resp, err := client.Do(req)
			if !assert.NoError(t, err) {
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			waited := time.Since(start)
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "replica %d: %s", i, body)
			assert.Contains(t, string(body), "store_unavailable")
			assert.Equal(t, "true", resp.Header.Get("Stripe-Should-Retry"))
			assert.GreaterOrEqual(t, waited, lockTimeout, "replica %d waited lock_timeout", i)
			// A bound, not a measurement: queued behind the other replica's
			// wait, a request waited two lock_timeouts (PostgreSQL's
			// lock_timeout bounds each wait, not a statement's).
			assert.Less(t, waited, 2*lockTimeout, "replica %d waited one lock_timeout, not two", i)
			t.Logf("replica %d answered %d after %s", i, resp.StatusCode, waited.Round(time.Millisecond))
		})
	}
	wg.Wait()
	status, body, err := postForm(ctx, client, rs.proxyURL(0)+"/v1/charges", freeTok, "free-1", chargeForm(100, "free-1"))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status, "another key is served meanwhile: %s", body)
	assert.Equal(t, 1, fake.Count(), "only the other key's charge reached Stripe")

	// The frozen session ends; the key works again, and the retries of the
	// refused charges go through once each.
	require.NoError(t, frozen.Close(ctx))
	require.Eventually(t, func() bool {
		status, _, err := postForm(ctx, client, rs.proxyURL(1)+"/v1/charges", heldTok, "frozen-0", chargeForm(100, "frozen-0"))
		return err == nil && status == http.StatusOK
	}, 90*time.Second, 200*time.Millisecond, "the key is served once the frozen session is gone")
	rs.stopAll()
	assertMetered(t, store, held.ID, 100)
}

// mintAt mints a key on upstream "default" in the store whose policy mod
// changes MustPolicy's.
func mintAt(t *testing.T, s vault.Store, name string, mod func(p *policy.Policy)) string {
	t.Helper()
	p := MustPolicy(t, 50)
	mod(&p)
	_, token, err := s.MintKey(context.Background(), "test", vault.MintRequest{Name: name, Upstream: upstreamDefault, Policy: p})
	require.NoError(t, err)
	return token
}

// TestSkewedReplicaClockDecidesNoKeyDifferently: three replicas on one
// database, one whose own clock is right, one 48 h fast and one 48 h slow
// (--unsafe-clock-skew). For a key that expires in 24 h, one valid only from
// tomorrow, and one that has just expired, every replica answers a read and a
// charge exactly as the right one does: expiry and not-yet-valid are decided
// at the database's clock. The skewed replicas say so on /readyz (503) and in
// keybrake_store_clock_offset_seconds; the right one is ready.
func TestSkewedReplicaClockDecidesNoKeyDifferently(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs real replicas")
	}
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_skew")
	store, masterText := MustPostgresVault(t, dbURL, fake.Secret)
	now := store.Now()
	tokens := map[string]string{
		"expires tomorrow": mintAt(t, store, "tomorrow", func(p *policy.Policy) { p.ExpiresAt = now.Add(24 * time.Hour).Truncate(time.Second) }),
		"valid from tomorrow": mintAt(t, store, "future", func(p *policy.Policy) {
			p.PeriodStart = now.Add(24 * time.Hour).Truncate(time.Second)
		}),
		"just expired": mintAt(t, store, "expired", func(p *policy.Policy) { p.ExpiresAt = now.Add(2 * time.Second).Truncate(time.Second) }),
	}
	skews := []string{"0s", "48h", "-48h"}
	var replicas []*replicaSet
	for _, skew := range skews {
		replicas = append(replicas, MustReplicas(t, 1, dbURL, fake.URL, masterText, "--unsafe-clock-skew", skew))
	}
	// The database's clock passes the third key's expiry.
	for store.Now().Before(now.Add(3 * time.Second)) {
		time.Sleep(100 * time.Millisecond)
	}

	answer := func(rs *replicaSet, name string, n int) string {
		status, body := MustGet(t, rs.proxyURL(0)+"/v1/charges?limit=1", tokens[name])
		read := fmt.Sprintf("read %d %s", status, errorCode(body))
		ck := fmt.Sprintf("skew-%s-%d", strings.ReplaceAll(name, " ", "-"), n)
		status, body, err := postForm(ctx, http.DefaultClient, rs.proxyURL(0)+"/v1/charges", tokens[name], ck, chargeForm(100, ck))
		require.NoError(t, err)
		return read + fmt.Sprintf(", charge %d %s", status, errorCode(body))
	}
	want := map[string]string{
		"expires tomorrow":    "read 200 , charge 200 ",
		"valid from tomorrow": "read 403 vault_key_not_yet_valid, charge 403 vault_key_not_yet_valid",
		"just expired":        "read 401 vault_key_expired, charge 401 vault_key_expired",
	}
	for name, w := range want {
		for i, rs := range replicas {
			assert.Equal(t, w, answer(rs, name, i), "%s on the replica %s off", name, skews[i])
		}
	}

	admin := replicaAdminToken(t)
	for i, rs := range replicas {
		status, body := MustGet(t, rs.adminURL(0)+"/readyz", "")
		_, page, _ := adminSend(t, http.MethodGet, rs.adminURL(0)+"/metrics", admin, "")
		offset := metricFloat(t, page, "keybrake_store_clock_offset_seconds")
		if skews[i] == "0s" {
			assert.Equal(t, http.StatusOK, status, "%s", body)
			assert.Less(t, offset, 2.0)
			assert.Greater(t, offset, -2.0)
		} else {
			assert.Equal(t, http.StatusServiceUnavailable, status, "%s", body)
			assert.Contains(t, string(body), "clock")
			skew, err := time.ParseDuration(skews[i])
			require.NoError(t, err)
			assert.InDelta(t, -skew.Seconds(), offset, 2, "the offset measured on the replica %s off", skews[i])
		}
		rs.stopAll()
	}
}

// errorCode is the code of a Stripe-shaped error body ("" for none).
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	return e.Error.Code
}

// metricFloat reads the value of an unlabelled metric from a text exposition.
func metricFloat(t *testing.T, page, name string) float64 {
	t.Helper()
	v := metricValue(page, name)
	require.NotEmpty(t, v, "no metric "+name, page)
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	require.NoError(t, err)
	return f
}

// TestBootstrapTokenPrintedByTheReplicaThatCreatedTheSchema: three replicas
// started together on an empty database print the first-start admin token
// once between them: the one that created the schema does.
func TestBootstrapTokenPrintedByTheReplicaThatCreatedTheSchema(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs real replicas")
	}
	dbURL := pgtest.URL(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_bootstrap")
	masterText, err := newMasterKeyText()
	require.NoError(t, err)
	rs := MustReplicas(t, 3, dbURL, fake.URL, masterText)
	// Each replica writes its first-start banner (or the line saying another
	// printed it) just after it starts serving: wait for all three.
	const token, other = "no vault keys yet. An admin token", "the replica that created the schema printed"
	printed := 0
	for i := range 3 {
		require.Eventually(t, func() bool {
			l := rs.procs[i].logs()
			return strings.Contains(l, token) || strings.Contains(l, other)
		}, time.Minute, 20*time.Millisecond, "replica %d wrote no first-start banner", i)
		if strings.Contains(rs.procs[i].logs(), token) {
			printed++
		}
	}
	rs.stopAll()
	assert.Equal(t, 1, printed, "replicas that printed the token")
}
