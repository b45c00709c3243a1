package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// BackupConfig is the configuration of `keybrake backup`.
type BackupConfig struct {
	// Out is the file the copy is written to (atomically: temporary file, fsync, rename).
	Out string
	// serverAccess says where the database is: DataDir for the offline copy,
	// AdminURL for a running server's GET /api/v1/backup. A DatabaseURL is
	// refused: pg_dump copies a PostgreSQL store.
	serverAccess
}

// DefaultBackupConfig returns backup's defaults.
func DefaultBackupConfig() BackupConfig {
	return BackupConfig{serverAccess: defaultServerAccess(10 * time.Minute)}
}

// Validate returns every problem with the configuration at once.
func (c BackupConfig) Validate() error {
	if c.DatabaseURL != "" {
		return errors.New("database-url: keybrake backup copies a bbolt data directory; a PostgreSQL store is backed up with its own tools: " +
			`pg_dump --format=custom --file=keybrake.dump "$KEYBRAKE_DATABASE_URL" (a consistent copy while replicas write)`)
	}
	var errs []error
	if c.Out == "" {
		errs = append(errs, errors.New("out: required"))
	}
	return errors.Join(append(errs, c.validate()...)...)
}

// backupTokenTTL is the lifetime of a token backup mints for itself.
const backupTokenTTL = 5 * time.Minute

// parseBackup reads backup's flags; --data-dir, --admin-url and --token fall back to
// KEYBRAKE_DATA_DIR, KEYBRAKE_ADMIN_URL and KEYBRAKE_ADMIN_TOKEN.
func (m *Main) parseBackup(args []string) error {
	fs := m.flagSet(cmdBackup, "keybrake backup --out FILE [--data-dir DIR] [--admin-url URL [--token JWT]]\n\nWithout --admin-url the database is copied from the data directory while the\nserver is stopped (the server holds the file lock). With --admin-url the copy is\nstreamed from a running server's GET /api/v1/backup.")
	c := &m.Backup
	fs.StringVar(&c.Out, "out", c.Out, "file to write the copy to (required)")
	c.bind(fs, "copy", "pg_dump backs it up")
	return m.parseServerCommand(fs, args, func() error { return c.Validate() }) // after the parse: Validate has a value receiver
}

// runBackup writes the copy and reports its size on Stdout.
func (m *Main) runBackup(ctx context.Context) error {
	c := m.Backup
	// Renaming a copy over the live database would silently drop every later write.
	if same, err := samePath(filepath.Join(c.DataDir, databaseFile), c.Out); err != nil {
		return fmt.Errorf("backup: %w", err)
	} else if same {
		return errors.New("backup: --out is the database itself")
	}
	var (
		n   int64
		err error
	)
	if c.AdminURL != "" {
		n, err = m.backupOnline(ctx)
	} else {
		n, err = m.backupOffline(ctx)
	}
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	_, err = fmt.Fprintf(m.Stdout, "wrote %d bytes to %s\n", n, c.Out)
	return err
}

// backupOffline opens the database (which fails while a server holds its lock)
// and writes a consistent copy.
func (m *Main) backupOffline(ctx context.Context) (int64, error) {
	c := m.Backup
	dbPath := filepath.Join(c.DataDir, databaseFile)
	if _, err := os.Stat(dbPath); err != nil {
		return 0, fmt.Errorf("database: %w", err)
	}
	masterKey, masterSrc, err := loadSecret(masterKeySpec, m.Getenv, c.DataDir, nil)
	if err != nil {
		return 0, fmt.Errorf("master key: %w", err)
	}
	store, err := bolt.Open(dbPath, bolt.Options{
		MasterKey:   masterKey,
		OpenTimeout: c.OpenTimeout,
		Logger:      newStderrLogger(m),
		CheckPages:  true, // a damaged file is refused, not copied
	})
	if errors.Is(err, vault.ErrLocked) {
		return 0, fmt.Errorf("open %s (is keybrake serve running on it? then use --admin-url): %w", dbPath, err)
	}
	if err != nil {
		return 0, openStoreError(dbPath, masterSrc, err)
	}
	n, err := m.writeBackup(ctx, func(w io.Writer) (int64, error) { return store.Backup(ctx, w) })
	if cerr := store.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("close store: %w", cerr))
	}
	return n, err
}

