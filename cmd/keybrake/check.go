package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// CheckConfig is the configuration of `keybrake check`.
type CheckConfig struct {
	// File, when set, is the database file to check (a backup): else the data
	// directory's keybrake.db, or a running server's store with AdminURL.
	File string
	// serverAccess says where the database is: DataDir for the offline
	// check, AdminURL for a running server's GET /api/v1/check. A DatabaseURL
	// is refused: a replica's GET /api/v1/check checks a PostgreSQL store.
	serverAccess
}

// DefaultCheckConfig returns check's defaults.
func DefaultCheckConfig() CheckConfig {
	return CheckConfig{serverAccess: defaultServerAccess(time.Hour)}
}

// Validate returns every problem with the configuration at once.
func (c CheckConfig) Validate() error {
	var errs []error
	if c.DatabaseURL != "" {
		errs = append(errs, errors.New("database-url: keybrake check reads a bbolt file; a replica checks its PostgreSQL store: keybrake check --admin-url URL"))
	}
	if c.File != "" && c.AdminURL != "" {
		errs = append(errs, errors.New("file: --file and --admin-url exclude each other"))
	}
	return errors.Join(append(errs, c.validate()...)...)
}

// parseCheck reads check's flags; --data-dir, --admin-url and --token fall
// back to KEYBRAKE_DATA_DIR, KEYBRAKE_ADMIN_URL and KEYBRAKE_ADMIN_TOKEN.
func (m *Main) parseCheck(args []string) error {
	fs := m.flagSet(cmdCheck, "keybrake check [--data-dir DIR | --file FILE | --admin-url URL [--token JWT]]\n\n"+
		"Tells whether a database is whole: its meta pages and size, bbolt's page check (every page\n"+
		"reachable once, none both free and in use) and the vault's invariant (the counters agree\n"+
		"with the holds, the ledger and the caps). Without --admin-url it reads the data directory's\n"+
		"database while the server is stopped, or --file (a backup); no master key is needed. With\n"+
		"--admin-url a running server checks its store in one read transaction, while it serves.\n"+
		"Exits 1 on any finding.")
	c := &m.Check
	fs.StringVar(&c.File, "file", c.File, "database file to check (a backup) instead of the data directory's")
	c.bind(fs, "check", "a replica's --admin-url checks it")
	return m.parseServerCommand(fs, args, func() error { return c.Validate() }) // after the parse: Validate has a value receiver
}

// runCheck checks and writes the summary on Stdout; any finding is an error.
func (m *Main) runCheck(ctx context.Context) error {
	c := m.Check
	var (
		rep  vault.CheckReport
		what string
		err  error
	)
	start := time.Now()
	switch {
	case c.AdminURL != "":
		what = "the store of the server at " + c.AdminURL
		rep, err = m.checkOnline(ctx)
	default:
		path := c.File
		if path == "" {
			path = filepath.Join(c.DataDir, databaseFile)
		}
		what = path
		if fi, serr := os.Stat(path); serr == nil {
			what = fmt.Sprintf("%s (%s)", path, formatBytes(fi.Size()))
		}
		rep, err = bolt.CheckFile(ctx, path, c.OpenTimeout, newStderrLogger(m))
		if errors.Is(err, vault.ErrLocked) {
			err = fmt.Errorf("%w (is keybrake serve running on it? then use --admin-url)", err)
		}
	}
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if err := writeCheckReport(m.Stdout, what, rep, time.Since(start)); err != nil {
		return err
	}
	if n := len(rep.PageProblems) + len(rep.InvariantProblems); n > 0 {
		return fmt.Errorf("check: %d problems found in %s: do not serve it; restore the last backup that checks clean", n, what)
	}
	return nil
}

// checkOnline asks a running server to check its store.
func (m *Main) checkOnline(ctx context.Context) (vault.CheckReport, error) {
	resp, done, err := m.callAdmin(ctx, m.Check.serverAccess, http.MethodGet, "/api/v1/check", "keybrake-check")
	if err != nil {
		return vault.CheckReport{}, err
	}
	defer done()
	var out api.CheckView
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&out); err != nil {
		return vault.CheckReport{}, fmt.Errorf("get %s: the answer: %w", resp.Request.URL, err)
	}
	return vault.CheckReport{Pages: out.Pages, PageProblems: out.PageProblems, Records: out.Records,
		InvariantProblems: out.InvariantProblems}, nil
}

// writeCheckReport writes the summary a person reads.
func writeCheckReport(w io.Writer, what string, rep vault.CheckReport, took time.Duration) error {
	fmt.Fprintf(w, "checked %s in %s\n", what, took.Round(time.Millisecond))
	section := func(name, clean string, problems []string) {
		if len(problems) == 0 {
			fmt.Fprintf(w, "  %-10s ok (%s)\n", name+":", clean)
			return
		}
		fmt.Fprintf(w, "  %-10s %d problems\n", name+":", len(problems))
		for _, p := range problems {
			fmt.Fprintf(w, "    - %s\n", p)
		}
	}
	if rep.Pages > 0 || len(rep.PageProblems) > 0 {
		section("pages", fmt.Sprintf("%d pages, each reachable once or free", rep.Pages), rep.PageProblems)
	}
	if len(rep.PageProblems) > 0 && len(rep.InvariantProblems) == 0 {
		_, err := fmt.Fprintln(w, "  invariant: not checked (the pages are damaged)")
		return err
	}
	section("invariant", fmt.Sprintf("%d idempotency records; the counters agree with the holds, the ledger and the caps", rep.Records),
		rep.InvariantProblems)
	return nil
}

// formatBytes is n in the largest binary unit that keeps it at least 1.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// verifyCopy checks the database copy at path (ErrDamaged, or an error
// naming what the check found): a backup is reported written only once it
// checks clean.
func verifyCopy(ctx context.Context, path string, openTimeout time.Duration) error {
	rep, err := bolt.CheckFile(ctx, path, openTimeout, nil)
	if err != nil {
		return fmt.Errorf("verify the copy: %w", err)
	}
	if !rep.OK() {
		first := append(rep.PageProblems, rep.InvariantProblems...)[0]
		return fmt.Errorf("verify the copy: %d problems, the first: %s: the database it was copied from is damaged (keybrake check says more): %w",
			len(rep.PageProblems)+len(rep.InvariantProblems), first, vault.ErrDamaged)
	}
	return nil
}
