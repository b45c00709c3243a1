package bolt

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/vaulttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	crashEnvPath = "KEYBRAKE_CRASH_CHILD_DB"
	crashEnvIter = "KEYBRAKE_CRASH_CHILD_ITER"
	// crashEnvStep names a step of the log or the fold (see Store.crash) at
	// which the child kills itself, the crashEnvAfter-th time it gets there;
	// at "write" it tears the record first (writes half of it).
	crashEnvStep  = "KEYBRAKE_CRASH_CHILD_STEP"
	crashEnvAfter = "KEYBRAKE_CRASH_CHILD_AFTER"
)

// TestCrashChild is not a test: it is the child process of TestCrashRecovery. It
// opens the store, resumes some unknown holds, then reserves and settles from
// several goroutines until it is killed; half the settles are queued, as the
// proxy queues them, and the goroutine goes on before they are durable. It
// reports on stdout, after each durable write, what the parent may rely on;
// before an abandon it says so first, since an abandon deletes the hold.
func TestCrashChild(t *testing.T) {
	t.Parallel()
	path := os.Getenv(crashEnvPath)
	if path == "" {
		t.Skip("the child process of TestCrashRecovery")
	}
	iter, err := strconv.Atoi(os.Getenv(crashEnvIter))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad iteration:", err)
		os.Exit(2)
	}
	started := time.Now()
	base := vaulttest.T0.Add(time.Duration(iter) * 10 * time.Second)
	s, err := Open(path, Options{MasterKey: vaulttest.MasterKey, Logger: vaulttest.QuietLogger(),
		Now: func() time.Time { return base.Add(time.Since(started)) }})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	if step := os.Getenv(crashEnvStep); step != "" {
		after, err := strconv.Atoi(os.Getenv(crashEnvAfter))
		if err != nil {
			fmt.Fprintln(os.Stderr, "bad count:", err)
			os.Exit(2)
		}
		var seen atomic.Int64
		hook := crashHook(func(at string, tear func()) {
			if at != step || seen.Add(1) != int64(after) {
				return
			}
			if tear != nil {
				tear()
			}
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		})
		s.testCrash.Store(&hook)
	}
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	ctx := context.Background()
	keys, _, err := s.ListKeys(ctx, vault.KeyFilter{})
	if err != nil || len(keys) == 0 {
		fmt.Fprintln(os.Stderr, "list keys:", err)
		os.Exit(2)
	}
	unknown, _, err := s.ListHolds(ctx, vault.HoldUnknown, 20, "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "list holds:", err)
		os.Exit(2)
	}
	say("ready")
	go func() { // never outlive a parent that forgot us
		time.Sleep(30 * time.Second)
		os.Exit(3)
	}()

	settle := func(rng *rand.Rand, keyID, idem string, amount int64) {
		out := []vault.SettleOutcome{vault.SettleCommit, vault.SettleRelease, vault.SettleUnknown, vault.SettleAbandon}[rng.IntN(4)]
		if out == vault.SettleAbandon {
			say("abandoning %s", idem)
		}
		req := vault.SettleRequest{KeyID: keyID, IdempotencyKey: idem, Outcome: out, Amount: amount,
			Response: &vault.StoredResponse{Status: 200, Body: []byte("ok")}}
		failed := func(err error) {
			fmt.Fprintln(os.Stderr, "settle:", err)
			os.Exit(2)
		}
		if rng.IntN(2) == 0 {
			// As the proxy settles: queued, reported once durable; the caller
			// goes on meanwhile.
			err := s.SettleQueued(ctx, req, func(err error) {
				if err != nil {
					failed(err)
				}
				say("settled %s %s", idem, out)
			})
			if err != nil {
				failed(err)
			}
			return
		}
		if err := s.Settle(ctx, req); err != nil {
			failed(err)
		}
		say("settled %s %s", idem, out)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(iter), uint64(g)))
			// Some of the holds a previous run left unknown are retried first.
			for i, h := range unknown {
				if i%8 != g {
					continue
				}
				res, err := s.Reserve(ctx, vaulttest.Charge(h.KeyID, h.IdempotencyKey, h.Amount))
				if err != nil || res.Outcome != vault.ReserveResume {
					fmt.Fprintln(os.Stderr, "resume:", res.Outcome, err)
					os.Exit(2)
				}
				say("resumed %s %s", h.IdempotencyKey, h.ID)
				settle(rng, h.KeyID, h.IdempotencyKey, h.Amount)
			}
			for i := 0; ; i++ {
				k := keys[rng.IntN(len(keys))]
				idem := fmt.Sprintf("i%03d-g%d-%05d", iter, g, i)
				amount := 1 + rng.Int64N(5000)
				res, err := s.Reserve(ctx, vaulttest.Charge(k.ID, idem, amount))
				if err != nil {
					fmt.Fprintln(os.Stderr, "reserve:", err)
					os.Exit(2)
				}
				if res.Outcome != vault.ReserveClaimed {
					continue
				}
				say("claimed %s %s", idem, res.Hold.ID)
				if rng.IntN(5) == 0 {
					continue // left in flight: Open must turn it into unknown
				}
				settle(rng, k.ID, idem, amount)
			}
		}()
	}
	wg.Wait()
}