// backupOnline streams GET /api/v1/backup from a running server.
func (m *Main) backupOnline(ctx context.Context) (int64, error) {
	c := m.Backup
	resp, done, err := m.callAdmin(ctx, c.serverAccess, http.MethodGet, "/api/v1/backup", "keybrake-backup")
	if err != nil {
		return 0, err
	}
	defer done()
	return m.writeBackup(ctx, func(w io.Writer) (int64, error) { return io.Copy(w, resp.Body) })
}

// writeBackup writes the copy to --out through fill, and checks it (bbolt's
// page check and the invariant) before it renames it into place: a copy of
// a damaged database is never reported written. The temporary files that
// killed backups left beside --out go first.
func (m *Main) writeBackup(ctx context.Context, fill func(io.Writer) (int64, error)) (int64, error) {
	out := m.Backup.Out
	removeTempLeftovers(out, m.Stderr)
	return writeFileAtomic(out, fill, func(tmp string) error { return verifyCopy(ctx, tmp, m.Backup.OpenTimeout) })
}

// removeTempLeftovers removes the temporary files (writeTemp's names) that a
// killed write of path left beside it, and says so on w.
func removeTempLeftovers(path string, w io.Writer) {
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*"))
	for _, f := range leftovers {
		if os.Remove(f) == nil {
			fmt.Fprintf(w, "removed %s, left behind by a backup that was killed\n", f)
		}
	}
}

