// Package pgtest gives tests a real PostgreSQL server, never a mock, and each
// test its own empty database.
//
// URL creates a database for the calling test and returns its connection URL;
// Pool returns a pool connected to one. The database is created from template0
// (UTF-8, C collation, whatever the server's defaults) under a unique name that
// starts with kbtest_ and the test's name, and dropped in the test's Cleanup,
// ending any session left open. The server is, in this order:
//
//   - the one KEYBRAKE_TEST_DATABASE_URL names, when it is set: a postgres://
//     URL of a role that may create databases (CREATEDB or a superuser). A URL
//     that does not connect, or a role that may not create databases, fails the
//     test with the reason: it is never skipped.
//   - a throwaway cluster the package starts itself, when the PostgreSQL server
//     programs are installed: the first initdb on PATH with postgres next to it,
//     else the newest of Debian's /usr/lib/postgresql/*/bin. One cluster serves
//     the whole test binary: it is started on first use and stopped by Main.
//   - none: the test is skipped with the reason, or fails when the environment
//     variable CI is "true".
//
// The cluster lives in a new directory (data/ and the unix socket) in memory,
// under /dev/shm, when that is a tmpfs with room and the binary runs no
// benchmark, else under os.TempDir(); it listens on 127.0.0.1 only, on a free
// port; its TCP connections need a random superuser password, which the URLs
// carry. It runs with fsync on (on disk, commits wait for it, as in
// production), 200 connections and 32MB of shared buffers, in UTC. As root,
// initdb and postgres run as the "postgres" user (they refuse root), which
// owns the cluster's directory. No server
// outlives its test binary: Main and the tests' cleanups stop it, and on Linux
// a parent-death signal stops it when the binary dies in any other way (panic,
// timeout, SIGKILL); a later run removes the directory such a death leaves.
// PostgreSQL 13 or newer is needed.
//
// A package whose tests use URL or Pool runs them through Main:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		pool := pgtest.Pool(t) // a new empty database, dropped after the test
//		...
//	}
//
// Tests that all start from the same prepared database — keybrake's schema,
// migrated — take copies of a Template instead, which prepares it once per
// test binary and copies it for each test (CREATE DATABASE … TEMPLATE):
//
//	var migrated = pgtest.NewTemplate("schema", migrate)
//
//	func TestOnTheSchema(t *testing.T) {
//		t.Parallel()
//		url := migrated.URL(t) // a copy of the migrated database, dropped after the test
//		...
//	}
//
// A test that stops or restarts the server takes a cluster of its own with
// NewCluster, so that the tests sharing the binary's cluster are not disturbed.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvDatabaseURL names the environment variable holding the URL of a server
// the tests use instead of starting their own.
const EnvDatabaseURL = "KEYBRAKE_TEST_DATABASE_URL"

// shared is the test binary's cluster, started by the first test that needs it.
var shared struct {
	mu      sync.Mutex
	main    bool // Main runs the tests, and will stop the cluster
	cluster *Cluster
	err     error          // why it could not start: every later test gets it too
	atEnd   []func() error // what Main does after the tests, before it stops the cluster
}

// AtEnd has Main run fn after the tests, before it stops the cluster; an error
// fn returns fails the test binary. A package uses it for what its tests
// share, such as one browser.
func AtEnd(fn func() error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.atEnd = append(shared.atEnd, fn)
}

// Main runs the tests of a package, then stops the cluster they shared, if one
// was started, and exits with the tests' status (1 when the cluster does not
// stop cleanly). Call it from TestMain.
func Main(m *testing.M) {
	shared.mu.Lock()
	shared.main = true
	shared.mu.Unlock()
	code := m.Run()
	shared.mu.Lock()
	c, ends := shared.cluster, shared.atEnd
	shared.cluster, shared.err, shared.atEnd = nil, errors.New("the tests have ended"), nil
	shared.mu.Unlock()
	for _, end := range ends {
		if err := end(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
			code = max(code, 1)
		}
	}
	admins.closeAll()
	if c != nil {
		if err := c.close(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
			code = max(code, 1)
		}
	}
	os.Exit(code)
}

