package main

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
	"github.com/keybrake/keybrake/vault/postgres/pgtest"
)

// TestMigrateStore: a vault served on bbolt is copied into PostgreSQL by
// keybrake migrate-store, refused while serve holds it, and then served from
// PostgreSQL: the same usage, the same unknown hold, and a retry of a
// completed charge replays the same answer without reaching Stripe. A second
// copy into the same database is refused.
func TestMigrateStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fake := proxytest.NewFakeStripe(t, "sk_test_migrate")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	key, vaultKey := MustMintKey(t, m.Store(), "migrated", 100)
	client := &http.Client{}
	status, body, err := postForm(ctx, client, m.ProxyURL()+"/v1/charges", vaultKey, "order-1", chargeForm(2500, "order-1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	fake.FailNext(proxytest.FailAfterCreate500, 1)
	status, _, err = postForm(ctx, client, m.ProxyURL()+"/v1/charges", vaultKey, "order-2", chargeForm(3000, "order-2"))
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, status, "Stripe's 500: outcome unknown")
	_, wantWindows, wantUsage, err := m.Store().KeyUsage(ctx, key.ID)
	require.NoError(t, err)

	dbURL := pgtest.URL(t)
	_, err = runCommand(env{}, "migrate-store", "--from", dataDir, "--to", dbURL)
	assert.ErrorContains(t, err, "stop serve first")
	require.NoError(t, m.Close())

	// The URL from the environment, as serve reads it.
	out := MustRunCommand(t, env{envName("database-url"): dbURL}, "migrate-store", "--from", dataDir)
	t.Log(out)
	assert.Contains(t, out, "1 vault keys, 1 upstreams")
	assert.Contains(t, out, "2 idempotency records, with 2 holds: 0 held, 1 outcome unknown, 1 committed, 0 released")
	assert.Contains(t, out, "the key in "+filepath.Join(dataDir, masterKeyFile))
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	password, ok := u.User.Password()
	require.True(t, ok)
	assert.NotContains(t, out, password, "the target is named without its password")
	assert.NoFileExists(t, filepath.Join(dataDir, databaseFile), "the bbolt vault is retired")
	retired, err := filepath.Glob(filepath.Join(dataDir, databaseFile+".migrated-*"))
	require.NoError(t, err)
	require.Len(t, retired, 1)
	assert.Contains(t, out, "is now "+retired[0])
	_, err = bolt.Open(retired[0], bolt.Options{MasterKey: MustMasterKey(t, dataDir), OpenTimeout: time.Second})
	assert.ErrorIs(t, err, vault.ErrMigrated, "the retired vault is marked: no server serves it")
	old, err := bolt.Open(retired[0], bolt.Options{MasterKey: MustMasterKey(t, dataDir), OpenTimeout: time.Second, AllowMigrated: true})
	require.NoError(t, err)
	_, _, oldUsage, err := old.KeyUsage(ctx, key.ID)
	require.NoError(t, err)
	assert.Equal(t, wantUsage, oldUsage, "the retired vault is unchanged")
	require.NoError(t, old.Close())

	masterText := base64.StdEncoding.EncodeToString(MustMasterKey(t, dataDir))
	pg := MustServe(t, t.TempDir(), fake.URL, env{envMasterKey: masterText, envName("database-url"): dbURL})
	_, windows, usage, err := pg.Store().KeyUsage(ctx, key.ID)
	require.NoError(t, err)
	assert.Equal(t, wantWindows, windows)
	assert.Equal(t, wantUsage, usage)
	unknown, _, err := pg.Store().ListHolds(ctx, vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	require.Len(t, unknown, 1)
	assert.Equal(t, "order-2", unknown[0].IdempotencyKey)
	before := fake.Count()
	req, err := http.NewRequest(http.MethodPost, pg.ProxyURL()+"/v1/charges", strings.NewReader(chargeForm(2500, "order-1").Encode()))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+vaultKey)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "order-1")
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "the charge made on bbolt replays from PostgreSQL")
	assert.Equal(t, before, fake.Count(), "the replay did not reach Stripe")
	require.NoError(t, pg.Store().CheckInvariant(ctx))

	require.NoError(t, os.Rename(retired[0], filepath.Join(dataDir, databaseFile)))
	_, err = runCommand(env{}, "migrate-store", "--from", dataDir, "--to", dbURL)
	assert.ErrorContains(t, err, "not empty")
	assert.ErrorContains(t, err, "nothing was copied")
	assert.FileExists(t, filepath.Join(dataDir, databaseFile), "a refused copy retires nothing")
}

