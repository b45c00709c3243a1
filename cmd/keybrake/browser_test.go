package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault/postgres/pgtest"
)

// envBrowser names a Chromium or Chrome binary for the browser tests; without it
// they look for chromium, chromium-browser, google-chrome and
// google-chrome-stable on PATH.
const envBrowser = "KEYBRAKE_BROWSER"

// envScreenshots names the directory the browser tests write their screenshots
// to; without it (and without -update-docs) they take none. CI can keep it as
// an artifact.
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
	waits   int // WaitFor calls so far, each an id for refreshHook
}

// The dashboard re-reads the open page's data every 5 s (REFRESH_MS in
// web/static/js/app.js), so a test that waits for the page to show a change
// made behind its back (a charge through the proxy, a webhook delivered) waited
// 2.5 s on average for the next tick, and most of a browser test's time went
// there. refreshHook runs before the page's scripts in every document of a
// test's tab: it keeps the page's 5 s setInterval as it is, and lets WaitFor run
// that same callback sooner, once its predicate has been false for
// waitRefreshAfter. A wait that the page satisfies by itself (a dialog opening,
// a route mounting) never sees an early refresh, and no wait returns while a
// refresh it started is still rendering, so that the test's next step does not
// race it.
const (
	waitRefreshAfter = 500 * time.Millisecond
	waitRefreshEvery = 250 * time.Millisecond
)

var refreshHook = fmt.Sprintf(`(() => {
	const setInterval = window.setInterval;
	const refreshes = [];
	window.setInterval = function (fn, ms, ...args) {
		if (ms === 5000 && typeof fn === 'function') refreshes.push(() => fn(...args));
		return setInterval.call(this, fn, ms, ...args);
	};
	const since = new Map();
	let running = null;
	let last = 0;
	window.__keybrakeWait = (id, ok) => {
		if (running) return false;
		if (ok) {
			since.delete(id);
			return true;
		}
		const now = Date.now();
		if (!since.has(id)) since.set(id, now);
		if (refreshes.length === 0 || now - since.get(id) < %d || now - last < %d) return false;
		last = now;
		running = Promise.allSettled(refreshes.map((r) => r())).finally(() => { running = null; });
		return false;
	};
})();`, waitRefreshAfter.Milliseconds(), waitRefreshEvery.Milliseconds())

// sharedBrowser is the one headless Chromium of the test binary, started by the
// first browser test and stopped after the tests (pgtest.Main runs what
// pgtest.AtEnd gives it). Every test has a tab in a browser context of its own,
// which shares no cookies, storage or cache with the other tests'.
var sharedBrowser struct {
	mu   sync.Mutex
	ctx  context.Context // the browser's first tab; tests' tabs are its children
	path string
	err  error // why it did not start: every later browser test gets it too
}

// startBrowser starts the shared browser once and returns its first tab's
// context, or why it does not start.
func startBrowser(path string) (context.Context, error) {
	sharedBrowser.mu.Lock()
	defer sharedBrowser.mu.Unlock()
	if sharedBrowser.ctx != nil || sharedBrowser.err != nil {
		return sharedBrowser.ctx, sharedBrowser.err
	}
	dir, err := os.MkdirTemp("", "keybrake-browser-")
	if err != nil {
		sharedBrowser.err = err
		return nil, err
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(dir),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.WindowSize(1280, 800),
		// A renderer process per tab (each test's tab has a browser context
		// of its own) cost a process start and a JavaScript engine's warm-up
		// for every test: with the screenshots off, two renderers shared by
		// every tab took the browser tests from 51 to 43 s of the machine's
		// CPU. The contexts still share no cookies, storage or cache.
		chromedp.Flag("renderer-process-limit", "2"),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(allocCtx)
	stop := func() error {
		cancelBrowser()
		cancelAlloc()
		return os.RemoveAll(dir)
	}
	// The browser lives as long as ctx, so the start is bounded by a timer
	// rather than by a context with a deadline.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	select {
	case err = <-started:
	case <-time.After(browserTimeout):
		err = fmt.Errorf("no answer within %s", browserTimeout)
	}
	if err != nil {
		_ = stop()
		sharedBrowser.err = fmt.Errorf("%s does not start: %w", path, err)
		return nil, sharedBrowser.err
	}
	pgtest.AtEnd(stop)
	sharedBrowser.ctx, sharedBrowser.path = ctx, path
	return ctx, nil
}

