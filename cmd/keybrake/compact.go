package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"time"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// CompactConfig is the configuration of `keybrake compact`.
type CompactConfig struct {
	// DataDir holds keybrake.db for the offline compaction.
	DataDir string
	// AdminURL, when set, compacts a running server's store through POST
	// /api/v1/compact instead.
	AdminURL string
	// Token authenticates against AdminURL (--token, else KEYBRAKE_ADMIN_TOKEN,
	// else minted from the local JWT secret).
	Token string
	// OpenTimeout is how long the offline compaction waits for the file lock.
	OpenTimeout time.Duration
	// DatabaseURL, when set, names a PostgreSQL store, which compact refuses:
	// its autovacuum reclaims space.
	DatabaseURL string
	// Timeout bounds the online compaction.
	Timeout time.Duration
}

// DefaultCompactConfig returns compact's defaults.
func DefaultCompactConfig() CompactConfig {
	return CompactConfig{DataDir: DefaultConfig().DataDir, OpenTimeout: 2 * time.Second, Timeout: time.Hour}
}

// Validate returns every problem with the configuration at once.
func (c CompactConfig) Validate() error {
	if c.DatabaseURL != "" {
		return errors.New("database-url: keybrake compact rewrites a bbolt data directory; PostgreSQL's autovacuum reclaims the space of a PostgreSQL store (VACUUM FULL gives it back to the file system)")
	}
	var errs []error
	if c.AdminURL != "" {
		if err := validateBaseURL(c.AdminURL); err != nil {
			errs = append(errs, fmt.Errorf("admin-url: %w", err))
		}
	}
	if c.OpenTimeout <= 0 {
		errs = append(errs, fmt.Errorf("open-timeout: must be positive, got %s", c.OpenTimeout))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout: must be positive, got %s", c.Timeout))
	}
	return errors.Join(errs...)
}

// parseCompact reads compact's flags; --data-dir, --admin-url and --token fall
// back to KEYBRAKE_DATA_DIR, KEYBRAKE_ADMIN_URL and KEYBRAKE_ADMIN_TOKEN.
func (m *Main) parseCompact(args []string) error {
	fs := m.flagSet(cmdCompact, "keybrake compact [--data-dir DIR] [--admin-url URL [--token JWT]]\n\n"+
		"Gives the space the reaper freed back to the file system: the database is rewritten\n"+
		"without its free pages and replaced atomically (the old file or the complete copy,\n"+
		"never a mix). Without --admin-url it compacts the data directory's database while the\n"+
		"server is stopped; with --admin-url a running server compacts its own, and every\n"+
		"request waits while it copies (seconds per gigabyte).")
	c := &m.Compact
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "data directory holding keybrake.db")
	fs.StringVar(&c.AdminURL, "admin-url", c.AdminURL, "compact a running server's store at this admin URL (e.g. http://127.0.0.1:8081)")
	fs.StringVar(&c.Token, "token", c.Token, "admin JWT for --admin-url (default: "+envAdminToken+", else minted from the local JWT secret)")
	fs.DurationVar(&c.OpenTimeout, "open-timeout", c.OpenTimeout, "how long to wait for the database lock (offline)")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "time limit of the online compaction")
	fs.StringVar(&c.DatabaseURL, "database-url", c.DatabaseURL, "a PostgreSQL store's URL: refused, autovacuum reclaims its space")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	envs := map[string]string{"data-dir": envName("data-dir"), "admin-url": envName("admin-url"), "token": envAdminToken,
		"database-url": envName("database-url")}
	if err := applyEnv(fs, m.Getenv, envs); err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	return nil
}

// runCompact compacts and reports the sizes on Stdout.
func (m *Main) runCompact(ctx context.Context) error {
	c := m.Compact
	var (
		res vault.CompactResult
		err error
	)
	if c.AdminURL != "" {
		res, err = m.compactOnline(ctx)
	} else {
		dbPath := filepath.Join(c.DataDir, databaseFile)
		res, err = bolt.Compact(ctx, dbPath, c.OpenTimeout)
		if errors.Is(err, vault.ErrLocked) {
			err = fmt.Errorf("%w (is keybrake serve running on it? then use --admin-url)", err)
		}
	}
	if err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	_, err = fmt.Fprintf(m.Stdout, "compacted: %d bytes before, %d after\n", res.Before, res.After)
	return err
}

// compactOnline asks a running server to compact its store.
func (m *Main) compactOnline(ctx context.Context) (vault.CompactResult, error) {
	c := m.Compact
	resp, done, err := m.callAdmin(ctx, http.MethodPost, c.AdminURL, "/api/v1/compact", c.Token, c.DataDir, "keybrake-compact", c.Timeout)
	if err != nil {
		return vault.CompactResult{}, err
	}
	defer done()
	var out struct {
		Before int64 `json:"bytes_before"`
		After  int64 `json:"bytes_after"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&out); err != nil {
		return vault.CompactResult{}, fmt.Errorf("post %s: the answer: %w", resp.Request.URL, err)
	}
	return vault.CompactResult{Before: out.Before, After: out.After}, nil
}
