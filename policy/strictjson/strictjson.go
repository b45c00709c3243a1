// Package strictjson reads JSON from outside keybrake without the ambiguity
// encoding/json resolves silently: an object member given twice, of which
// encoding/json keeps the last ({"daily_cap":"10","daily_cap":null} would quietly
// remove a cap). Policies, the bodies of the admin and agent APIs and Stripe v2
// bodies are all checked with it. It lives under policy/, the lowest layer, so
// that every package may use it; it imports only the standard library.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Duplicate is an object member given twice in the same object.
type Duplicate struct {
	// Path is where the member is, from the root: member names joined by ".",
	// array elements as "[i]" ("a[0].b").
	Path string
	// Name is the member's name ("b").
	Name string
}

// ErrTooDeep is Duplicates' error for a document nested deeper than it allows.
var ErrTooDeep = errors.New("nested too deeply")

// ErrTrailingData is Duplicates' error for anything but white space after the
// document's value.
var ErrTrailingData = errors.New("data after the JSON value")

// Duplicates returns every object member of the JSON document data whose name
// appears more than once in the same object, in document order. Names are
// compared exactly ("Name" and "name" are two members). data must be one JSON
// value with nothing after it but white space, nested at most maxDepth objects
// and arrays deep (no bound when maxDepth is 0); otherwise the error is
// encoding/json's, ErrTrailingData, or one wrapping ErrTooDeep, and comes with
// the duplicates found before it. The walk keeps one set of names per open
// object, so its memory is bounded by the nesting, not by the document.
func Duplicates(data []byte, maxDepth int) ([]Duplicate, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var (
		dups  []Duplicate
		stack []*frame // the open objects and arrays, innermost last
	)
	for {
		tok, err := dec.Token()
		if err != nil {
			return dups, err
		}
		top := (*frame)(nil)
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch {
		case top != nil && top.object && top.wantName && tok != json.Delim('}'):
			name, _ := tok.(string) // the decoder only gives strings here
			if top.names[name] {
				dups = append(dups, Duplicate{Path: join(top.path, name), Name: name})
			}
			top.names[name], top.name, top.wantName = true, name, false
			continue
		case tok == json.Delim('{') || tok == json.Delim('['):
			if maxDepth > 0 && len(stack) == maxDepth {
				return dups, fmt.Errorf("more than %d levels: %w", maxDepth, ErrTooDeep)
			}
			f := &frame{object: tok == json.Delim('{'), path: top.childPath()}
			if f.object {
				f.names, f.wantName = map[string]bool{}, true
			}
			stack = append(stack, f)
			continue
		case tok == json.Delim('}') || tok == json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value is complete: the enclosing container moves on.
		if len(stack) == 0 {
			break
		}
		stack[len(stack)-1].next()
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return dups, ErrTrailingData
	}
	return dups, nil
}

// frame is an open object or array.
type frame struct {
	object   bool
	path     string
	names    map[string]bool // an object's member names so far
	name     string          // the member whose value is being read
	wantName bool            // an object expects a member name (or its end)
	index    int             // the element being read (arrays)
}

// childPath is the path of the value f reads now; "" at the root (f nil).
func (f *frame) childPath() string {
	switch {
	case f == nil:
		return ""
	case f.object:
		return join(f.path, f.name)
	default:
		return fmt.Sprintf("%s[%d]", f.path, f.index)
	}
}

// next moves f past the value it was reading.
func (f *frame) next() {
	if f.object {
		f.wantName = true
	} else {
		f.index++
	}
}

// join appends a member name to a path.
func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
