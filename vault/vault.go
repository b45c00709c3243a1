// Package vault is keybrake's key vault: the domain types (keys, upstreams, holds,
// idempotency records, events, audit entries), the sentinel errors, token minting
// and secret sealing, and the Store on bbolt that owns every bucket and transaction.
//
// Nothing outside this package sees bbolt: its errors are translated at the
// boundary (ErrClosed, ErrLocked, ErrStorage, ...).
//
// # Storage
//
// One bbolt file, opened with the hashmap freelist, a 64 MiB initial mmap and a
// lock timeout; every commit is fsynced (NoSync is never set). The buckets are
// listed in one registry (buckets.go) and created by Open; the meta bucket holds
// the schema version (Open refuses a newer one) and a value sealed under the master
// key, so a wrong master key fails Open with ErrSealed instead of failing later.
// Each public method is one read or write transaction, or one group-committed
// operation; `now` is read once per transaction.
//
// Group commit: Reserve and Settle are queued to one committer goroutine, which
// applies everything queued while the previous transaction was being fsynced in a
// single write transaction, so concurrent callers share its fsyncs. When the
// previous batch had several operations it waits up to 200µs for the callers it
// just answered, so that concurrent callers share one batch rather than alternate
// between two; a lone caller never waits. Business
// outcomes (Refused, Replay, InFlight, ...) and domain errors found before any
// write are results of the operation, never errors of the transaction; if the
// transaction fails anyway, it is rolled back and its operations re-run one by one,
// each resetting its own result, so one bad operation cannot fail the others.
//
// # Secrets and tokens
//
// Upstream secrets and stored response bodies are sealed with AES-256-GCM under
// Options.MasterKey: version byte, random 12-byte nonce, ciphertext. The associated
// data binds each ciphertext to its place (the upstream's name; the key id and
// idempotency key of the record), so a sealed value copied elsewhere does not open.
// Only an upstream secret's last four characters are readable without unsealing.
//
// A vault key token is "vk_" + base64url of 32 random bytes; only its hex SHA-256
// is stored, indexed token hash → key id. Key ids are "key_" + 26 base32hex
// characters of a 48-bit millisecond timestamp and 80 random bits, made strictly
// increasing, so id order is creation order and list cursors are ids. Revoking
// keeps the token's index entry (the token is then answered ErrKeyRevoked);
// rotating replaces it (the old token is ErrKeyInvalid at once).
//
// # Idempotency records and holds
//
// A record is keyed by a 16-byte hash of (key id, idempotency key), the one HoldID
// encodes, and carries its hold: a hold id leads straight to its record, and a
// claim or a settle rewrites one randomly placed page, not two (random pages are
// what a commit's fsync pays for). Reserve claims it in the same write
// transaction that re-reads the key, reads the window counters, runs policy.Decide
// and adds the amount to held on every window (daily and period):
//
//	no record, refused          → nothing but a refusal event (metered requests only)
//	no record, allowed          → in_progress (lease), hold "held"        Claimed
//	fingerprint differs         → unchanged                                Mismatch
//	completed                   → unchanged                                Replay
//	in_progress, lease live     → unchanged                                InFlight
//	unknown, or lease lapsed    → in_progress (new lease), same hold       Resume
//	  ... but older than UnknownRetryLimit → unknown, for an operator       Stale
//
// Settle (only of an in_progress record):
//
//	commit   → completed, hold "committed": held −= hold, committed += Amount
//	           (against a money object: see "Money objects")
//	release  → completed, hold "released":  held −= hold
//	unknown  → unknown, hold "unknown" (still counted as held); a stored 5xx
//	           answer is kept but a retry is resumed, never replayed
//	abandon  → a claim that created the record: record and hold deleted, held −=
//	           hold (a retry starts afresh); a resumed claim: back to unknown
//
// A hold settles on the windows it was placed on, even after midnight. Open turns
// every in_progress record into unknown (its hold stays counted as held): the
// process that claimed it is gone. ResolveHold lets an operator settle an unknown
// hold (or a held one whose lease lapsed) as committed or released; its record is
// completed with a synthetic answer that a retry replays: 409, type
// idempotency_error, code idempotency_key_resolved, Stripe-Should-Retry: false,
// saying what the operator decided (keybrake never saw Stripe's object).
//
// # Money objects
//
// Stripe moves money through objects that outlive a request: a PaymentIntent
// created now and confirmed later in a browser, an authorisation captured in
// pieces, a Checkout Session paid later, an invoice Stripe collects by itself. For
// each such object a key created or acted on, the objects bucket keeps what the key
// counted for it: the money committed for it, and its live exposure — the most it
// can still move that the key answers for — as parts, each held on the windows of
// the request that placed it (exactly like a hold, so it counts against the caps
// where it was placed, and settles there even days later). A commit with an
// ObjectID:
//
//  1. takes Amount from the object's parts, oldest first (money counted at
//     creation or at a raise is not counted again when it moves), then from the
//     request's hold;
//  2. keeps what is left of the hold as a new part (Object.Expose: the object can
//     still move it), or releases it;
//  3. releases every part when Stripe's answer proves the object can move no more
//     money (Object.Terminal: cancelled, expired, voided, fully captured);
//  4. writes one "exposure" event (reason "commit" or "release") per part it
//     changed, on that part's windows.
//
// Amount may exceed hold + exposure only as an overrun (AllowOverrun): Stripe
// reported that the request moved more than keybrake held, because the object was
// changed outside keybrake between the amount lookup and the request. The money has
// moved, so it is booked, and the excess is recorded as the event's allowance;
// every other commit above what was held is refused (ErrInvalid). ObserveObject
// applies an answer that was not a metered request's own (a read, a cancel, a
// deletion) the same way, committing at most the exposure. Refunds and other money
// going out are ordinary commits: they never give exposure or budget back.
//
// # Ledger and audit
//
// Every metered Reserve writes an event (allowed, would_refuse or refused) and
// every Settle of a hold a settle event (decision "settled", reason = outcome);
// ResolveHold writes "resolved"; every change of a money object's exposure writes
// "exposure" (reason "commit" or "release", on the part's windows); RecordEvent
// appends a moneyless "would_refuse" for a request report mode let through
// without a hold; an UpdateKey whose new time zone puts now in another daily
// window writes "carried" (operation key.update, reason timezone_changed): the
// old zone's current day's committed and held money is carried into the new
// zone's current day as committed (only what that window does not count yet), so
// a change of zone never opens a fresh daily budget; the carry above the new cap
// is booked as allowance. Each event carries the windows it touched and its
// HeldDelta, CommittedDelta and AllowanceDeltas, so a key's ledger sums to its counters. Every admin
// write (PutUpstream, DeleteUpstream, MintKey, UpdateKey, RevokeKey, RotateKey,
// ResolveHold) writes an audit entry in the same transaction, with JSON views of
// before and after that never contain a secret, a token or a token hash.
//
// # Retention (Reap)
//
//   - completed records IdempotencyTTL (24 h) after completion, with their settled
//     holds; in_progress and unknown records are never reaped, and neither are
//     records an operator resolved (ResolveHold): a retry keeps being told so;
//   - daily counters with nothing held, 48 h after the latest moment their day can
//     end in any time zone — and, when they hold committed money, only once the
//     key has a daily counter at least 7 days later by the counters' own dates,
//     so that a clock jumping days ahead cannot delete the current day's spend;
//     period counters stay;
//   - money-object records ObjectRetention (35 days) after their last change, once
//     they have no live exposure (live exposure is held money and is never reaped).
//
// Events and audit entries are the ledger and are kept. Reap works in transactions
// of at most 1,000 deletions.
//
// # The invariant and how CheckInvariant judges it
//
// committed + held ≤ cap holds for every window as long as the cap is enforced
// and never lowered: every hold is placed by Decide against the counters in the
// same transaction, exposure is only ever a hold kept or moved between held and
// committed on its own windows, and a commit never exceeds what was held for it.
// Four things can legitimately break it, and the counter and the ledger record
// them: an overrun commit (Stripe moved more than was held, see "Money objects";
// the excess is added to the window's allowance), a report-mode hold past the cap
// (its excess is added too), a time-zone change that carries more than the new
// cap into the new zone's day (the excess is added too), and a cap lowered after
// holds were placed (each counter remembers the highest cap in force when a hold
// — or a carry — was placed on it). So CheckInvariant checks, for every window
// counter:
//
//   - held equals the sum of its live holds (held or unknown) and of the live
//     exposure parts placed on it, and held and committed equal the sums of the
//     ledger's deltas;
//   - the allowance equals the sum of the ledger's allowance deltas (each one an
//     overrun or a report-mode hold past the cap), so no other excess can hide in it;
//   - committed is at least the sum of its committed holds (settled holds are
//     reaped with their records);
//   - committed + held ≤ max(current cap, highest cap at placement) + allowance,
//     unless a hold was placed on it while the window had no cap;
//
// and that records and holds agree (in_progress ↔ held, unknown ↔ unknown,
// completed ↔ committed or released; no live hold without its record).
//
// UpdateKey refuses a change of currency: counters are in the key's minor units.
package vault

