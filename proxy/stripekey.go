package proxy

import (
	"bytes"
	"errors"
	"net/http"
	"regexp"
	"strings"
)

// ErrStripeSecretKey is VaultToken's error for a Stripe secret or restricted key
// (sk_…, rk_…) sent where a vault key belongs: a caller configured with the real
// key, which keybrake never forwards. Worth an operator's attention.
var ErrStripeSecretKey = errors.New("this is a Stripe secret key, not a vault key")

// StripeSecretKeyAdvice is the answer to a request authenticated with a Stripe
// secret key.
const StripeSecretKeyAdvice = "This is a Stripe secret key, not a vault key: keybrake does not forward it. " +
	"Give this client a vault key (vk_...) minted for it, and keep the Stripe key out of it; " +
	"if the Stripe key was exposed to the client, roll it in the Stripe Dashboard."

// isStripeSecretKey reports whether a credential looks like a Stripe secret key
// (sk_live_…, sk_test_…) or restricted key (rk_…).
func isStripeSecretKey(token string) bool {
	return strings.HasPrefix(token, "sk_") || strings.HasPrefix(token, "rk_")
}

// StripeKeyKind names the kind of Stripe secret key a request carries in place
// of a vault key — "sk_live", "sk_test", "rk_live", "rk_test", or "sk"/"rk" — and
// "" when it carries none. It never returns more of the key than that, so it
// can be logged.
func StripeKeyKind(h http.Header) string {
	token, err := readCredential(h)
	if err != nil || !isStripeSecretKey(token) {
		return ""
	}
	kind := token[:2]
	if mode, _, ok := strings.Cut(token[3:], "_"); ok && (mode == "live" || mode == "test") {
		kind += "_" + mode
	}
	return kind
}

// secretLike matches what looks like a Stripe secret: a secret or restricted
// key (sk_live_…, rk_test_…) or a webhook signing secret (whsec_…), whole.
// A masked key as Stripe quotes one (sk_test_****1234) is not matched.
var secretLike = regexp.MustCompile(`\b(?:(?:sk|rk)_(?:live|test)_|whsec_)[A-Za-z0-9]{8,}`)

// ScrubSecrets replaces everything in an upstream error body that looks like
// a Stripe secret by its prefix and "[redacted]", so that no caller ever
// reads keybrake's upstream credential, or another secret, in an error
// Stripe words (an error may quote what it was sent). It returns body itself
// when there is nothing to scrub.
func ScrubSecrets(body []byte) []byte {
	if !secretLike.Match(body) {
		return body
	}
	return secretLike.ReplaceAllFunc(body, func(m []byte) []byte {
		prefix := m[:bytes.IndexByte(m, '_')+1]
		if !bytes.Equal(prefix, []byte("whsec_")) {
			prefix = m[:bytes.IndexByte(m[len(prefix):], '_')+len(prefix)+1]
		}
		return append(append([]byte(nil), prefix...), "[redacted]"...)
	})
}
