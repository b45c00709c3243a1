// Command keybrake is the spend-cap vault for the Stripe API: `keybrake serve`
// runs the metering proxy and the admin API; `token`, `backup`, `rekey`,
// `migrate-store` and `version` are small tools around it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"

	// Policies name IANA time zones: the binary carries the zone database so that
	// it does not depend on the host's (a distroless or scratch image may have none).
	_ "time/tzdata"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/fakestripe"
	"github.com/keybrake/keybrake/vault"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// main only turns signals into a cancelled context and errors into exit codes;
// everything else is Main's, so tests run the real program in-process.
func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	m := NewMain()
	if err := m.ParseFlags(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(exitOK)
		}
		fmt.Fprintln(os.Stderr, "keybrake:", err)
		os.Exit(exitUsage)
	}
	// SIGHUP reloads the TLS certificates (after a renewal); it never stops serve.
	// It is caught before Run starts the servers: once serve logs that it is
	// ready, a SIGHUP must not find the default action (exit) still in place.
	hup := make(chan os.Signal, 1)
	if m.Command == cmdServe {
		tuneGC(os.Getenv)
		signal.Notify(hup, syscall.SIGHUP)
	}
	if err := m.Run(ctx); err != nil {
		// Close releases what Run set up before it failed; its own error is reported too.
		err = errors.Join(err, m.Close())
		fmt.Fprintln(os.Stderr, "keybrake:", err)
		os.Exit(exitError)
	}
	go func() {
		for range hup {
			_ = m.ReloadTLS() // each failure is logged; the current certificate stays
		}
	}()
	err := m.Wait(ctx)
	// A second SIGINT/SIGTERM during the graceful shutdown kills the process at once.
	stop()
	if cerr := m.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "keybrake:", err)
		os.Exit(exitError)
	}
}

// Subcommands.
const (
	cmdServe   = "serve"
	cmdToken   = "token"
	cmdBackup  = "backup"
	cmdRekey   = "rekey"
	cmdCompact = "compact"
	cmdCheck   = "check"
	cmdMigrate = "migrate-store"
	cmdVersion = "version"
	cmdHelp    = "help"
)

// Main is the keybrake program. ParseFlags picks the subcommand and reads its
// flags and environment; Run executes it — for serve it starts the servers and
// returns, and Wait blocks until the context ends or a server fails; Close shuts
// down gracefully.
type Main struct {
	// Command is the subcommand ParseFlags chose.
	Command string
	// Config is serve's configuration.
	Config Config
	// Token is the token subcommand's configuration.
	Token TokenConfig
	// Backup is the backup subcommand's configuration.
	Backup BackupConfig
	// Rekey is the rekey subcommand's configuration.
	Rekey RekeyConfig
	// Compact is the compact subcommand's configuration.
	Compact CompactConfig
	// Check is the check subcommand's configuration.
	Check CheckConfig
	// Migrate is the migrate-store subcommand's configuration.
	Migrate MigrateConfig

	// Stdout receives a command's output (a token, the version).
	Stdout io.Writer
	// Stderr receives logs and the first-start banner.
	Stderr io.Writer
	// Getenv reads the environment; os.Getenv in NewMain.
	Getenv func(string) string

	logger  *slog.Logger
	metrics *api.Metrics
	store   vault.Store
	// demoStripe is the fake Stripe of serve --demo.
	demoStripe *fakestripe.FakeStripe
	proxyLn    net.Listener
	adminLn    net.Listener
	proxyTLS   *certReloader // nil without --tls-cert
	adminTLS   *certReloader // nil without --admin-tls-cert
	proxySrv   *http.Server
	stripe     *proxy.Proxy // flushed on shutdown
	adminSrv   *http.Server
	pprofLn    net.Listener
	pprofSrv   *http.Server
	publicURL  string
	inflight   inflight
	serveErr   chan error
	stopReap   context.CancelFunc
	wg         sync.WaitGroup
	closeOnce  sync.Once
	closeErr   error
}

// NewMain returns a Main with the default configuration that talks to the
// process's standard streams and environment.
func NewMain() *Main {
	return &Main{
		Config:  DefaultConfig(),
		Token:   DefaultTokenConfig(),
		Backup:  DefaultBackupConfig(),
		Rekey:   DefaultRekeyConfig(),
		Compact: DefaultCompactConfig(),
		Check:   DefaultCheckConfig(),
		Migrate: DefaultMigrateConfig(),
		Stdout:  os.Stdout,
		Stderr:  os.Stderr,
		Getenv:  os.Getenv,
	}
}

