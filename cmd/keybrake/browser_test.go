package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// envBrowser names a Chromium or Chrome binary for the browser tests; without it
// they look for chromium, chromium-browser, google-chrome and
// google-chrome-stable on PATH.
const envBrowser = "KEYBRAKE_BROWSER"

// envScreenshots names the directory the browser tests write their screenshots
// to (a new temporary directory when unset). CI can keep it as an artifact.
const envScreenshots = "KEYBRAKE_SCREENSHOTS"

// browserTimeout bounds one browser test from start to end.
const browserTimeout = 2 * time.Minute

// findBrowser returns the browser binary to drive, or "".
func findBrowser() string {
	if p := os.Getenv(envBrowser); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// testBrowser is a headless Chromium tab whose console the test watches.
type testBrowser struct {
	tb  testing.TB
	ctx context.Context

	mu      sync.Mutex
	console []chromedp.ConsoleMessage
}

// MustBrowser starts a headless Chromium with a fresh profile in a temporary
// directory, at 1280×800, and stops it in tb.Cleanup. Without a browser the test
// is skipped, or fails when CI=true. Every console message is recorded; see
// AssertNoConsoleErrors.
func MustBrowser(tb testing.TB) *testBrowser {
	tb.Helper()
	path := findBrowser()
	if path == "" {
		browserUnavailable(tb, "no Chromium or Chrome found (looked for chromium, chromium-browser, google-chrome on PATH and $"+
			envBrowser+"); install the Debian package chromium to run the dashboard's browser tests")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(tb.TempDir()),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.WindowSize(1280, 800),
	)
	ctx, cancelTimeout := context.WithTimeout(context.Background(), browserTimeout)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	tb.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
		cancelTimeout()
	})
	b := &testBrowser{tb: tb, ctx: bctx}
	messages := chromedp.Console(bctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.console = append(b.console, m)
			b.mu.Unlock()
		}
	}()
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		browserUnavailable(tb, fmt.Sprintf("%s does not start: %v", path, err))
	}
	return b
}

// browserUnavailable skips the test, or fails it when CI=true.
func browserUnavailable(tb testing.TB, msg string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg)
	}
	tb.Skip(msg + " (set CI=true to make this fatal)")
}

// Do runs actions, failing the test on an error.
func (b *testBrowser) Do(actions ...chromedp.Action[chromedp.Void]) {
	b.tb.Helper()
	require.NoError(b.tb, chromedp.Do(b.ctx, actions...))
}

// Eval evaluates a JavaScript expression in the page.
func (b *testBrowser) Eval(expr string) string {
	b.tb.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](expr))
	require.NoError(b.tb, err, expr)
	return v
}

// Text is the visible text of the first element sel matches, once it is visible.
func (b *testBrowser) Text(sel string) string {
	b.tb.Helper()
	b.Do(chromedp.WaitVisible(chromedp.CSS(sel)))
	v, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(b.tb, err, sel)
	return v
}

// WaitFor polls a JavaScript predicate until it is true (within timeout), and
// fails the test with what with the page's text otherwise.
func (b *testBrowser) WaitFor(what, predicate string, timeout time.Duration) {
	b.tb.Helper()
	_, err := chromedp.Run(b.ctx, chromedp.Poll[chromedp.Void](predicate,
		chromedp.WithPollingTimeout(timeout), chromedp.WithPollingInterval(100*time.Millisecond)))
	if err != nil {
		text, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
		require.NoError(b.tb, err, "waiting for %s; the page says:\n%s", what, text)
	}
}

// Screenshot saves a screenshot of the whole page as dir/name.png.
func (b *testBrowser) Screenshot(dir, name string) string {
	b.tb.Helper()
	buf, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	require.NoError(b.tb, err)
	path := filepath.Join(dir, name+".png")
	require.NoError(b.tb, os.WriteFile(path, buf, 0o644))
	return path
}

// AssertNoConsoleErrors fails the test when the page wrote an error or threw an
// exception that nothing caught. The browser's log of a failed network request
// is an error too, except for the admin API's own answers under allowAPI: a
// problem+json 4xx is how the API reports what the page then shows.
func (b *testBrowser) AssertNoConsoleErrors(allowAPI string) {
	b.tb.Helper()
	// Messages arrive asynchronously: give the last ones a moment.
	time.Sleep(200 * time.Millisecond)
	b.mu.Lock()
	defer b.mu.Unlock()
	var bad []string
	for _, m := range b.console {
		if m.Type != chromedp.ConsoleError && !m.IsException() {
			continue
		}
		if m.Source == "network" && allowAPI != "" && strings.HasPrefix(m.URL, allowAPI) {
			continue
		}
		bad = append(bad, fmt.Sprintf("%s [%s] %s", m, m.Source, m.URL))
	}
	if len(bad) > 0 {
		b.tb.Errorf("the page logged %d console errors:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}

// screenshotDir returns where the browser tests write screenshots: $KEYBRAKE_SCREENSHOTS,
// or a new temporary directory that outlives the test (so that it can be looked
// at afterwards). The path is logged.
func screenshotDir(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv(envScreenshots)
	if dir != "" {
		require.NoError(tb, os.MkdirAll(dir, 0o755))
	} else {
		var err error
		dir, err = os.MkdirTemp("", "keybrake-dashboard-screenshots-")
		require.NoError(tb, err)
	}
	tb.Logf("dashboard screenshots: %s", dir)
	return dir
}
