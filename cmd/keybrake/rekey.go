package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// envNewMasterKey backs rekey's --new-master-key (safer than the flag, which
// other local users can read in the process list).
const envNewMasterKey = "KEYBRAKE_NEW_MASTER_KEY"

// RekeyConfig is the configuration of `keybrake rekey`.
type RekeyConfig struct {
	// DataDir holds keybrake.db (and, in development, master.key).
	DataDir string
	// NewMasterKey is the new key, base64 of 32 bytes.
	NewMasterKey string
	// OpenTimeout is how long rekey waits for the database's file lock.
	OpenTimeout time.Duration
	// DatabaseURL, when set, names a PostgreSQL store, which rekey refuses for
	// now (docs/decisions/0019-rekey-is-bbolt-only.md).
	DatabaseURL string
}

// DefaultRekeyConfig returns rekey's defaults.
func DefaultRekeyConfig() RekeyConfig {
	return RekeyConfig{DataDir: DefaultConfig().DataDir, OpenTimeout: DefaultConfig().OpenTimeout}
}

// Validate returns every problem with the configuration at once.
func (c RekeyConfig) Validate() error {
	if c.DatabaseURL != "" {
		return errors.New("database-url: keybrake rekey re-seals a bbolt data directory; it cannot rekey a PostgreSQL store yet")
	}
	var errs []error
	if c.NewMasterKey == "" {
		errs = append(errs, fmt.Errorf("new-master-key: required (or %s); make one with: openssl rand -base64 32", envNewMasterKey))
	} else if _, err := decodeMasterKey(c.NewMasterKey); err != nil {
		errs = append(errs, fmt.Errorf("new-master-key: %w", err))
	}
	if c.OpenTimeout <= 0 {
		errs = append(errs, fmt.Errorf("open-timeout: must be positive, got %s", c.OpenTimeout))
	}
	return errors.Join(errs...)
}

// parseRekey reads rekey's flags; --data-dir and --new-master-key fall back to
// KEYBRAKE_DATA_DIR and KEYBRAKE_NEW_MASTER_KEY.
func (m *Main) parseRekey(args []string) error {
	fs := m.flagSet(cmdRekey, "keybrake rekey --new-master-key KEY [--data-dir DIR]\n\n"+
		"Seals every sealed value of the database (upstream secrets, stored responses, claim\n"+
		"results) again under a new master key, while the server is stopped. The current key\n"+
		"comes from KEYBRAKE_MASTER_KEY, else the data directory's master.key. The database is\n"+
		"replaced atomically: a failure or a crash leaves it as it was, under the old key.\n"+
		"When the current key came from master.key, the new key is written there too;\n"+
		"otherwise set KEYBRAKE_MASTER_KEY to the new key before the next start.\n"+
		"Prefer "+envNewMasterKey+" to the flag: other local users can read a flag.")
	c := &m.Rekey
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "data directory holding keybrake.db")
	fs.StringVar(&c.NewMasterKey, "new-master-key", c.NewMasterKey, "the new master key, base64 of 32 bytes (default: "+envNewMasterKey+")")
	fs.DurationVar(&c.OpenTimeout, "open-timeout", c.OpenTimeout, "how long to wait for the database lock")
	fs.StringVar(&c.DatabaseURL, "database-url", c.DatabaseURL, "a PostgreSQL store's URL: refused, rekey works on bbolt only for now")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	envs := map[string]string{"data-dir": envName("data-dir"), "new-master-key": envNewMasterKey,
		"database-url": envName("database-url")}
	if err := applyEnv(fs, m.Getenv, envs); err != nil {
		return fmt.Errorf("rekey: %w", err)
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("rekey: %w", err)
	}
	return nil
}

// runRekey re-seals the database and, when the current key lives in master.key,
// replaces that file with the new key. Run again after a crash, it finishes the
// job: a database already sealed under the new key only gets its master.key.
func (m *Main) runRekey(ctx context.Context) error {
	c := m.Rekey
	dbPath := filepath.Join(c.DataDir, databaseFile)
	if _, err := os.Stat(dbPath); err != nil {
		return fmt.Errorf("rekey: database: %w", err)
	}
	oldKey, source, err := loadSecret(masterKeySpec, m.Getenv, c.DataDir, nil)
	if err != nil {
		return fmt.Errorf("rekey: current master key: %w", err)
	}
	newKey, err := decodeMasterKey(c.NewMasterKey)
	if err != nil {
		return fmt.Errorf("rekey: new master key: %w", err)
	}

	stats, err := bolt.Rekey(ctx, dbPath, oldKey, newKey, bolt.RekeyOptions{OpenTimeout: c.OpenTimeout})
	switch {
	case errors.Is(err, vault.ErrLocked):
		return fmt.Errorf("rekey: another keybrake process holds %s: stop the server first", dbPath)
	case errors.Is(err, vault.ErrSealed) && sealedUnder(dbPath, newKey, c.OpenTimeout):
		// A rekey that died after replacing the database, before updating
		// master.key: finish it.
		fmt.Fprintf(m.Stdout, "%s is already sealed under the new master key (an interrupted rekey); nothing to re-seal\n", dbPath)
	case errors.Is(err, vault.ErrSealed):
		return fmt.Errorf("rekey: the master key from the %s does not open %s: %w", source, dbPath, err)
	case err != nil:
		return fmt.Errorf("rekey: %w", err)
	default:
		fmt.Fprintf(m.Stdout, "re-sealed %d upstream secrets, %d stored responses and %d claim results of %s under the new master key\n",
			stats.Upstreams, stats.Responses, stats.ClaimResults, dbPath)
	}

	if source == sourceEnv {
		_, err := fmt.Fprintf(m.Stdout, "set %s to the new master key before the next start: the old key no longer opens the database\n", envMasterKey)
		return err
	}
	keyPath := filepath.Join(c.DataDir, masterKeyFile)
	text := strings.TrimSpace(c.NewMasterKey) + "\n"
	if _, err := writeFileAtomic(keyPath, func(w io.Writer) (int64, error) {
		n, err := io.WriteString(w, text)
		return int64(n), err
	}); err != nil {
		return fmt.Errorf("rekey: the database is sealed under the new key, but %s was not updated (run the same rekey again, or write the new key there): %w", keyPath, err)
	}
	_, err = fmt.Fprintf(m.Stdout, "wrote the new master key to %s\n", keyPath)
	return err
}

// sealedUnder reports whether key opens the database at path.
func sealedUnder(path string, key []byte, timeout time.Duration) bool {
	s, err := bolt.Open(path, bolt.Options{MasterKey: key, OpenTimeout: timeout, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return false
	}
	_ = s.Close()
	return true
}