import (
	"crypto/sha256"
	"encoding/base64"
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

	// ErrLocked: another process holds the database file (Open timed out on its lock).
	ErrLocked = errors.New("database locked by another process")
	// ErrSchemaVersion: the database was written by a newer keybrake.
	ErrSchemaVersion = errors.New("unsupported schema version")
	// ErrStorage: the storage engine failed (I/O, corruption); the detail is in the message.
	ErrStorage = errors.New("storage failure")
	// ErrInvariant: CheckInvariant found counters that disagree with holds, the ledger or a cap.
	ErrInvariant = errors.New("invariant violated")
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

// Decision is what a ledger event records about a key's money.
type Decision string

// Ledger decisions. A metered Reserve writes DecisionAllowed, DecisionWouldRefuse
// or DecisionRefused; the rest record what happened to money already held.
const (
	DecisionAllowed     Decision = "allowed"      // a hold was placed
	DecisionWouldRefuse Decision = "would_refuse" // report mode let through what the policy refuses
	DecisionRefused     Decision = "refused"      // the policy refused: nothing held
	DecisionSettled     Decision = "settled"      // a hold settled; Reason is the SettleOutcome
	DecisionResolved    Decision = "resolved"     // an operator settled an unknown hold (ResolveHold)
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
	// Tool is the MCP tool whose call made the request ("" for a request that
	// reached the proxy directly).
	Tool string

	// WindowIDs are the windows the event's deltas apply to (the hold's windows).
	WindowIDs []string
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
	sum := pairHash("hold", keyID, idempotencyKey)
	return "hold_" + lowerBase32.EncodeToString(sum[:16])
}

// pairHash hashes a (keyID, idempotencyKey) pair under a purpose label. The NUL
// separators keep ("a", "bc") and ("ab", "c") apart; key ids never contain NUL.
func pairHash(purpose, keyID, idempotencyKey string) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte(purpose))
	h.Write([]byte{0})
	h.Write([]byte(keyID))
	h.Write([]byte{0})
	h.Write([]byte(idempotencyKey))
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}