// callAdmin sends method path, without a body, to the admin API at a.AdminURL
// as an admin, within a.Timeout: with a.Token, else with one minted for subject
// from the local JWT secret (in a.DataDir or KEYBRAKE_JWT_SECRET). Any status
// but 200 is an error quoting the answer. The caller reads the body, then
// calls done.
func (m *Main) callAdmin(ctx context.Context, a serverAccess, method, path, subject string) (resp *http.Response, done func(), err error) {
	token := a.Token
	if token == "" {
		secret, err := m.localJWTSecret(m.Getenv(envJWTSecret), a.DataDir)
		if err != nil {
			return nil, nil, fmt.Errorf("no --token or %s, and %w", envAdminToken, err)
		}
		token, err = api.IssueToken(secret, subject, api.RoleAdmin, backupTokenTTL, time.Now())
		if err != nil {
			return nil, nil, fmt.Errorf("issue token: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, a.Timeout)
	u := strings.TrimRight(a.AdminURL, "/") + path
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	verb := strings.ToLower(method)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("%s %s: %w", verb, u, err)
	}
	done = func() {
		_ = resp.Body.Close()
		cancel()
	}
	if resp.StatusCode != http.StatusOK {
		detail, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		done()
		return nil, nil, fmt.Errorf("%s %s: %s: %s", verb, u, resp.Status, strings.TrimSpace(string(detail)))
	}
	return resp, done, nil
}

// writeFileAtomic writes path through fill: a temporary file beside it (mode 0600),
// fsync, the verify of each one given (with the temporary file's name), rename
// over path, fsync of the directory. On error path is untouched.
func writeFileAtomic(path string, fill func(io.Writer) (int64, error), verify ...func(tmp string) error) (int64, error) {
	tmpName, n, err := writeTemp(path, fill)
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	for _, v := range verify {
		if err := v(tmpName); err != nil {
			_ = os.Remove(tmpName)
			return 0, err
		}
	}
	if err := os.Rename(tmpName, path); err != nil {
		_ = os.Remove(tmpName)
		return 0, fmt.Errorf("rename into place: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return n, err
	}
	return n, nil
}

// samePath reports whether a and b name the same file (b need not exist).
func samePath(a, b string) (bool, error) {
	aa, err := filepath.Abs(a)
	if err != nil {
		return false, fmt.Errorf("resolve %s: %w", a, err)
	}
	bb, err := filepath.Abs(b)
	if err != nil {
		return false, fmt.Errorf("resolve %s: %w", b, err)
	}
	if aa == bb {
		return true, nil
	}
	ai, errA := os.Stat(aa)
	bi, errB := os.Stat(bb)
	return errA == nil && errB == nil && os.SameFile(ai, bi), nil
}

// serverAccess is what backup and compact share: where the bbolt database is,
// in a data directory while its server is stopped, or behind a running
// server's admin API.
type serverAccess struct {
	// DataDir holds keybrake.db for the offline command (and the generated secrets).
	DataDir string
	// AdminURL, when set, has a running server do it through its admin API.
	AdminURL string
	// Token authenticates against AdminURL (--token, else KEYBRAKE_ADMIN_TOKEN,
	// else minted from the local JWT secret).
	Token string
	// OpenTimeout is how long the offline command waits for the database's file lock.
	OpenTimeout time.Duration
	// Timeout bounds the online command.
	Timeout time.Duration
	// DatabaseURL, when set, names a PostgreSQL store, which both commands refuse.
	DatabaseURL string
}

// defaultServerAccess is the default data directory and timeouts.
func defaultServerAccess(timeout time.Duration) serverAccess {
	return serverAccess{DataDir: DefaultConfig().DataDir, OpenTimeout: 2 * time.Second, Timeout: timeout}
}

// serverAccessEnv names the variables serverAccess's flags fall back to.
var serverAccessEnv = map[string]string{"data-dir": envName("data-dir"), "admin-url": envName("admin-url"),
	"token": envAdminToken, "database-url": envName("database-url")}

// bind registers the flags; what names the command's work ("copy"), pgRefusal
// says what serves a PostgreSQL store instead.
func (a *serverAccess) bind(fs *flag.FlagSet, what, pgRefusal string) {
	fs.StringVar(&a.DataDir, "data-dir", a.DataDir, "data directory holding keybrake.db")
	fs.StringVar(&a.AdminURL, "admin-url", a.AdminURL, "have a running server at this admin URL do the "+what+" (e.g. http://127.0.0.1:8081)")
	fs.StringVar(&a.Token, "token", a.Token, "admin JWT for --admin-url (default: "+envAdminToken+", else minted from the local JWT secret)")
	fs.DurationVar(&a.OpenTimeout, "open-timeout", a.OpenTimeout, "how long to wait for the database lock (offline "+what+")")
	fs.DurationVar(&a.Timeout, "timeout", a.Timeout, "time limit of the online "+what)
	fs.StringVar(&a.DatabaseURL, "database-url", a.DatabaseURL, "a PostgreSQL store's URL: refused, "+pgRefusal)
}

// parseServerCommand parses the args of a command that takes serverAccess's
// flags (fs), fills the unset ones from the environment (serverAccessEnv) and
// validates the result.
func (m *Main) parseServerCommand(fs *flag.FlagSet, args []string, validate func() error) error {
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if err := applyEnv(fs, m.Getenv, serverAccessEnv); err != nil {
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	if err := validate(); err != nil {
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	return nil
}

// validate returns the problems with the admin URL and the timeouts.
func (a serverAccess) validate() []error {
	var errs []error
	if a.AdminURL != "" {
		if err := validateBaseURL(a.AdminURL); err != nil {
			errs = append(errs, fmt.Errorf("admin-url: %w", err))
		}
	}
	if a.OpenTimeout <= 0 {
		errs = append(errs, fmt.Errorf("open-timeout: must be positive, got %s", a.OpenTimeout))
	}
	if a.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout: must be positive, got %s", a.Timeout))
	}
	return errs
}
