package pgtest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// tagged is a template whose preparation writes one row; taggedRuns counts
// the preparations.
var (
	taggedRuns atomic.Int32
	tagged     = pgtest.NewTemplate("tagged", func(ctx context.Context, url string) error {
		taggedRuns.Add(1)
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "CREATE TABLE prepared (n int); INSERT INTO prepared VALUES (1)")
		return err
	})
	broken = pgtest.NewTemplate("broken", func(context.Context, string) error {
		return errors.New("failing on purpose")
	})
)

func TestEachTestGetsItsOwnEmptyDatabase(t *testing.T) {
	t.Parallel()
	var urls, names [2]string
	for i := range urls {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			urls[i] = pgtest.URL(t)
			pool := pgtest.NewPool(t, urls[i])
			assert.Zero(t, userTables(t, pool), "a new database has no tables")
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT current_database()").Scan(&names[i]))
			_, err := pool.Exec(t.Context(), "CREATE TABLE left_behind (n int); INSERT INTO left_behind VALUES (1)")
			require.NoError(t, err)
		})
	}
	assert.NotEqual(t, names[0], names[1])
	assertDropped(t, urls[:], names[:])
}

// TestTemplateCopiesItsPreparedDatabase: each test gets its own copy of the
// database the template prepared once; what one writes stays in its copy;
// the template accepts no connections; the copies are dropped after their
// tests.
func TestTemplateCopiesItsPreparedDatabase(t *testing.T) {
	t.Parallel()
	var urls, names [2]string
	for i := range urls {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			urls[i] = tagged.URL(t)
			pool := pgtest.NewPool(t, urls[i])
			var rows int
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT current_database(), (SELECT count(*) FROM prepared)").Scan(&names[i], &rows))
			assert.Equal(t, 1, rows, "the copy holds what the preparation wrote, and not what the other test wrote")
			assert.True(t, strings.HasPrefix(names[i], "kbtest_testtemplatecopiesitsprepar"), names[i])
			_, err := pool.Exec(t.Context(), "INSERT INTO prepared VALUES (2)")
			require.NoError(t, err)

			var template string
			var allowed bool
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT datname, datallowconn FROM pg_database WHERE datname LIKE 'kbtpl_tagged_%'").Scan(&template, &allowed))
			assert.False(t, allowed, "the template %s accepts connections", template)
			u, err := url.Parse(urls[i])
			require.NoError(t, err)
			u.Path = "/" + template
			assert.ErrorContains(t, connect(t, u.String()), "not currently accepting connections")
		})
	}
	assert.NotEqual(t, names[0], names[1])
	assert.EqualValues(t, 1, taggedRuns.Load(), "prepared once for the binary")
	assertDropped(t, urls[:], names[:])
}

// assertDropped asserts that the databases at urls, named names, are gone.
func assertDropped(t *testing.T, urls, names []string) {
	t.Helper()
	for i, u := range urls {
		err := connect(t, u)
		var pgErr *pgconn.PgError
		if assert.ErrorAs(t, err, &pgErr, "database %s outlived its test", names[i]) {
			assert.Equal(t, "3D000", pgErr.Code, "invalid_catalog_name: %v", err)
		}
	}
}

func TestPoolIsReady(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT 40 + 2").Scan(&n))
	assert.Equal(t, 42, n)
	var db string
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT current_database()").Scan(&db))
	assert.True(t, strings.HasPrefix(db, "kbtest_testpoolisready_"), db)
}

func TestRestartKeepsDataAndURL(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t)
	u := c.URL(t)
	pool := pgtest.NewPool(t, u)
	ctx := t.Context()
	_, err := pool.Exec(ctx, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
	require.NoError(t, err)
	pid, port := c.PID(), c.Port()
	require.NotZero(t, pid)

	c.Restart(t)
	assert.NotEqual(t, pid, c.PID(), "a new postmaster")
	assert.Equal(t, port, c.Port())
	assert.Equal(t, []int{1}, rows(t, u), "the same URL, the same data")
	// The pool's connections died with the server; it recovers by itself.
	execEventually(t, pool, "INSERT INTO kept VALUES (2)")

	c.Stop(t)
	assert.Zero(t, c.PID())
	assert.Error(t, connect(t, u), "a stopped server accepts connections")
	c.Stop(t) // stopping twice does nothing
	c.Start(t)
	assert.Equal(t, []int{1, 2}, rows(t, u))

	// Committed rows survive a crash (immediate shutdown): the start replays the WAL.
	execEventually(t, pool, "INSERT INTO kept VALUES (3)")
	c.Crash(t)
	assert.Error(t, connect(t, u))
	c.Start(t)
	c.Start(t) // starting twice does nothing
	assert.Equal(t, []int{1, 2, 3}, rows(t, u))
}

