package proxy

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// MaxIdempotencyKeyLen is the longest idempotency key Stripe (and keybrake) accepts.
const MaxIdempotencyKeyLen = 255

// errIdemKeyInvalid is returned by ParseIdempotencyKey for an unusable key.
var errIdemKeyInvalid = errors.New("invalid idempotency key")

// ParseIdempotencyKey reads the Idempotency-Key header: absent (present=false), a
// bare key as the Stripe SDKs send it, or an RFC 8941 structured-field string
// ("\"abc\"" is abc, with \" and \\ escapes). The decoded key must be 1–255
// printable ASCII characters; the header must not be repeated.
func ParseIdempotencyKey(h http.Header) (key string, present bool, err error) {
	vals, ok := h[http.CanonicalHeaderKey(headerIdempotencyKey)]
	if !ok || len(vals) == 0 {
		return "", false, nil
	}
	if len(vals) > 1 {
		return "", true, fmt.Errorf("header repeated: %w", errIdemKeyInvalid)
	}
	v := strings.Trim(vals[0], " \t")
	if strings.HasPrefix(v, `"`) {
		v, err = parseSFString(v)
		if err != nil {
			return "", true, err
		}
	}
	if v == "" {
		return "", true, fmt.Errorf("empty key: %w", errIdemKeyInvalid)
	}
	if len(v) > MaxIdempotencyKeyLen {
		return "", true, fmt.Errorf("key of %d characters, at most %d: %w", len(v), MaxIdempotencyKeyLen, errIdemKeyInvalid)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e {
			return "", true, fmt.Errorf("non-printable character at %d: %w", i, errIdemKeyInvalid)
		}
	}
	return v, true, nil
}

// parseSFString decodes an RFC 8941 sf-string (the whole value must be one string).
func parseSFString(v string) (string, error) {
	if len(v) < 2 || v[0] != '"' {
		return "", fmt.Errorf("unterminated string: %w", errIdemKeyInvalid)
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("bad escape: %w", errIdemKeyInvalid)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("characters after the closing quote: %w", errIdemKeyInvalid)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("non-printable character: %w", errIdemKeyInvalid)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("unterminated string: %w", errIdemKeyInvalid)
}

// MissingFieldError is returned by DeriveIdempotencyKey when a listed field is
// absent from the request.
type MissingFieldError struct {
	Field string
}

// Error implements error.
func (e *MissingFieldError) Error() string {
	return fmt.Sprintf("idempotency field %q missing from the request", e.Field)
}

// DeriveIdempotencyKey computes the idempotency key of policy mode "derive" from the
// operation and the values of the listed fields (as the form parser decodes them),
// ignoring whatever key the caller sent. A missing field is an error naming it.
// The result is "kbd_" and 64 hex characters.
func DeriveIdempotencyKey(operation string, fields []string, get func(string) (string, bool)) (string, error) {
	h := sha256.New()
	writeField(h, "keybrake-derive-v1")
	writeField(h, operation)
	for _, f := range fields {
		v, ok := get(f)
		if !ok {
			return "", &MissingFieldError{Field: f}
		}
		writeField(h, f)
		writeField(h, v)
	}
	return "kbd_" + hex.EncodeToString(h.Sum(nil)), nil
}

// DeriveCallIdempotencyKey is the idempotency key of a money-moving MCP call
// made without one: the SHA-256 over the vault key's id, the operation and the
// request's fingerprint (method, exact path, accounts, canonical parameters), so
// the same call repeated is the same payment for as long as the record lives
// (the idempotency TTL, 24 h by default), and any other call is another. The
// result is "kbm_" and 64 hex characters.
func DeriveCallIdempotencyKey(keyID, operation, fingerprint string) string {
	h := sha256.New()
	writeField(h, "keybrake-mcp-derive-v1")
	writeField(h, keyID)
	writeField(h, operation)
	writeField(h, fingerprint)
	return "kbm_" + hex.EncodeToString(h.Sum(nil))
}

// Fingerprint is the SHA-256 (hex) over the method, the exact path, the
// Stripe-Account and Stripe-Context values and the canonical parameters: two
// requests with the same fingerprint are the same request to Stripe.
func Fingerprint(method, path, account, context string, canonical []byte) string {
	// The fields are laid out in one buffer (on the stack for a usual request)
	// and hashed at once: what writeField would feed a hash, without its
	// allocations.
	var buf [512]byte
	b := appendField(buf[:0], "keybrake-fingerprint-v1")
	b = appendField(b, method)
	b = appendField(b, path)
	b = appendField(b, account)
	b = appendField(b, context)
	b = binary.BigEndian.AppendUint64(b, uint64(len(canonical)))
	sum := sha256.Sum256(append(b, canonical...))
	return hex.EncodeToString(sum[:])
}

// appendField appends what writeField writes.
func appendField(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint64(b, uint64(len(s))), s...)
}

// writeField writes a length-prefixed field so that no two field lists collide.
func writeField(h interface{ Write([]byte) (int, error) }, s string) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(s)))
	_, _ = h.Write(n[:])
	_, _ = h.Write([]byte(s))
}
