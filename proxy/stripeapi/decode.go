package stripeapi

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// DecodeObject decodes a JSON object, nil when body is not one.
//
// It gives exactly what json.Unmarshal into an Object gives (the differential
// fuzz test FuzzDecodeObject holds it to that) without reflection: every
// forwarded money request decodes Stripe's answer, and encoding/json's
// reflective map decoding cost about as much as the rest of reading it.
// json.Valid checks the whole body first, so the walk below only finds where
// each member's key and value end.
func DecodeObject(body []byte) Object {
	if !json.Valid(body) {
		return nil
	}
	i := skipSpace(body, 0)
	if body[i] != '{' {
		return nil // null, an array or a scalar: no object
	}
	o := make(Object, 16)    // most answers have more members: fewer rehashes
	own := bytes.Clone(body) // the values' bytes: one copy, not one per member
	// The members' names, cut from one copy of the body as a string: one
	// allocation, not one per member (a Stripe charge has dozens).
	names := string(body)
	for i = skipSpace(body, i+1); body[i] != '}'; i = skipSpace(body, i+1) {
		end := stringEnd(body, i)
		key := objectKey(names, body, i, end)
		i = skipSpace(body, skipSpace(body, end)+1) // past the colon
		end = valueEnd(body, i)
		o[key] = json.RawMessage(own[i:end:end])
		if i = skipSpace(body, end); body[i] == '}' {
			break
		}
	}
	return o
}

// objectKey is the member name of the quoted JSON string body[i:end]:
// names[i+1:end-1] when the quotes hold the name itself (names is body as a
// string), else what encoding/json makes of its escapes.
func objectKey(names string, body []byte, i, end int) string {
	if isPlain(body[i+1 : end-1]) {
		return names[i+1 : end-1]
	}
	var s string
	_ = json.Unmarshal(body[i:end], &s) // a valid JSON string
	return s
}

// isPlain reports whether `"` + s + `"` is a JSON string that means s itself:
// valid UTF-8 without quotes, backslashes or control characters. Anything
// else is left to encoding/json.
func isPlain(s []byte) bool {
	for _, c := range s {
		if c < 0x20 || c == '"' || c == '\\' {
			return false
		}
	}
	return utf8.Valid(s)
}

// skipSpace returns the index of the first byte of b at or after i that is not
// JSON white space (len(b) when there is none).
func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the index just past the valid JSON string that starts at
// b[i] (its opening quote).
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++ // the escaped byte; a \u escape's hex digits need no care
		case '"':
			return i + 1
		}
	}
	return i
}

// valueEnd returns the index just past the valid JSON value that starts at
// b[i]: a string, an object or array (brackets counted outside strings), or a
// literal (which ends at the first byte that cannot be part of it).
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = stringEnd(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}
