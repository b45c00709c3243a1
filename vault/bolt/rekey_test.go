package bolt

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
	"github.com/keybrake/keybrake/vault/vaulttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// newMasterKeyForTest is a second master key, to rekey to.
var newMasterKeyForTest = []byte("fedcba9876543210fedcba9876543210")

// rekeyFixture is what a database was filled with, to compare after a rekey.
type rekeyFixture struct {
	keyID     string
	upstreams map[string]string // name → secret
	responses map[string]string // idempotency key → stored body
	claims    map[string]string // claim key → result
}

// MustFillForRekey fills a fresh database at path, sealed under vaulttest.MasterKey,
// with every kind of sealed value: upstream secrets, stored responses (committed,
// released and 5xx-unknown), records without a response (in flight, unknown),
// completed claims and a claim in progress; n metered requests in all.
func MustFillForRekey(tb testing.TB, path string, n int) rekeyFixture {
	tb.Helper()
	ctx := context.Background()
	clock := vaulttest.NewClock(vaulttest.T0)
	s := MustOpenPath(tb, path, clock)
	f := rekeyFixture{upstreams: map[string]string{}, responses: map[string]string{}, claims: map[string]string{}}
	for _, name := range []string{"default", "eu"} {
		secret := "sk_test_" + name + "_0123456789"
		_, _, err := s.PutUpstream(ctx, "tester", name, "stripe", secret)
		require.NoError(tb, err)
		f.upstreams[name] = secret
	}
	_, err := s.SetUpstreamWebhookSecrets(ctx, "tester", "eu", []string{"whsec_rekey_new", "whsec_rekey_old"})
	require.NoError(tb, err)
	k, _ := vaulttest.MustMint(tb, s, "rekey", vaulttest.Policy(tb, "", "100000000.00", ""), nil)
	f.keyID = k.ID
	unsynced(tb, s, func() {
		for i := range n {
			id := vaulttest.Idem(i)
			vaulttest.MustReserve(tb, s, vaulttest.Charge(k.ID, id, 100))
			// Every other answer is long enough to be stored compressed.
			body := fmt.Sprintf(`{"id":"ch_%d","object":"charge","padding":%q}`, i, strings.Repeat("x", 200+2000*(i%2)))
			resp := &vault.StoredResponse{Status: 200, Body: []byte(body)}
			out := vault.SettleCommit
			switch i % 5 {
			case 1:
				out, resp.Status = vault.SettleRelease, 402
			case 2:
				out, resp.Status = vault.SettleUnknown, 500
			case 3:
				out, resp = vault.SettleUnknown, nil // no answer at all
			case 4:
				continue // left in flight
			}
			vaulttest.MustSettle(tb, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: id, Outcome: out, Amount: 100, Response: resp})
			if resp != nil {
				f.responses[id] = body
			}
		}
		for i := range 3 {
			key := fmt.Sprintf("job-%d", i)
			res, err := s.Claim(ctx, k.ID, key, "fp", time.Minute)
			require.NoError(tb, err)
			if i == 2 {
				continue // in progress: nothing sealed
			}
			result := fmt.Sprintf(`{"done":%d}`, i)
			require.NoError(tb, s.CompleteClaim(ctx, k.ID, key, res.Claim.FencingToken, []byte(result)))
			f.claims[key] = result
		}
	})
	require.NoError(tb, s.Close())
	return f
}

// AssertRekeyed checks that the database at path opens with masterKey (and only
// with it), holds everything the fixture put in it, and keeps its invariant.
func AssertRekeyed(tb testing.TB, path string, masterKey []byte, f rekeyFixture) {
	tb.Helper()
	ctx := context.Background()
	other := vaulttest.MasterKey
	if bytes.Equal(masterKey, vaulttest.MasterKey) {
		other = newMasterKeyForTest
	}
	_, err := Open(path, Options{MasterKey: other, Logger: vaulttest.QuietLogger(), OpenTimeout: time.Second})
	require.ErrorIs(tb, err, vault.ErrSealed, "the other key does not open it")

	s, err := Open(path, Options{MasterKey: masterKey, Logger: vaulttest.QuietLogger(), Now: vaulttest.NewClock(vaulttest.T0).Now, OpenTimeout: time.Second})
	require.NoError(tb, err)
	defer func() { require.NoError(tb, s.Close()) }()
	require.NoError(tb, s.CheckInvariant(ctx))
	for name, secret := range f.upstreams {
		got, err := s.UpstreamSecret(ctx, name)
		require.NoError(tb, err, name)
		assert.Equal(tb, secret, got, name)
	}
	whsecs, err := s.UpstreamWebhookSecrets(ctx, "eu")
	require.NoError(tb, err)
	assert.Equal(tb, []string{"whsec_rekey_new", "whsec_rekey_old"}, whsecs, "the webhook secrets are resealed too")
	for id, body := range f.responses {
		resp, err := engine.StoredResponse(s.Engine, ctx, f.keyID, id)
		require.NoError(tb, err, id)
		require.NotNil(tb, resp, id)
		assert.Equal(tb, body, string(resp.Body), id)
	}
	for key, result := range f.claims {
		c, err := s.GetClaim(ctx, f.keyID, key)
		require.NoError(tb, err, key)
		assert.Equal(tb, result, string(c.Result), key)
	}
}

