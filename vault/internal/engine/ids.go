package engine

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// lowerBase32 is base32 with the "extended hex" alphabet in lower case and no
// padding. Its alphabet is in ASCII order, so encodings of equal-length big-endian
// byte strings sort like the bytes: ids built from a timestamp prefix sort by time.
var lowerBase32 = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

const (
	tokenPrefix     = vault.TokenPrefix
	tokenRandBytes  = vault.TokenRandBytes
	tokenDisplayLen = 10 // Key.TokenPrefix: "vk_" and 7 more characters
	keyIDPrefix     = "key_"
	keyIDRawLen     = 16 // 48-bit ms timestamp + 80 random bits
	maxIdemKeyLen   = 255
)

// newToken returns a fresh vault key token: "vk_" + base64url of 32 random bytes.
func newToken() (string, error) {
	var b [tokenRandBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("read random token: %w", err)
	}
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// tokenHash is the hex SHA-256 of a token, the only form in which tokens are stored.
func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// wellFormedToken reports whether token looks like one newToken makes, so that
// garbage is refused without a lookup.
func wellFormedToken(token string) bool {
	return vault.CheckTokenShape(token) == nil
}

// newKeyIDRaw returns 16 bytes: a 48-bit millisecond timestamp followed by 80 random
// bits. The result is strictly greater than after (the newest existing id's raw bytes,
// nil for none), so ids sort by creation even within one millisecond or if the
// clock steps back.
func newKeyIDRaw(now time.Time, after []byte) ([]byte, error) {
	raw := make([]byte, keyIDRawLen)
	ms := uint64(now.UnixMilli())
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], ms)
	copy(raw[:6], ts[2:])
	if _, err := rand.Read(raw[6:]); err != nil {
		return nil, fmt.Errorf("read random key id: %w", err)
	}
	if len(after) == keyIDRawLen && string(raw) <= string(after) {
		// Same millisecond (or the clock stepped back): continue after the newest id.
		copy(raw, after)
		for i := keyIDRawLen - 1; i >= 0; i-- {
			raw[i]++
			if raw[i] != 0 {
				break
			}
		}
	}
	return raw, nil
}

// encodeKeyID renders a raw key id as "key_" + 26 base32 characters.
func encodeKeyID(raw []byte) string { return keyIDPrefix + lowerBase32.EncodeToString(raw) }

// decodeKeyID parses an id made by encodeKeyID.
func decodeKeyID(id string) ([]byte, bool) {
	rest, ok := strings.CutPrefix(id, keyIDPrefix)
	if !ok || len(rest) != lowerBase32.EncodedLen(keyIDRawLen) {
		return nil, false
	}
	raw, err := lowerBase32.DecodeString(rest)
	if err != nil || len(raw) != keyIDRawLen {
		return nil, false
	}
	return raw, true
}

// seqID renders a bucket sequence number as a fixed-width, sortable id.
func seqID(prefix string, seq uint64) string { return fmt.Sprintf("%s%016x", prefix, seq) }

// parseSeqID is the inverse of seqID.
func parseSeqID(prefix, id string) (uint64, bool) {
	rest, ok := strings.CutPrefix(id, prefix)
	if !ok || len(rest) != 16 {
		return 0, false
	}
	var seq uint64
	if _, err := fmt.Sscanf(rest, "%016x", &seq); err != nil {
		return 0, false
	}
	return seq, true
}

// u64 encodes n big-endian, so byte order is numeric order.
func u64(n uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	return b[:]
}

// encodeCursor makes a cursor opaque to callers.
func encodeCursor(s string) string {
	if s == "" {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

// decodeCursor reverses encodeCursor; a malformed cursor is ErrInvalid.
func decodeCursor(c string) (string, error) {
	if c == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(b) == 0 {
		return "", fmt.Errorf("cursor: %w", vault.ErrInvalid)
	}
	return string(b), nil
}

// clampLimit applies the listing default (50) and maximum (500).
func clampLimit(limit int) int {
	switch {
	case limit <= 0:
		return 50
	case limit > 500:
		return 500
	default:
		return limit
	}
}
