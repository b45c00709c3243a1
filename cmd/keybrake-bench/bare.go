package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// The bare proxy runs as this very program started again with these variables
// set: a process of its own, like keybrake, so that neither target shares a Go
// runtime (scheduler, garbage collector) with the load generator.
const (
	envBareUpstream = "KEYBRAKE_BENCH_BARE_UPSTREAM"
	envBareSecret   = "KEYBRAKE_BENCH_BARE_SECRET"
)

// isBareChild reports whether this process was started as the bare proxy.
func isBareChild() bool { return os.Getenv(envBareUpstream) != "" }

// newBareProxy is the baseline: a tuned httputil.ReverseProxy that forwards
// everything to upstream with secret in place of the caller's Authorization, and
// does nothing else. Its transport is tuned as keybrake's is (one upstream host,
// a large idle pool) and it copies bodies with pooled buffers.
func newBareProxy(upstream *url.URL, secret string) *httputil.ReverseProxy {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.MaxIdleConns = 512
	t.MaxIdleConnsPerHost = 256
	t.IdleConnTimeout = 90 * time.Second
	auth := "Bearer " + secret
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.Out.Header.Set("Authorization", auth)
		},
		Transport:  t,
		BufferPool: newBufferPool(),
		ErrorLog:   log.New(io.Discard, "", 0),
	}
}

// bufferPool is an httputil.BufferPool of 32 KiB copy buffers.
type bufferPool struct{ pool sync.Pool }

func newBufferPool() *bufferPool {
	return &bufferPool{pool: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
}

// Get implements httputil.BufferPool.
func (b *bufferPool) Get() []byte { return *(b.pool.Get().(*[]byte)) }

// Put implements httputil.BufferPool.
func (b *bufferPool) Put(buf []byte) { b.pool.Put(&buf) }

// runBareChild serves the bare proxy on 127.0.0.1, writes "listening ADDR" to
// stdout, and serves until stdin is closed (the parent closes it to stop it, and
// the pipe closes by itself if the parent dies). It returns the exit code.
func runBareChild(stdin io.Reader, stdout, stderr io.Writer) int {
	upstream, err := url.Parse(os.Getenv(envBareUpstream))
	if err != nil || upstream.Host == "" {
		fmt.Fprintf(stderr, "bare proxy: bad %s %q\n", envBareUpstream, os.Getenv(envBareUpstream))
		return exitUsage
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(stderr, "bare proxy:", err)
		return exitError
	}
	srv := &http.Server{
		Handler:           newBareProxy(upstream, os.Getenv(envBareSecret)),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() { _ = srv.Serve(ln) }()
	fmt.Fprintln(stdout, "listening", ln.Addr())
	_, _ = io.Copy(io.Discard, stdin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		fmt.Fprintln(stderr, "bare proxy: shutdown:", err)
		return exitError
	}
	return exitOK
}

// bareChild is the running bare proxy.
type bareChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	url   string
}

// startBare starts this program again as the bare proxy in front of upstream.
func startBare(ctx context.Context, upstream, secret string, stderr io.Writer) (*bareChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(childEnv(), envBareUpstream+"="+upstream, envBareSecret+"="+secret)
	cmd.Stderr = stderr
	setDeathSignal(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("bare proxy: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("bare proxy: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start bare proxy: %w", err)
	}
	c := &bareChild{cmd: cmd, stdin: stdin}
	addr := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		addr <- strings.TrimSpace(strings.TrimPrefix(line, "listening "))
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case a := <-addr:
		if a == "" {
			return c, errors.New("the bare proxy did not start")
		}
		c.url = "http://" + a
		return c, nil
	case <-time.After(30 * time.Second):
		return c, errors.New("the bare proxy did not start within 30s")
	case <-ctx.Done():
		return c, ctx.Err()
	}
}

// pid is the child's process id.
func (c *bareChild) pid() int { return c.cmd.Process.Pid }

// stop closes the child's stdin and waits for it to exit (killing it after 15 s).
func (c *bareChild) stop() error {
	_ = c.stdin.Close()
	return waitOrKill(c.cmd, 15*time.Second)
}

// waitOrKill waits for cmd to exit, and kills it by its pid after d.
func waitOrKill(cmd *exec.Cmd, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not exit within %s: killed", cmd.Path, d)
	}
}

// childEnv is this process's environment without the variables that would
// change a child's configuration behind the benchmark's back (KEYBRAKE_*,
// STRIPE_SECRET_KEY); GOMAXPROCS, GOGC and GODEBUG pass through.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KEYBRAKE_") || strings.HasPrefix(kv, "STRIPE_SECRET_KEY=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}
