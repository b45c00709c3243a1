package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// keybrakePackage is what BuildKeybrake builds.
const keybrakePackage = "github.com/keybrake/keybrake/cmd/keybrake"

// BuildKeybrake builds keybrake serve's binary into dir with the go command and
// returns its path; extra go build flags (-race) come before the package. It needs
// this module's source: run it from within the repository.
func BuildKeybrake(ctx context.Context, dir string, extra ...string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("build keybrake (or pass --keybrake): %w", err)
	}
	bin := filepath.Join(dir, "keybrake")
	args := append([]string{"build", "-buildvcs=false", "-o", bin}, extra...)
	cmd := exec.CommandContext(ctx, goBin, append(args, keybrakePackage)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s (run from the repository, or pass --keybrake): %w: %s",
			keybrakePackage, err, bytes.TrimSpace(out))
	}
	return bin, nil
}

// keybrakeChild is a running `keybrake serve`.
type keybrakeChild struct {
	cmd      *exec.Cmd
	log      string // its stderr
	url      string // the proxy listener
	adminURL string
	pprofURL string // "" unless started with the profiler
	exited   chan struct{}
	exitErr  error
}

// keybrakeSecrets are what serve reads from its environment.
type keybrakeSecrets struct {
	masterKey []byte
	jwtSecret []byte
}

// startKeybrake runs `bin serve` on dataDir (whose store the setup prepared) with
// both listeners on 127.0.0.1, the fake Stripe as its upstream and, with pprof,
// its profiler on a loopback port, and extraEnv (KEYBRAKE_DATABASE_URL for a
// replica on PostgreSQL). Its log goes to keybrake.log in dataDir. It returns
// once serve logs that it is serving.
func startKeybrake(ctx context.Context, bin, dataDir, stripeURL, logLevel string, s keybrakeSecrets, pprof bool, extraEnv ...string) (*keybrakeChild, error) {
	logPath := filepath.Join(dataDir, "keybrake.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("keybrake log: %w", err)
	}
	defer logFile.Close() // the child has its own descriptor
	args := []string{"serve",
		"--data-dir", dataDir,
		"--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0",
		"--stripe-url", stripeURL,
		"--log-format", "json",
		"--log-level", logLevel,
	}
	if pprof {
		args = append(args, "--pprof-listen", "127.0.0.1:0")
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(childEnv(),
		"KEYBRAKE_MASTER_KEY="+base64.StdEncoding.EncodeToString(s.masterKey),
		"KEYBRAKE_JWT_SECRET="+base64.StdEncoding.EncodeToString(s.jwtSecret))
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	c := &keybrakeChild{cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		c.exitErr = cmd.Wait()
		close(c.exited)
	}()
	if err := c.awaitServing(ctx, 60*time.Second); err != nil {
		return c, err
	}
	return c, nil
}

// awaitServing reads the log until serve says where it listens.
func (c *keybrakeChild) awaitServing(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		if rec, ok := c.servingLine(); ok {
			c.url, c.adminURL = "http://"+rec.Proxy, "http://"+rec.Admin
			if rec.Pprof != "" {
				c.pprofURL = "http://" + rec.Pprof
			}
			return nil
		}
		select {
		case <-c.exited:
			return fmt.Errorf("keybrake exited before serving (%v): %s", c.exitErr, c.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("keybrake did not serve within %s: %s", within, c.logTail())
		}
	}
}

// servingRecord is the log line serve writes once it listens.
type servingRecord struct {
	Msg   string `json:"msg"`
	Proxy string `json:"proxy"`
	Admin string `json:"admin"`
	Pprof string `json:"pprof"`
}

func (c *keybrakeChild) servingLine() (servingRecord, bool) {
	f, err := os.Open(c.log)
	if err != nil {
		return servingRecord{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var rec servingRecord
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "keybrake serving" && rec.Proxy != "" {
			return rec, true
		}
	}
	return servingRecord{}, false
}

// logTail is the end of keybrake's log, for error messages.
func (c *keybrakeChild) logTail() string {
	data, err := os.ReadFile(c.log)
	if err != nil {
		return err.Error()
	}
	const n = 2000
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return string(bytes.TrimSpace(data))
}

// pid is the child's process id.
func (c *keybrakeChild) pid() int { return c.cmd.Process.Pid }

// stop sends SIGTERM (serve shuts down gracefully: in-flight requests finish, the
// store is closed) and waits, killing it by its pid after 60 s.
func (c *keybrakeChild) stop() error {
	select {
	case <-c.exited:
		return c.exitErr
	default:
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop keybrake: %w", err)
	}
	select {
	case <-c.exited:
		if c.exitErr != nil {
			return fmt.Errorf("keybrake exited: %w: %s", c.exitErr, c.logTail())
		}
		return nil
	case <-time.After(60 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
		return errors.New("keybrake did not shut down within 60s: killed")
	}
}

// cpuProfile takes a CPU profile of d (whole seconds, at least one) through the
// profiler listener and writes it to path.
func (c *keybrakeChild) cpuProfile(ctx context.Context, d time.Duration, path string) error {
	if c.pprofURL == "" {
		return errors.New("keybrake was started without its profiler")
	}
	secs := max(1, int(d/time.Second))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", c.pprofURL, secs), nil)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return fmt.Errorf("cpu profile: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return fmt.Errorf("cpu profile: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("cpu profile: write %s: %w", path, err)
	}
	return nil
}

// storeCounters reads the group committer's histograms from /metrics: its write
// transactions (each with its fsyncs) and the operations they carried.
func (c *keybrakeChild) storeCounters(ctx context.Context) (commits, ops int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.adminURL+"/metrics", nil)
	if err != nil {
		return 0, 0, fmt.Errorf("metrics: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return 0, 0, fmt.Errorf("metrics: %w", err)
	}
	// The commit histograms: _count is the number of commits, the batch size's
	// _sum the operations they carried.
	durations, sizes := families["keybrake_store_commit_duration_seconds"], families["keybrake_store_commit_batch_size"]
	if durations == nil || sizes == nil || len(durations.GetMetric()) != 1 || len(sizes.GetMetric()) != 1 {
		return 0, 0, errors.New("metrics: no keybrake_store_commit_duration_seconds and keybrake_store_commit_batch_size")
	}
	commits = int64(durations.GetMetric()[0].GetHistogram().GetSampleCount())
	ops = int64(sizes.GetMetric()[0].GetHistogram().GetSampleSum())
	return commits, ops, nil
}
