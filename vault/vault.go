// Package vault is keybrake's key vault: the domain types (keys, upstreams,
// holds, idempotency records, ledger events, audit entries, claims), the
// sentinel errors, and Store, the storage contract.
//
// Store's contract, which both stores keep — vault/bolt (one bbolt file, the
// default) and vault/postgres (PostgreSQL, shared by replicas) — because both
// run the same rules, vault/internal/engine, and pass the same conformance
// suite, vault/vaulttest:
//
//   - Each method is one transaction and reads the store's clock once. The
//     hot path (Reserve, Settle, ObserveObject, RecordEvent, the claims API,
//     Ping) returns once its write is durable. The admin's changes are one
//     write transaction each, with their audit entry; reads see one snapshot,
//     long walks are chunked.
//   - Reserve claims an idempotency key and places a hold for the request's
//     amount on every cap window of the key in the same transaction, after
//     policy.Decide against the counters read in it; Settle settles that hold,
//     on the windows it was placed on, and stores Stripe's answer for replay. A
//     money object's exposure is held money too (ObjectExposure, ObserveObject).
//     So committed + held ≤ cap holds for every window under any concurrency,
//     across processes sharing a store, except where the ledger records why
//     (CheckInvariant).
//   - Business outcomes (ReserveOutcome, ClaimOutcome) are results, never
//     errors; errors are the sentinels below, wrapped with context. Nothing
//     above the stores sees their engines.
//   - A request left in flight by a process that died becomes outcome
//     unknown, its hold still counted: at the next open of a bbolt file, and
//     once its lease lapsed on any store (the reaper).
//   - Secrets, stored answers and claim results are sealed under the master key
//     (AES-256-GCM), bound to their place; tokens are stored only as hashes.
//
// docs/ARCHITECTURE.md describes the buckets and transactions, the group
// committer, the metering model, the idempotency state machine, crash recovery
// and the invariant with its exceptions.
package vault

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
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
	// ErrKeyChanged: a Reserve made with a remembered key (see
	// KeyRememberer) found the key or its upstream changed since; it wrote
	// nothing.
	ErrKeyChanged = errors.New("vault key changed since it was authenticated")
	ErrSealed     = errors.New("cannot unseal") // wrong master key or tampered data
	ErrClosed     = errors.New("store closed")

	// ErrLocked: another process holds the database file (Open timed out on its lock).
	ErrLocked = errors.New("database locked by another process")
	// ErrSchemaVersion: the database was written by a newer keybrake.
	ErrSchemaVersion = errors.New("unsupported schema version")
	// ErrStorage: the storage engine failed (I/O, corruption); the detail is in the message.
	ErrStorage = errors.New("storage failure")
	// ErrInvariant: CheckInvariant found counters that disagree with holds, the ledger or a cap.
	ErrInvariant = errors.New("invariant violated")
	// ErrPrecondition: a conditional change found the entry at another version
	// than the one it was made against (an ETag that no longer matches).
	ErrPrecondition = errors.New("precondition failed")
	// ErrNoSpace: a write failed because the file system is full. It comes
	// with ErrStorage (errors.Is matches both): whoever does not tell them
	// apart sees a storage failure.
	ErrNoSpace = errors.New("no space left on the device")
	// ErrDamaged: the database file is damaged (shorter than its own meta
	// page says, a meta page that does not check, a page that fails the page
	// check); the message names the file and what was found.
	ErrDamaged = errors.New("database file damaged")
	// ErrMigrated: the bbolt database was copied into PostgreSQL by
	// migrate-store and marked so: serving it again would spend its keys a
	// second time beside the PostgreSQL replicas.
	ErrMigrated = errors.New("database migrated")
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
	// Version counts the key's changes: every write of the key (a patch, a
	// revocation, a rotation) raises it, so two reads that see the same
	// version saw the same key. It is at least 1.
	Version uint64

	// Refused counts the requests refused because this key was revoked or
	// expired (Store.RecordKeyRefusal): who still uses a key that no longer works.
	Refused KeyRefusals

	// Raises are the key's raises, active or ended within RaiseRetention, oldest
	// first (Store.AddRaise).
	Raises []Raise

	// UpstreamVersion is the version of the key's upstream (Upstream.Version)
	// read with the key or after it (never older than the key as read). Only
	// Authenticate sets it; it
	// is 0 elsewhere and when the upstream is not registered.
	UpstreamVersion uint64
}

