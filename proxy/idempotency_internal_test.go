package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"net/textproto"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestFingerprintLayout pins Fingerprint to the hash of its fields as
// writeField streams them: fingerprints are stored with idempotency records
// and compared with a retry's after a restart, so the layout never changes,
// whether the fields fit Fingerprint's stack buffer or not.
func TestFingerprintLayout(t *testing.T) {
	t.Parallel()
	for _, canonical := range []string{"", "amount=100&currency=usd", strings.Repeat("metadata[k]=v&", 100)} {
		h := sha256.New()
		for _, f := range []string{"keybrake-fingerprint-v1", "POST", "/v1/charges", "acct_1", "ctx_1", canonical} {
			writeField(h, f)
		}
		assert.Equal(t, hex.EncodeToString(h.Sum(nil)), Fingerprint("POST", "/v1/charges", "acct_1", "ctx_1", []byte(canonical)))
	}
}

// TestStrippedHeaders checks that rewrite's list is canonical: it deletes the
// names from the header map as they are, and the map's keys are canonical.
func TestStrippedHeaders(t *testing.T) {
	t.Parallel()
	for _, name := range strippedHeaders {
		assert.Equal(t, textproto.CanonicalMIMEHeaderKey(name), name)
	}
}