// rawDump reads every bucket of a database file: entries and sequences, without
// a master key.
func rawDump(tb testing.TB, path string) map[string]map[string][]byte {
	tb.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	require.NoError(tb, err)
	defer db.Close()
	out := map[string]map[string][]byte{}
	require.NoError(tb, db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			m := map[string][]byte{"\x00sequence": []byte(strconv.FormatUint(b.Sequence(), 10))}
			out[string(name)] = m
			return b.ForEach(func(k, v []byte) error {
				m[string(k)] = bytes.Clone(v)
				return nil
			})
		})
	}))
	return out
}

func TestRekeyResealsEverythingElseUnchanged(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "keybrake.db")
	f := MustFillForRekey(t, path, 40)
	before := rawDump(t, path)

	stats, err := Rekey(context.Background(), path, vaulttest.MasterKey, newMasterKeyForTest, RekeyOptions{batch: 7})
	require.NoError(t, err)
	assert.Equal(t, RekeyStats{Upstreams: 2, Responses: len(f.responses), ClaimResults: len(f.claims)}, stats)

	// Byte for byte, only sealed values changed; every bucket, entry and sequence
	// is there. (Read before a store opens it: Open recovers in-flight records.)
	after := rawDump(t, path)
	require.Equal(t, len(before), len(after), "buckets")
	changed := 0
	for name, entries := range before {
		require.Len(t, after[name], len(entries), name)
		for k, v := range entries {
			w, ok := after[name][k]
			require.True(t, ok, "%s/%q", name, k)
			if !bytes.Equal(v, w) {
				changed++
			}
		}
	}
	// The check value, 2 upstreams, the stored responses, the claim results.
	assert.Equal(t, 1+2+len(f.responses)+len(f.claims), changed)
	AssertRekeyed(t, path, newMasterKeyForTest, f)
	leftovers, err := filepath.Glob(filepath.Join(filepath.Dir(path), ".keybrake.db.rekey-*"))
	require.NoError(t, err)
	assert.Empty(t, leftovers)

	// And back again.
	_, err = Rekey(context.Background(), path, newMasterKeyForTest, vaulttest.MasterKey, RekeyOptions{})
	require.NoError(t, err)
	AssertRekeyed(t, path, vaulttest.MasterKey, f)
}

func TestRekeyRefusalsLeaveTheFileUntouched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "keybrake.db")
	MustFillForRekey(t, path, 5)
	orig, err := os.ReadFile(path)
	require.NoError(t, err)
	unchanged := func(msg string) {
		t.Helper()
		now, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(orig, now), "%s: the database file is untouched", msg)
	}

	_, err = Rekey(ctx, path, newMasterKeyForTest, vaulttest.MasterKey, RekeyOptions{})
	assert.ErrorIs(t, err, vault.ErrSealed, "the wrong old key")
	unchanged("wrong old key")
	_, err = Rekey(ctx, path, vaulttest.MasterKey, vaulttest.MasterKey, RekeyOptions{})
	assert.ErrorIs(t, err, vault.ErrInvalid, "the same key")
	_, err = Rekey(ctx, path, vaulttest.MasterKey, []byte("short"), RekeyOptions{})
	assert.ErrorIs(t, err, vault.ErrInvalid, "a new key of the wrong length")
	_, err = Rekey(ctx, filepath.Join(dir, "missing.db"), vaulttest.MasterKey, newMasterKeyForTest, RekeyOptions{})
	assert.ErrorIs(t, err, vault.ErrNotFound)
	assert.NoFileExists(t, filepath.Join(dir, "missing.db"), "no database created")

	s := MustOpenPath(t, path, vaulttest.NewClock(vaulttest.T0))
	start := time.Now()
	_, err = Rekey(ctx, path, vaulttest.MasterKey, newMasterKeyForTest, RekeyOptions{OpenTimeout: 100 * time.Millisecond})
	assert.ErrorIs(t, err, vault.ErrLocked, "a server holds the database")
	assert.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, s.Close())
	orig, err = os.ReadFile(path) // Open recovered the in-flight records
	require.NoError(t, err)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = Rekey(cancelled, path, vaulttest.MasterKey, newMasterKeyForTest, RekeyOptions{batch: 1})
	assert.ErrorIs(t, err, context.Canceled)
	unchanged("cancelled")

	// A copy a killed rekey left behind is removed by the next one.
	leftover := filepath.Join(dir, ".keybrake.db.rekey-123")
	require.NoError(t, os.WriteFile(leftover, []byte("half a copy"), 0o600))
	_, err = Rekey(ctx, path, vaulttest.MasterKey, newMasterKeyForTest, RekeyOptions{})
	require.NoError(t, err)
	assert.NoFileExists(t, leftover)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.Equal(t, []string{"keybrake.db"}, names)
}

