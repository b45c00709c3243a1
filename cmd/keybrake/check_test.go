package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bbolt "go.etcd.io/bbolt"
)

// spoilCounters overwrites every window counter of the vault at path with
// bytes that are no counter, as a bug or a bad disk could: bbolt's pages stay
// whole, the vault's invariant does not.
func spoilCounters(t *testing.T, path string) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("counters"))
		require.NotNil(t, b)
		var keys [][]byte
		require.NoError(t, b.ForEach(func(k, _ []byte) error { keys = append(keys, append([]byte(nil), k...)); return nil }))
		require.NotEmpty(t, keys)
		for _, k := range keys {
			if err := b.Put(k, []byte{0xde, 0xad}); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(t, db.Close())
}

// TestCheck: keybrake check says a data directory, a backup and a running
// server's store are whole, and lists what it finds in a damaged one with
// exit 1; backup refuses to report a copy of a damaged vault written.
func TestCheck(t *testing.T) {
	t.Parallel()
	vault, fake := MustVault(t)
	out := MustRunCommand(t, env{}, "check", "--data-dir", vault)
	t.Log(out)
	assert.Contains(t, out, "checked "+filepath.Join(vault, databaseFile))
	assert.Contains(t, out, "pages:     ok")
	assert.Contains(t, out, "invariant: ok (2 idempotency records")

	backup := filepath.Join(t.TempDir(), "backup.db")
	MustRunCommand(t, env{}, "backup", "--out", backup, "--data-dir", vault)
	out = MustRunCommand(t, env{}, "check", "--file", backup)
	assert.Contains(t, out, "invariant: ok (2 idempotency records")

	m := MustServe(t, vault, fake.URL, env{envStripeKey: fake.Secret})
	out = MustRunCommand(t, env{}, "check", "--admin-url", m.AdminURL(), "--data-dir", vault)
	assert.Contains(t, out, "pages:     ok")
	assert.Contains(t, out, "invariant: ok (2 idempotency records")
	_, err := runCommand(env{}, "check", "--data-dir", vault, "--open-timeout", "100ms")
	assert.ErrorContains(t, err, "--admin-url", "a running server holds the file")
	require.NoError(t, m.Close())

	spoiled := copyDir(t, vault)
	spoilCounters(t, filepath.Join(spoiled, databaseFile))
	out, err = runCommand(env{}, "check", "--data-dir", spoiled)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "problems found")
	assert.Contains(t, err.Error(), "restore")
	assert.Contains(t, out, "pages:     ok")
	assert.Contains(t, out, "invariant:")
	assert.Contains(t, out, "counter")

	copyOut := filepath.Join(t.TempDir(), "copy.db")
	_, err = runCommand(env{}, "backup", "--out", copyOut, "--data-dir", spoiled)
	require.Error(t, err, "the copy does not check")
	assert.Contains(t, err.Error(), "verify the copy")
	assert.NoFileExists(t, copyOut)
	assertNoTempFiles(t, filepath.Dir(copyOut))

	// The spoiled vault still serves (its pages are whole); its online backup
	// is refused as well.
	m = MustServe(t, spoiled, fake.URL, env{envStripeKey: fake.Secret})
	_, err = runCommand(env{}, "backup", "--out", copyOut, "--admin-url", m.AdminURL(), "--data-dir", spoiled)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "verify the copy")
	assert.NoFileExists(t, copyOut)
	_, err = runCommand(env{}, "check", "--admin-url", m.AdminURL(), "--data-dir", spoiled)
	assert.ErrorContains(t, err, "problems found")
	require.NoError(t, m.Close())

	if testing.Short() {
		return
	}
	// The binary exits 1 on a finding, 0 on a whole file.
	bin := MustBuildBinary(t)
	for dir, code := range map[string]int{vault: exitOK, spoiled: exitError} {
		cmd := exec.Command(bin, "check", "--data-dir", dir)
		cmd.Env = childEnviron()
		output, err := cmd.CombinedOutput()
		got := 0
		if exit, ok := err.(*exec.ExitError); ok {
			got = exit.ExitCode()
		} else {
			require.NoError(t, err)
		}
		assert.Equal(t, code, got, "%s", output)
	}
	_, err = os.Stat(filepath.Join(spoiled, databaseFile))
	require.NoError(t, err, "check changes nothing")
}
