package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
	"github.com/keybrake/keybrake/vault/postgres"
)

// MigrateConfig is the configuration of `keybrake migrate-store`.
type MigrateConfig struct {
	// From is the data directory of the bbolt vault to copy.
	From string
	// To is the URL of the empty PostgreSQL database to copy it into.
	To string
	// OpenTimeout is how long the copy waits for the bbolt file's lock.
	OpenTimeout time.Duration
	// Unmark, instead of copying, removes the mark a copy left in the bbolt
	// vault, so that serve serves it again (a return to bbolt).
	Unmark bool
}

// DefaultMigrateConfig returns migrate-store's defaults.
func DefaultMigrateConfig() MigrateConfig {
	return MigrateConfig{From: DefaultConfig().DataDir, OpenTimeout: 2 * time.Second}
}

// Validate returns every problem with the configuration at once.
func (c MigrateConfig) Validate() error {
	var errs []error
	if strings.TrimSpace(c.From) == "" {
		errs = append(errs, errors.New("from: must not be empty"))
	}
	if c.Unmark {
		// --to is not needed.
	} else if c.To == "" {
		errs = append(errs, fmt.Errorf("to: required (or %s): the postgres:// URL of an empty database", envName("database-url")))
	} else if err := validateDatabaseURL(c.To); err != nil {
		errs = append(errs, fmt.Errorf("to: %w", err))
	}
	if c.OpenTimeout <= 0 {
		errs = append(errs, fmt.Errorf("open-timeout: must be positive, got %s", c.OpenTimeout))
	}
	return errors.Join(errs...)
}

// parseMigrate reads migrate-store's flags; --from and --to fall back to
// KEYBRAKE_DATA_DIR and KEYBRAKE_DATABASE_URL, as serve's --data-dir and
// --database-url do.
func (m *Main) parseMigrate(args []string) error {
	fs := m.flagSet(cmdMigrate, "keybrake migrate-store --from DATA_DIR --to postgres://…\n\n"+
		"Copies the bbolt vault in DATA_DIR — keys, counters, holds, idempotency records, claims,\n"+
		"money objects, the ledger and the audit log — into an empty PostgreSQL database, in one\n"+
		"transaction, and checks the copy before it commits. The server must be stopped (it holds\n"+
		"the vault's file lock). The master key comes from KEYBRAKE_MASTER_KEY, else DATA_DIR's\n"+
		"master.key; every replica of the PostgreSQL store needs it. Prefer KEYBRAKE_DATABASE_URL\n"+
		"to --to: other local users can read a flag, and the URL may carry a password.")
	c := &m.Migrate
	fs.StringVar(&c.From, "from", c.From, "data directory holding the bbolt vault (keybrake.db)")
	fs.StringVar(&c.To, "to", c.To, "postgres:// URL of the empty database to copy into (default: "+envName("database-url")+")")
	fs.DurationVar(&c.OpenTimeout, "open-timeout", c.OpenTimeout, "how long to wait for the vault's file lock")
	fs.BoolVar(&c.Unmark, "unmark", c.Unmark, "remove the mark a copy left in the bbolt vault, so that serve serves it again "+
		"(only to return to bbolt, before any replica serves the PostgreSQL store)")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	envs := map[string]string{"from": envName("data-dir"), "to": envName("database-url")}
	if err := applyEnv(fs, m.Getenv, envs); err != nil {
		return fmt.Errorf("migrate-store: %w", err)
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("migrate-store: %w", err)
	}
	return nil
}

