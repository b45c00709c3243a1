package postgres

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/postgres/pgtest"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// TestTheClockIsTheDatabases: without UnsafeNow every time the store writes
// comes from the database's clock, read in the transaction that writes it —
// microseconds, between the database's times before and after — and never
// from this process's.
func TestTheClockIsTheDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := migrated.URL(t)
	s, err := Open(ctx, url, Options{MasterKey: vaulttest.MasterKey, Logger: vaulttest.QuietLogger()})
	require.NoError(t, err)
	defer s.Close()
	pool := pgtest.NewPool(t, url)
	dbNow := func() time.Time {
		var now time.Time
		require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now))
		return now
	}
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	p := vaulttest.Policy(t, "100.00", "", "")
	p.PeriodStart, p.ExpiresAt = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	k, _ := vaulttest.MustMint(t, s, "k", p, nil)
	for i := range 10 {
		before := dbNow()
		res := vaulttest.MustReserve(t, s, vaulttest.Charge(k.ID, vaulttest.Idem(i), 1))
		after := dbNow()
		require.Equal(t, vault.ReserveClaimed, res.Outcome)
		created := res.Record.CreatedAt
		assert.False(t, created.Before(before) || created.After(after), "%s is not between %s and %s", created, before, after)
		assert.Zero(t, created.Nanosecond()%1000, "the database's clock counts microseconds: %s", created)
		assert.Equal(t, created.Add(vault.DefaultLease), res.Record.LeaseUntil)
	}
}

// TestOpenRefusesANewerSchema: a database a newer keybrake migrated, or whose
// records a newer keybrake wrote, is not written by this one.
func TestOpenRefusesANewerSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, newer := range map[string]string{
		"migrations": "INSERT INTO keybrake_schema_migrations (version, name) VALUES (999, 'future')",
		"records":    "UPDATE keybrake_meta SET v = '\\x00000000000003e7' WHERE k = 'schema_version'",
	} {
		t.Run(name, func(t *testing.T) {
			url := migrated.URL(t)
			s := mustOpenURL(t, url, vaulttest.Options{MasterKey: vaulttest.MasterKey})
			require.NoError(t, s.Close())
			_, err := pgtest.NewPool(t, url).Exec(ctx, newer)
			require.NoError(t, err)
			_, err = Open(ctx, url, Options{MasterKey: vaulttest.MasterKey, Logger: vaulttest.QuietLogger()})
			assert.ErrorIs(t, err, vault.ErrSchemaVersion)
		})
	}
}

// TestOpenErrors: what Open says about what it cannot use, without the URL's
// password.
func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := Open(ctx, migrated.URL(t), Options{MasterKey: []byte("short")})
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = Open(ctx, "postgres://u:secret-pw@127.0.0.1:bad/x", Options{MasterKey: vaulttest.MasterKey})
	assert.ErrorIs(t, err, vault.ErrInvalid)
	assert.NotContains(t, err.Error(), "secret-pw")
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = Open(ctx, "postgres://u:secret-pw@127.0.0.1:1/x?connect_timeout=2", Options{MasterKey: vaulttest.MasterKey})
	assert.ErrorIs(t, err, vault.ErrStorage)
	assert.NotContains(t, err.Error(), "secret-pw")
}

// TestBackupAndSize: keybrake does not copy a PostgreSQL store (pg_dump
// does), nor compact it (autovacuum does); its size is its tables'.
func TestBackupAndSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := mustOpenURL(t, migrated.URL(t), vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: vaulttest.NewClock(vaulttest.T0).Now})
	var buf bytes.Buffer
	_, err := s.Backup(ctx, &buf)
	assert.ErrorIs(t, err, errors.ErrUnsupported)
	assert.ErrorContains(t, err, "pg_dump")
	_, err = s.Compact(ctx)
	assert.ErrorIs(t, err, errors.ErrUnsupported)
	assert.ErrorContains(t, err, "autovacuum")
	before, err := s.Size(ctx)
	require.NoError(t, err)
	assert.Positive(t, before)
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	for i := range 200 {
		_, _, err := s.MintKey(ctx, "t", vault.MintRequest{Name: vaulttest.Idem(i), Policy: vaulttest.Policy(t, "1", "", "")})
		require.NoError(t, err)
	}
	after, err := s.Size(ctx)
	require.NoError(t, err)
	assert.Greater(t, after, before)
	require.NoError(t, s.Close())
	_, err = s.Size(ctx)
	assert.ErrorIs(t, err, vault.ErrClosed)
	assert.ErrorIs(t, s.Ping(ctx), vault.ErrClosed)
}