// MustBrowser opens a tab at 1280×800 in a new browser context (no cookies or
// storage of another test) of the test binary's one headless Chromium, which
// it starts with a fresh profile in a temporary directory the first time; the
// tab and its context are closed in tb.Cleanup. Without a browser the test is
// skipped, or fails when CI=true. Every console message is recorded; see
// AssertNoConsoleErrors. WaitFor may run the dashboard's refresh early; see
// refreshHook.
func MustBrowser(tb testing.TB) *testBrowser {
	tb.Helper()
	path := findBrowser()
	if path == "" {
		browserUnavailable(tb, "no Chromium or Chrome found (looked for chromium, chromium-browser, google-chrome on PATH and $"+
			envBrowser+"); install the Debian package chromium to run the dashboard's browser tests")
	}
	root, err := startBrowser(path)
	if err != nil {
		browserUnavailable(tb, err.Error())
	}
	ctx, cancelTimeout := context.WithTimeout(root, browserTimeout)
	bctx, cancelTab := chromedp.NewContext(ctx, chromedp.WithNewBrowserContext())
	tb.Cleanup(func() {
		cancelTab()
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
	if _, err := chromedp.Call(bctx, page.AddScriptToEvaluateOnNewDocument,
		page.AddScriptToEvaluateOnNewDocumentParams{Source: refreshHook}); err != nil {
		browserUnavailable(tb, fmt.Sprintf("%s opens no tab: %v", path, err))
	}
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		browserUnavailable(tb, fmt.Sprintf("%s opens no tab: %v", path, err))
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
// The element is found and read in one evaluation: the dashboard's refresh
// replaces elements, and a node found by one protocol call can be gone by the
// next.
func (b *testBrowser) Text(sel string) string {
	b.tb.Helper()
	q, err := json.Marshal(sel)
	require.NoError(b.tb, err)
	el := `document.querySelector(` + string(q) + `)`
	b.WaitFor("a visible "+sel, `((el) => !!el && !!(el.offsetWidth || el.offsetHeight || el.getClientRects().length))(`+el+`)`, uiWait)
	return b.Eval(`(` + el + `)?.innerText ?? ''`)
}

// WaitFor polls a JavaScript predicate until it is true (within timeout), and
// fails the test with what with the page's text otherwise. A predicate still
// false after waitRefreshAfter has the dashboard refresh its page early (see
// refreshHook).
func (b *testBrowser) WaitFor(what, predicate string, timeout time.Duration) {
	b.tb.Helper()
	b.mu.Lock()
	b.waits++
	id := b.waits
	b.mu.Unlock()
	wait := fmt.Sprintf(`((ok) => window.__keybrakeWait ? window.__keybrakeWait(%d, ok) : ok)(!!(%s))`, id, predicate)
	_, err := chromedp.Run(b.ctx, chromedp.Poll[chromedp.Void](wait,
		chromedp.WithPollingTimeout(timeout), chromedp.WithPollingInterval(100*time.Millisecond)))
	if err != nil {
		text, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
		require.NoError(b.tb, err, "waiting for %s; the page says:\n%s", what, text)
	}
}

// Screenshot saves a screenshot of the whole page as dir/name.png and returns
// its path; with dir "" (see screenshotDir) it takes none and returns "".
func (b *testBrowser) Screenshot(dir, name string) string {
	b.tb.Helper()
	if dir == "" {
		return ""
	}
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

// screenshotDir returns where the browser tests write screenshots:
// $KEYBRAKE_SCREENSHOTS, or with -update-docs a new temporary directory that
// outlives the test (its path is logged), or "" for none. A full-page
// screenshot re-lays and re-rasters the whole page and encodes a PNG: the
// browser tests' twenty-odd took a quarter of their CPU, for files nobody
// looked at unless asked.
func screenshotDir(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv(envScreenshots)
	switch {
	case dir != "":
		require.NoError(tb, os.MkdirAll(dir, 0o755))
	case *updateDocs:
		var err error
		dir, err = os.MkdirTemp("", "keybrake-dashboard-screenshots-")
		require.NoError(tb, err)
	default:
		return ""
	}
	tb.Logf("dashboard screenshots: %s", dir)
	return dir
}
