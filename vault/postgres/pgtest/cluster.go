package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	superuser = "postgres"
	// initdbTime bounds initdb; startTime a start, including crash recovery;
	// stopTime a fast shutdown before it escalates.
	initdbTime = 2 * time.Minute
	startTime  = time.Minute
	stopTime   = time.Minute
	adminTime  = 30 * time.Second
	// maxSocketPath is the longest unix socket path Linux accepts (sun_path
	// holds 108 bytes with the terminating NUL).
	maxSocketPath = 107
)

// Cluster is a throwaway PostgreSQL cluster this package started: a data
// directory in a fresh directory (in memory where it can be, see clusterRoot)
// and one postgres process listening on 127.0.0.1 only, on a port that stays
// the same across Stop and Start. Its methods are safe for concurrent use.
type Cluster struct {
	bin      string      // directory of initdb and postgres
	user     *serverUser // nil: the current user
	dir      string      // the cluster's directory: data/ and the unix socket
	port     int
	password string // the superuser's, needed over TCP
	version  string
	// fileCopy: copies of a template are a copy of its files (see createFrom).
	fileCopy bool
	log      *tailBuffer

	mu   sync.Mutex
	proc *process // nil when stopped
}

// process is one running postgres (the postmaster).
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	err  error         // its exit status, once done is closed
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// NewCluster starts a private cluster for tb, stopped and removed in
// tb.Cleanup: for tests that stop, crash or restart the server, which the
// cluster that URL and Pool share must never do. It needs the server programs
// whether or not KEYBRAKE_TEST_DATABASE_URL is set, since a server named by URL
// cannot be restarted; without them tb is skipped, or fails when CI=true.
func NewCluster(tb testing.TB) *Cluster {
	tb.Helper()
	start := time.Now()
	c, err := startCluster()
	if err != nil {
		unavailable(tb, err)
	}
	tb.Cleanup(func() {
		if err := c.close(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	tb.Logf("pgtest: %s on 127.0.0.1:%d started in %s", c.version, c.port, time.Since(start).Round(time.Millisecond))
	return c
}

// startCluster creates and starts a cluster: initdb into a new directory, a
// free loopback port, and a random superuser password for TCP.
func startCluster() (c *Cluster, err error) {
	bin, err := findServer(os.Getenv("PATH"), debianBinGlob)
	if err != nil {
		return nil, err
	}
	runAs, err := lookupServerUser()
	if err != nil {
		return nil, err
	}
	sweepOnce.Do(sweepAllLeftovers)
	root, inMemory := clusterRoot()
	dir, err := os.MkdirTemp(root, dirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return nil, fmt.Errorf("create the cluster directory: %w", err)
	}
	c = &Cluster{bin: bin, user: runAs, dir: dir, password: randomHex(16), log: &tailBuffer{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.close())
		}
	}()
	if runAs != nil {
		// MkdirTemp made it 0700 and ours: hand it to the server's user.
		if err := os.Chown(dir, int(runAs.uid), int(runAs.gid)); err != nil {
			return c, fmt.Errorf("give %s to user %s: %w", dir, runAs.name, err)
		}
	}
	if n := len(c.socketPath(65535)); n > maxSocketPath {
		return c, fmt.Errorf("the unix socket path %s would be %d bytes, more than %d: set TMPDIR to a shorter directory", c.socketPath(65535), n, maxSocketPath)
	}
	out, err := c.run("postgres", "-V")
	if err != nil {
		return c, fmt.Errorf("postgres -V: %w: %s", err, out)
	}
	c.version = strings.TrimPrefix(strings.TrimSpace(string(out)), "postgres (PostgreSQL) ")
	c.version = "PostgreSQL " + c.version
	c.fileCopy = inMemory && majorVersion(c.version) >= 15
	if out, err := c.run("initdb", "-D", c.dataDir(), "-U", superuser, "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		return c, fmt.Errorf("initdb (%s): %w: %s", c.bin, err, clip(string(out)))
	}
	if err := c.writeHBA(); err != nil {
		return c, err
	}
	for attempt := 0; ; attempt++ { // a free port can be taken between probing and binding
		if c.port, err = freePort(); err != nil {
			return c, err
		}
		if err = c.start(); err == nil || attempt == 2 {
			break
		}
	}
	if err != nil {
		return c, err
	}
	if err := c.admin(`ALTER ROLE ` + superuser + ` PASSWORD '` + c.password + `'`); err != nil {
		return c, fmt.Errorf("set the superuser's password: %w", err)
	}
	return c, nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) socketPath(port int) string {
	return filepath.Join(c.dir, ".s.PGSQL."+strconv.Itoa(port))
}

// writeHBA replaces initdb's pg_hba.conf: the unix socket, in a directory only
// the server's user (and root) may enter, trusts; TCP on loopback wants the
// superuser's password, so that no other account of the machine gets in. The
// password is checked by md5, not SCRAM: a SCRAM login derives the key from
// the password anew (4,096 rounds of HMAC-SHA-256), about 10 ms of CPU under
// -race for every connection the tests' pools and replicas open, and a
// throwaway cluster's password needs no protection against its own files
// being read.
func (c *Cluster) writeHBA() error {
	path := filepath.Join(c.dataDir(), "pg_hba.conf")
	hba := "# Written by pgtest: the socket's directory is private; TCP needs the password.\n" +
		"local all all trust\n" +
		"host  all all 127.0.0.1/32 md5\n"
	if err := os.WriteFile(path, []byte(hba), 0o600); err != nil {
		return fmt.Errorf("write pg_hba.conf: %w", err)
	}
	if c.user != nil {
		if err := os.Chown(path, int(c.user.uid), int(c.user.gid)); err != nil {
			return fmt.Errorf("give pg_hba.conf to user %s: %w", c.user.name, err)
		}
	}
	return nil
}

// serverArgs are postgres's arguments: the settings that matter for tests are
// given here rather than in postgresql.conf, so that they are in one place.
// fsync and synchronous_commit keep their defaults (on): a commit waits for the
// disk as in production and as bbolt does, so that benchmarks compare like with
// like; tests that need the speed should batch, not cheat.
func (c *Cluster) serverArgs() []string {
	settings := []string{
		"listen_addresses=127.0.0.1",
		"port=" + strconv.Itoa(c.port),
		`unix_socket_directories="` + c.dir + `"`,
		// Several keybrake replicas, each with a pool, plus the tests' own pools.
		"max_connections=200",
		"shared_buffers=32MB",
		// Stored as md5, so that md5 is what TCP logins use (see writeHBA).
		"password_encryption=md5",
		"TimeZone=UTC",
		"log_timezone=UTC",
	}
	args := []string{"-D", c.dataDir()}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	return args
}

// run runs a short server program to completion and returns its output.
func (c *Cluster) run(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), initdbTime)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	var out bytes.Buffer
	c.setup(cmd, &out, syscall.SIGKILL)
	if err := startProgram(cmd); err != nil {
		return nil, err
	}
	err := cmd.Wait()
	return out.Bytes(), err
}

