package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keybrake/keybrake/vault"
)

// The schema is versioned by a small table of its own rather than a migration
// library: docs/decisions/0018-postgres-migrations.md says why. Each file of
// migrations/ is one version, NNNN_name.sql, applied in its own transaction
// with its row in keybrake_schema_migrations, while the migrating process
// holds an advisory lock, so that replicas starting together apply each
// version once.

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrateLock is the advisory lock key that serializes migrations
// ("keybrake" in ASCII, as a number).
const migrateLock int64 = 0x6b65796272616b65

// migration is one version of the schema.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in version order; versions
// must run 1, 2, 3… without a gap.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration file %s is not NNNN_name.sql", e.Name())
		}
		body, err := migrationFiles.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: name, sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration versions must run 1, 2, 3…: %d is at position %d", m.version, i+1)
		}
	}
	return out, nil
}

// migrate brings the database's schema to the newest embedded version. It
// refuses a database whose schema is newer than this keybrake knows
// (ErrSchemaVersion): an older binary must not write to it.
func migrate(ctx context.Context, pool *pgxpool.Pool) (applied []int, err error) {
	all, err := migrations()
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrateLock); err != nil {
		return nil, fmt.Errorf("take the migration lock: %w", err)
	}
	defer func() {
		// A failed unlock leaves the lock with the session; closing the
		// connection releases it.
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrateLock); uerr != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS keybrake_schema_migrations (
		version integer PRIMARY KEY,
		name text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("create the migrations table: %w", err)
	}
	var current int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM keybrake_schema_migrations").Scan(&current); err != nil {
		return nil, fmt.Errorf("read the schema version: %w", err)
	}
	if current > len(all) {
		return nil, fmt.Errorf("database schema version %d is newer than this keybrake's %d: %w", current, len(all), vault.ErrSchemaVersion)
	}
	for _, m := range all[current:] {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO keybrake_schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("apply migration %d (%s): %w", m.version, m.name, err)
		}
		applied = append(applied, m.version)
	}
	return applied, nil
}

// Migrate brings the schema of the database at url to this keybrake's version,
// as Open and Import do first, and returns the versions it applied: no store
// is opened, so no master key is needed or checked, and no record is written.
// Tests use it to prepare once the database they copy for each test.
//
// Errors: ErrInvalid (a malformed URL), ErrSchemaVersion (the database was
// migrated by a newer keybrake), ErrStorage (the database cannot be reached,
// or fails).
func Migrate(ctx context.Context, url string) ([]int, error) {
	cfg, err := parseURL(url)
	if err != nil {
		return nil, fmt.Errorf("migrate PostgreSQL: %w", err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("migrate PostgreSQL: %w", translate(err))
	}
	defer pool.Close()
	applied, err := migrate(ctx, pool)
	if err != nil {
		return applied, fmt.Errorf("migrate PostgreSQL: %w", translate(err))
	}
	return applied, nil
}

// SchemaVersion is the newest schema version this keybrake knows.
func SchemaVersion() int {
	all, err := migrations()
	if err != nil {
		panic(errors.Join(errors.New("postgres: the embedded migrations are broken"), err))
	}
	return len(all)
}