func TestClusterListensOnLoopbackOnly(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t)
	u := c.URL(t)
	pool := pgtest.NewPool(t, u)

	assert.Equal(t, "127.0.0.1", setting(t, pool, "listen_addresses"))
	socketDir := strings.Trim(setting(t, pool, "unix_socket_directories"), `"`)
	assert.Equal(t, filepath.Join(socketDir, "data"), setting(t, pool, "data_directory"), "the socket is in the cluster's directory")
	assert.True(t, strings.HasPrefix(socketDir, os.TempDir()) || strings.HasPrefix(socketDir, "/dev/shm/"),
		"socket in %s: a temporary directory, on disk or in memory", socketDir)
	assert.Equal(t, "on", setting(t, pool, "fsync"))
	assert.Equal(t, "200", setting(t, pool, "max_connections"))
	assert.Equal(t, "UTC", setting(t, pool, "TimeZone"))

	parsed, err := url.Parse(u)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", parsed.Hostname())
	assert.Equal(t, fmt.Sprint(c.Port()), parsed.Port())

	// Nothing answers on the machine's other addresses.
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		ip, _, err := net.ParseCIDR(a.String())
		require.NoError(t, err)
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() {
			continue
		}
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip.String(), fmt.Sprint(c.Port())), 2*time.Second)
		if err == nil {
			conn.Close()
		}
		assert.Error(t, err, "PostgreSQL answers on %s", ip)
	}

	// TCP wants the password: another account of the machine cannot get in.
	parsed.User = url.User("postgres")
	assert.Error(t, connect(t, parsed.String()), "connected without the password")

	// The admin URL reaches the server as its superuser.
	var super bool
	admin := pgtest.NewPool(t, c.AdminURL())
	require.NoError(t, admin.QueryRow(t.Context(), "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super))
	assert.True(t, super)
	var version string
	require.NoError(t, admin.QueryRow(t.Context(), "SELECT split_part(version(), ' ', 2)").Scan(&version))
	assert.True(t, strings.HasPrefix(c.Version(), "PostgreSQL "+version), "%s is not %s", c.Version(), version)
}

// execEventually runs sql through a pool that may still hold connections to a
// server that has since stopped: each failed try discards one.
func execEventually(tb testing.TB, pool *pgxpool.Pool, sql string) {
	tb.Helper()
	var err error
	for range 10 {
		if _, err = pool.Exec(context.Background(), sql); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("the pool does not recover after a restart: %v", err)
}

// userTables counts the tables outside PostgreSQL's own schemas.
func userTables(tb testing.TB, pool *pgxpool.Pool) int {
	tb.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
		WHERE c.relkind = 'r' AND s.nspname NOT IN ('pg_catalog', 'information_schema')`).Scan(&n)
	require.NoError(tb, err)
	return n
}

func setting(tb testing.TB, pool *pgxpool.Pool, name string) string {
	tb.Helper()
	var v string
	require.NoError(tb, pool.QueryRow(context.Background(), "SELECT current_setting($1)", name).Scan(&v))
	return v
}

// connect opens and closes one connection to u.
func connect(tb testing.TB, u string) error {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// rows reads table kept through a new connection to u.
func rows(tb testing.TB, u string) []int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	require.NoError(tb, err)
	defer conn.Close(ctx)
	r, err := conn.Query(ctx, "SELECT n FROM kept ORDER BY n")
	require.NoError(tb, err)
	ns, err := pgx.CollectRows(r, pgx.RowTo[int])
	require.NoError(tb, err)
	return ns
}
