package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault/bolt"
)

// MustAdminToken mints an admin token from the data directory's JWT secret.
func MustAdminToken(t *testing.T, dataDir string) string {
	t.Helper()
	secret, _, err := loadSecret(jwtSecretSpec, noEnv, dataDir, nil)
	require.NoError(t, err)
	token, err := api.IssueToken(secret, "test", api.RoleAdmin, time.Hour, time.Now())
	require.NoError(t, err)
	return token
}

// TestCompactDoesNotStallBehindABackup: a hot backup whose client reads
// slowly holds its read transaction for as long as it likes; a compaction
// asked for meanwhile waits for it, and the charges go on while it waits.
func TestCompactDoesNotStallBehindABackup(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_stall")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	k, vaultKey := MustMintKey(t, m.Store(), "stall", 1_000_000)
	require.NoError(t, m.Close())
	// A database larger than what the sockets buffer, so that the backup
	// blocks on its unread client: about 10 MB of answers, in 400 charges of
	// 24 KB rather than 4,000 of 2.4 KB (each a Reserve and a Settle).
	s, err := bolt.Open(filepath.Join(dataDir, databaseFile), bolt.Options{MasterKey: MustMasterKey(t, dataDir), OpenTimeout: time.Second})
	require.NoError(t, err)
	seedLargeCharges(t, s, k.ID, "seed", 400, 12000)
	require.NoError(t, s.Close())

	m = MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	token := MustAdminToken(t, dataDir)
	u, err := url.Parse(m.AdminURL())
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "GET /api/v1/backup HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", u.Host, token)
	status, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, status, "200", "the backup started; the test reads no more of it")

	compacted := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, m.AdminURL()+"/api/v1/compact", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			compacted <- 0
			return
		}
		resp.Body.Close()
		compacted <- resp.StatusCode
	}()
	// Both requests are in their handlers: the backup streams, the compaction waits.
	eventually(t, "the compaction request is in its handler", func() bool {
		m.inflight.mu.Lock()
		defer m.inflight.mu.Unlock()
		return m.inflight.n >= 2
	})
	select {
	case code := <-compacted:
		require.FailNow(t, "the compaction ran during the backup", "status %d", code)
	default:
	}

	client := &http.Client{Timeout: 20 * time.Second}
	for i := range 3 {
		idem := fmt.Sprintf("during-%d", i)
		code, body, err := postForm(context.Background(), client, m.ProxyURL()+"/v1/charges", vaultKey, idem, chargeForm(100, idem))
		require.NoError(t, err, "a charge during the backup and the waiting compaction is answered")
		assert.Equal(t, http.StatusOK, code, "%s", body)
	}

	require.NoError(t, conn.Close()) // the backup ends (aborted)
	select {
	case code := <-compacted:
		assert.Equal(t, http.StatusOK, code, "the compaction runs once the backup ended")
	case <-time.After(time.Minute):
		require.FailNow(t, "the compaction never ran")
	}
	require.NoError(t, m.Store().CheckInvariant(context.Background()))
}

// TestStartRemovesKilledCopies: the temporary copies that a killed compact
// or rekey left beside the database, as large as it, are removed when the
// next server starts; a killed backup's beside its --out, when the next
// backup to it starts.
func TestStartRemovesKilledCopies(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_leftovers")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	require.NoError(t, m.Close())
	outDir := t.TempDir()
	leftovers := []string{
		filepath.Join(dataDir, ".keybrake.db.compact-1234567"),
		filepath.Join(dataDir, ".keybrake.db.rekey-7654321"),
		filepath.Join(outDir, ".nightly.db.tmp-424242"),
	}
	for _, f := range leftovers {
		require.NoError(t, os.WriteFile(f, make([]byte, 1<<20), 0o600))
	}
	unrelated := filepath.Join(dataDir, "notes.txt")
	require.NoError(t, os.WriteFile(unrelated, []byte("mine"), 0o600))

	m = MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret}, "--log-level", "info")
	assert.NoFileExists(t, leftovers[0])
	assert.NoFileExists(t, leftovers[1])
	assert.Contains(t, m.stderr.String(), "removed the temporary copy a killed compact or rekey left behind")
	require.NoError(t, m.Close())

	MustRunCommand(t, env{}, "backup", "--out", filepath.Join(outDir, "nightly.db"), "--data-dir", dataDir)
	assert.NoFileExists(t, leftovers[2])
	assert.FileExists(t, unrelated, "only the copies, by their names")
}
