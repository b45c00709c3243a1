package vaulttest

import (
	"bytes"
	"context"
	"testing"

	"github.com/keybrake/keybrake/vault"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func testSyncEnvUpstream(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	audits := func() int {
		t.Helper()
		entries, _, err := s.ListAudit(ctx, 500, "")
		require.NoError(t, err)
		return len(entries)
	}
	secretOf := func() string {
		t.Helper()
		v, err := s.UpstreamSecret(ctx, "default")
		require.NoError(t, err)
		return v
	}
	sync := func(secret string, want vault.EnvUpstreamAction) {
		t.Helper()
		up, action, err := s.SyncEnvUpstream(ctx, "system", "default", "stripe", secret)
		require.NoError(t, err)
		assert.Equal(t, want, action, secret)
		assert.Equal(t, "default", up.Name)
	}

	sync("sk_test_env_first_1111", vault.EnvUpstreamRegistered)
	assert.Equal(t, 1, audits())
	sync("sk_test_env_first_1111", vault.EnvUpstreamKept)
	assert.Equal(t, 1, audits(), "a restart with the same value writes nothing")

	// An admin replaces the secret through the API; the environment did not change.
	_, _, err := s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_admin_2222")
	require.NoError(t, err)
	sync("sk_test_env_first_1111", vault.EnvUpstreamKept)
	assert.Equal(t, "sk_test_admin_2222", secretOf(), "the admin's change survives the restart")

	// The environment changes: it wins, once.
	sync("sk_test_env_second_3333", vault.EnvUpstreamReplaced)
	assert.Equal(t, "sk_test_env_second_3333", secretOf())
	entries, _, err := s.ListAudit(ctx, 1, "")
	require.NoError(t, err)
	assert.Equal(t, "system", entries[0].Actor)
	assert.Equal(t, "upstream.put", entries[0].Action)
	sync("sk_test_env_second_3333", vault.EnvUpstreamKept)

	// A changed value that is already the registered secret only records its
	// fingerprint.
	_, _, err = s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_admin_4444")
	require.NoError(t, err)
	n := audits()
	sync("sk_test_admin_4444", vault.EnvUpstreamUnchanged)
	assert.Equal(t, n, audits())
	sync("sk_test_admin_4444", vault.EnvUpstreamKept)

	// Deleted by an admin: registered again.
	require.NoError(t, s.DeleteUpstream(ctx, "alice", "default"))
	sync("sk_test_admin_4444", vault.EnvUpstreamRegistered)

	_, _, err = s.SyncEnvUpstream(ctx, "system", "default", "stripe", " ")
	assert.ErrorIs(t, err, vault.ErrInvalid)

	// The fingerprints never hold a value in clear (an upstream's last 4
	// characters are stored, by design, for display).
	raw := rawStore(t, s)
	for _, v := range []string{"sk_test_env_first_1111", "sk_test_env_second_3333", "sk_test_admin_4444", "env_first", "env_second"} {
		assert.False(t, bytes.Contains(raw, []byte(v)), "%s is in the store", v)
	}
}

func testSyncEnvUpstreamAfterAnUpgrade(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, NewClock(T0))
	// A database from before fingerprints: the upstream exists, no fingerprint.
	MustUpstream(t, s, "sk_test_same_5555")
	_, action, err := s.SyncEnvUpstream(ctx, "system", "default", "stripe", "sk_test_same_5555")
	require.NoError(t, err)
	assert.Equal(t, vault.EnvUpstreamUnchanged, action)

	s2 := mustOpen(t, NewClock(T0))
	MustUpstream(t, s2, "sk_test_old_6666")
	_, action, err = s2.SyncEnvUpstream(ctx, "system", "default", "stripe", "sk_test_new_7777")
	require.NoError(t, err)
	assert.Equal(t, vault.EnvUpstreamReplaced, action, "as before fingerprints: the environment wins")
}