// KeyRefusals counts the requests refused for a key's status, with the last one.
type KeyRefusals struct {
	Count int64
	// Code is the last refusal's code (vault_key_revoked, vault_key_expired).
	Code       string
	First      time.Time
	Last       time.Time
	RemoteAddr string // the last refused request's remote address
	Path       string // the last refused request's path
}

// KeyRefusal is one request refused for its key's status, as RecordKeyRefusal
// takes it, or Count of them with the last one's code, address and path (the
// proxy aggregates a burst in memory and writes it once).
type KeyRefusal struct {
	Code       string
	RemoteAddr string
	Path       string
	Count      int64 // refusals this record stands for; 0 means 1
}

// StatusAt returns KeyExpired when the key is active but its policy expired at now.
func (k *Key) StatusAt(now time.Time) KeyStatus {
	if k.Status == KeyActive && !k.Policy.ExpiresAt.IsZero() && !now.Before(k.Policy.ExpiresAt) {
		return KeyExpired
	}
	return k.Status
}

// Upstream is a registered Stripe account credential. The secret is only ever
// readable through Store.UpstreamSecret.
type Upstream struct {
	Name        string
	Vendor      string
	SecretLast4 string
	CreatedAt   time.Time
	UpdatedAt   time.Time
	// Version changes on every write of the upstream (a replaced secret): a
	// cache of the unsealed secret keyed on (Name, Version) is never stale.
	// It is not a count; it is never 0.
	Version uint64
	// WebhookSecretsLast4 are the last 4 characters of each secret Stripe signs
	// the upstream's events with (Store.SetUpstreamWebhookSecrets); the
	// secrets themselves are only readable through Store.UpstreamWebhookSecrets.
	WebhookSecretsLast4 []string
}

// MaxWebhookSecrets is how many webhook secrets an upstream has at most: the
// current one and, during a rotation, the one before.
const MaxWebhookSecrets = 2

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
	// RecordAwaitingApproval: the request waits for a person's decision (or,
	// approved, for its retry); its hold is held, nothing was forwarded.
	RecordAwaitingApproval RecordState = "awaiting_approval"
)

// Decision is what a ledger event records about a key's money.
type Decision string

// Ledger decisions. A metered Reserve writes DecisionAllowed, DecisionWouldRefuse
// or DecisionRefused; the rest record what happened to money already held.
const (
	DecisionAllowed     Decision = "allowed"      // a hold was placed
	DecisionWouldRefuse Decision = "would_refuse" // report mode let through what the policy refuses
	DecisionRefused     Decision = "refused"      // the policy refused: nothing held
	DecisionSettled     Decision = "settled"      // a hold settled; Reason is the SettleOutcome
	DecisionResolved    Decision = "resolved"     // an operator settled an unknown hold (ResolveHold) or released an exposure (ReleaseExposure)
	DecisionExposure    Decision = "exposure"     // a money object's exposure was committed or released
	DecisionCarried     Decision = "carried"      // a time-zone change carried the day's usage (UpdateKey)
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
	WindowIDs      []policy.WindowID
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
	// ApprovalID is the approval the request waited for ("" when none).
	ApprovalID string
	// Resolved is set when an operator settled the record's hold (ResolveHold):
	// a retry is told so, with the hold's state; no answer of Stripe's is stored.
	Resolved    bool
	CreatedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt time.Time // zero unless completed; the idempotency TTL runs from here
}

