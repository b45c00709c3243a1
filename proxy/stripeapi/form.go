package stripeapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/keybrake/keybrake/policy/strictjson"
)

// maxKeyDepth bounds the nesting of one parameter key ("a[b][c]" has depth 3).
// Stripe's deepest documented parameters have depth 5; Rack refuses beyond 32.
const maxKeyDepth = 16

// keySegsOnStack is how many segments of a key parseKey's callers keep on
// their stack; a deeper key's segments go to the heap.
const keySegsOnStack = 4

// Value kinds of a parameter. Form parameters are always strings; JSON bodies (v2)
// also carry numbers (literal text), booleans, null and empty containers, which
// Canonical keeps apart so {"a":1} and {"a":"1"} do not share a fingerprint.
const (
	kindString      = 's'
	kindNumber      = 'n'
	kindBool        = 'b'
	kindNull        = 'z'
	kindEmptyObject = 'o'
	kindEmptyArray  = 'a'
)

// paramNodeKind says what a key of the parameter tree holds.
type paramNodeKind uint8

const (
	nodeScalar paramNodeKind = iota + 1
	nodeHash                 // "a[b]=…": named children
	nodeArray                // "a[]=…": scalar elements in body order
)

// paramNode is one element of the parsed parameter tree, used to detect duplicates and
// scalar/container conflicts exactly as a Rack parser would see them.
type paramNode struct {
	kind     paramNodeKind
	value    string
	vkind    byte
	children map[string]*paramNode
	elems    []string
}

func newParamHash() *paramNode { return &paramNode{kind: nodeHash, children: map[string]*paramNode{}} }

func formErr(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrMalformed)
}