// crashLog is what a child reported before it died.
type crashLog struct {
	claimed    map[string]string // idem → hold id
	abandoning map[string]bool
	settled    map[string]vault.SettleOutcome
	lines      int
}

func parseCrashLog(lines []string) crashLog {
	l := crashLog{claimed: map[string]string{}, abandoning: map[string]bool{}, settled: map[string]vault.SettleOutcome{}}
	for _, line := range lines {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && (f[0] == "claimed" || f[0] == "resumed"):
			l.claimed[f[1]] = f[2]
		case len(f) == 2 && f[0] == "abandoning":
			l.abandoning[f[1]] = true
		case len(f) == 3 && f[0] == "settled":
			l.settled[f[1]] = vault.SettleOutcome(f[2])
		}
	}
	l.lines = len(lines)
	return l
}

func TestCrashRecovery(t *testing.T) {
	t.Parallel()
	if os.Getenv(crashEnvPath) != "" {
		t.Skip("inside a crash child")
	}
	runs := 20
	if vaulttest.Long() {
		runs = 200
	}
	clock, path := crashStore(t)

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	acknowledged := 0
	for iter := range runs {
		lines := runCrashChild(t, path, iter, time.Duration(rng.IntN(120))*time.Millisecond)
		log := parseCrashLog(lines)
		acknowledged += log.lines

		checkAfterCrash(t, path, clock, log, iter)
		if t.Failed() {
			t.Fatalf("run %d failed; the child printed %d lines", iter, log.lines)
		}
	}
	t.Logf("%d runs, %d acknowledged writes", runs, acknowledged)
	assert.Positive(t, acknowledged, "the children got work done before they were killed")
}

// checkAfterCrash opens the store a killed child left and checks it against
// what the child reported: the invariant on every window, no record left in
// progress, every acknowledged hold there in the state its settle gave it.
func checkAfterCrash(t *testing.T, path string, clock *vaulttest.Clock, log crashLog, iter int) {
	t.Helper()
	s := MustOpenPath(t, path, clock)
	require.NoError(t, s.CheckInvariant(context.Background()), "run %d", iter)
	assert.Zero(t, recordStates(t, s)[vault.RecordInProgress], "run %d: no in_progress record survives Open", iter)
	holds := allHolds(t, s)
	for idem, holdID := range log.claimed {
		h, ok := holds[holdID]
		if !ok {
			assert.True(t, log.abandoning[idem], "run %d: hold %s of %s lost", iter, holdID, idem)
			continue
		}
		switch log.settled[idem] {
		case vault.SettleCommit:
			assert.Equal(t, vault.HoldCommitted, h.State, "run %d: %s", iter, idem)
		case vault.SettleRelease:
			assert.Equal(t, vault.HoldReleased, h.State, "run %d: %s", iter, idem)
		case vault.SettleUnknown, "":
			// Unknown, or in flight when the child died: unknown now (unless the
			// settle landed and its report did not).
			if log.settled[idem] == vault.SettleUnknown {
				assert.Equal(t, vault.HoldUnknown, h.State, "run %d: %s", iter, idem)
			}
		}
	}
	require.NoError(t, s.Close())
}

// crashStore makes the store the crash children work on: an upstream and
// three keys, closed.
func crashStore(t *testing.T) (*vaulttest.Clock, string) {
	t.Helper()
	clock := vaulttest.NewClock(vaulttest.T0)
	s, path := MustOpen(t, clock)
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	for i := range 3 {
		vaulttest.MustMint(t, s, fmt.Sprintf("crash-%d", i), vaulttest.Policy(t, "5000.00", "20000.00", ""), nil)
	}
	require.NoError(t, s.Close())
	return clock, path
}

// runCrashChild starts the child, lets it work for about d after it is ready, kills
// it with SIGKILL and returns the complete lines it printed.
func runCrashChild(t *testing.T, path string, iter int, d time.Duration, env ...string) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnvPath+"="+path, crashEnvIter+"="+strconv.Itoa(iter))
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	ready := make(chan struct{})
	linesCh := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if line == "ready" {
				close(ready)
				continue
			}
			lines = append(lines, line)
		}
		linesCh <- lines
	}()
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child %d never got ready: %s", iter, stderr.String())
	}
	var lines []string
	if d >= 0 {
		time.Sleep(d)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		lines = <-linesCh
	} else {
		// The child kills itself (crashEnvStep); a bound in case it never
		// gets there.
		select {
		case lines = <-linesCh:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("child %d never reached its crash step: %s", iter, stderr.String())
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "child %d: %s", iter, stderr.String())
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "child %d died of something else: %v\n%s", iter, err, stderr.String())
	return lines
}