// The rekey crash test: a child process rekeys a copy of a filled database and is
// killed at a random stage of the copy (after some transaction of the copy, just
// before the rename, just after it). Whatever the moment, the database is either
// the old one under the old key or the complete copy under the new key.
const (
	rekeyEnvPath = "KEYBRAKE_REKEY_CHILD_DB"
	rekeyEnvStop = "KEYBRAKE_REKEY_CHILD_STOP"
)

// TestRekeyChild is not a test: it is the child process of TestRekeyKilled. It
// prints each stage of the copy; at the stage numbered KEYBRAKE_REKEY_CHILD_STOP
// it stops there, so that the parent's SIGKILL lands exactly at that stage.
func TestRekeyChild(t *testing.T) {
	t.Parallel()
	path := os.Getenv(rekeyEnvPath)
	if path == "" {
		t.Skip("the child process of TestRekeyKilled")
	}
	stop, _ := strconv.Atoi(os.Getenv(rekeyEnvStop))
	go func() { // never outlive a parent that forgot us
		time.Sleep(60 * time.Second)
		os.Exit(3)
	}()
	n := 0
	hook := func(stage string) {
		n++
		fmt.Fprintln(os.Stdout, stage)
		if n == stop {
			select {} // wait for the SIGKILL
		}
	}
	if _, err := Rekey(context.Background(), path, vaulttest.MasterKey, newMasterKeyForTest, RekeyOptions{batch: 50, hook: hook}); err != nil {
		fmt.Fprintln(os.Stderr, "rekey:", err)
		os.Exit(2)
	}
	fmt.Fprintln(os.Stdout, "done")
}

func TestRekeyKilled(t *testing.T) {
	t.Parallel()
	if os.Getenv(rekeyEnvPath) != "" {
		t.Skip("inside a rekey child")
	}
	if testing.Short() {
		t.Skip("runs and kills child processes")
	}
	runs := 4
	if vaulttest.Long() {
		runs = 30
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	dir := t.TempDir()
	orig := filepath.Join(dir, "orig.db")
	f := MustFillForRekey(t, orig, 400) // a few hundred entries: many batches of 50
	fresh := func(run int) string {
		path := filepath.Join(dir, fmt.Sprintf("run-%d", run), "keybrake.db")
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
		data, err := os.ReadFile(orig)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, data, 0o600))
		return path
	}

	// An uninterrupted run tells the stages: "batch" per transaction of the copy,
	// then "copied", "renamed", "done".
	path := fresh(-1)
	stages := runRekeyChild(t, path, 0)
	require.Greater(t, len(stages), 5)
	require.Equal(t, []string{"copied", "renamed", "done"}, stages[len(stages)-3:])
	AssertRekeyed(t, path, newMasterKeyForTest, f)

	for run := range runs {
		// Kill after the k-th line: just before the rename and just after it once
		// each, else anywhere in the copy.
		k := 1 + rng.IntN(len(stages)-3)
		switch run {
		case 0:
			k = len(stages) - 2 // "copied"
		case 1:
			k = len(stages) - 1 // "renamed"
		}
		path := fresh(run)
		lines := runRekeyChild(t, path, k)
		last := lines[len(lines)-1]
		renamed := last == "renamed"
		t.Logf("run %d: killed after line %d of %d, %q", run, len(lines), len(stages), last)

		// Exactly one key opens it, and then with everything in it (AssertRekeyed
		// checks that the other key fails).
		if renamed {
			AssertRekeyed(t, path, newMasterKeyForTest, f)
		} else {
			AssertRekeyed(t, path, vaulttest.MasterKey, f)
			// A rekey run again finishes the job and removes the killed one's copy.
			_, err := Rekey(context.Background(), path, vaulttest.MasterKey, newMasterKeyForTest, RekeyOptions{})
			require.NoError(t, err)
			AssertRekeyed(t, path, newMasterKeyForTest, f)
			leftovers, err := filepath.Glob(filepath.Join(filepath.Dir(path), ".keybrake.db.rekey-*"))
			require.NoError(t, err)
			assert.Empty(t, leftovers, "run %d", run)
		}
		if t.Failed() {
			t.Fatalf("run %d failed (seed %d)", run, seed)
		}
	}
}

// runRekeyChild starts a rekey child on path, kills it with SIGKILL once it has
// printed `after` lines (0: lets it finish) and returns the lines it printed.
func runRekeyChild(t *testing.T, path string, after int) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRekeyChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), rekeyEnvPath+"="+path, rekeyEnvStop+"="+strconv.Itoa(after))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var lines []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if line == "PASS" || strings.HasPrefix(line, "ok") {
			continue
		}
		lines = append(lines, line)
		if len(lines) == after {
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			break
		}
	}
	_, _ = io.Copy(io.Discard, out)
	err = cmd.Wait()
	if len(lines) == after {
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s", stderr.String())
	} else {
		require.NoError(t, err, "the child finished before the chosen stage: %s", stderr.String())
	}
	require.NotEmpty(t, lines, "the child printed nothing: %s", stderr.String())
	return lines
}
