package main

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repoRoot is where the repository's documents are, seen from this package's
// directory (go test runs a package's tests in its own directory).
const repoRoot = "../.."

// The README is a short guide and docs/ the reference (docs/README.md lists
// the pages); every relative link between them, and every #anchor, must lead
// somewhere: a file that exists, a heading that GitHub gives that anchor.
func TestDocumentLinksResolve(t *testing.T) {
	t.Parallel()
	docs := []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md"}
	err := filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(repoRoot, path)
			if err != nil {
				return err
			}
			docs = append(docs, filepath.ToSlash(rel))
		}
		return nil
	})
	require.NoError(t, err)

	anchors := map[string]map[string]bool{} // document → its anchors, read once
	anchorsOf := func(doc string) (map[string]bool, error) {
		if a, ok := anchors[doc]; ok {
			return a, nil
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(doc)))
		if err != nil {
			return nil, err
		}
		a := headingAnchors(string(b))
		anchors[doc] = a
		return a, nil
	}

	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(doc)))
		require.NoError(t, err)
		for _, target := range markdownLinks(string(b)) {
			checked++
			if problem := checkLink(doc, target, anchorsOf); problem != "" {
				t.Errorf("%s: link %q: %s", doc, target, problem)
			}
		}
	}
	// The guide links to the reference: a parser that found nothing proves nothing.
	assert.Greater(t, checked, 100, "links checked")
}

// checkLink says what is wrong with the link target found in doc (a path
// relative to the repository's root), or "" when it resolves.
func checkLink(doc, target string, anchorsOf func(doc string) (map[string]bool, error)) string {
	if u, err := url.Parse(target); err == nil && u.Scheme != "" {
		return "" // http:, https:, mailto: — not this test's business
	}
	path, fragment, _ := strings.Cut(target, "#")
	file := doc
	if path != "" {
		unescaped, err := url.PathUnescape(path)
		if err != nil {
			return err.Error()
		}
		file = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(doc), unescaped)))
		if file == ".." || strings.HasPrefix(file, "../") {
			return "leads out of the repository"
		}
		if _, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(file))); err != nil {
			return fmt.Sprintf("%s does not exist", file)
		}
	}
	if fragment == "" {
		return ""
	}
	if !strings.HasSuffix(file, ".md") {
		return fmt.Sprintf("an anchor into %s, which is not a Markdown document", file)
	}
	a, err := anchorsOf(file)
	if err != nil {
		return err.Error()
	}
	if !a[fragment] {
		return fmt.Sprintf("%s has no heading with the anchor #%s", file, fragment)
	}
	return ""
}