// runMigrate copies the bbolt vault into PostgreSQL and says what it copied
// and what to do next. It fails closed: the vault is marked as migrated,
// inside the file, before the copy commits (serve refuses a marked vault), and
// retired by a rename after; a rename that fails is an error, since the file
// left in place must not be served again.
func (m *Main) runMigrate(ctx context.Context) error {
	c := m.Migrate
	dbPath := filepath.Join(c.From, databaseFile)
	if c.Unmark {
		return m.unmarkMigrated(ctx, dbPath)
	}
	target := redactedDatabaseURL(c.To)
	if _, err := os.Stat(dbPath); err != nil {
		return fmt.Errorf("migrate-store: no vault to copy: %w", err)
	}
	masterKey, masterSrc, err := loadSecret(masterKeySpec, m.Getenv, c.From, nil)
	if err != nil {
		return fmt.Errorf("migrate-store: master key: %w", err)
	}
	// Opening the vault takes its file lock, which keeps a server out until
	// the copy is done, and turns the requests a stopped server left in
	// flight into outcome-unknown holds, as its next start would.
	src, err := bolt.Open(dbPath, bolt.Options{MasterKey: masterKey, OpenTimeout: c.OpenTimeout, Logger: newStderrLogger(m),
		AllowMigrated: true, CheckPages: true})
	switch {
	case errors.Is(err, vault.ErrLocked):
		return fmt.Errorf("migrate-store: another keybrake process holds %s (its file lock): stop serve first, "+
			"so that nothing changes the vault after it is copied: %w", dbPath, err)
	case err != nil:
		return fmt.Errorf("migrate-store: %w", openStoreError(dbPath, masterSrc, err))
	}
	defer src.Close()
	marked := false
	stats, err := postgres.Import(ctx, c.To, src, postgres.ImportOptions{MasterKey: masterKey, Logger: newStderrLogger(m),
		BeforeCommit: func(ctx context.Context) error {
			if err := src.MarkMigrated(ctx, target, time.Now()); err != nil {
				return fmt.Errorf("mark %s as migrated: %w", dbPath, err)
			}
			marked = true
			return nil
		}})
	if err != nil && marked {
		// Only the commit can have failed, and a commit that failed may
		// still have happened: the mark stays.
		return fmt.Errorf("migrate-store: %s to %s: the copy's commit failed, and it may have committed: %s stays marked as migrated, so serve refuses it. "+
			"If the PostgreSQL database is still empty, run keybrake migrate-store again; to return to bbolt instead, keybrake migrate-store --from %s --unmark: %w",
			dbPath, target, dbPath, c.From, err)
	}
	if err != nil {
		return fmt.Errorf("migrate-store: %s to %s: nothing was copied: %w", dbPath, target, err)
	}
	// The bbolt vault is renamed while its lock is held, so that no serve on
	// the data directory spends from it again beside the replicas: one started
	// by mistake finds no vault, makes an empty one and knows no vault key.
	retired := dbPath + ".migrated-" + time.Now().UTC().Format("20060102T150405Z")
	renameErr := os.Rename(dbPath, retired)
	if renameErr == nil {
		renameErr = syncDir(c.From)
	}
	if err := src.Close(); err != nil {
		return fmt.Errorf("migrate-store: close %s: %w", dbPath, err)
	}

	e, h := stats.Entries, stats.Holds
	fmt.Fprintf(m.Stdout, "copied %s into %s:\n", dbPath, target)
	fmt.Fprintf(m.Stdout, "  %d vault keys, %d upstreams, %d window counters\n", e["keys"], e["upstreams"], e["counters"])
	fmt.Fprintf(m.Stdout, "  %d idempotency records, with %d holds: %d held, %d outcome unknown, %d committed, %d released\n",
		e["idem"], e["hold_index"], h[vault.HoldHeld], h[vault.HoldUnknown], h[vault.HoldCommitted], h[vault.HoldReleased])
	fmt.Fprintf(m.Stdout, "  %d money objects, %d claims, %d ledger events, %d audit entries\n",
		e["objects"], e["claims"], e["events"], e["audit"])
	key := envMasterKey
	if masterSrc != sourceEnv {
		key = fmt.Sprintf("%s (the key in %s)", envMasterKey, filepath.Join(c.From, masterKeyFile))
	}
	fmt.Fprintf(m.Stdout, "Start every replica with --database-url (or %s) and %s.\n", envName("database-url"), key)
	if renameErr != nil {
		return fmt.Errorf("migrate-store: the copy is committed, but %s could not be renamed to %s (%w): it is marked as migrated, so serve refuses it; "+
			"move it out of %s by hand, and never serve it again, or its keys would spend a second time beside the replicas", dbPath, retired, renameErr, c.From)
	}
	_, err = fmt.Fprintf(m.Stdout, "%s is now %s, marked as migrated, so that no serve on %s spends from it again "+
		"(to return to bbolt, before any replica serves the PostgreSQL store: rename it back and run keybrake migrate-store --from %s --unmark).\n",
		dbPath, retired, c.From, c.From)
	return err
}

// unmarkMigrated removes migrate-store's mark from the vault at dbPath.
func (m *Main) unmarkMigrated(ctx context.Context, dbPath string) error {
	c := m.Migrate
	if _, err := os.Stat(dbPath); err != nil {
		return fmt.Errorf("migrate-store: no vault to unmark: %w", err)
	}
	masterKey, masterSrc, err := loadSecret(masterKeySpec, m.Getenv, c.From, nil)
	if err != nil {
		return fmt.Errorf("migrate-store: master key: %w", err)
	}
	src, err := bolt.Open(dbPath, bolt.Options{MasterKey: masterKey, OpenTimeout: c.OpenTimeout, Logger: newStderrLogger(m), AllowMigrated: true})
	if err != nil {
		return fmt.Errorf("migrate-store: %w", openStoreError(dbPath, masterSrc, err))
	}
	err = src.Unmark(ctx)
	if cerr := src.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("migrate-store: unmark %s: %w", dbPath, err)
	}
	_, err = fmt.Fprintf(m.Stdout, "%s is no longer marked as migrated: serve serves it again. Do not serve the PostgreSQL copy as well.\n", dbPath)
	return err
}
