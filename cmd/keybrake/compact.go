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
	// serverAccess says where the database is: DataDir for the offline
	// compaction, AdminURL for a running server's POST /api/v1/compact. A
	// DatabaseURL is refused: PostgreSQL's autovacuum reclaims space.
	serverAccess
}

// DefaultCompactConfig returns compact's defaults.
func DefaultCompactConfig() CompactConfig {
	return CompactConfig{serverAccess: defaultServerAccess(time.Hour)}
}

// Validate returns every problem with the configuration at once.
func (c CompactConfig) Validate() error {
	if c.DatabaseURL != "" {
		return errors.New("database-url: keybrake compact rewrites a bbolt data directory; PostgreSQL's autovacuum reclaims the space of a PostgreSQL store (VACUUM FULL gives it back to the file system)")
	}
	return errors.Join(c.validate()...)
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
	c.bind(fs, "compaction", "autovacuum reclaims its space")
	return m.parseServerCommand(fs, args, func() error { return c.Validate() }) // after the parse: Validate has a value receiver
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
	resp, done, err := m.callAdmin(ctx, c.serverAccess, http.MethodPost, "/api/v1/compact", "keybrake-compact")
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
