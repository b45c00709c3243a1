package vault

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/keybrake/keybrake/policy"
)

// Options configure a Store. Zero values take the documented defaults.
type Options struct {
	// MasterKey is the 32-byte AES-256-GCM key that seals upstream secrets and stored
	// responses. Required.
	MasterKey []byte
	// Now is the clock; time.Now when nil. Captured once per transaction.
	Now func() time.Time
	// IdempotencyTTL is how long completed records replay (default 24h).
	IdempotencyTTL time.Duration
	// UnknownRetryLimit is the age after which an unknown record is no longer
	// re-forwarded (default 23h).
	UnknownRetryLimit time.Duration
	// Lease is how long an in_progress claim is held before it may be taken over
	// (default 2 minutes; the proxy sets upstream timeout + margin).
	Lease time.Duration
	// Logger; slog.Default() when nil.
	Logger *slog.Logger
	// OpenTimeout is how long Open waits for the file lock (default 5s).
	OpenTimeout time.Duration
}

// Open opens (creating if needed) the bbolt database at path, checks or writes the
// schema version, and recovers: records left in_progress by a previous process
// become unknown (their holds stay held, counted as held).
func Open(path string, opts Options) (*Store, error) { panic("unimplemented") }

// Store is the vault on bbolt. It is safe for concurrent use. Reserve and Settle
// are group-committed: concurrent callers share fsyncs.
type Store struct{}

// Close flushes and closes the database.
func (s *Store) Close() error { panic("unimplemented") }

// ---- upstreams ----

// PutUpstream registers or replaces the upstream `name` with a sealed secret.
// Returns ErrInvalid for an empty name/secret or a vendor other than "stripe".
func (s *Store) PutUpstream(ctx context.Context, actor, name, vendor, secret string) (Upstream, error) {
	panic("unimplemented")
}

// GetUpstream returns ErrNotFound when there is no such upstream.
func (s *Store) GetUpstream(ctx context.Context, name string) (Upstream, error) {
	panic("unimplemented")
}

// ListUpstreams lists upstreams by name.
func (s *Store) ListUpstreams(ctx context.Context) ([]Upstream, error) { panic("unimplemented") }

// DeleteUpstream returns ErrNotFound, or ErrConflict while an active key uses it.
func (s *Store) DeleteUpstream(ctx context.Context, actor, name string) error { panic("unimplemented") }

// UpstreamSecret unseals the upstream's secret (ErrNotFound, ErrSealed).
func (s *Store) UpstreamSecret(ctx context.Context, name string) (string, error) {
	panic("unimplemented")
}

// ---- keys ----

// MintRequest is what MintKey needs. Policy must already be normalized; MintKey
// validates it with ValidateNew (ErrInvalid wrapping *policy.ValidationError).
type MintRequest struct {
	Name     string
	Upstream string
	Labels   map[string]string
	Policy   policy.Policy
}

// MintKey creates a key and returns it with its token ("vk_" + ≥ 256 random bits,
// base62 or base64url). Only the token's SHA-256 is stored. Errors: ErrInvalid,
// ErrConflict (name taken), ErrNotFound (upstream unknown; wrapped so the message
// names the upstream).
func (s *Store) MintKey(ctx context.Context, actor string, req MintRequest) (Key, string, error) {
	panic("unimplemented")
}

// Authenticate finds the key for a token: ErrKeyInvalid (unknown or malformed),
// ErrKeyRevoked. Expiry and not-yet-valid are the policy's business (Decide), so an
// expired key is returned without error.
func (s *Store) Authenticate(ctx context.Context, token string) (Key, error) { panic("unimplemented") }

// GetKey returns ErrNotFound when there is no such key.
func (s *Store) GetKey(ctx context.Context, id string) (Key, error) { panic("unimplemented") }

// KeyFilter selects keys for ListKeys. Status may be "active", "revoked" or
// "expired" (evaluated at the store clock). Labels must all match. Limit defaults
// to 50, max 500. Cursor is an opaque value from a previous page's next cursor.
type KeyFilter struct {
	Status     KeyStatus
	Labels     map[string]string
	Upstream   string
	NamePrefix string
	Limit      int
	Cursor     string
}

// ListKeys lists keys oldest first (by id). next is "" on the last page.
func (s *Store) ListKeys(ctx context.Context, f KeyFilter) (keys []Key, next string, err error) {
	panic("unimplemented")
}

// UpdateKey replaces the key's policy and labels in one transaction, validating the
// policy with ValidateNew. Usage is never touched. Errors: ErrNotFound,
// ErrInvalid, ErrConflict (revoked keys cannot be changed).
func (s *Store) UpdateKey(ctx context.Context, actor, id string, p policy.Policy, labels map[string]string) (Key, error) {
	panic("unimplemented")
}

// RevokeKey revokes at once (idempotent: revoking a revoked key returns it).
func (s *Store) RevokeKey(ctx context.Context, actor, id string) (Key, error) { panic("unimplemented") }

// RotateKey gives the key a new token; the old one stops working at once.
// ErrConflict for a revoked key.
func (s *Store) RotateKey(ctx context.Context, actor, id string) (Key, string, error) {
	panic("unimplemented")
}

// KeyUsage returns the key, its windows at the store clock and their counters, in one
// read transaction.
func (s *Store) KeyUsage(ctx context.Context, id string) (Key, []policy.Window, policy.Usage, error) {
	panic("unimplemented")
}

// ---- metering ----