var (
	fence       = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpan    = regexp.MustCompile("`+[^`]*`+")
	inlineLink  = regexp.MustCompile(`!?\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refLinkDef  = regexp.MustCompile(`(?m)^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	atxHeading  = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$`)
	htmlTag     = regexp.MustCompile(`<[^>]+>`)
	htmlAnchors = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// prose is a document without its fenced code blocks, and with its code spans
// blanked: links and headings are only where Markdown renders them.
func prose(doc string) []string {
	var lines []string
	in := false
	for line := range strings.SplitSeq(doc, "\n") {
		if fence.MatchString(line) {
			in = !in
			continue
		}
		if in {
			continue
		}
		lines = append(lines, line)
	}
	return lines
}

// markdownLinks lists the targets of a document's links and images, inline
// (a link's text may wrap onto the next line) and by reference definition.
func markdownLinks(doc string) []string {
	text := strings.Join(prose(doc), "\n")
	text = codeSpan.ReplaceAllString(text, "``")
	var targets []string
	for _, m := range inlineLink.FindAllStringSubmatch(text, -1) {
		targets = append(targets, m[2])
	}
	for _, m := range refLinkDef.FindAllStringSubmatch(text, -1) {
		targets = append(targets, m[1])
	}
	return targets
}

// headingAnchors is the set of anchors GitHub makes for a document's headings
// (headingSlug, with -1, -2, … for repeats) and for its HTML anchors.
func headingAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(doc) {
		for _, m := range htmlAnchors.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := headingSlug(m[2])
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// headingSlug is GitHub's anchor for a heading: the rendered text (code spans
// and links reduced to their text, tags dropped), lower case, every space a
// hyphen, and every character that is not a letter, a digit, a hyphen or an
// underscore dropped — so "Limits — what keybrake cannot meter" is
// "limits--what-keybrake-cannot-meter".
func headingSlug(heading string) string {
	text := inlineLink.ReplaceAllString(heading, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	text = strings.ReplaceAll(text, "`", "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestHeadingSlugIsGitHubs(t *testing.T) {
	t.Parallel()
	for heading, want := range map[string]string{
		"Quickstart":                            "quickstart",
		"Limits — what keybrake cannot meter":   "limits--what-keybrake-cannot-meter",
		"What is refused as `amount_unknown`":   "what-is-refused-as-amount_unknown",
		"Amounts, operation by operation":       "amounts-operation-by-operation",
		"Backups, rekeying, upgrades":           "backups-rekeying-upgrades",
		"1. The request path (`proxy`)":         "1-the-request-path-proxy",
		"See [the README](../README.md) first":  "see-the-readme-first",
		"Ledger and logs":                       "ledger-and-logs",
		"Über `keybrake serve` & the `--flags`": "über-keybrake-serve--the---flags",
	} {
		assert.Equal(t, want, headingSlug(heading), heading)
	}
}

// The checker itself: what it must find, and what it must let through.
func TestLinkCheckerFindsBrokenLinks(t *testing.T) {
	t.Parallel()
	doc := strings.Join([]string{
		"# Title",
		"## Caps and idempotency",
		"## Caps and idempotency",
		"See [caps](#caps-and-idempotency), [again](#caps-and-idempotency-1),",
		"[gone](#no-such-heading), [a file](missing.md), [wrapped",
		"text](#title \"a title\"), ![img](missing.png) and [web](https://example.com/x#y).",
		"`[in code](#not-a-link)`",
		"```",
		"[in a fence](#not-a-link-either)",
		"## Not a heading",
		"```",
		"[ref]: #title",
	}, "\n")
	targets := markdownLinks(doc)
	assert.Equal(t, []string{
		"#caps-and-idempotency", "#caps-and-idempotency-1", "#no-such-heading",
		"missing.md", "#title", "missing.png", "https://example.com/x#y", "#title",
	}, targets)

	anchorsOf := func(string) (map[string]bool, error) { return headingAnchors(doc), nil }
	var broken []string
	for _, target := range targets {
		if checkLink("docs/page.md", target, anchorsOf) != "" {
			broken = append(broken, target)
		}
	}
	sort.Strings(broken)
	assert.Equal(t, []string{"#no-such-heading", "missing.md", "missing.png"}, broken)
	assert.False(t, headingAnchors(doc)["not-a-heading"], "a heading inside a fence")
}

// The quickstart's first command starts keybrake on its embedded defaults and
// its second runs every test,
// and CI runs exactly that second command (.ci/run's run_tests), so what a
// newcomer runs is what CI proves.
func TestQuickstartIsWhatCIRuns(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	_, quickstart, ok := strings.Cut(string(readme), "\n## Quickstart\n")
	require.True(t, ok, "the README has a Quickstart section")
	_, block, ok := strings.Cut(quickstart, "```sh\n")
	require.True(t, ok, "the Quickstart starts with a shell block")
	block, _, _ = strings.Cut(block, "```")
	commands := strings.Split(strings.TrimSpace(block), "\n")
	require.Len(t, commands, 2, "the quickstart's two commands")
	assert.Equal(t, "go run ./cmd/keybrake serve", commands[0])

	ci, err := os.ReadFile(filepath.Join(repoRoot, ".ci", "run"))
	require.NoError(t, err)
	_, runTests, ok := strings.Cut(string(ci), "\nrun_tests() {\n")
	require.True(t, ok, ".ci/run has run_tests")
	runTests, _, _ = strings.Cut(runTests, "\n}")
	var last string
	for line := range strings.SplitSeq(runTests, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			last = line
		}
	}
	assert.Equal(t, commands[1], last, ".ci/run's tests are the README's second command")
}