const usage = `keybrake — spend-cap vault for the Stripe API

Usage:
  keybrake serve         [flags]  run the metering proxy and the admin API
  keybrake token         [flags]  print an admin API token (JWT)
  keybrake backup        [flags]  write a consistent copy of the database
  keybrake rekey         [flags]  re-seal the database under a new master key (server stopped)
  keybrake compact       [flags]  give the space the reaper freed back to the file system
  keybrake check         [flags]  tell whether a database (or a backup) is whole; exits 1 on a finding
  keybrake migrate-store [flags]  copy a bbolt vault into an empty PostgreSQL database (server stopped)
  keybrake version                print the version
  keybrake help [command]         show help

Run "keybrake COMMAND -h" for a command's flags. Every serve flag can also be set
with the environment variable KEYBRAKE_<FLAG> (e.g. KEYBRAKE_DATA_DIR); a flag wins.
`

// ParseFlags selects the subcommand from args[0] and parses the rest as its flags,
// then fills unset flags from the environment. It returns flag.ErrHelp after
// printing help, and an error for a bad command line or configuration.
func (m *Main) ParseFlags(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(m.Stderr, usage)
		return errors.New("no command given")
	}
	m.Command, args = args[0], args[1:]
	switch m.Command {
	case cmdServe:
		return m.parseServe(args)
	case cmdToken:
		return m.parseToken(args)
	case cmdBackup:
		return m.parseBackup(args)
	case cmdRekey:
		return m.parseRekey(args)
	case cmdCompact:
		return m.parseCompact(args)
	case cmdCheck:
		return m.parseCheck(args)
	case cmdMigrate:
		return m.parseMigrate(args)
	case cmdVersion:
		return parseArgs(m.flagSet(cmdVersion, "keybrake version"), args)
	case cmdHelp, "-h", "-help", "--help":
		if len(args) > 0 && args[0] != cmdHelp {
			return m.ParseFlags(ctx, []string{args[0], "-h"})
		}
		fmt.Fprint(m.Stdout, usage)
		return flag.ErrHelp
	default:
		fmt.Fprint(m.Stderr, usage)
		return fmt.Errorf("unknown command %q", m.Command)
	}
}

// flagSet returns a FlagSet that reports errors (instead of exiting) and prints
// its help to Stderr.
func (m *Main) flagSet(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(m.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(m.Stderr, "Usage: %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseArgs parses args with fs and refuses positional arguments: no command takes
// any.
func parseArgs(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", fs.Name(), fs.Args())
	}
	return nil
}

// parseServe reads serve's flags and environment.
func (m *Main) parseServe(args []string) error {
	fs := m.flagSet(cmdServe, "keybrake serve [flags]\n\nEach flag is also read from KEYBRAKE_<FLAG> (flag wins).\nSecrets: KEYBRAKE_MASTER_KEY (base64 of 32 bytes), KEYBRAKE_JWT_SECRET (at least 32 bytes);\ngenerated into the data directory when unset (development only).\nSTRIPE_SECRET_KEY registers the upstream \"default\" when absent or changed since the last start.")
	m.Config.bindFlags(fs)
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if err := applyEnv(fs, m.Getenv, nil); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if err := m.Config.applyDemo(fs); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if err := m.Config.Validate(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// Run executes the subcommand. For serve it returns once both listeners are bound
// and serving; call Wait, then Close.
func (m *Main) Run(ctx context.Context) error {
	switch m.Command {
	case cmdServe:
		return m.runServe(ctx)
	case cmdToken:
		return m.runToken(ctx)
	case cmdBackup:
		return m.runBackup(ctx)
	case cmdRekey:
		return m.runRekey(ctx)
	case cmdCompact:
		return m.runCompact(ctx)
	case cmdCheck:
		return m.runCheck(ctx)
	case cmdMigrate:
		return m.runMigrate(ctx)
	case cmdVersion:
		_, err := fmt.Fprintln(m.Stdout, "keybrake", Version())
		return err
	default:
		return fmt.Errorf("unknown command %q", m.Command)
	}
}

// Wait blocks until ctx ends (nil) or, under serve, a server stops with an error.
// Other commands return at once.
func (m *Main) Wait(ctx context.Context) error {
	if m.serveErr == nil {
		return nil
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-m.serveErr:
		return err
	}
}

// Close shuts serve down gracefully: both servers stop accepting, in-flight
// requests get up to Config.ShutdownTimeout to finish (then their connections are
// closed), the reaper stops, and the store is closed last. It is safe to call more
// than once and after a failed Run.
func (m *Main) Close() error {
	m.closeOnce.Do(func() { m.closeErr = m.close() })
	return m.closeErr
}

// newLogger builds the process logger on Stderr.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	l, err := parseLevel(level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("log format %q is not json or text", format)
	}
}

// newStderrLogger is the logger of the one-shot commands: warnings and errors, as
// text, on Stderr.
func newStderrLogger(m *Main) *slog.Logger {
	return slog.New(slog.NewTextHandler(m.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
