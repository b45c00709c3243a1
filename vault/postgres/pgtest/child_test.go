//go:build linux

package pgtest_test

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault/postgres/pgtest"
)

// The tests in this file run the test binary again as a child, with
// PGTEST_CHILD saying what TestChildProcess does there, and watch what the
// child leaves behind. They read /proc, so they are Linux's.
const childEnv = "PGTEST_CHILD"

// TestChildProcess is what a child does; on its own it is skipped.
func TestChildProcess(t *testing.T) {
	mode := os.Getenv(childEnv)
	switch {
	case mode == "":
		t.Skip("runs only in a child of TestEnvDatabaseURLIsHonoured or TestNoServerOutlivesTheTestBinary")
	case mode == "databases":
		for i := range 2 {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				pool := pgtest.Pool(t)
				var db string
				var port int
				require.NoError(t, pool.QueryRow(t.Context(), "SELECT current_database(), inet_server_port()").Scan(&db, &port))
				fmt.Printf("PGTEST database %s %d\n", db, port)
			})
		}
	case mode == "template":
		for i := range 2 {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				pool := pgtest.NewPool(t, tagged.URL(t))
				var db string
				var rows int
				require.NoError(t, pool.QueryRow(t.Context(), "SELECT current_database(), (SELECT count(*) FROM prepared)").Scan(&db, &rows))
				fmt.Printf("PGTEST copy %s %d\n", db, rows)
			})
		}
	case mode == "template-broken":
		broken.URL(t)
		t.Error("a template that cannot be prepared gave a database")
	case strings.HasPrefix(mode, "server-"):
		pool := pgtest.Pool(t)
		dir, pids := serverProcesses(t, pool)
		fmt.Printf("PGTEST server %s %s\n", dir, strings.Trim(fmt.Sprint(pids), "[]"))
		switch mode {
		case "server-fail":
			t.Fatal("failing on purpose")
		case "server-panic":
			panic("panicking on purpose")
		case "server-kill":
			time.Sleep(time.Minute)
			t.Error("the parent did not kill this child")
		}
	default:
		t.Fatalf("unknown %s=%s", childEnv, mode)
	}
}

func TestEnvDatabaseURLIsHonoured(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t)
	admin := pgtest.NewPool(t, c.AdminURL())

	t.Run("a role that may create databases", func(t *testing.T) {
		out, err := runChild(t, "databases", c.AdminURL())
		require.NoError(t, err, out)
		found := regexp.MustCompile(`(?m)^PGTEST database (\S+) (\d+)$`).FindAllStringSubmatch(out, -1)
		require.Len(t, found, 2, out)
		assert.NotEqual(t, found[0][1], found[1][1], "each test its own database")
		for _, f := range found {
			assert.Equal(t, strconv.Itoa(c.Port()), f[2], "the database is on the server the URL names")
			var n int
			require.NoError(t, admin.QueryRow(t.Context(), "SELECT count(*) FROM pg_database WHERE datname = $1", f[1]).Scan(&n))
			assert.Zero(t, n, "database %s outlived its test", f[1])
		}
		assert.NotContains(t, out, "started in", "the child started a server of its own")
	})

	t.Run("a template", func(t *testing.T) {
		out, err := runChild(t, "template", c.AdminURL())
		require.NoError(t, err, out)
		found := regexp.MustCompile(`(?m)^PGTEST copy (\S+) (\d+)$`).FindAllStringSubmatch(out, -1)
		require.Len(t, found, 2, out)
		assert.NotEqual(t, found[0][1], found[1][1], "each test its own copy")
		for _, f := range found {
			assert.Equal(t, "1", f[2], "the copy holds what the preparation wrote: %s", out)
		}
		assert.Equal(t, 1, strings.Count(out, `pgtest: template "tagged" prepared`), "prepared once for the binary: %s", out)
		var left []string
		rows, err := admin.Query(t.Context(), "SELECT datname FROM pg_database WHERE datname LIKE 'kbt%'")
		require.NoError(t, err)
		left, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		assert.Empty(t, left, "the copies are dropped after their tests, the template after the binary's")
	})

	t.Run("a template that cannot be prepared", func(t *testing.T) {
		out, err := runChild(t, "template-broken", c.AdminURL())
		require.Error(t, err, out)
		assert.Contains(t, out, `pgtest: template "broken" on `+pgtest.EnvDatabaseURL)
		assert.Contains(t, out, "failing on purpose")
		assert.NotContains(t, out, "gave a database")
	})

	t.Run("a role that may not", func(t *testing.T) {
		_, err := admin.Exec(t.Context(), "CREATE ROLE pgtest_nocreatedb LOGIN NOCREATEDB PASSWORD 'secret-pw'")
		require.NoError(t, err)
		u, err := url.Parse(c.AdminURL())
		require.NoError(t, err)
		u.User = url.UserPassword("pgtest_nocreatedb", "secret-pw")
		out, err := runChild(t, "databases", u.String())
		require.Error(t, err, out)
		assert.Contains(t, out, "pgtest_nocreatedb:xxxxx@")
		assert.Contains(t, out, "the role may not create databases: grant it CREATEDB")
		assert.NotContains(t, out, "secret-pw")
	})

	t.Run("a server that does not answer", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		closed := l.Addr().String()
		require.NoError(t, l.Close())
		out, err := runChild(t, "databases", "postgres://postgres:secret-pw@"+closed+"/postgres?sslmode=disable")
		require.Error(t, err, "a URL that does not connect must fail, not skip: %s", out)
		assert.Contains(t, out, pgtest.EnvDatabaseURL)
		assert.NotContains(t, out, "--- SKIP")
		assert.NotContains(t, out, "secret-pw")
	})
}

