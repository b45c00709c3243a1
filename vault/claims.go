package vault

import (
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits of the claims API.
const (
	// MaxClaimKeyLen is the longest claim key, in characters (as for idempotency keys).
	MaxClaimKeyLen = 255
	// MaxClaimFingerprintLen is the longest fingerprint, in bytes.
	MaxClaimFingerprintLen = 1024
	// MaxClaimResultBytes is the largest result a claim stores.
	MaxClaimResultBytes = 1 << 20
)

// ClaimState is the state of a claim.
type ClaimState string

// Claim states. A released claim is deleted, so it has no state.
const (
	ClaimInProgress ClaimState = "in_progress"
	ClaimCompleted  ClaimState = "completed"
)

// Claim is one claim of a unit of work under a vault key.
type Claim struct {
	KeyID       string
	Key         string
	Fingerprint string
	State       ClaimState
	// LeaseExpiresAt is when an in_progress claim may be taken over (zero once
	// completed).
	LeaseExpiresAt time.Time
	// FencingToken identifies the current owner; it increases every time ownership
	// changes.
	FencingToken uint64
	// Result is the JSON the owner completed the claim with (nil unless completed).
	Result      []byte
	CreatedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt time.Time // zero unless completed; the retention runs from here
}

// ClaimOutcome says what Claim did.
type ClaimOutcome int

// Claim outcomes.
const (
	// ClaimOutcomeClaimed: the caller owns the claim now (a new claim, or one whose
	// lease had lapsed, taken over with a new fencing token).
	ClaimOutcomeClaimed ClaimOutcome = iota + 1
	// ClaimOutcomeCompleted: the work is done; Claim.Result is its result.
	ClaimOutcomeCompleted
	// ClaimOutcomeInProgress: another owner holds a live lease (Claim.LeaseExpiresAt).
	ClaimOutcomeInProgress
	// ClaimOutcomeFingerprintMismatch: the key was claimed with another fingerprint.
	ClaimOutcomeFingerprintMismatch
)

// ClaimResult is what Claim returns. Claim is the claim after the call; its Result
// is set only for ClaimOutcomeCompleted and its FencingToken only for
// ClaimOutcomeClaimed (the token is the owner's, never shown to anyone else).
type ClaimResult struct {
	Outcome ClaimOutcome
	Claim   Claim
	// TookOver is true when a claim whose lease had lapsed changed owner.
	TookOver bool
}

// ValidClaimKey reports whether key can name a claim: 1–255 characters of valid
// UTF-8 without control characters.
func ValidClaimKey(key string) bool {
	if key == "" || !utf8.ValidString(key) || utf8.RuneCountInString(key) > MaxClaimKeyLen {
		return false
	}
	for _, r := range key {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
