package api

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/web"
)

// UIPath is where the admin listener serves the web dashboard.
const UIPath = "/ui/"

// uiAssetsPrefix is the path of the dashboard's assets; the segment after it is
// the version (a hash of every asset), so an asset's URL changes with its content
// and can be cached for good.
const uiAssetsPrefix = UIPath + "assets/"

// uiAssetsPlaceholder is what index.html writes where the versioned asset path
// goes.
const uiAssetsPlaceholder = "{{assets}}"

// UIContentSecurityPolicy is the Content-Security-Policy of every dashboard answer:
// scripts, styles, images and API calls from this origin only, no inline script or
// style, no plugins, no framing, and no form submission (forms are handled by
// script; a form that did submit would put its fields, a token among them, in a
// URL).
const UIContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// uiContentTypes are the media types of the dashboard's files, by extension (not
// from the host's mime tables, so the answer does not depend on the machine).
var uiContentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
}

// uiFile is one file of the dashboard, ready to serve.
type uiFile struct {
	body        []byte
	contentType string
	etag        string // strong: a hash of body
}

// uiBundle is the dashboard: index.html with its asset paths filled in, and the
// assets by their path below the version.
type uiBundle struct {
	version string
	index   uiFile
	assets  map[string]uiFile
}

// loadUI reads the embedded dashboard once.
var loadUI = sync.OnceValues(func() (*uiBundle, error) { return newUIBundle(web.Files()) })

// newUIBundle reads every file of files, computes the version and fills in
// index.html.
func newUIBundle(files fs.FS) (*uiBundle, error) {
	b := &uiBundle{assets: map[string]uiFile{}}
	var rawIndex []byte
	h := sha256.New()
	err := fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		if p == "index.html" {
			rawIndex = body
			return nil
		}
		ct, ok := uiContentTypes[path.Ext(p)]
		if !ok {
			return fmt.Errorf("dashboard file %s: no content type for its extension", p)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(body))
		h.Write(body)
		b.assets[p] = newUIFile(body, ct)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read dashboard: %w", err)
	}
	if rawIndex == nil {
		return nil, fmt.Errorf("read dashboard: no index.html")
	}
	b.version = hex.EncodeToString(h.Sum(nil))[:16]
	index := strings.ReplaceAll(string(rawIndex), uiAssetsPlaceholder, uiAssetsPrefix+b.version)
	b.index = newUIFile([]byte(index), uiContentTypes[".html"])
	return b, nil
}

func newUIFile(body []byte, contentType string) uiFile {
	sum := sha256.Sum256(body)
	return uiFile{body: body, contentType: contentType, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
}

// mountUI adds the dashboard's routes to e: /ui/ (the page), its assets, and
// redirects from / and /ui to /ui/.
func mountUI(e *echo.Echo, b *uiBundle) {
	e.GET("/", uiRedirect, uiHeaders)
	e.GET(strings.TrimSuffix(UIPath, "/"), uiRedirect, uiHeaders)
	e.GET(UIPath, func(c echo.Context) error {
		// The page names the current asset version, so it is revalidated on every load.
		return serveUIFile(c, b.index, "no-cache")
	}, uiHeaders)
	e.GET(uiAssetsPrefix+":version/*", func(c echo.Context) error {
		f, ok := b.assets[c.Param("*")]
		if !ok || c.Param("version") != b.version {
			// An old page asking for an old version gets no new content under
			// the old name: it would be cached as immutable.
			return newProblem(http.StatusNotFound, "no such dashboard file")
		}
		return serveUIFile(c, f, "public, max-age=31536000, immutable")
	}, uiHeaders)
}

// uiRedirect sends / and /ui to the dashboard.
func uiRedirect(c echo.Context) error {
	return c.Redirect(http.StatusFound, UIPath)
}

// uiHeaders sets the dashboard's security headers on every answer, errors too.
func uiHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Content-Security-Policy", UIContentSecurityPolicy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		return next(c)
	}
}

// serveUIFile answers with f, or 304 when the client has it (If-None-Match).
func serveUIFile(c echo.Context, f uiFile, cacheControl string) error {
	h := c.Response().Header()
	h.Set("Cache-Control", cacheControl)
	h.Set("ETag", f.etag)
	if etagMatches(c.Request().Header.Get("If-None-Match"), f.etag) {
		return c.NoContent(http.StatusNotModified)
	}
	return c.Blob(http.StatusOK, f.contentType, f.body)
}

// etagMatches reports whether an If-None-Match header names etag (weak
// comparison, as RFC 9110 asks for If-None-Match) or is "*".
func etagMatches(header, etag string) bool {
	if header == "" {
		return false
	}
	tags := strings.Split(header, ",")
	for i := range tags {
		tags[i] = strings.TrimPrefix(strings.TrimSpace(tags[i]), "W/")
	}
	return slices.Contains(tags, etag) || slices.Contains(tags, "*")
}