// TestRoundTrips counts what a metered request costs the database: each of
// Reserve and Settle is one transaction that waits on one commit, in two
// round trips — everything it reads with its lock, its writes with the
// COMMIT.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	clock := vaulttest.NewClock(vaulttest.T0)
	s := mustOpenURL(t, migrated.URL(t), vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: clock.Now})
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	k, tok := vaulttest.MustMint(t, s, "k", vaulttest.Policy(t, "1000.00", "", ""), nil)
	vaulttest.MustCommit(t, s, k.ID, "warm", 100) // statements prepared on the connection
	commits := func(fn func()) (roundTrips int64, commits int) {
		before := s.roundTrips.Load()
		var n int
		observe := s.observe
		s.observe = func(int, time.Duration) { n++ }
		fn()
		s.observe = observe
		return s.roundTrips.Load() - before, n
	}
	reserve, rc := commits(func() { vaulttest.MustReserve(t, s, vaulttest.Charge(k.ID, "a", 100)) })
	settle, sc := commits(func() {
		vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: k.ID, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 100,
			Response: &vault.StoredResponse{Status: 200, Body: []byte(`{"id":"ch_1"}`)}})
	})
	t.Logf("round trips: Reserve %d, Settle %d", reserve, settle)
	assert.Equal(t, 1, rc, "Reserve waits on one commit")
	assert.Equal(t, 1, sc, "Settle waits on one commit")
	// BEGIN, the key locked and read, the record, the windows' counters and
	// the clock; the writes (record, hold index, counters, event) with COMMIT.
	assert.Equal(t, int64(2), reserve)
	// The same for Settle: BEGIN, the key's lock, the record, the counters,
	// the clock; the writes with COMMIT.
	assert.Equal(t, int64(2), settle)

	// Authenticate, on every request: the token with its key in one
	// statement, the upstream's version in another, outside a transaction
	// (no BEGIN, no COMMIT).
	auth, ac := commits(func() {
		got, err := s.Authenticate(context.Background(), tok)
		require.NoError(t, err)
		assert.Equal(t, k.ID, got.ID)
		assert.NotZero(t, got.UpstreamVersion)
	})
	assert.Equal(t, 0, ac, "Authenticate commits nothing")
	assert.Equal(t, int64(2), auth, "Authenticate's round trips")
	before := s.roundTrips.Load()
	_, err := s.Authenticate(context.Background(), "vk_"+strings.Repeat("a", 43))
	assert.ErrorIs(t, err, vault.ErrKeyInvalid)
	assert.Equal(t, int64(1), s.roundTrips.Load()-before, "an unknown token costs one statement")
}

// TestRestartOfPostgreSQL: while the server is down a request fails at once
// with ErrStorage — nothing is reserved, so nothing may be forwarded — and
// the store serves again once the server is back, on the same pool.
func TestRestartOfPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgtest.NewCluster(t)
	s := mustOpenURL(t, c.URL(t), vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: vaulttest.NewClock(vaulttest.T0).Now})
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := vaulttest.MustMint(t, s, "k", vaulttest.Policy(t, "100.00", "", ""), nil)
	vaulttest.MustCommit(t, s, k.ID, "before", 100)

	c.Stop(t)
	_, err := s.Reserve(ctx, vaulttest.Charge(k.ID, "down", 100))
	assert.ErrorIs(t, err, vault.ErrStorage)
	assert.ErrorIs(t, s.Ping(ctx), vault.ErrStorage)

	c.Start(t)
	require.Eventually(t, func() bool { return s.Ping(ctx) == nil }, 30*time.Second, 50*time.Millisecond)
	res := vaulttest.MustReserve(t, s, vaulttest.Charge(k.ID, "down", 100))
	assert.Equal(t, vault.ReserveClaimed, res.Outcome, "the failed attempt left nothing behind")
	require.NoError(t, s.CheckInvariant(ctx))
}

// openForBenchmark opens a store on a new database of the test binary's
// PostgreSQL (fsync on: commits wait for the disk).
func openForBenchmark(b *testing.B) vault.Store {
	return mustOpenURL(b, migrated.URL(b), vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: vaulttest.NewClock(vaulttest.T0).Now})
}

// BenchmarkReserve measures hold + claim (one transaction, one commit) at 1,
// 8 and 64 concurrent callers.
func BenchmarkReserve(b *testing.B) { vaulttest.BenchmarkReserve(b, openForBenchmark) }

// BenchmarkReserveManyKeys measures Reserve at 64 callers over 64 keys.
func BenchmarkReserveManyKeys(b *testing.B) { vaulttest.BenchmarkReserveManyKeys(b, openForBenchmark) }

// BenchmarkReserveSettle measures a whole metered request: Reserve then Settle.
func BenchmarkReserveSettle(b *testing.B) { vaulttest.BenchmarkReserveSettle(b, openForBenchmark) }

// BenchmarkSettle measures the settle alone.
func BenchmarkSettle(b *testing.B) { vaulttest.BenchmarkSettle(b, openForBenchmark) }

// BenchmarkReserveSettleUnderBudget compares 64 keys under one budget with 64
// independent keys.
func BenchmarkReserveSettleUnderBudget(b *testing.B) {
	vaulttest.BenchmarkReserveSettleUnderBudget(b, openForBenchmark)
}