func (c *Cluster) setup(cmd *exec.Cmd, out io.Writer, deathSig syscall.Signal) {
	cmd.Dir = c.dir // the test's working directory may be closed to the server's user
	cmd.Env = serverEnv()
	cmd.SysProcAttr = sysProcAttr(c.user, deathSig)
	cmd.Stdout, cmd.Stderr = out, out
}

// start starts postgres and waits until it accepts connections; the caller
// holds c.mu or owns c alone. The parent-death signal is SIGQUIT, PostgreSQL's
// immediate shutdown: the postmaster takes its children down with it.
func (c *Cluster) start() error {
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), c.serverArgs()...)
	c.setup(cmd, c.log, syscall.SIGQUIT)
	if err := startProgram(cmd); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	deadline := time.Now().Add(startTime)
	for {
		err := c.ping()
		if err == nil {
			c.proc = p
			return nil
		}
		if p.exited() {
			return fmt.Errorf("postgres exited at start (%v): %s", p.err, clip(c.log.String()))
		}
		if time.Now().After(deadline) {
			_ = p.stop(syscall.SIGQUIT, stopTime)
			return fmt.Errorf("postgres did not accept connections within %s (%v): %s", startTime, err, clip(c.log.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ping connects once over the unix socket.
func (c *Cluster) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.socketURL())
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// stop signals the postmaster and waits for it; after wait it escalates to
// SIGQUIT (immediate shutdown) and then SIGKILL, and says so.
func (p *process) stop(sig syscall.Signal, wait time.Duration) error {
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal postgres (pid %d): %w", p.cmd.Process.Pid, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(wait):
	}
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return fmt.Errorf("postgres (pid %d) did not stop within %s of %s", p.cmd.Process.Pid, wait, sig)
}

// shutdown stops the server, if it runs, with sig: SIGINT is PostgreSQL's fast
// shutdown (sessions are ended, a checkpoint is written), SIGQUIT its immediate
// one (like a crash: the next start replays the WAL).
func (c *Cluster) shutdown(sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.proc
	c.proc = nil
	admins.close(c.socketURL())
	if p == nil || p.exited() {
		return nil
	}
	return p.stop(sig, stopTime)
}

// close stops the server and removes the cluster's directory.
func (c *Cluster) close() error {
	err := c.shutdown(syscall.SIGINT)
	if rmErr := os.RemoveAll(c.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("remove the cluster directory: %w", rmErr))
	}
	return err
}

// Stop shuts the server down the way an operator would (fast shutdown: open
// sessions are ended, the data is checkpointed). Connections fail until Start.
// Stopping a stopped cluster does nothing.
func (c *Cluster) Stop(tb testing.TB) {
	tb.Helper()
	if err := c.shutdown(syscall.SIGINT); err != nil {
		tb.Fatalf("pgtest: stop: %v", err)
	}
}

// Crash stops the server as a crash would (immediate shutdown: no checkpoint,
// so Start replays the WAL; committed transactions survive). Crashing a stopped
// cluster does nothing.
func (c *Cluster) Crash(tb testing.TB) {
	tb.Helper()
	if err := c.shutdown(syscall.SIGQUIT); err != nil {
		tb.Fatalf("pgtest: crash: %v", err)
	}
}

// Start starts a stopped server again on the same port with the same data, and
// returns once it accepts connections: every URL of the cluster works again.
// It fails tb if another program took the port meanwhile. Starting a running
// cluster does nothing.
func (c *Cluster) Start(tb testing.TB) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc != nil && !c.proc.exited() {
		return
	}
	c.proc = nil
	if err := c.start(); err != nil {
		tb.Fatalf("pgtest: start again on port %d: %v", c.port, err)
	}
}

