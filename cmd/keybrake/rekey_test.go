package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// MustNewMasterKeyText returns a fresh master key in its environment form.
func MustNewMasterKeyText(tb testing.TB) string {
	tb.Helper()
	text, err := newMasterKeyText()
	require.NoError(tb, err)
	return text
}

// assertServesWith starts serve on dataDir with e and checks that the upstream
// secret unseals.
func assertServesWith(t *testing.T, dataDir, stripeURL string, e env, secret string) {
	t.Helper()
	m := MustServe(t, dataDir, stripeURL, e)
	got, err := m.Store().UpstreamSecret(context.Background(), upstreamDefault)
	require.NoError(t, err)
	assert.Equal(t, secret, got)
	require.NoError(t, m.Close())
}

func TestRekeyWithTheDataDirectorysMasterKey(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_rekeyfile")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	MustMintKey(t, m.Store(), "before-rekey", 10)
	oldKey := MustMasterKey(t, dataDir)

	_, err := runCommand(env{}, "rekey", "--data-dir", dataDir, "--new-master-key", MustNewMasterKeyText(t), "--open-timeout", "100ms")
	require.ErrorContains(t, err, "stop the server first", "serve holds the database")
	require.NoError(t, m.Close())

	newText := MustNewMasterKeyText(t)
	out := MustRunCommand(t, env{}, "rekey", "--data-dir", dataDir, "--new-master-key", newText)
	assert.Contains(t, out, "re-sealed 1 upstream secrets")
	assert.Contains(t, out, "wrote the new master key to "+filepath.Join(dataDir, masterKeyFile))
	newKey := MustMasterKey(t, dataDir)
	assert.NotEqual(t, oldKey, newKey)
	fi, err := os.Stat(filepath.Join(dataDir, masterKeyFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	assertNoTempFiles(t, dataDir)

	// The next start reads the new key from master.key; the keys are still there.
	m = MustServe(t, dataDir, fake.URL, env{})
	keys, _, err := m.Store().ListKeys(context.Background(), vault.KeyFilter{})
	require.NoError(t, err)
	require.Len(t, keys, 1)
	assert.Equal(t, "before-rekey", keys[0].Name)
	secret, err := m.Store().UpstreamSecret(context.Background(), upstreamDefault)
	require.NoError(t, err)
	assert.Equal(t, fake.Secret, secret)
}

func TestRekeyWithTheEnvironmentsMasterKey(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_rekeyenv")
	dataDir := t.TempDir()
	oldText, newText := MustNewMasterKeyText(t), MustNewMasterKeyText(t)
	m := MustServe(t, dataDir, fake.URL, env{envMasterKey: oldText, envStripeKey: fake.Secret})
	require.NoError(t, m.Close())

	out := MustRunCommand(t, env{envMasterKey: oldText, envNewMasterKey: newText}, "rekey", "--data-dir", dataDir)
	assert.Contains(t, out, "set KEYBRAKE_MASTER_KEY to the new master key before the next start")
	assert.NoFileExists(t, filepath.Join(dataDir, masterKeyFile), "the key stays out of the data directory")

	_, err := runCommand(env{envMasterKey: oldText}, "serve", "--data-dir", dataDir,
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--stripe-url", fake.URL)
	assert.ErrorContains(t, err, "sealed with another master key", "the old key no longer opens it")
	assertServesWith(t, dataDir, fake.URL, env{envMasterKey: newText}, fake.Secret)
}

// A rekey killed after it replaced the database and before it wrote master.key
// is finished by running it again.
func TestRekeyFinishesAnInterruptedRekey(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_rekeyagain")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	require.NoError(t, m.Close())
	oldKey := MustMasterKey(t, dataDir)
	newText := MustNewMasterKeyText(t)
	newKey, err := decodeMasterKey(newText)
	require.NoError(t, err)
	_, err = bolt.Rekey(context.Background(), filepath.Join(dataDir, databaseFile), oldKey, newKey, bolt.RekeyOptions{})
	require.NoError(t, err) // the database is replaced; master.key still holds the old key

	out := MustRunCommand(t, env{envNewMasterKey: newText}, "rekey", "--data-dir", dataDir)
	assert.Contains(t, out, "already sealed under the new master key")
	assert.Equal(t, newKey, MustMasterKey(t, dataDir))
	assertServesWith(t, dataDir, fake.URL, env{}, fake.Secret)
}

func TestRekeyRefuses(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_rekeyno")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	require.NoError(t, m.Close())
	before, err := os.ReadFile(filepath.Join(dataDir, databaseFile))
	require.NoError(t, err)

	tests := map[string]struct {
		env  env
		args []string
		want string
	}{
		"no new key":         {args: nil, want: "openssl rand -base64 32"},
		"a new key in hex":   {args: []string{"--new-master-key", strings.Repeat("ab", 32)}, want: "must be base64 of 32 bytes"},
		"the wrong old key":  {env: env{envMasterKey: MustNewMasterKeyText(t)}, args: []string{"--new-master-key", MustNewMasterKeyText(t)}, want: "does not open"},
		"the same key twice": {args: []string{"--new-master-key", strings.TrimSpace(readFile(t, filepath.Join(dataDir, masterKeyFile)))}, want: "the new master key is the old one"},
		"no database":        {args: []string{"--new-master-key", MustNewMasterKeyText(t), "--data-dir", t.TempDir()}, want: "database"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"rekey", "--data-dir", dataDir}, tc.args...)
			_, err := runCommand(tc.env, args...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	after, err := os.ReadFile(filepath.Join(dataDir, databaseFile))
	require.NoError(t, err)
	assert.Equal(t, before, after, "the database is untouched")
	assertServesWith(t, dataDir, fake.URL, env{}, fake.Secret)
}

func readFile(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	require.NoError(tb, err)
	return string(b)
}