// Event is one entry of a key's ledger of metered requests.
type Event struct {
	ID              string // sortable, newest sorts last
	Time            time.Time
	KeyID           string
	Operation       string
	Amount          int64
	Currency        string
	Decision        Decision
	Reason          string
	HoldID          string
	HoldState       HoldState
	UpstreamStatus  int
	StripeRequestID string
	ObjectID        string
	// IdempotencyKey is the caller's idempotency key of the request the event
	// is about ("" for an event about a money object, and in events written
	// before keybrake kept it).
	IdempotencyKey string
	// Tool is the MCP tool whose call made the request ("" for a request that
	// reached the proxy directly).
	Tool string
	// Scope is the id of the key or budget a refusal is about ("" when the
	// event is no refusal, or was written before keybrake named it).
	Scope string

	// WindowIDs are the windows the event's deltas apply to (the hold's
	// windows: a key's "day:…" and "period", a budget's scoped
	// "bud_…/day:…" and "bud_…/period").
	WindowIDs []policy.WindowID
	// HeldDelta and CommittedDelta are what the event changed on each of WindowIDs'
	// counters (minor units). Summed over a key's ledger they equal its counters.
	HeldDelta      int64
	CommittedDelta int64
	// AllowanceDeltas, when set, are aligned with WindowIDs: what the event let
	// each window exceed its cap by (a report-mode hold past a cap, an overrun
	// commit). Summed over a key's ledger they equal the counters' allowance.
	AllowanceDeltas []int64
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

// A vault key's token is TokenPrefix followed by the unpadded base64url
// encoding of TokenRandBytes random bytes.
const (
	TokenPrefix    = "vk_"
	TokenRandBytes = 32 // 256 bits
)

// CheckTokenShape says what is wrong with the shape of a vault key token, or
// returns nil for one that could have been minted. Its errors name the
// mistakes a shell pipeline makes: the word null or undefined (what jq and
// JavaScript print for a missing field), an empty value, a value cut short or
// with something appended, another kind of credential. They never repeat the
// token.
func CheckTokenShape(token string) error {
	rest, ok := strings.CutPrefix(token, TokenPrefix)
	switch {
	case token == "":
		return errors.New("the vault key is empty")
	case token == "null" || token == "undefined" || token == "None" || token == "nil":
		return fmt.Errorf("the vault key is the word %q, which is what a script prints for a value that is missing: "+
			"the command that should have produced the key failed (with jq, use jq -er so that it fails loudly)", token)
	case strings.HasPrefix(token, "eyJ") && strings.Count(token, ".") == 2:
		return errors.New("this looks like an admin API token (a JWT), not a vault key: the proxy takes a vault key (vk_…), the admin API the token")
	case !ok:
		return fmt.Errorf("a vault key starts with %s, and this one does not", TokenPrefix)
	case len(rest) != base64.RawURLEncoding.EncodedLen(TokenRandBytes):
		return fmt.Errorf("a vault key is %s followed by %d characters, and this one has %d: it was cut short or has something appended",
			TokenPrefix, base64.RawURLEncoding.EncodedLen(TokenRandBytes), len(rest))
	}
	if _, err := base64.RawURLEncoding.DecodeString(rest); err != nil {
		return errors.New("a vault key has only letters, digits, - and _ after its " + TokenPrefix + ", and this one has other characters")
	}
	return nil
}

// UpstreamKey derives the upstream Idempotency-Key for (keyID, idempotencyKey).
// It is stable across restarts and at most 255 characters: "keybrake_" followed by
// the base64url SHA-256 of the pair (52 characters in all).
func UpstreamKey(keyID, idempotencyKey string) string {
	sum := pairHash("upstream-key", keyID, idempotencyKey)
	return "keybrake_" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// HoldID derives the hold id for (keyID, idempotencyKey): "hold_" followed by 26
// lower-case base32 characters of the pair's SHA-256.
func HoldID(keyID, idempotencyKey string) string {
	sum := HoldHash(keyID, idempotencyKey)
	return "hold_" + lowerBase32.EncodeToString(sum[:])
}

// HoldHash is what HoldID encodes: the first 16 bytes of the pair's SHA-256.
func HoldHash(keyID, idempotencyKey string) [16]byte {
	sum := pairHash("hold", keyID, idempotencyKey)
	return [16]byte(sum[:16])
}

// lowerBase32 is base32 with the "extended hex" alphabet in lower case and no
// padding, so that encodings sort like the bytes they encode.
var lowerBase32 = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// pairHash hashes a (keyID, idempotencyKey) pair under a purpose label. The NUL
// separators keep ("a", "bc") and ("ab", "c") apart; key ids never contain NUL.
func pairHash(purpose, keyID, idempotencyKey string) [sha256.Size]byte {
	// One buffer on the stack and one Sum256: no allocation on the hot path.
	var buf [320]byte
	b := append(buf[:0], purpose...)
	b = append(b, 0)
	b = append(b, keyID...)
	b = append(b, 0)
	b = append(b, idempotencyKey...)
	return sha256.Sum256(b)
}