// Restart is Stop followed by Start.
func (c *Cluster) Restart(tb testing.TB) {
	tb.Helper()
	c.Stop(tb)
	c.Start(tb)
}

// PID returns the process ID of the running postmaster, or 0 when the server
// is stopped.
func (c *Cluster) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil || c.proc.exited() {
		return 0
	}
	return c.proc.cmd.Process.Pid
}

// Port returns the TCP port the server listens on, on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Version returns the server's version, as "PostgreSQL 15.18 (Debian …)".
func (c *Cluster) Version() string { return c.version }

// AdminURL returns a URL of the superuser on the "postgres" database, for
// tests that create roles or inspect the server. Tests should not create their
// tables there: URL gives each its own database.
func (c *Cluster) AdminURL() string { return c.tcpURL("postgres") }

// URL creates a new empty database in c for tb and returns its URL; the
// database is dropped in tb.Cleanup (unless the server is stopped by then).
func (c *Cluster) URL(tb testing.TB) string {
	tb.Helper()
	return c.database(tb, "")
}

// database creates tb's database in c as a copy of source (template0 when
// empty) and returns its URL; it is dropped in tb.Cleanup.
func (c *Cluster) database(tb testing.TB, source string) string {
	tb.Helper()
	name := databaseName(tb)
	if err := c.admin(createFrom(name, source, c.fileCopy)); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if c.PID() == 0 {
			return // stopped: the cluster goes away whole
		}
		if err := c.admin(dropDatabase(name)); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return c.tcpURL(name)
}

