package main

import (
	"context"
	"net/http"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// TestCompactOnlineAndOffline: keybrake compact asks a running server to
// compact its store, charges go on afterwards; once the server is stopped it
// compacts the file itself, and refuses a PostgreSQL store.
func TestCompactOnlineAndOffline(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_compact")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	k, vaultKey := MustMintKey(t, m.Store(), "compact", 100)
	charge := func(idem string) int {
		status, _, err := postForm(context.Background(), http.DefaultClient, m.ProxyURL()+"/v1/charges", vaultKey, idem,
			url.Values{"amount": {"700"}, "currency": {"usd"}, "source": {"tok_visa"}})
		require.NoError(t, err)
		return status
	}
	require.Equal(t, 200, charge("before"))

	stdout := MustRunCommand(t, env{}, "compact", "--admin-url", m.AdminURL(), "--data-dir", dataDir)
	assert.Contains(t, stdout, "compacted:")
	require.Equal(t, 200, charge("after"), "the server goes on with the compacted file")
	require.NoError(t, m.Close())

	stdout = MustRunCommand(t, env{}, "compact", "--data-dir", dataDir)
	assert.Contains(t, stdout, "compacted:")
	s := MustOpenStore(t, filepath.Join(dataDir, databaseFile), MustMasterKey(t, dataDir))
	_, windows, usage, err := s.KeyUsage(context.Background(), k.ID)
	require.NoError(t, err)
	assert.Equal(t, int64(1400), usage[windows[1].ID].Committed, "both charges are in the compacted file")

	_, err = runCommand(env{}, "compact", "--database-url", "postgres://u@localhost/db")
	assert.ErrorContains(t, err, "autovacuum")
}
