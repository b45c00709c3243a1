package main

import (
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// boltPageSize is the page size of the databases the tests make (the OS's).
const boltPageSize = 4096

// MustVault serves a data directory once — a key, two charges — and stops,
// leaving a vault whose keybrake.db the test may damage.
func MustVault(t *testing.T) (dataDir string, fake *proxytest.FakeStripe) {
	t.Helper()
	fake = proxytest.NewFakeStripe(t, "sk_test_damaged")
	dataDir = t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	_, vaultKey := MustMintKey(t, m.Store(), "damaged", 100)
	for _, idem := range []string{"order-1", "order-2"} {
		status, body, err := postForm(context.Background(), http.DefaultClient, m.ProxyURL()+"/v1/charges", vaultKey, idem, chargeForm(700, idem))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}
	require.NoError(t, m.Close())
	return dataDir, fake
}

// copyDir copies the files of a data directory into a new one.
func copyDir(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	entries, err := os.ReadDir(from)
	require.NoError(t, err)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(to, e.Name()), data, 0o600))
	}
	return to
}

// newestMeta reads the meta page with the highest transaction id of the
// bbolt file at path: its high water mark and its root bucket's page.
func newestMeta(t *testing.T, path string) (pgid, root uint64) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var best uint64
	for i := range int64(2) {
		buf := make([]byte, 16+64)
		_, err := f.ReadAt(buf, i*boltPageSize)
		require.NoError(t, err)
		m := buf[16:]
		if txid := binary.LittleEndian.Uint64(m[48:]); txid >= best {
			best, pgid, root = txid, binary.LittleEndian.Uint64(m[40:]), binary.LittleEndian.Uint64(m[16:])
		}
	}
	return pgid, root
}

// runBinary runs the binary with args until it exits (at most a minute) and
// returns its exit code and combined output; a server that starts serving is
// stopped with SIGTERM and reports -1.
func runBinary(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	c := startChild(t, bin, args, childEnviron())
	select {
	case <-c.ready:
		_ = c.signalAndWait(t, syscall.SIGTERM, 30*time.Second)
		return -1, c.logs()
	case <-c.exited:
	case <-time.After(time.Minute):
		_ = c.cmd.Process.Kill()
		<-c.exited
		require.FailNow(t, "the binary neither served nor exited", "%s", c.logs())
	}
	var exit *exec.ExitError
	if errors.As(c.exitErr, &exit) {
		return exit.ExitCode(), c.logs()
	}
	require.NoError(t, c.exitErr)
	return 0, c.logs()
}

// TestServeRefusesDamagedFiles runs the binary on damaged copies of a vault:
// a file cut short, an empty file beside its master.key and a zeroed page are
// refused at start with exit 1 and a message that names the file and says to
// restore it (no SIGBUS, no goroutine dump, no new empty vault); a meta page
// that does not check is survived, with a warning that names the file.
func TestServeRefusesDamagedFiles(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the real binary")
	}
	bin := MustBuildBinary(t)
	vault, fake := MustVault(t)
	pgid, root := newestMeta(t, filepath.Join(vault, databaseFile))
	require.Greater(t, pgid, uint64(4))
	serve := func(dataDir string) (int, string) {
		return runBinary(t, bin, "serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
			"--stripe-url", fake.URL, "--log-format", "json", "--log-level", "info")
	}
	for name, tc := range map[string]struct {
		damage func(path string)
		want   string
	}{
		"cut short": {func(path string) { require.NoError(t, os.Truncate(path, int64(pgid-1)*boltPageSize)) }, "cut short"},
		"empty":     {func(path string) { require.NoError(t, os.Truncate(path, 0)) }, "is empty (0 bytes)"},
		"a zeroed page": {func(path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			require.NoError(t, err)
			_, err = f.WriteAt(make([]byte, boltPageSize), int64(root)*boltPageSize)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}, "page check"},
	} {
		t.Run(name, func(t *testing.T) {
			dataDir := copyDir(t, vault)
			path := filepath.Join(dataDir, databaseFile)
			tc.damage(path)
			code, out := serve(dataDir)
			assert.Equal(t, exitError, code, "%s", out)
			assert.Contains(t, out, path, "the message names the file")
			assert.Contains(t, out, tc.want)
			assert.Contains(t, out, "backup", "the message says to restore it")
			assert.NotContains(t, out, "SIGBUS")
			assert.NotContains(t, out, "goroutine ")
			assert.NotContains(t, out, "keybrake serving")
		})
	}

	t.Run("a damaged meta page", func(t *testing.T) {
		dataDir := copyDir(t, vault)
		path := filepath.Join(dataDir, databaseFile)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		_, err = f.WriteAt([]byte{0xff, 0xff, 0xff, 0xff}, boltPageSize+16+8) // the second meta's page size
		require.NoError(t, err)
		require.NoError(t, f.Close())
		code, out := serve(dataDir)
		assert.Equal(t, -1, code, "bbolt falls back to the other meta page: %s", out)
		assert.Contains(t, out, "meta page of the database does not check")
		assert.Contains(t, out, path)
	})
}