// URL creates a new empty database for tb and returns its connection URL
// ("postgres://…@host:port/kbtest_…?…"). The database is dropped in tb.Cleanup.
func URL(tb testing.TB) string {
	tb.Helper()
	return newDatabase(tb, nil)
}

// newDatabase creates tb's database on the binary's server, from tpl's
// database there (nil: empty, from template0), and returns its URL.
func newDatabase(tb testing.TB, tpl *Template) string {
	tb.Helper()
	if admin := os.Getenv(EnvDatabaseURL); admin != "" {
		return externalURL(tb, admin, tpl)
	}
	c := sharedCluster(tb)
	source := ""
	if tpl != nil {
		source = tpl.on(tb, c.socketURL(), c.admin, c.tcpURL, "")
	}
	return c.database(tb, source)
}

// Pool returns a pool connected to a new empty database (see URL). The pool is
// closed, then the database dropped, in tb.Cleanup.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return NewPool(tb, URL(tb))
}

// NewPool returns a pool connected to url, pinged once and closed in
// tb.Cleanup: for tests that want several pools on one database, as several
// keybrake replicas have.
func NewPool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTime)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		tb.Fatalf("pgtest: pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		tb.Fatalf("pgtest: pool: %v", err)
	}
	return pool
}

// requireMain fails tb unless its tests run through Main.
func requireMain(tb testing.TB) {
	tb.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.main {
		tb.Fatalf("pgtest: the package's tests must run through pgtest.Main, which stops the PostgreSQL they share and drops their templates: func TestMain(m *testing.M) { pgtest.Main(m) }")
	}
}

func sharedCluster(tb testing.TB) *Cluster {
	tb.Helper()
	requireMain(tb)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster == nil && shared.err == nil {
		start := time.Now()
		shared.cluster, shared.err = startCluster()
		if shared.err == nil {
			tb.Logf("pgtest: %s on 127.0.0.1:%d started in %s for this test binary",
				shared.cluster.version, shared.cluster.port, time.Since(start).Round(time.Millisecond))
		}
	}
	if shared.err != nil {
		unavailable(tb, shared.err)
	}
	return shared.cluster
}

// unavailable ends tb for err: skipped when no server can be had on this
// machine (failed when CI is "true"), failed for anything else.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	if errors.Is(err, errUnavailable) && os.Getenv("CI") != "true" {
		tb.Skipf("pgtest: %v (set CI=true to make this fatal)", err)
	}
	tb.Fatalf("pgtest: %v", err)
}

// externalURL creates tb's database on the server admin names, from tpl's
// database there (nil: template0).
func externalURL(tb testing.TB, admin string, tpl *Template) string {
	tb.Helper()
	u, err := url.Parse(admin)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		tb.Fatalf("pgtest: %s must be a postgres:// URL", EnvDatabaseURL)
	}
	exec := func(sql string) error { return admins.exec(admin, sql) }
	urlOf := func(name string) string {
		v := *u
		v.Path, v.RawPath = "/"+name, ""
		return v.String()
	}
	source := ""
	if tpl != nil {
		source = tpl.on(tb, admin, exec, urlOf, fmt.Sprintf("%s (%s)", EnvDatabaseURL, u.Redacted()))
	}
	name := databaseName(tb)
	if err := exec(createFrom(name, source, false)); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
			tb.Fatalf("pgtest: %s (%s): the role may not create databases: grant it CREATEDB (ALTER ROLE … CREATEDB), or unset %s to let the tests start their own PostgreSQL: %v",
				EnvDatabaseURL, u.Redacted(), EnvDatabaseURL, err)
		}
		tb.Fatalf("pgtest: %s (%s): create database %s: %v", EnvDatabaseURL, u.Redacted(), name, err)
	}
	tb.Cleanup(func() {
		if err := exec(dropDatabase(name)); err != nil {
			tb.Errorf("pgtest: %s (%s): drop database %s: %v", EnvDatabaseURL, u.Redacted(), name, err)
		}
	})
	return urlOf(name)
}
