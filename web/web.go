// Package web holds keybrake's admin dashboard: static HTML, CSS and JavaScript
// modules embedded into the binary, with no build step and nothing fetched from
// elsewhere. The api package serves it on the admin listener under /ui/; the page
// talks only to the admin API (/api/v1), with the admin or viewer JWT the user
// signs in with kept in the tab's sessionStorage.
//
// Layout of Files: index.html, whose "{{assets}}" placeholders the server
// replaces with the versioned asset path; css/, js/ (ES modules importing each
// other by relative paths) and img/.
package web

import (
	"embed"
	"io/fs"
)

//go:embed static
var static embed.FS

// Files returns the dashboard's files, rooted at the directory of index.html.
func Files() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // "static" is embedded above: unreachable
	}
	return sub
}