// ReserveRequest is one request that wants to be forwarded under a vault key.
// IdempotencyKey is required (the proxy derives or demands one for every request
// it meters or remembers). Amount is in minor units of Currency; a request that
// moves no money has Amount 0 and Currency "" and places no hold, but its record
// is still claimed. Metered says whether the request can move money (then an
// Event is written and a hold placed, even for amount 0).
type ReserveRequest struct {
	KeyID          string
	IdempotencyKey string
	Fingerprint    string
	Request        policy.Request
	Metered        bool
}

// ReserveOutcome says what Reserve did.
type ReserveOutcome int

// Reserve outcomes.
const (
	// Claimed: a new record (in_progress, with lease) and, if metered, a hold on every window.
	Claimed ReserveOutcome = iota + 1
	// Replay: the record is completed; Record.Response is Stripe's stored answer.
	Replay
	// InFlight: the record is in_progress under a live lease (409, Retry-After).
	InFlight
	// Mismatch: same idempotency key, different fingerprint (422).
	Mismatch
	// Resume: the record was unknown (or its lease lapsed); it is in_progress again under a
	// new lease and keeps its existing hold. Forward again with the SAME upstream key.
	Resume
	// Stale: the record is unknown and older than UnknownRetryLimit: not re-forwarded;
	// an operator must resolve it.
	Stale
	// Refused: the policy refused (Decision says why). Nothing was written except the event.
	Refused
)

// ReserveResult is what Reserve returns. Decision is set for Claimed (possibly with
// WouldRefuse in report mode) and Refused. Record is set for every outcome but Refused.
type ReserveResult struct {
	Outcome  ReserveOutcome
	Decision policy.Decision
	Key      Key
	Record   IdempotencyRecord
	Hold     *Hold
}

// Reserve authenticates nothing (the caller has the key) but re-reads the key in the
// same write transaction: a revoked key gives ErrKeyRevoked. Then, atomically, it
// looks up the idempotency record (Replay / InFlight / Mismatch / Resume / Stale),
// else runs policy.Decide against the current window counters and, if allowed,
// writes the record (in_progress with a lease) and adds Amount to `held` of every
// window — or writes nothing but a refusal event. One write transaction, group
// committed. Business outcomes are results, not errors.
func (s *Store) Reserve(ctx context.Context, req ReserveRequest) (ReserveResult, error) {
	panic("unimplemented")
}

// SettleOutcome is how a forwarded request ended.
type SettleOutcome string

// Settle outcomes.
const (
	SettleCommit  SettleOutcome = "commit"  // 2xx: held → committed (Amount may differ from the hold)
	SettleRelease SettleOutcome = "release" // definitive 4xx: held → 0; record completed
	SettleUnknown SettleOutcome = "unknown" // 5xx / no answer: stays held; record unknown
	SettleAbandon SettleOutcome = "abandon" // upstream 409/429 or never forwarded: record back to its previous state; hold unchanged if it pre-existed, released if this claim created it
)

// SettleRequest settles the record (KeyID, IdempotencyKey). Amount is the amount to
// commit (minor units; for SettleCommit it may be lower or higher than held — e.g.
// amount_captured — and a higher amount is committed even if it passes the cap,
// because the money has moved). Response is stored for replay with Commit and
// Release (and Unknown when Stripe answered 5xx: Stripe replays 5xx too).
type SettleRequest struct {
	KeyID           string
	IdempotencyKey  string
	Outcome         SettleOutcome
	Amount          int64
	Response        *StoredResponse
	UpstreamStatus  int
	StripeRequestID string
	ObjectID        string
}

// Settle applies the outcome in one write transaction, group committed, and writes
// the settle event. ErrNotFound when there is no such record; ErrConflict when the
// record is not in_progress.
func (s *Store) Settle(ctx context.Context, req SettleRequest) error { panic("unimplemented") }

// ObjectAmount returns what has been metered (committed, minor units) under keyID for
// a Stripe object that was created or raised through this key (a PaymentIntent or a
// Charge), so confirming or capturing it later is not counted twice. ok is false when
// nothing was metered for it. Every SettleCommit with an ObjectID adds its Amount to
// the object's total in the same transaction.
func (s *Store) ObjectAmount(ctx context.Context, keyID, objectID string) (amount int64, ok bool, err error) {
	panic("unimplemented")
}

// ListHolds lists holds in the given state ("" for all), newest first.
func (s *Store) ListHolds(ctx context.Context, state HoldState, limit int, cursor string) ([]Hold, string, error) {
	panic("unimplemented")
}

// ResolveHold settles an unknown hold by an operator's decision (HoldCommitted or
// HoldReleased) and completes its record. ErrNotFound; ErrConflict unless the hold
// is unknown (or held with its lease lapsed).
func (s *Store) ResolveHold(ctx context.Context, actor, holdID string, outcome HoldState) (Hold, error) {
	panic("unimplemented")
}

// ---- ledger and audit ----

// ListEvents lists a key's events newest first.
func (s *Store) ListEvents(ctx context.Context, keyID string, limit int, cursor string) ([]Event, string, error) {
	panic("unimplemented")
}

// ListAudit lists audit entries newest first.
func (s *Store) ListAudit(ctx context.Context, limit int, cursor string) ([]AuditEntry, string, error) {
	panic("unimplemented")
}

// ---- maintenance ----

// Reap deletes completed idempotency records older than IdempotencyTTL and daily
// counters of days that ended more than 48 hours ago with nothing held, in small
// transactions. It returns how many entries it removed.
func (s *Store) Reap(ctx context.Context) (int, error) { panic("unimplemented") }

// Backup writes a hot, consistent copy of the database to w.
func (s *Store) Backup(ctx context.Context, w io.Writer) (int64, error) { panic("unimplemented") }
