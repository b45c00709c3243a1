package vault

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSyncEnvUpstream(t *testing.T) {
	ctx := context.Background()
	s, path := MustOpen(t, newClock(t0))
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
	sync := func(secret string, want EnvUpstreamAction) {
		t.Helper()
		up, action, err := s.SyncEnvUpstream(ctx, "system", "default", "stripe", secret)
		require.NoError(t, err)
		assert.Equal(t, want, action, secret)
		assert.Equal(t, "default", up.Name)
	}

	sync("sk_test_env_first_1111", EnvUpstreamRegistered)
	assert.Equal(t, 1, audits())
	sync("sk_test_env_first_1111", EnvUpstreamKept)
	assert.Equal(t, 1, audits(), "a restart with the same value writes nothing")

	// An admin replaces the secret through the API; the environment did not change.
	_, err := s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_admin_2222")
	require.NoError(t, err)
	sync("sk_test_env_first_1111", EnvUpstreamKept)
	assert.Equal(t, "sk_test_admin_2222", secretOf(), "the admin's change survives the restart")

	// The environment changes: it wins, once.
	sync("sk_test_env_second_3333", EnvUpstreamReplaced)
	assert.Equal(t, "sk_test_env_second_3333", secretOf())
	entries, _, err := s.ListAudit(ctx, 1, "")
	require.NoError(t, err)
	assert.Equal(t, "system", entries[0].Actor)
	assert.Equal(t, "upstream.put", entries[0].Action)
	sync("sk_test_env_second_3333", EnvUpstreamKept)

	// A changed value that is already the registered secret only records its
	// fingerprint.
	_, err = s.PutUpstream(ctx, "alice", "default", "stripe", "sk_test_admin_4444")
	require.NoError(t, err)
	n := audits()
	sync("sk_test_admin_4444", EnvUpstreamUnchanged)
	assert.Equal(t, n, audits())
	sync("sk_test_admin_4444", EnvUpstreamKept)

	// Deleted by an admin: registered again.
	require.NoError(t, s.DeleteUpstream(ctx, "alice", "default"))
	sync("sk_test_admin_4444", EnvUpstreamRegistered)

	_, _, err = s.SyncEnvUpstream(ctx, "system", "default", "stripe", " ")
	assert.ErrorIs(t, err, ErrInvalid)

	// The fingerprints never hold a value in clear (an upstream's last 4
	// characters are stored, by design, for display).
	require.NoError(t, s.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, v := range []string{"sk_test_env_first_1111", "sk_test_env_second_3333", "sk_test_admin_4444", "env_first", "env_second"} {
		assert.False(t, bytes.Contains(raw, []byte(v)), "%s is in the database file", v)
	}
}

func TestSyncEnvUpstreamAfterAnUpgrade(t *testing.T) {
	ctx := context.Background()
	s, _ := MustOpen(t, newClock(t0))
	// A database from before fingerprints: the upstream exists, no fingerprint.
	MustUpstream(t, s, "sk_test_same_5555")
	_, action, err := s.SyncEnvUpstream(ctx, "system", "default", "stripe", "sk_test_same_5555")
	require.NoError(t, err)
	assert.Equal(t, EnvUpstreamUnchanged, action)

	s2, _ := MustOpen(t, newClock(t0))
	MustUpstream(t, s2, "sk_test_old_6666")
	_, action, err = s2.SyncEnvUpstream(ctx, "system", "default", "stripe", "sk_test_new_7777")
	require.NoError(t, err)
	assert.Equal(t, EnvUpstreamReplaced, action, "as before fingerprints: the environment wins")
}

func TestEnvFingerprint(t *testing.T) {
	a := envFingerprint("sk_test_x", []byte("0123456789abcdef"))
	assert.True(t, envFingerprintMatches(a, "sk_test_x"))
	assert.False(t, envFingerprintMatches(a, "sk_test_y"))
	assert.False(t, envFingerprintMatches(nil, "sk_test_x"))
	assert.False(t, envFingerprintMatches(a[:20], "sk_test_x"))
	b := envFingerprint("sk_test_x", []byte("fedcba9876543210"))
	assert.NotEqual(t, a, b, "salted: the same value fingerprints differently")
}