// TestMigrateStoreExitCodes runs the binary: a bad command line exits 2, a
// copy that cannot be made 1, each with a message on stderr.
func TestMigrateStoreExitCodes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the real binary")
	}
	bin := MustBuildBinary(t)
	dataDir := t.TempDir()
	for name, tc := range map[string]struct {
		args []string
		code int
		msg  string
	}{
		"no target":    {[]string{"--from", dataDir}, exitUsage, "to: required"},
		"not postgres": {[]string{"--from", dataDir, "--to", "mysql://u:pw@127.0.0.1/x"}, exitUsage, "must be postgres://"},
		"no vault":     {[]string{"--from", dataDir, "--to", "postgres://127.0.0.1:1/x"}, exitError, "no vault to copy"},
		"a stray flag": {[]string{"--from", dataDir, "--into", "x"}, exitUsage, "flag provided but not defined"},
		"an argument":  {[]string{"--from", dataDir, "--to", "postgres://127.0.0.1:1/x", "extra"}, exitUsage, "unexpected arguments"},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"migrate-store"}, tc.args...)...)
			cmd.Env = childEnviron()
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "%v: %s", err, out)
			assert.Equal(t, tc.code, exit.ExitCode(), "%s", out)
			assert.Contains(t, string(out), tc.msg)
			assert.NotContains(t, string(out), "pw@", "no password in a message")
		})
	}
}

// TestMigrateStoreFailsClosed: migrate-store marks the bbolt vault as
// migrated inside the file before the PostgreSQL copy commits, so a vault
// left in place — here because its rename fails — is refused by serve
// instead of spending its keys a second time beside the replicas; the failed
// rename exits 1. --unmark returns the vault to serve.
func TestMigrateStoreFailsClosed(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the real binary")
	}
	ctx := context.Background()
	bin := MustBuildBinary(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_migrate")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	_, vaultKey := MustMintKey(t, m.Store(), "migrated", 60)
	status, body, err := postForm(ctx, http.DefaultClient, m.ProxyURL()+"/v1/charges", vaultKey, "order-1", chargeForm(2500, "order-1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.NoError(t, m.Close())

	// Every name the retired file could get in the next two minutes is a
	// directory that is not empty: the rename fails.
	dbPath := filepath.Join(dataDir, databaseFile)
	now := time.Now().UTC()
	for i := range 120 {
		dir := dbPath + ".migrated-" + now.Add(time.Duration(i)*time.Second).Format("20060102T150405Z")
		require.NoError(t, os.Mkdir(dir, 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "x"), nil, 0o600))
	}
	cmd := exec.Command(bin, "migrate-store", "--from", dataDir)
	cmd.Env = childEnviron(envName("database-url") + "=" + pgtest.URL(t))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "a rename that failed is an error: %v: %s", err, out)
	assert.Equal(t, exitError, exit.ExitCode(), "%s", out)
	assert.Contains(t, string(out), "could not be renamed")
	assert.Contains(t, string(out), "marked as migrated")
	assert.FileExists(t, dbPath, "the rename failed")

	tm := NewTestMain(env{envStripeKey: fake.Secret})
	require.NoError(t, tm.ParseFlags(ctx, []string{"serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--stripe-url", fake.URL, "--log-level", "warn"}))
	err = tm.Run(ctx)
	require.Error(t, err, "serve refuses a migrated vault")
	require.NoError(t, tm.Close())
	assert.ErrorIs(t, err, vault.ErrMigrated)
	assert.Contains(t, err.Error(), dbPath)
	assert.Contains(t, err.Error(), "--unmark")

	out2 := MustRunCommand(t, env{}, "migrate-store", "--from", dataDir, "--unmark")
	assert.Contains(t, out2, "no longer marked")
	m = MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	require.NoError(t, m.Close())
}
