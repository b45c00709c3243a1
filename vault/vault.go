// Package vault is keybrake's key vault: the domain types (keys, upstreams, holds,
// idempotency records, events, audit entries), the sentinel errors, token minting
// and secret sealing, and the Store on bbolt that owns every bucket and transaction.
//
// Nothing outside this package sees bbolt.
package vault

import (
	"errors"
	"net/http"
	"time"

	"github.com/keybrake/keybrake/policy"
)

// Sentinel errors. Callers match them with errors.Is; the HTTP surfaces map them to
// status codes in one place each.
var (
	ErrNotFound   = errors.New("not found")
	ErrConflict   = errors.New("conflict")          // duplicate name, upstream in use, wrong state
	ErrInvalid    = errors.New("invalid")           // a *policy.ValidationError or bad argument wraps this too
	ErrKeyInvalid = errors.New("vault key invalid") // unknown token
	ErrKeyRevoked = errors.New("vault key revoked")
	ErrKeyExpired = errors.New("vault key expired")
	ErrSealed     = errors.New("cannot unseal") // wrong master key or tampered data
	ErrClosed     = errors.New("store closed")
)

// KeyStatus is a vault key's stored status. "expired" is derived (see Key.StatusAt).
type KeyStatus string

// Key statuses.
const (
	KeyActive  KeyStatus = "active"
	KeyRevoked KeyStatus = "revoked"
	KeyExpired KeyStatus = "expired" // never stored; reported by StatusAt
)

// Key is a vault key. The token itself is never stored: TokenHash is its SHA-256 (hex).
type Key struct {
	ID          string // "key_" + 26 chars, sortable by creation time
	Name        string // unique
	Upstream    string
	Labels      map[string]string
	Policy      policy.Policy
	Status      KeyStatus
	TokenHash   string
	TokenPrefix string // first 10 characters of the token, for display ("vk_AbCdEfG")
	CreatedAt   time.Time
	UpdatedAt   time.Time
	RevokedAt   time.Time // zero unless revoked
}

// StatusAt returns KeyExpired when the key is active but its policy expired at now.
func (k *Key) StatusAt(now time.Time) KeyStatus { panic("unimplemented") }

// Upstream is a registered Stripe account credential. The secret is only ever
// readable through Store.UpstreamSecret.
type Upstream struct {
	Name        string
	Vendor      string
	SecretLast4 string
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// HoldState is the state of a hold (and of the idempotency record it belongs to).
type HoldState string

// Hold states.
const (
	HoldHeld      HoldState = "held"      // request in flight (record in_progress)
	HoldCommitted HoldState = "committed" // Stripe answered 2xx
	HoldReleased  HoldState = "released"  // Stripe answered a definitive 4xx, or refused before forwarding
	HoldUnknown   HoldState = "unknown"   // no answer / 5xx: money may have moved; amount stays held
)

// RecordState is the state of an idempotency record.
type RecordState string

// Record states.
const (
	RecordInProgress RecordState = "in_progress"
	RecordCompleted  RecordState = "completed"
	RecordUnknown    RecordState = "unknown"
)

// Hold is the money a request has reserved on its key's windows. WindowIDs are the
// windows it was placed on (a hold placed on day:2026-09-14 settles there, even
// if it settles after midnight).
type Hold struct {
	ID             string // "hold_…", derived from (KeyID, IdempotencyKey)
	KeyID          string
	IdempotencyKey string
	Operation      string
	Currency       string
	Amount         int64 // minor units held (or committed once settled)
	WindowIDs      []string
	State          HoldState
	CreatedAt      time.Time
	SettledAt      time.Time
}

// StoredResponse is a Stripe answer kept for replay. Header holds only the
// allow-listed headers the caller passes in. The body is sealed at rest.
type StoredResponse struct {
	Status int
	Header http.Header
	Body   []byte
}

// IdempotencyRecord is the claim of one idempotency key under one vault key.
type IdempotencyRecord struct {
	KeyID          string
	IdempotencyKey string
	Fingerprint    string
	UpstreamKey    string // the Idempotency-Key sent to Stripe; stable for (KeyID, IdempotencyKey)
	State          RecordState
	LeaseUntil     time.Time // for in_progress
	HoldID         string    // "" when the request moved no money
	Response       *StoredResponse
	RequestID      string // Stripe's Request-Id of the stored answer (Original-Request on replay)
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

// Event is one entry of a key's ledger of metered requests.
type Event struct {
	ID              string // sortable, newest sorts last
	Time            time.Time
	KeyID           string
	Operation       string
	Amount          int64
	Currency        string
	Decision        string // "allowed", "refused", "would_refuse", "settled", "resolved"
	Reason          string
	HoldID          string
	HoldState       HoldState
	UpstreamStatus  int
	StripeRequestID string
	ObjectID        string
}

// AuditEntry records one admin change. Before/After are JSON documents without any
// secret or token.
type AuditEntry struct {
	ID     string
	Time   time.Time
	Actor  string // the JWT sub
	Action string // "upstream.put", "key.mint", "key.update", "key.revoke", "key.rotate", "hold.resolve", …
	Target string // id or name
	Before []byte
	After  []byte
}

// UpstreamKey derives the upstream Idempotency-Key for (keyID, idempotencyKey).
// It is stable across restarts and at most 255 characters.
func UpstreamKey(keyID, idempotencyKey string) string { panic("unimplemented") }

// HoldID derives the hold id for (keyID, idempotencyKey).
func HoldID(keyID, idempotencyKey string) string { panic("unimplemented") }
