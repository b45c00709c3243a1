package pgtest

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// errUnavailable marks why no server can be had on this machine: the test is
// skipped, or fails when CI=true. Any other error fails the test.
var errUnavailable = errors.New("PostgreSQL unavailable")

// debianBinGlob is where Debian's postgresql packages put the server programs,
// one directory per major version.
const debianBinGlob = "/usr/lib/postgresql/*/bin"

// findServer returns the directory holding initdb and postgres: the one of the
// first initdb on path that has postgres next to it (symbolic links resolved),
// else the newest directory matching debianGlob.
func findServer(path, debianGlob string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		initdb, err := filepath.EvalSymlinks(filepath.Join(dir, "initdb"))
		if err != nil || !isExecutable(initdb) {
			continue
		}
		if bin := filepath.Dir(initdb); isExecutable(filepath.Join(bin, "postgres")) {
			return bin, nil
		}
	}
	dirs, err := filepath.Glob(debianGlob)
	if err != nil {
		return "", fmt.Errorf("look for %s: %w", debianGlob, err)
	}
	var found []string
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "postgres")) {
			found = append(found, d)
		}
	}
	if len(found) == 0 {
		return "", fmt.Errorf("%w: no initdb on PATH nor in %s: install the server (Debian: apt-get install postgresql) or set %s", errUnavailable, debianGlob, EnvDatabaseURL)
	}
	return slices.MaxFunc(found, func(a, b string) int {
		return compareVersions(filepath.Base(filepath.Dir(a)), filepath.Base(filepath.Dir(b)))
	}), nil
}

// compareVersions orders dotted version numbers ("9.6" < "15" < "17"); parts
// that are not numbers compare as 0.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// serverUser is the account the server programs run as when it is not the
// current one.
type serverUser struct {
	name     string
	uid, gid uint32
}

// lookupServerUser returns nil when the tests do not run as root: the programs
// then run as the current user. initdb and postgres refuse to run as root, so
// as root they run as the "postgres" user, which Debian's postgresql package
// creates.
func lookupServerUser() (*serverUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	if !canSwitchUser {
		return nil, fmt.Errorf("%w: the tests run as root, which PostgreSQL refuses, and cannot switch users on %s: run them as another user", errUnavailable, runtime.GOOS)
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w: the tests run as root, which PostgreSQL refuses, and there is no \"postgres\" user to run it as: %v", errUnavailable, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user postgres: uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user postgres: gid %q: %w", u.Gid, err)
	}
	return &serverUser{name: u.Username, uid: uint32(uid), gid: uint32(gid)}, nil
}

// starter is a goroutine locked to its OS thread for the life of the test
// binary. Every server program is started from it: the parent-death signal
// (Linux) fires when the starting thread ends, and an ordinary Go thread may
// end before the process does.
var starter struct {
	once sync.Once
	reqs chan startRequest
}

type startRequest struct {
	cmd  *exec.Cmd
	done chan error
}

// startProgram starts cmd from the starter thread.
func startProgram(cmd *exec.Cmd) error {
	starter.once.Do(func() {
		starter.reqs = make(chan startRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread must outlive every child
			for r := range starter.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	starter.reqs <- startRequest{cmd: cmd, done: done}
	return <-done
}

// serverEnv is the whole environment of the server programs: no PG* variable
// of the test's environment reaches them, and the locale and time zone are
// fixed.
func serverEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC"}
}

// tailBuffer keeps the last tailSize bytes of a server's output for error
// messages.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

const tailSize = 16 << 10

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > tailSize {
		t.b = t.b[len(t.b)-tailSize:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// dirPrefix starts the name of every cluster's directory in its root (see
// clusterRoot); the test binary's PID follows, so that a later run can tell a
// leftover.
const dirPrefix = "keybrake-pgtest-"

// clusterRoot is the directory a new cluster's directory is made in: a tmpfs
// with room (memoryDir) unless the binary runs benchmarks, else os.TempDir().
// In memory the CREATE DATABASE and DROP DATABASE of every test cost a
// fraction of their CPU on ext4, whose allocator rescans the inodes a drop
// freed for each file a copy creates, and the WAL's fsyncs return at once.
// The server, its settings and its crash recovery are the same: a killed
// server's WAL is replayed from memory as it would be from disk. Benchmarks
// keep the disk, so that a commit waits for it as it does in production.
func clusterRoot() (dir string, inMemory bool) {
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		if dir := memoryDir(); dir != "" {
			return dir, true
		}
	}
	return os.TempDir(), false
}

// memoryNeed is the room a tmpfs must have free to hold clusters: the shared
// cluster's WAL can grow to max_wal_size (1 GB) between checkpoints.
const memoryNeed = 2 << 30

var sweepOnce sync.Once

// sweepAllLeftovers sweeps both places a cluster's directory can be.
func sweepAllLeftovers() {
	for _, root := range []string{memoryDir(), os.TempDir()} {
		if root != "" {
			sweepLeftovers(root)
		}
	}
}

// sweepLeftovers removes the directories of clusters whose test binary died
// before it could (a panic, a timeout, SIGKILL: the server itself is stopped by
// the parent-death signal then). A directory is kept while its test binary or
// its server may still run, or when that cannot be told.
func sweepLeftovers(tmp string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, dirPrefix+"*"))
	for _, dir := range dirs {
		if leftover(dir) {
			_ = os.RemoveAll(dir) // best effort: another user's directory stays
		}
	}
}

func leftover(dir string) bool {
	owner, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(dir), dirPrefix), "-")
	pid, err := strconv.Atoi(owner)
	if err != nil || pid == os.Getpid() || processAlive(pid) {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return true
	case err != nil:
		return false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err = strconv.Atoi(strings.TrimSpace(line))
	return err == nil && !processAlive(pid)
}
