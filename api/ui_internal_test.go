package api

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUIBundleVersionFollowsTheAssets(t *testing.T) {
	t.Parallel()
	files := fstest.MapFS{
		"index.html":  {Data: []byte(`<script type="module" src="{{assets}}/js/app.js"></script>`)},
		"js/app.js":   {Data: []byte(`import './b.js';`)},
		"js/b.js":     {Data: []byte(`export const b = 1;`)},
		"css/app.css": {Data: []byte(`body {}`)},
	}
	b1, err := newUIBundle(files)
	require.NoError(t, err)
	assert.Len(t, b1.version, 16)
	assert.Equal(t, `<script type="module" src="/ui/assets/`+b1.version+`/js/app.js"></script>`, string(b1.index.body))
	assert.Len(t, b1.assets, 3)
	assert.Equal(t, "text/javascript; charset=utf-8", b1.assets["js/b.js"].contentType)

	// Any change to any asset is a new version, so cached copies are never stale.
	files["js/b.js"] = &fstest.MapFile{Data: []byte(`export const b = 2;`)}
	b2, err := newUIBundle(files)
	require.NoError(t, err)
	assert.NotEqual(t, b1.version, b2.version)
	assert.NotEqual(t, b1.index.etag, b2.index.etag, "the page names the new version")
	assert.Equal(t, b1.assets["js/app.js"].etag, b2.assets["js/app.js"].etag, "an unchanged file keeps its ETag")
	assert.NotEqual(t, b1.assets["js/b.js"].etag, b2.assets["js/b.js"].etag)

	files["notes.txt"] = &fstest.MapFile{Data: []byte("x")}
	_, err = newUIBundle(files)
	assert.ErrorContains(t, err, "notes.txt", "a file of an unknown type is refused, not served as anything")
	delete(files, "notes.txt")
	delete(files, "index.html")
	_, err = newUIBundle(files)
	assert.ErrorContains(t, err, "index.html")

	b, err := loadUI()
	require.NoError(t, err, "the embedded dashboard")
	assert.False(t, strings.Contains(string(b.index.body), uiAssetsPlaceholder))
}

func TestETagMatches(t *testing.T) {
	t.Parallel()
	for header, want := range map[string]bool{
		`"abc"`: true, `W/"abc"`: true, `"x", "abc"`: true, `"x",W/"abc"`: true, `*`: true,
		``: false, `"ab"`: false, `abc`: false, `"abcd"`: false,
	} {
		assert.Equal(t, want, etagMatches(header, `"abc"`), header)
	}
}
