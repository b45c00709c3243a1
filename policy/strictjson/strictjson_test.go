package strictjson_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy/strictjson"
)

func TestDuplicates(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		body  string
		paths []string // nil for none
	}{
		"none":                   {body: `{"a":1,"b":{"a":2},"c":[{"a":1},{"a":2}]}`},
		"top level":              {body: `{"a":1,"b":2,"a":3}`, paths: []string{"a"}},
		"nested":                 {body: `{"policy":{"daily_cap":"1","daily_cap":null}}`, paths: []string{"policy.daily_cap"}},
		"in an array":            {body: `{"x":[{"k":1},{"k":1,"k":2}]}`, paths: []string{"x[1].k"}},
		"after nested objects":   {body: `{"a":{"b":{"c":1}},"d":[1,[2,3]],"a":0}`, paths: []string{"a"}},
		"same name, other level": {body: `{"a":{"a":{"a":1}}}`},
		"case differs":           {body: `{"Name":"x","name":"y"}`},
		"scalar document":        {body: `"x"`},
		"empty object":           {body: `{}`},
		"every one, in order":    {body: `{"a":1,"a":2,"b":{"c":1,"c":2},"a":3}`, paths: []string{"a", "b.c", "a"}},
		"inside a duplicate":     {body: `{"a":{"x":1},"a":{"x":1,"x":2}}`, paths: []string{"a", "a.x"}},
		"nested arrays":          {body: `[[{"k":1}],[{"k":1,"k":1}]]`, paths: []string{"[1][0].k"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dups, err := strictjson.Duplicates([]byte(tc.body), 0)
			require.NoError(t, err)
			var paths []string
			for _, d := range dups {
				paths = append(paths, d.Path)
				assert.True(t, strings.HasSuffix(d.Path, d.Name), "%s names %s", d.Path, d.Name)
			}
			assert.Equal(t, tc.paths, paths)
		})
	}
}

func TestDuplicatesRefusesWhatIsNotOneDocument(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"empty":           ``,
		"syntax":          `{"a":}`,
		"unterminated":    `{"a":[1,2`,
		"two values":      `{"a":1} {"a":2}`,
		"trailing scalar": `1 2`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := strictjson.Duplicates([]byte(body), 0)
			assert.Error(t, err)
		})
	}
	_, err := strictjson.Duplicates([]byte(`{"a":1} {}`), 0)
	assert.ErrorIs(t, err, strictjson.ErrTrailingData)
	dups, err := strictjson.Duplicates([]byte(`{"a":1,"a":2,"b":`), 0)
	assert.Error(t, err)
	assert.Equal(t, []strictjson.Duplicate{{Path: "a", Name: "a"}}, dups, "what was found before the error comes with it")
}

func TestDuplicatesBoundsTheDepth(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat(`{"a":`, 3) + "1" + strings.Repeat("}", 3)
	_, err := strictjson.Duplicates([]byte(deep), 3)
	assert.NoError(t, err, "three levels are allowed")
	_, err = strictjson.Duplicates([]byte(`[`+deep+`]`), 3)
	assert.ErrorIs(t, err, strictjson.ErrTooDeep)
	_, err = strictjson.Duplicates([]byte(strings.Repeat("[", 10000)+strings.Repeat("]", 10000)), 0)
	assert.NoError(t, err, "no bound when maxDepth is 0")
}