// ParseForm parses an application/x-www-form-urlencoded body ("+" and "%20" for
// spaces, percent-encoded brackets accepted).
//
// The grammar is strict, so that keybrake and Stripe cannot read one body two ways:
//   - pairs are separated by "&"; an empty pair ("a=1&&b=2", a leading or trailing
//     "&") and a pair without "=" are refused (Rack reads "a" as nil, Go as "");
//   - the raw body may not contain spaces, control characters or ";" (Rack 2 also
//     splits on ";" and strips spaces after a separator);
//   - keys and values are percent-decoded first ("%5B" is "["), then the key is
//     parsed as name("[" segment "]")*; names and segments may not be empty, except a
//     final "[]" (array append); "[]" followed by more nesting is refused; at most
//     16 levels;
//   - a scalar key given twice (whatever the values), a key used both as a scalar and
//     as a container, and a container used both as a hash ("a[0]", "a[x]") and as an
//     array ("a[]") are refused;
//   - key segments with leading or trailing spaces, or all-digit segments with a
//     leading zero ("a[01]", which an integer-keyed array would read as index 1) are
//     refused;
//   - decoded keys and values must be valid UTF-8; keys may hold no control
//     character, values none except tab, line feed and carriage return (multi-line
//     descriptions are legitimate).
//
// An empty body is valid and has no parameters. Every refusal wraps ErrMalformed.
func ParseForm(body []byte) (*Params, error) {
	p := &Params{root: newParamHash()}
	if len(body) == 0 {
		return p, nil
	}
	for i, b := range body {
		if b <= ' ' || b == 0x7f || b == ';' {
			return nil, formErr("form body: byte %#02x at offset %d must be percent-encoded", b, i)
		}
	}
	for raw := range bytes.SplitSeq(body, []byte{'&'}) {
		if len(raw) == 0 {
			return nil, formErr("form body: empty parameter")
		}
		rk, rv, ok := bytes.Cut(raw, []byte{'='})
		if !ok {
			return nil, formErr("form body: parameter %q has no \"=\"", clipText(string(raw)))
		}
		key, err := formUnescape(rk)
		if err != nil {
			return nil, fmt.Errorf("form key: %w", err)
		}
		value, err := formUnescape(rv)
		if err != nil {
			return nil, fmt.Errorf("form value of %q: %w", clipText(key), err)
		}
		if err := checkValue(value); err != nil {
			return nil, fmt.Errorf("form value of %q: %w", clipText(key), err)
		}
		if err := p.add(key, value, kindString); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// formUnescape decodes "+" as a space and "%XX" as a byte, and checks that the result
// is valid UTF-8.
func formUnescape(s []byte) (string, error) {
	if bytes.IndexByte(s, '%') < 0 && bytes.IndexByte(s, '+') < 0 {
		if !utf8.Valid(s) {
			return "", formErr("invalid UTF-8")
		}
		return string(s), nil
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '+':
			b.WriteByte(' ')
		case '%':
			if i+2 >= len(s) || !formIsHex(s[i+1]) || !formIsHex(s[i+2]) {
				return "", formErr("invalid percent-encoding")
			}
			b.WriteByte(formUnhex(s[i+1])<<4 | formUnhex(s[i+2]))
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	out := b.String()
	if !utf8.ValidString(out) {
		return "", formErr("invalid UTF-8")
	}
	return out, nil
}

func formIsHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func formUnhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

// checkValue refuses control characters in a decoded value, except tab, LF and CR.
func checkValue(v string) error {
	for _, r := range v {
		if r == '\t' || r == '\n' || r == '\r' {
			continue
		}
		if unicode.IsControl(r) {
			return formErr("control character %U in value", r)
		}
	}
	return nil
}

// checkSegment refuses a key name or segment that another parser could read
// differently.
func checkSegment(s string) error {
	for _, r := range s {
		if unicode.IsControl(r) {
			return formErr("control character %U in key", r)
		}
	}
	if strings.TrimSpace(s) != s {
		return formErr("key segment %q has leading or trailing spaces", clipText(s))
	}
	if len(s) > 1 && s[0] == '0' && isDigits(s) {
		return formErr("key segment %q has a leading zero", clipText(s))
	}
	return nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseKey splits a decoded key into its name and bracketed segments, appended to
// buf[:0] (a caller's array on its stack: most keys have a few segments, and
// parsing every key of every request then allocates nothing). appendArr is true
// when the key ends in "[]" (the "[]" itself is not among segs).
func parseKey(key string, buf []string) (segs []string, appendArr bool, err error) {
	segs = buf[:0]
	if key == "" {
		return nil, false, formErr("empty key")
	}
	open := strings.IndexAny(key, "[]")
	if open < 0 {
		if err := checkSegment(key); err != nil {
			return nil, false, err
		}
		return append(segs, key), false, nil
	}
	if open == 0 {
		return nil, false, formErr("key %q has an empty name", clipText(key))
	}
	if key[open] == ']' {
		return nil, false, formErr("key %q has unbalanced brackets", clipText(key))
	}
	segs = append(segs, key[:open])
	rest := key[open:]
	for rest != "" {
		if rest[0] != '[' {
			return nil, false, formErr("key %q has text after a bracket", clipText(key))
		}
		end := strings.IndexAny(rest[1:], "[]")
		if end < 0 || rest[1+end] != ']' {
			return nil, false, formErr("key %q has unbalanced brackets", clipText(key))
		}
		seg := rest[1 : 1+end]
		rest = rest[2+end:]
		if seg == "" {
			if rest != "" {
				return nil, false, formErr("key %q nests after \"[]\"", clipText(key))
			}
			appendArr = true
			break
		}
		segs = append(segs, seg)
	}
	if len(segs)+boolInt(appendArr) > maxKeyDepth {
		return nil, false, formErr("key %q nests deeper than %d", clipText(key), maxKeyDepth)
	}
	for _, s := range segs {
		if err := checkSegment(s); err != nil {
			return nil, false, err
		}
	}
	return segs, appendArr, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// add inserts one decoded pair into the tree, refusing duplicates and conflicts.
func (p *Params) add(key, value string, vkind byte) error {
	var buf [keySegsOnStack]string
	segs, appendArr, err := parseKey(key, buf[:])
	if err != nil {
		return err
	}
	n := p.root
	for i, s := range segs {
		last := i == len(segs)-1
		child := n.children[s]
		switch {
		case last && !appendArr:
			if child != nil {
				if child.kind == nodeScalar {
					return formErr("parameter %q given twice", clipText(key))
				}
				return formErr("parameter %q used both as a scalar and as a container", clipText(key))
			}
			n.children[s] = &paramNode{kind: nodeScalar, value: value, vkind: vkind}
		default:
			want := nodeHash
			if last {
				want = nodeArray
			}
			if child == nil {
				child = &paramNode{kind: want}
				if want == nodeHash {
					child.children = map[string]*paramNode{}
				}
				n.children[s] = child
			} else if child.kind != want {
				return formErr("parameter %q conflicts with an earlier parameter of another shape", clipText(key))
			}
			n = child
		}
	}
	if appendArr {
		n.elems = append(n.elems, value)
	}
	p.pairs = append(p.pairs, Pair{Key: key, Value: value})
	p.kinds = append(p.kinds, vkind)
	return nil
}

// Clip shortens caller-supplied text for messages and logs: at most 200 bytes.
func Clip(s string) string {
	const n = 200
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// clipText keeps parse error messages short when they quote request text.
func clipText(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}

// find walks the tree to the node named by key; appendArr keys ("a[]") name the
// array node itself.
func (p *Params) find(key string) *paramNode {
	if p == nil || p.root == nil {
		return nil
	}
	var buf [keySegsOnStack]string
	segs, _, err := parseKey(key, buf[:])
	if err != nil {
		return nil
	}
	n := p.root
	for _, s := range segs {
		if n.kind != nodeHash {
			return nil
		}
		n = n.children[s]
		if n == nil {
			return nil
		}
	}
	return n
}

// Get returns the value of a scalar key ("amount", "metadata[billing_period]").
// It returns false for an absent key, for a key that holds a hash or an array, and
// for JSON null and empty containers.
func (p *Params) Get(key string) (string, bool) {
	n := p.find(key)
	if n == nil || n.kind != nodeScalar {
		return "", false
	}
	switch n.vkind {
	case kindNull, kindEmptyObject, kindEmptyArray:
		return "", false
	}
	return n.value, true
}

// Has reports whether key is present in any shape (scalar, hash or array).
func (p *Params) Has(key string) bool { return p.find(key) != nil }

// IsContainer reports whether key holds a hash ("a[b]=…") or an array ("a[]=…")
// rather than a scalar.
func (p *Params) IsContainer(key string) bool {
	n := p.find(key)
	return n != nil && n.kind != nodeScalar
}

// Values returns the elements of an array key ("expand" or "expand[]" for
// "expand[]=a&expand[]=b") in body order, or nil when key is not an array.
func (p *Params) Values(key string) []string {
	n := p.find(strings.TrimSuffix(key, "[]"))
	if n == nil || n.kind != nodeArray {
		return nil
	}
	return slices.Clone(n.elems)
}

// Keys returns the child names of a hash key in sorted order ("line_items" gives
// "0", "1", …; "" gives the top-level names), or nil when key is not a hash.
func (p *Params) Keys(key string) []string {
	var n *paramNode
	if key == "" {
		if p != nil {
			n = p.root
		}
	} else {
		n = p.find(key)
	}
	if n == nil || n.kind != nodeHash {
		return nil
	}
	keys := make([]string, 0, len(n.children))
	for k := range n.children {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Len returns the number of parameters (pairs).
func (p *Params) Len() int {
	if p == nil {
		return 0
	}
	return len(p.pairs)
}

// sortedIndex returns the pair indexes sorted by key; pairs of one array key keep
// their body order (a stable sort), since array order matters to Stripe.
func (p *Params) sortedIndex() []int {
	idx := make([]int, len(p.pairs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return strings.Compare(p.pairs[a].Key, p.pairs[b].Key) })
	return idx
}

// Canonical returns a deterministic encoding of the parameters for fingerprints:
// decoded, sorted by key, elements of one array ("a[]") in body order, each pair
// written as kind, len(key) ":" key, len(value) ":" value, so no two parameter sets
// share an encoding. Two bodies Stripe reads the same way through the same syntax
// have the same canonical form whatever the SDK's percent-encoding and pair order.
// "a[0]=x" and "a[]=x" stay distinct (keybrake does not guess how Stripe folds an
// integer-keyed hash into an array); a retry that switches syntax is refused as a
// changed request, which is the safe side.
func (p *Params) Canonical() []byte {
	if p == nil {
		return []byte{}
	}
	var b []byte
	for _, i := range p.sortedIndex() {
		pr := p.pairs[i]
		b = append(b, p.kinds[i])
		b = strconv.AppendInt(b, int64(len(pr.Key)), 10)
		b = append(b, ':')
		b = append(b, pr.Key...)
		b = strconv.AppendInt(b, int64(len(pr.Value)), 10)
		b = append(b, ':')
		b = append(b, pr.Value...)
	}
	if b == nil {
		b = []byte{}
	}
	return b
}

// Encode returns the parameters as a form body in canonical order, every key and
// value percent-encoded. ParseForm(p.Encode()) has the same Canonical as p for
// parameters that came from a form.
func (p *Params) Encode() []byte {
	if p == nil {
		return []byte{}
	}
	var b []byte
	for n, i := range p.sortedIndex() {
		if n > 0 {
			b = append(b, '&')
		}
		b = append(b, url.QueryEscape(p.pairs[i].Key)...)
		b = append(b, '=')
		b = append(b, url.QueryEscape(p.pairs[i].Value)...)
	}
	if b == nil {
		b = []byte{}
	}
	return b
}

// ParseJSON parses a JSON request body (Stripe's v2 API) into the same key syntax as
// a form: {"a":{"b":[{"c":1}]}} gives "a[b][0][c]"="1". Numbers keep their literal
// text; true and false are "true" and "false"; null and empty objects and arrays are
// kept as leaves that Get does not return but Canonical does. The body must be one
// JSON object (or empty); duplicate keys in an object (which encoding/json would
// silently resolve to the last), keys that are empty, contain brackets or control
// characters, invalid UTF-8, strings holding U+FFFD (what encoding/json makes of
// lone surrogates) and trailing data are refused with ErrMalformed.
func ParseJSON(body []byte) (*Params, error) {
	p := &Params{root: newParamHash()}
	if len(bytes.TrimSpace(body)) == 0 {
		return p, nil
	}
	if !utf8.Valid(body) {
		return nil, formErr("json body: invalid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, formErr("json body: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, formErr("json body: not an object")
	}
	// encoding/json would resolve a member given twice silently; and two
	// {"a":{…}} with different members would merge into one hash here.
	dups, err := strictjson.Duplicates(body, maxKeyDepth)
	switch {
	case errors.Is(err, strictjson.ErrTooDeep):
		return nil, formErr("json body: nested deeper than %d", maxKeyDepth)
	case errors.Is(err, strictjson.ErrTrailingData):
		return nil, formErr("json body: data after the object")
	case err != nil:
		return nil, formErr("json body: %v", err)
	case len(dups) > 0:
		return nil, formErr("json body: key %q given twice", clipText(dups[0].Name))
	}
	if err := p.jsonObject(dec, "", 1); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, formErr("json body: data after the object")
	}
	return p, nil
}

// jsonObject reads the members of an object whose "{" was consumed; ParseJSON
// has checked that no member is given twice.
func (p *Params) jsonObject(dec *json.Decoder, prefix string, depth int) error {
	if depth > maxKeyDepth {
		return formErr("json body: nested deeper than %d", maxKeyDepth)
	}
	empty := true
	for {
		tok, err := dec.Token()
		if err != nil {
			return formErr("json body: %v", err)
		}
		if d, ok := tok.(json.Delim); ok && d == '}' {
			break
		}
		name, ok := tok.(string)
		if !ok {
			return formErr("json body: object key expected")
		}
		if name == "" || strings.ContainsAny(name, "[]") || strings.ContainsRune(name, utf8.RuneError) {
			return formErr("json body: key %q not allowed", clipText(name))
		}
		empty = false
		key := name
		if prefix != "" {
			key = prefix + "[" + name + "]"
		}
		if err := p.jsonValue(dec, key, depth); err != nil {
			return err
		}
	}
	if empty && prefix != "" {
		return p.add(prefix, "{}", kindEmptyObject)
	}
	return nil
}

// jsonValue reads one value and adds it under key.
func (p *Params) jsonValue(dec *json.Decoder, key string, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return formErr("json body: %v", err)
	}
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			return p.jsonObject(dec, key, depth+1)
		}
		if v != '[' {
			return formErr("json body: unexpected %q", v)
		}
		if depth+1 > maxKeyDepth {
			return formErr("json body: nested deeper than %d", maxKeyDepth)
		}
		i := 0
		for dec.More() {
			if err := p.jsonValue(dec, key+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
				return err
			}
			i++
		}
		if _, err := dec.Token(); err != nil {
			return formErr("json body: %v", err)
		}
		if i == 0 {
			return p.add(key, "[]", kindEmptyArray)
		}
		return nil
	case string:
		if strings.ContainsRune(v, utf8.RuneError) {
			return formErr("json body: value of %q holds U+FFFD", clipText(key))
		}
		if err := checkValue(v); err != nil {
			return fmt.Errorf("json value of %q: %w", clipText(key), err)
		}
		return p.add(key, v, kindString)
	case json.Number:
		return p.add(key, v.String(), kindNumber)
	case bool:
		return p.add(key, strconv.FormatBool(v), kindBool)
	case nil:
		return p.add(key, "null", kindNull)
	default:
		return formErr("json body: unexpected token")
	}
}