// runChild runs TestChildProcess in a child with KEYBRAKE_TEST_DATABASE_URL set
// to dbURL and CI unset, and returns its output.
func runChild(t *testing.T, mode, dbURL string) (string, error) {
	cmd := childCommand(mode, pgtest.EnvDatabaseURL+"="+dbURL)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func childCommand(mode string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildProcess$", "-test.v", "-test.count=1", "-test.timeout=2m")
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name != childEnv && name != pgtest.EnvDatabaseURL && (name != "CI" || len(env) > 0) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, childEnv+"="+mode)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

func TestNoServerOutlivesTheTestBinary(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"pass", "fail", "panic", "kill"} {
		t.Run(end, func(t *testing.T) {
			var out syncBuilder
			cmd := childCommand("server-" + end)
			pr, pw, err := os.Pipe()
			require.NoError(t, err)
			cmd.Stdout, cmd.Stderr = pw, pw
			require.NoError(t, cmd.Start())
			pw.Close()
			line := make(chan string, 1)
			scanned := make(chan struct{})
			go func() {
				defer close(scanned)
				s := bufio.NewScanner(pr)
				for s.Scan() {
					out.WriteLine(s.Text())
					if strings.HasPrefix(s.Text(), "PGTEST server ") {
						line <- s.Text()
					}
				}
			}()
			var fields []string
			select {
			case l := <-line:
				fields = strings.Fields(strings.TrimPrefix(l, "PGTEST server "))
			case <-scanned:
				_ = cmd.Wait()
				if reason := regexp.MustCompile(`pgtest: PostgreSQL unavailable.*`).FindString(out.String()); reason != "" {
					t.Skipf("the child was skipped: %s", reason)
				}
				t.Fatalf("the child ended without a server: %s", out.String())
			case <-time.After(2 * time.Minute):
				_ = cmd.Process.Kill()
				t.Fatalf("the child did not start a server: %s", out.String())
			}
			dir, pids := fields[0], make([]int, 0, len(fields)-1)
			for _, f := range fields[1:] {
				pid, err := strconv.Atoi(f)
				require.NoError(t, err)
				pids = append(pids, pid)
			}
			require.GreaterOrEqual(t, len(pids), 2, "a postmaster and its children")
			if end == "kill" {
				require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			}
			<-scanned
			err = cmd.Wait()
			switch end {
			case "pass":
				require.NoError(t, err, out.String())
			case "kill":
				var exit *exec.ExitError
				require.ErrorAs(t, err, &exit)
				assert.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal())
			default:
				require.Error(t, err, out.String())
			}

			deadline := time.Now().Add(30 * time.Second)
			for len(runningPostgres(pids)) > 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			require.Empty(t, runningPostgres(pids), "postgres processes outlived the test binary (%s)", out.String())

			if end == "pass" || end == "fail" {
				assert.NoDirExists(t, dir, "Main removes the cluster's directory")
				return
			}
			assert.DirExists(t, dir, "a dead test binary cannot remove its cluster's directory")
			pgtest.SweepLeftovers()
			assert.NoDirExists(t, dir, "the next cluster start removes the leftover")
		})
	}
}

// serverProcesses returns the cluster's directory and the PIDs of its postmaster
// and the postmaster's children, found from pool's backend.
func serverProcesses(tb testing.TB, pool *pgxpool.Pool) (string, []int) {
	tb.Helper()
	var backend int
	var dataDir string
	require.NoError(tb, pool.QueryRow(tb.(*testing.T).Context(), "SELECT pg_backend_pid(), current_setting('data_directory')").Scan(&backend, &dataDir))
	postmaster := parentPID(tb, backend)
	pids := []int{postmaster}
	entries, err := os.ReadDir("/proc")
	require.NoError(tb, err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if parentOf, ok := readParent(pid); ok && parentOf == postmaster {
			pids = append(pids, pid)
		}
	}
	return filepath.Dir(dataDir), pids
}

func parentPID(tb testing.TB, pid int) int {
	tb.Helper()
	ppid, ok := readParent(pid)
	require.True(tb, ok, "no process %d", pid)
	return ppid
}

// readParent reads a process's parent PID from /proc/PID/stat.
func readParent(pid int) (int, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, false
	}
	// "pid (comm) state ppid …": comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	fields := strings.Fields(string(b[i+1:]))
	if i < 0 || len(fields) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	return ppid, err == nil
}

// runningPostgres returns those of pids that are still postgres processes.
func runningPostgres(pids []int) []int {
	return slices.DeleteFunc(slices.Clone(pids), func(pid int) bool {
		comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		return err != nil || strings.TrimSpace(string(comm)) != "postgres"
	})
}

// syncBuilder collects a child's output lines.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) WriteLine(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.WriteString(line + "\n")
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