func (c *Cluster) tcpURL(database string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(superuser, c.password),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// socketURL is the superuser on the "postgres" database over the unix socket,
// which needs no password.
func (c *Cluster) socketURL() string {
	q := url.Values{"host": {c.dir}, "port": {strconv.Itoa(c.port)}, "user": {superuser}, "sslmode": {"disable"}}
	return "postgres:///postgres?" + q.Encode()
}

// admin runs one statement as the superuser over the unix socket.
func (c *Cluster) admin(sql string) error {
	return admins.exec(c.socketURL(), sql)
}

// admins are the pools the statements that create and drop the tests'
// databases run on, one per server, kept until the server stops or the tests
// end: every test creates a database and drops it, and a new session for each
// of those statements cost the server a fork and a backend's start (about
// 30 ms of CPU on a small virtual machine, 350 sessions in vault/postgres).
var admins = adminPools{m: map[string]*pgxpool.Pool{}}

type adminPools struct {
	mu sync.Mutex
	m  map[string]*pgxpool.Pool // by the URL they connect to
}

// exec runs sql on url's pool.
func (a *adminPools) exec(url, sql string) error {
	pool, err := a.pool(url)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTime)
	defer cancel()
	_, err = pool.Exec(ctx, sql)
	return err
}

// pool is url's pool, opened on first use (it connects when first used).
func (a *adminPools) pool(url string) (*pgxpool.Pool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pool, ok := a.m[url]; ok {
		return pool, nil
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	// One round trip per statement; none of them is run twice.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	a.m[url] = pool
	return pool, nil
}

// close closes url's pool, if one is open: its server is stopping.
func (a *adminPools) close(url string) {
	a.mu.Lock()
	pool := a.m[url]
	delete(a.m, url)
	a.mu.Unlock()
	if pool != nil {
		pool.Close()
	}
}

// closeAll closes every pool: the tests have ended.
func (a *adminPools) closeAll() {
	a.mu.Lock()
	pools := a.m
	a.m = map[string]*pgxpool.Pool{}
	a.mu.Unlock()
	for _, pool := range pools {
		pool.Close()
	}
}

// majorVersion is the major version in "PostgreSQL 15.18 (…)", 0 when it
// cannot be read.
func majorVersion(version string) int {
	v := strings.TrimPrefix(version, "PostgreSQL ")
	n, _ := strconv.Atoi(v[:len(v)-len(strings.TrimLeft(v, "0123456789"))])
	return n
}

// createDatabase creates name from template0 with a UTF-8 encoding and the C
// collation, the same on every server, so that ordering never depends on the
// machine.
func createDatabase(name string) string { return createFrom(name, "", false) }

// createFrom creates name as a copy of the database source, or from template0
// when source is empty. A Template's database was itself created from
// template0 here, so a copy has the same encoding and collation. With fileCopy
// (PostgreSQL 15 or newer) a copy is a copy of the source's files, which in
// memory costs a fraction of the CPU of WAL_LOG, the default, which writes
// every page to the WAL.
func createFrom(name, source string, fileCopy bool) string {
	if source == "" {
		return "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() +
			" TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"
	}
	q := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{source}.Sanitize()
	if fileCopy {
		q += " STRATEGY FILE_COPY"
	}
	return q
}

// dropDatabase drops name, ending the sessions a test left open (PostgreSQL
// 13 or newer).
func dropDatabase(name string) string {
	return "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"
}

// databaseName is unique on the server, even when several test binaries share
// it, and says which test it belongs to.
func databaseName(tb testing.TB) string {
	return "kbtest_" + identifierPart(tb.Name(), 33) + "_" + randomHex(4)
}

// identifierPart is s in lower case with every byte but a letter or a digit
// made "_", at most n bytes of it.
func identifierPart(s string, n int) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if b.Len() >= n {
			break
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// freePort returns a 127.0.0.1 port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("probe a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("close the probe listener: %w", err)
	}
	return port, nil
}

// clip keeps the end of a long program output.
func clip(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
}
