package pgtest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Template is a database prepared once per test binary and server — by a
// schema's migrations, say — that each test asking for one gets a copy of
// (CREATE DATABASE … TEMPLATE): a copy costs what an empty database costs,
// where preparing every test's database again would cost the preparation's
// transactions, each waiting on the disk, in every test. Declare one per
// preparation, as a package variable:
//
//	var migrated = pgtest.NewTemplate("schema", postgres.Migrate)
//
//	func TestSomething(t *testing.T) {
//		url := migrated.URL(t) // a copy of the migrated database, dropped after the test
//		...
//	}
//
// The template's database is prepared by the first test that asks for it, on
// the server URL uses (KEYBRAKE_TEST_DATABASE_URL's or the binary's cluster);
// a preparation that fails fails that test and every later one that asks,
// with the reason. Once prepared, the database accepts no connections, so
// that no test can change what the next one gets. On a server the
// environment variable names, Main drops it after the tests (a binary that
// dies first leaves it, named kbtpl_…, as it leaves its tests' kbtest_…
// databases); the binary's cluster goes away whole. The tests using it must
// run through Main. Its methods are safe for concurrent use.
type Template struct {
	name    string
	prepare func(ctx context.Context, url string) error

	mu      sync.Mutex
	servers map[string]*templateDB // by the URL the server is administered through
}

// templateDB is a Template's database on one server.
type templateDB struct {
	ready chan struct{} // closed once name or err is set
	name  string
	err   error
}

// NewTemplate returns a template whose database prepare brings from empty to
// what every copy starts with; prepare is given the database's URL and must
// close every connection it opened before it returns. name says what the
// template holds, in messages and in the database's name.
func NewTemplate(name string, prepare func(ctx context.Context, url string) error) *Template {
	return &Template{name: name, prepare: prepare, servers: map[string]*templateDB{}}
}

// URL creates a copy of the template's database for tb and returns its
// connection URL; like pgtest.URL's database, it is dropped in tb.Cleanup.
func (t *Template) URL(tb testing.TB) string {
	tb.Helper()
	requireMain(tb)
	return newDatabase(tb, t)
}

// Pool returns a pool connected to a new copy of the template's database
// (see URL); the pool is closed, then the database dropped, in tb.Cleanup.
func (t *Template) Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return NewPool(tb, t.URL(tb))
}

// on returns the name of t's database on the server administered through
// admin, preparing it first if no test has: exec runs a statement there as a
// role that may create databases, urlOf gives a database's URL. external
// names a server that outlives the binary, in messages, ("" for the binary's
// cluster): Main drops the template's database there.
func (t *Template) on(tb testing.TB, admin string, exec func(sql string) error, urlOf func(database string) string, external string) string {
	tb.Helper()
	t.mu.Lock()
	db, ok := t.servers[admin]
	if !ok {
		db = &templateDB{ready: make(chan struct{})}
		t.servers[admin] = db
	}
	t.mu.Unlock()
	if !ok {
		db.name, db.err = t.build(exec, urlOf, external)
		close(db.ready)
		if db.err == nil {
			tb.Logf("pgtest: template %q prepared as database %s for this test binary", t.name, db.name)
		}
	}
	<-db.ready
	if db.err != nil {
		where := external
		if where == "" {
			where = "the test binary's cluster"
		}
		tb.Fatalf("pgtest: template %q on %s: %v", t.name, where, db.err)
	}
	return db.name
}

// build creates and prepares t's database, then closes it to connections.
func (t *Template) build(exec func(sql string) error, urlOf func(database string) string, external string) (string, error) {
	name := templateName(t.name)
	if err := exec(createFrom(name, "", false)); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	if external != "" {
		AtEnd(func() error {
			if err := exec(dropDatabase(name)); err != nil {
				return fmt.Errorf("%s: drop template database %s: %w", external, name, err)
			}
			return nil
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), initdbTime)
	defer cancel()
	if err := t.prepare(ctx, urlOf(name)); err != nil {
		return "", fmt.Errorf("prepare database %s: %w", name, err)
	}
	// A copy needs no session on its template; a session would make the
	// copies fail ("being accessed by other users") or differ.
	if err := exec("ALTER DATABASE " + pgx.Identifier{name}.Sanitize() + " ALLOW_CONNECTIONS false"); err != nil {
		return "", fmt.Errorf("close database %s to connections: %w", name, err)
	}
	return name, nil
}

// templateName is unique on the server, like databaseName, and says which
// template it is.
func templateName(name string) string {
	return "kbtpl_" + identifierPart(name, 30) + "_" + randomHex(4)
}
