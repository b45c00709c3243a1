package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// seedCallers is how many goroutines seed at once. The store commits what is
// queued together (up to 256 operations a transaction) and each commit waits
// for the disk, so more callers make fewer commits for the same charges.
const seedCallers = 64

// seedCharges commits n charges under keyID with answers of about 3 KB
// (random, so that they compress no better than real ones), from seedCallers
// callers.
func seedCharges(t *testing.T, s vault.Store, keyID, prefix string, n int) {
	t.Helper()
	seedLargeCharges(t, s, keyID, prefix, n, 1200)
}

// seedLargeCharges is seedCharges with answers of about 2×noise bytes: a
// fixture that needs megabytes in the file, not many records, gets them in
// fewer transactions.
func seedLargeCharges(t *testing.T, s vault.Store, keyID, prefix string, n, noiseBytes int) {
	t.Helper()
	var wg sync.WaitGroup
	for w := range seedCallers {
		wg.Go(func() {
			noise := make([]byte, noiseBytes)
			for i := w; i < n; i += seedCallers {
				_, _ = rand.Read(noise)
				idem := fmt.Sprintf("%s-%d", prefix, i)
				vaulttest.MustReserve(t, s, vaulttest.Charge(keyID, idem, 1))
				body := fmt.Appendf(nil, `{"id":"ch_%s","object":"charge","amount":1,"noise":%q}`, idem, hex.EncodeToString(noise))
				vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: keyID, IdempotencyKey: idem, Outcome: vault.SettleCommit,
					Amount: 1, Response: &vault.StoredResponse{Status: 200, Body: body}})
			}
		})
	}
	wg.Wait()
}

// compactSizes runs keybrake compact on dataDir and returns its report.
func compactSizes(t *testing.T, dataDir string) (before, after int64) {
	t.Helper()
	out := MustRunCommand(t, env{}, "compact", "--data-dir", dataDir)
	t.Log(strings.TrimSpace(out))
	fields := strings.Fields(strings.NewReplacer(",", "").Replace(out))
	require.Len(t, fields, 6, "compacted: N bytes before, M after")
	before, err := strconv.ParseInt(fields[1], 10, 64)
	require.NoError(t, err)
	after, err = strconv.ParseInt(fields[4], 10, 64)
	require.NoError(t, err)
	return before, after
}

// TestCompactGivesSpaceBack: keybrake compact never makes a file bigger —
// its copy fills its pages as full as the live server does, or fuller — and
// after the reaper removed half of the records it gives their space back.
// By default it seeds 1,000 charges in each half (each commit waits for the
// disk: 3,000 took seven minutes on a disk shared with other builds);
// KEYBRAKE_LONG=1 seeds 30,000.
func TestCompactGivesSpaceBack(t *testing.T) {
	t.Parallel()
	n := 1000
	if longRun() {
		n = 30000
	}
	fake := proxytest.NewFakeStripe(t, "sk_test_size")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	k, _ := MustMintKey(t, m.Store(), "size", 1_000_000)
	require.NoError(t, m.Close())

	dbPath := filepath.Join(dataDir, databaseFile)
	clock := vaulttest.NewClock(time.Now())
	open := func() *bolt.Store {
		s, err := bolt.Open(dbPath, bolt.Options{MasterKey: MustMasterKey(t, dataDir), Now: clock.Now, OpenTimeout: time.Second})
		require.NoError(t, err)
		return s
	}
	s := open()
	seedCharges(t, s, k.ID, "old", n)
	clock.Advance(vault.DefaultIdempotencyTTL / 2)
	seedCharges(t, s, k.ID, "new", n)
	require.NoError(t, s.Close())

	before, after := compactSizes(t, dataDir)
	require.LessOrEqual(t, after, before, "a compaction of a file without free pages does not make it bigger")

	// The older half passes its replay window and is reaped.
	clock.Advance(vault.DefaultIdempotencyTTL/2 + time.Hour)
	s = open()
	removed, err := s.Reap(context.Background())
	require.NoError(t, err)
	require.GreaterOrEqual(t, removed, n)
	require.NoError(t, s.CheckInvariant(context.Background()))
	require.NoError(t, s.Close())

	reaped, compacted := compactSizes(t, dataDir)
	t.Logf("%d charges: %.1f MiB, compacted %.1f MiB; half reaped: %.1f MiB, compacted %.1f MiB",
		2*n, mebibytes(before), mebibytes(after), mebibytes(reaped), mebibytes(compacted))
	require.Less(t, compacted, reaped, "the reaped records' space is given back")
	require.Less(t, compacted, after*3/4, "half the records are gone: the file is much smaller than with all of them")
	MustRunCommand(t, env{}, "check", "--data-dir", dataDir)
}

func mebibytes(n int64) float64 { return float64(n) / (1 << 20) }

// longRun reports whether KEYBRAKE_LONG asks for the long runs.
func longRun() bool { return os.Getenv("KEYBRAKE_LONG") != "" }

// TestCheckTimeOnALargeFile measures keybrake check on a database of
// KEYBRAKE_CHECK_BYTES (e.g. 1073741824), seeded with ~3 KB charges, and
// the compaction of it; it runs only when asked (it takes minutes).
func TestCheckTimeOnALargeFile(t *testing.T) {
	want, _ := strconv.ParseInt(os.Getenv("KEYBRAKE_CHECK_BYTES"), 10, 64)
	if want <= 0 {
		t.Skip("set KEYBRAKE_CHECK_BYTES to the size of the database to measure")
	}
	dataDir := os.Getenv("KEYBRAKE_CHECK_DIR")
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	fake := proxytest.NewFakeStripe(t, "sk_test_large")
	dbPath := filepath.Join(dataDir, databaseFile)
	if _, err := os.Stat(dbPath); err != nil {
		m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
		k, _ := MustMintKey(t, m.Store(), "large", 1_000_000_000)
		require.NoError(t, m.Close())
		s, err := bolt.Open(dbPath, bolt.Options{MasterKey: MustMasterKey(t, dataDir), OpenTimeout: time.Second})
		require.NoError(t, err)
		for i := 0; ; i++ {
			size, err := s.Size(context.Background())
			require.NoError(t, err)
			if size >= want {
				break
			}
			seedCharges(t, s, k.ID, fmt.Sprintf("large%d", i), 20000)
		}
		require.NoError(t, s.Close())
	}
	fi, err := os.Stat(dbPath)
	require.NoError(t, err)
	start := time.Now()
	out := MustRunCommand(t, env{}, "check", "--data-dir", dataDir)
	t.Logf("check of %.1f MiB took %s:\n%s", mebibytes(fi.Size()), time.Since(start).Round(time.Millisecond), out)
	start = time.Now()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	t.Logf("serve started (its page check included) in %s", time.Since(start).Round(time.Millisecond))
	require.NoError(t, m.Close())
}
