package api_test

import (
	"io/fs"
	"net/http"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/web"
)

// assertUIHeaders checks the security headers every dashboard answer carries.
func assertUIHeaders(tb testing.TB, r adminResponse, what string) {
	tb.Helper()
	assert.Equal(tb, api.UIContentSecurityPolicy, r.Header.Get("Content-Security-Policy"), what)
	assert.Equal(tb, "DENY", r.Header.Get("X-Frame-Options"), what)
	assert.Equal(tb, "no-referrer", r.Header.Get("Referrer-Policy"), what)
	assert.Equal(tb, "nosniff", r.Header.Get("X-Content-Type-Options"), what)
	assert.Equal(tb, "same-origin", r.Header.Get("Cross-Origin-Opener-Policy"), what)
}

// assetRE finds the versioned asset paths index.html refers to.
var assetRE = regexp.MustCompile(`(?:src|href)="(/ui/assets/[0-9a-f]{16}/[^"]+)"`)

func TestUIPageIsServedWithAStrictPolicy(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)

	r := env.Do(http.MethodGet, "/ui/", "", nil)
	require.Equal(t, http.StatusOK, r.Status, "the page itself needs no token: %s", r.Body)
	assertUIHeaders(t, r, "/ui/")
	assert.Equal(t, "text/html; charset=utf-8", r.Header.Get("Content-Type"))
	assert.Equal(t, "no-cache", r.Header.Get("Cache-Control"), "the page is revalidated: it names the current assets")
	assert.Regexp(t, `^"[0-9a-f]{32}"$`, r.Header.Get("ETag"))
	page := string(r.Body)
	assert.NotContains(t, page, "{{assets}}")

	// The CSP forbids inline script and style: the page has none.
	scripts := regexp.MustCompile(`<script [^>]*src="[^"]+"[^>]*></script>`).FindAllString(page, -1)
	assert.Equal(t, strings.Count(page, "<script"), len(scripts), "every script is a file, none is inline")
	assert.NotContains(t, page, "<style")
	assert.NotRegexp(t, `\sstyle=`, page)
	assert.NotRegexp(t, `\son[a-z]+=`, page, "no inline event handler")
	for _, directive := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'", "form-action 'none'", "base-uri 'none'"} {
		assert.Contains(t, api.UIContentSecurityPolicy, directive)
	}
	assert.NotContains(t, api.UIContentSecurityPolicy, "unsafe")

	// The same page again, revalidated: 304 with nothing in the body.
	for _, inm := range []string{r.Header.Get("ETag"), "W/" + r.Header.Get("ETag"), `"other", ` + r.Header.Get("ETag"), "*"} {
		again := env.Do(http.MethodGet, "/ui/", "", nil, "If-None-Match", inm)
		assert.Equal(t, http.StatusNotModified, again.Status, inm)
		assert.Empty(t, again.Body)
		assert.Equal(t, r.Header.Get("ETag"), again.Header.Get("ETag"))
		assertUIHeaders(t, again, "304")
	}
	changed := env.Do(http.MethodGet, "/ui/", "", nil, "If-None-Match", `"stale"`)
	assert.Equal(t, http.StatusOK, changed.Status)
	assert.Equal(t, r.Body, changed.Body)

	// Every asset the page names is served, cacheable for good under its version.
	assets := assetRE.FindAllStringSubmatch(page, -1)
	require.GreaterOrEqual(t, len(assets), 3, "icon, stylesheet, script: %s", page)
	for _, m := range assets {
		a := env.Do(http.MethodGet, m[1], "", nil)
		require.Equal(t, http.StatusOK, a.Status, m[1])
		assertUIHeaders(t, a, m[1])
		assert.Equal(t, "public, max-age=31536000, immutable", a.Header.Get("Cache-Control"), m[1])
		again := env.Do(http.MethodGet, m[1], "", nil, "If-None-Match", a.Header.Get("ETag"))
		assert.Equal(t, http.StatusNotModified, again.Status, m[1])
	}
}

func TestUIServesEveryFileWithItsType(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	r := env.Do(http.MethodGet, "/ui/", "", nil)
	require.Equal(t, http.StatusOK, r.Status)
	m := assetRE.FindStringSubmatch(string(r.Body))
	require.NotNil(t, m)
	base := m[1][:len("/ui/assets/")+16] + "/"
	types := map[string]string{
		".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml",
	}
	n := 0
	err := fs.WalkDir(web.Files(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == "index.html" {
			return err
		}
		n++
		want, err := fs.ReadFile(web.Files(), p)
		require.NoError(t, err)
		a := env.Do(http.MethodGet, base+p, "", nil)
		require.Equal(t, http.StatusOK, a.Status, p)
		assert.Equal(t, want, a.Body, p)
		assert.Equal(t, types[path.Ext(p)], a.Header.Get("Content-Type"), p)
		return nil
	})
	require.NoError(t, err)
	assert.Greater(t, n, 10, "the dashboard's modules")

	for p, status := range map[string]int{
		base + "js/nope.js":                       http.StatusNotFound,
		"/ui/assets/0123456789abcdef/js/app.js":   http.StatusNotFound, // another version
		base + "../index.html":                    http.StatusNotFound,
		base + "js%2f..%2f..%2f..%2fopenapi.json": http.StatusNotFound,
	} {
		a := env.Do(http.MethodGet, p, "", nil)
		assert.Equal(t, status, a.Status, p)
		assertUIHeaders(t, a, p)
	}
}

func TestUIRedirectsToTheDashboard(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, p := range []string{"/", "/ui"} {
		resp, err := client.Get(env.srv.URL + p)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusFound, resp.StatusCode, p)
		assert.Equal(t, "/ui/", resp.Header.Get("Location"), p)
	}
	// Only GET: the dashboard changes nothing itself.
	r := env.Do(http.MethodPost, "/ui/", env.adminToken, "{}")
	assert.Equal(t, http.StatusMethodNotAllowed, r.Status)
	r.Problem(t)
}

// The dashboard's script builds the page with DOM calls only: nothing it reads
// from the API can become markup or code, and nothing needs 'unsafe-inline' or
// 'unsafe-eval' in the CSP.
func TestUIScriptsNeverWriteMarkupOrCode(t *testing.T) {
	t.Parallel()
	forbidden := regexp.MustCompile(`\.innerHTML|\.outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|setAttribute\(['"]style|javascript:`)
	err := fs.WalkDir(web.Files(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".js") {
			return err
		}
		src, err := fs.ReadFile(web.Files(), p)
		require.NoError(t, err)
		for i, line := range strings.Split(string(src), "\n") {
			assert.NotRegexp(t, forbidden, line, "%s:%d", p, i+1)
		}
		return nil
	})
	require.NoError(t, err)
}
