package vault

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/keybrake/keybrake/policy"
)

// Store is the vault's storage contract. Two implementations exist, each in
// its own package: vault/bolt (one bbolt file, the default) and
// vault/postgres (PostgreSQL, which several keybrake replicas may share).
// Both run the same metering code and pass the same conformance suite
// (vault/vaulttest); nothing above this package knows which one runs.
//
// Every method is safe for concurrent use and is one transaction (the long
// walks and the reaper a series of short ones) that reads the store's clock
// once. Business outcomes (ReserveOutcome, ClaimOutcome, EnvUpstreamAction)
// are results, never errors. Errors are the sentinels of this package,
// wrapped with context; every method may also return ErrStorage (the engine
// failed: I/O, a lost connection, corruption), ErrClosed (after Close) and,
// where it takes one, ctx's error. The errors a method returns beyond those
// are named in its doc.
type Store interface {
	// WebhookStore: the webhook endpoints, their outbox and delivery log.
	WebhookStore
	// RenewalStore: objects keys created indirectly, and their renewals.
	RenewalStore
	// ---- upstreams ----

	// PutUpstream registers or replaces the upstream name with a sealed
	// secret, with its audit entry. Errors: ErrInvalid (an empty or
	// unprintable name, an empty secret, a vendor other than "stripe").
	// created reports that no upstream of the name existed, decided in the
	// transaction that writes it: of concurrent registrations of one new
	// name, exactly one is created. Every write changes Upstream.Version.
	PutUpstream(ctx context.Context, actor, name, vendor, secret string) (up Upstream, created bool, err error)
	// GetUpstream returns the upstream name. Errors: ErrNotFound.
	GetUpstream(ctx context.Context, name string) (Upstream, error)
	// ListUpstreams lists the upstreams by name.
	ListUpstreams(ctx context.Context) ([]Upstream, error)
	// DeleteUpstream deletes the upstream name, with its audit entry. Errors:
	// ErrNotFound; ErrConflict while a key that is not revoked names it (an
	// expired key can be given a new expiry and would need it again).
	DeleteUpstream(ctx context.Context, actor, name string) error
	// UpstreamSecret unseals the upstream's secret. Errors: ErrNotFound,
	// ErrSealed.
	UpstreamSecret(ctx context.Context, name string) (string, error)
	// SetUpstreamWebhookSecrets replaces the secrets (whsec_…, at most
	// MaxWebhookSecrets, for a rotation) that Stripe signs the upstream's
	// events with, sealed, with an audit entry; none removes them. Errors:
	// ErrNotFound, ErrInvalid (too many, an empty one).
	SetUpstreamWebhookSecrets(ctx context.Context, actor, name string, secrets []string) (Upstream, error)
	// UpstreamWebhookSecrets unseals the upstream's webhook secrets (none
	// when it has none). Errors: ErrNotFound, ErrSealed.
	UpstreamWebhookSecrets(ctx context.Context, name string) ([]string, error)
	// SyncEnvUpstream registers secret, given to the process at start (the
	// STRIPE_SECRET_KEY of serve), as the upstream name only when it is new:
	// when there is no such upstream, or when the value changed since the last
	// start. An upstream an admin changed through the API is therefore not
	// overwritten by an environment that did not change. Only a salted
	// fingerprint of the value is kept, never the value. A registration or
	// replacement writes an audit entry under actor. It returns the upstream
	// as it now is. Errors: ErrInvalid (see PutUpstream).
	SyncEnvUpstream(ctx context.Context, actor, name, vendor, secret string) (Upstream, EnvUpstreamAction, error)

	// ---- keys ----

	// MintKey creates a key and returns it with its token ("vk_" + 256
	// random bits, base64url), with its audit entry. Only the token's SHA-256
	// is stored. Errors: ErrInvalid (wrapping *policy.ValidationError),
	// ErrConflict (the name is taken), ErrNotFound (no such upstream; the
	// message names it).
	MintKey(ctx context.Context, actor string, req MintRequest) (Key, string, error)
	// Authenticate finds the key of a token. Expiry and not-yet-valid are the
	// policy's business (policy.Decide), so an expired key is returned without
	// error. Errors: ErrKeyInvalid (unknown or malformed token), ErrKeyRevoked
	// (the key is returned with it).
	Authenticate(ctx context.Context, token string) (Key, error)
	// GetKey returns the key id. Errors: ErrNotFound.
	GetKey(ctx context.Context, id string) (Key, error)
	// ListKeys lists the keys f selects, oldest first (by id); next is "" on
	// the last page. Errors: ErrInvalid (an unknown status, a malformed
	// cursor).
	ListKeys(ctx context.Context, f KeyFilter) (keys []Key, next string, err error)
	// UpdateKey replaces the key's policy and labels, validated like a new
	// key's, with its audit entry. Usage is never touched; a change of time
	// zone carries the day's usage into the new zone's day (a "carried"
	// event). Errors: ErrNotFound, ErrInvalid (also a change of currency),
	// ErrConflict (a revoked key cannot be changed).
	UpdateKey(ctx context.Context, actor, id string, p policy.Policy, labels map[string]string) (Key, error)
	// RecordKeyRefusal counts a request refused because key id was revoked or
	// had expired, keeping the last one's code, remote address and path
	// (Key.Refused; the caller bounds their length). It is a hot-path write
	// that changes nothing else: no audit entry, no ledger event, no change to
	// the key's UpdatedAt. r.Count refusals are added (1 when 0). Errors:
	// ErrNotFound, ErrInvalid (an empty code, a negative count).
	RecordKeyRefusal(ctx context.Context, id string, r KeyRefusal) error

	// PatchKey changes the key's policy and labels as change.Apply says, given
	// the key as it is: the read, Apply and the write are one write
	// transaction that holds the key's lock (a row lock on PostgreSQL), so
	// two patches of different fields sent at once through two replicas both
	// apply, and a patch computed from a read is never written over a newer
	// key. The new policy is validated like UpdateKey's, with its audit entry.
	// Errors: those of UpdateKey, ErrPrecondition (change.IfVersion is set and
	// the key is at another version), and Apply's own error, returned as it
	// is (nothing is written then).
	PatchKey(ctx context.Context, actor, id string, change KeyChange) (Key, error)
	// RevokeKey revokes the key at once, with its audit entry; revoking a
	// revoked key returns it unchanged. Errors: ErrNotFound.
	RevokeKey(ctx context.Context, actor, id string) (Key, error)
	// RotateKey gives the key a new token, with its audit entry; the old one
	// stops working at once. Errors: ErrNotFound, ErrConflict (revoked).
	RotateKey(ctx context.Context, actor, id string) (Key, string, error)
	// KeyUsage returns the key, its windows at the store clock and their
	// counters. Errors: ErrNotFound.
	KeyUsage(ctx context.Context, id string) (Key, []policy.Window, policy.Usage, error)

	// ---- raises ----

	// AddRaise adds a raise to the cap of one window of scope, with its audit
	// entry, in one write transaction that holds the scope's lock: the next
	// hold is judged against the raised cap, and a hold after the raise's end
	// against the cap as it was. Errors: ErrNotFound (no such key or budget),
	// ErrInvalid (an unknown window, an amount that is not positive, an until
	// not in the future or more than policy.MaxRaiseSpan ahead, a window
	// without a cap to raise, a reason over MaxRaiseReasonLen), ErrConflict (a
	// revoked key; MaxActiveRaises active already).
	AddRaise(ctx context.Context, actor string, scope RaiseScope, r NewRaise) (Raise, error)
	// ListRaises lists scope's raises, active or ended within RaiseRetention,
	// oldest first. Errors: ErrNotFound.
	ListRaises(ctx context.Context, scope RaiseScope) ([]Raise, error)
	// EndRaise ends one of scope's raises now, before its until, with its audit
	// entry: the cap is what it was from the next hold on. Errors: ErrNotFound
	// (no such scope or raise), ErrConflict (the raise has ended already).
	EndRaise(ctx context.Context, actor string, scope RaiseScope, raiseID string) (Raise, error)
	// RequestRaise records vault key keyID asking for a raise of one of its
	// caps (pending, for an admin to decide), with its audit entry. Errors:
	// ErrNotFound, ErrKeyRevoked, ErrInvalid (as AddRaise), ErrConflict (the
	// key has MaxPendingRaiseRequests pending already).
	RequestRaise(ctx context.Context, keyID string, r NewRaise) (RaiseRequest, error)
	// GetRaiseRequest returns the raise request id. Errors: ErrNotFound.
	GetRaiseRequest(ctx context.Context, id string) (RaiseRequest, error)
	// ListRaiseRequests lists the raise requests in state ("" for all),
	// newest first. Limit defaults to 50, max 500; cursor is the previous
	// page's next. Errors: ErrInvalid (an unknown state, a malformed cursor).
	ListRaiseRequests(ctx context.Context, state RaiseRequestState, limit int, cursor string) ([]RaiseRequest, string, error)
	// DecideRaiseRequest approves (creating the raise on the key, created by
	// actor) or declines a pending raise request, with its audit entry, in one
	// write transaction: of two admins deciding at once, one decides and the
	// other gets ErrConflict. Errors: ErrNotFound, ErrConflict (the request is
	// decided already; on approval, the key is revoked or has
	// MaxActiveRaises), ErrInvalid (on approval: the requested until has
	// passed, or the window no longer has a cap; a note over
	// MaxRaiseReasonLen).
	DecideRaiseRequest(ctx context.Context, actor, id string, approve bool, note string) (RaiseRequest, error)

	// ---- budgets ----

	// CreateBudget creates a budget, with its audit entry. Its parent, if
	// any, must exist, be in the same currency and leave the chain from a key
	// through it at most policy.MaxChainDepth long; its name must be unique
	// among its siblings (the budgets of the same parent, or the roots).
	// Errors: ErrInvalid (wrapping *policy.ValidationError), ErrNotFound (no
	// such parent), ErrConflict (a sibling has the name).
	CreateBudget(ctx context.Context, actor string, spec BudgetSpec) (Budget, error)
	// GetBudget returns the budget id. Errors: ErrNotFound.
	GetBudget(ctx context.Context, id string) (Budget, error)
	// ListBudgets lists the budgets f selects, oldest first; next is "" on
	// the last page. Errors: ErrInvalid (a malformed cursor).
	ListBudgets(ctx context.Context, f BudgetFilter) (budgets []Budget, next string, err error)
	// PatchBudget changes the budget as change.Apply says, given the budget
	// as it is: the read, Apply and the write are one write transaction that
	// holds the budget's lock. Currency and parent cannot change; usage is
	// never reset (a change of time zone carries the day's usage). Errors:
	// ErrNotFound, ErrInvalid, ErrPrecondition (IfVersion differs),
	// ErrConflict (a new name a sibling has), Apply's own error as it is.
	PatchBudget(ctx context.Context, actor, id string, change BudgetChange) (Budget, error)
	// DeleteBudget deletes the budget, with its audit entry. Errors:
	// ErrNotFound, ErrConflict (keys or budgets name it).
	DeleteBudget(ctx context.Context, actor, id string) error
	// BudgetChain returns the budget id and each of its ancestors, closest
	// first, with their windows and usage at the store clock. Errors:
	// ErrNotFound.
	BudgetChain(ctx context.Context, id string) ([]BudgetState, error)

	// ---- metering ----

	// Reserve re-reads the key in a write transaction (a revoked key gives
	// ErrKeyRevoked, with ReserveResult.Key set), then, atomically, looks up
	// the idempotency record (ReserveReplay, ReserveInFlight,
	// ReserveMismatch, ReserveResume, ReserveStale), else runs policy.Decide
	// against the current window counters and, if allowed, claims the record
	// (in_progress, with a lease) and adds the amount to held on every window
	// (ReserveClaimed) — or writes nothing but a refusal event
	// (ReserveRefused). It returns once the transaction is durable. Errors:
	// ErrNotFound (no such key), ErrKeyRevoked, ErrKeyChanged (a remembered
	// key's versions, ReserveRequest.KeyVersion, are no longer the key's),
	// ErrInvalid (an empty or over-255-byte idempotency key, a negative
	// amount, an amount on an unmetered request), ErrSealed (a stored
	// response does not open). Once its transaction has begun, Reserve waits for it even if ctx ends,
	// so its result is never lost.
	Reserve(ctx context.Context, req ReserveRequest) (ReserveResult, error)
	// Settle applies the outcome of a forwarded request to its in_progress
	// record and hold in one durable write transaction, with its ledger
	// events, and stores Stripe's answer for replay. A commit takes Amount
	// first from the live exposure of ObjectID (oldest part first), then from
	// the request's hold; what is left of the hold becomes the object's
	// exposure (Object.Expose) or is released, and a terminal answer
	// (Object.Terminal) releases the object's remaining exposure too. Errors:
	// ErrNotFound (no such record), ErrConflict (the record is not
	// in_progress), ErrInvalid (an unknown outcome, a negative amount, a
	// commit above the hold plus the object's exposure without
	// AllowOverrun).
	Settle(ctx context.Context, req SettleRequest) error
	// SettleQueued is Settle for a caller that does not wait until the
	// settle is durable (the proxy, which answers the request meanwhile). On
	// a store that group-commits (bbolt) it queues the settle behind every
	// hot-path write queued before it and ahead of every one queued after —
	// so a Reserve of the same idempotency key made after it returns finds
	// the record settled — and returns; the settle rides the next commit. A
	// crash before that commit leaves the record in progress, its hold
	// counted, and the next start makes it outcome unknown: a retry with the
	// same idempotency key resumes it under the same upstream key and
	// settles it from Stripe's replayed answer. On a store that commits each
	// write on its own (PostgreSQL) it settles before it returns. done, when
	// set, is called once with Settle's error (nil when durable); it runs on
	// the store's committer and must return at once. SettleQueued itself
	// returns an error, and never calls done, only when the settle was not
	// queued (ErrClosed, ctx's error, a response that cannot be sealed). A
	// settle whose commit fails for a storage reason (a full disk) is kept
	// in memory, a bounded number of them, and retried until it is durable
	// (done is then called with its final outcome); the reaper leaves its
	// record in progress meanwhile, so that only a crash leaves it unknown.
	SettleQueued(ctx context.Context, req SettleRequest, done func(error)) error
	// ResolveHold settles an unknown hold (or a held one whose lease lapsed)
	// by an operator's decision, HoldCommitted or HoldReleased, completes its
	// record and writes the audit entry. No answer is stored: a retry with the
	// same idempotency key is told the record was resolved
	// (IdempotencyRecord.Resolved). Errors: ErrNotFound, ErrConflict (the
	// hold is in another state), ErrInvalid (another outcome).
	ResolveHold(ctx context.Context, actor, holdID string, outcome HoldState) (Hold, error)
	// UnknownRequest returns the idempotency record of an unknown hold and the
	// request it was forwarded with, unsealed (Settle's Request). Errors:
	// ErrNotFound (no such hold), ErrConflict (the hold is not unknown, or
	// its request was not kept: the outcome became unknown in a crash, or
	// before keybrake kept requests).
	UnknownRequest(ctx context.Context, holdID string) (IdempotencyRecord, StoredRequest, error)
	// ListApprovals lists the approvals f selects, newest first. Errors:
	// ErrInvalid (an unknown state, a malformed cursor).
	ListApprovals(ctx context.Context, f ApprovalFilter) ([]Approval, string, error)
	// GetApproval returns the approval id. Errors: ErrNotFound.
	GetApproval(ctx context.Context, id string) (Approval, error)
	// DecideApproval approves (approve true) or declines a pending approval
	// by actor's decision, with note, and writes the audit entry, in one
	// write transaction under the key's lock. Approved, the approval waits
	// for the caller's retry until now plus its timeout; declined, its hold is
	// released and its record completed, so that every retry is told. The
	// approval is returned as it is after the change — or, with ErrConflict,
	// as it is: already decided, used or expired (one of two admins deciding
	// at once wins, the other is told the state). Errors: ErrNotFound,
	// ErrConflict, ErrInvalid (a note over MaxApprovalReason bytes).
	DecideApproval(ctx context.Context, actor, id string, approve bool, note string) (Approval, error)
	// WatchApproval returns a channel closed when approval id is decided or
	// expires in this process, and a function that stops watching. Decisions
	// made by another process sharing the store are not seen: a waiter also
	// polls GetApproval.
	WatchApproval(id string) (<-chan struct{}, func())

	// ListHolds lists the holds in state ("" for all), newest first (by
	// creation). Limit defaults to 50, max 500; cursor is the previous page's
	// next. Errors: ErrInvalid (an unknown state, a malformed cursor).
	ListHolds(ctx context.Context, state HoldState, limit int, cursor string) ([]Hold, string, error)
	// CountHolds counts the holds in state. It walks the holds in read
	// transactions of a bounded number of entries, so the count is not one
	// snapshot: a hold that changes state during the walk counts in the state
	// it had when it was read. Errors: ErrInvalid (another state).
	CountHolds(ctx context.Context, state HoldState) (int, error)
	// ObjectExposure returns what keyID has counted for the Stripe object
	// objectID; ok is false when the key never metered anything for it (or
	// its record was reaped).
	ObjectExposure(ctx context.Context, keyID, objectID string) (exp Exposure, ok bool, err error)
	// ObserveObject applies a Stripe answer about a money object to the key's
	// live exposure on it: money the object moved since the last answer the
	// key saw is committed from the exposure (never more than the exposure),
	// and a terminal answer releases the rest. It returns whether anything
	// changed; an object without live exposure is left alone (no write).
	// Errors: ErrInvalid (an empty key or object id, a negative amount).
	ObserveObject(ctx context.Context, keyID, objectID string, ob Observation) (bool, error)
	// ListExposures lists the money objects keyID has live exposure on, by
	// object id, in one read transaction. Limit defaults to 50, max 500;
	// cursor is the previous page's next. Errors: ErrNotFound (no such key),
	// ErrInvalid (a malformed cursor).
	ListExposures(ctx context.Context, keyID string, limit int, cursor string) ([]ExposedObject, string, error)
	// RefreshExposure applies Stripe's answer about a money object, read at an
	// operator's request (actor), to keyID's exposure on it exactly as
	// ObserveObject does (ob.Operation is set to "exposure.refresh"), and
	// writes the audit entry "exposure.refresh" (the object before and after)
	// in the same write transaction, whether or not anything changed. Errors:
	// ErrInvalid (an empty key or object id, a negative amount), ErrNotFound
	// (no such key, or the key never counted the object).
	RefreshExposure(ctx context.Context, actor, keyID, objectID string, ob Observation) (ExposureChange, error)
	// ReleaseExposure releases what is left of keyID's exposure on a money
	// object by an operator's decision (actor), without Stripe's word: the
	// windows are freed, each part's ledger event is "resolved" with reason
	// "operator:released", and the audit entry "exposure.release" is written
	// in the same write transaction. Errors: ErrInvalid and ErrNotFound (as
	// RefreshExposure), ErrConflict (no exposure is left on the object).
	ReleaseExposure(ctx context.Context, actor, keyID, objectID string) (ExposureChange, error)
	// StaleExposures lists, oldest first, up to limit (default 50, max 500)
	// money objects of any key with live exposure untouched for olderThan at
	// the store clock: their record unchanged, and not claimed by
	// ClaimStaleExposure, since then. One read of an ordered range, kept in
	// the objects' own transactions. Errors: ErrInvalid (olderThan ≤ 0).
	StaleExposures(ctx context.Context, olderThan time.Duration, limit int) ([]StaleExposure, error)
	// ClaimStaleExposure claims keyID's exposure on objectID for one lookup
	// at Stripe by the background refresher: in one write transaction under
	// the key's lock, when the object still has live exposure untouched for
	// olderThan, it is marked touched now and claimed is true; otherwise
	// (settled, or touched since — by a request, an event, or another
	// replica's claim) nothing changes and claimed is false. Errors:
	// ErrInvalid (an empty key or object id, olderThan ≤ 0).
	ClaimStaleExposure(ctx context.Context, keyID, objectID string, olderThan time.Duration) (exp ExposedObject, claimed bool, err error)
	// ApplyStripeEvent applies one of Stripe's events, its signature verified,
	// in one write transaction that also records its id, so that the event is
	// applied once (a later delivery of the id: StripeEventDuplicate, nothing
	// changed). A signature timestamp outside StripeEventTolerance of the
	// store's clock is StripeEventTooOld and changes nothing. An
	// IdempotencyKey that is the upstream key of an unknown hold of a key of
	// ev.Upstream settles that hold from the event's object; then every key of
	// ev.Upstream that counts the object has the object applied to its
	// exposure as ObserveObject would. Only the id, type, upstream, time and
	// outcome are recorded. Errors: ErrInvalid (no id or upstream).
	ApplyStripeEvent(ctx context.Context, ev StripeEvent) (StripeEventResult, error)

	// ---- ledger and audit ----

	// RecordEvent appends an event that no hold belongs to (a request that
	// moves no money but that report mode let through) to its key's ledger,
	// stamped with the store clock. Errors: ErrInvalid (no key id, or an event
	// that carries money).
	RecordEvent(ctx context.Context, e Event) error
	// ListEvents lists a key's events newest first. Limit defaults to 50, max
	// 500; cursor is the previous page's next. Errors: ErrInvalid.
	ListEvents(ctx context.Context, keyID string, limit int, cursor string) ([]Event, string, error)
	// ListAudit lists the audit entries newest first. Limit defaults to 50,
	// max 500; cursor is the previous page's next. Errors: ErrInvalid.
	ListAudit(ctx context.Context, limit int, cursor string) ([]AuditEntry, string, error)

	// ---- claims ----

	// Claim claims the unit of work key under the vault key keyID for lease,
	// in one durable write transaction that re-reads the key:
	//
	//	no claim                   → new claim, next fencing token   Claimed
	//	another fingerprint        → unchanged                       FingerprintMismatch
	//	completed                  → unchanged, with its result      Completed
	//	in_progress, lease live    → unchanged                       InProgress
	//	in_progress, lease lapsed  → new lease, next fencing token   Claimed (TookOver)
	//
	// Fencing tokens increase across every claim of every key and are never
	// handed out twice. Errors: ErrInvalid (a bad key, a fingerprint over
	// MaxClaimFingerprintLen, a lease that is not positive), ErrNotFound (no
	// such vault key), ErrKeyRevoked, ErrKeyExpired, ErrSealed (a stored
	// result does not open).
	Claim(ctx context.Context, keyID, key, fingerprint string, lease time.Duration) (ClaimResult, error)
	// CompleteClaim stores result (JSON) as the outcome of the claim and
	// marks it completed. Only the current owner may: fencing must be the
	// token its Claim returned (a lapsed lease nobody took over still belongs
	// to its owner). Completing again with the same token and result
	// succeeds. Errors: ErrInvalid (a bad key; a result that is not JSON or
	// is over MaxClaimResultBytes), ErrNotFound (no such claim or vault key),
	// ErrConflict (a stale owner, or completed with another result),
	// ErrKeyRevoked, ErrKeyExpired.
	CompleteClaim(ctx context.Context, keyID, key string, fencing uint64, result []byte) error
	// ReleaseClaim gives an in-progress claim up: it is deleted, so the work
	// can be claimed again at once (with a new, higher fencing token).
	// Errors: ErrInvalid, ErrNotFound, ErrConflict (a stale owner, or the
	// claim is completed), ErrKeyRevoked, ErrKeyExpired.
	ReleaseClaim(ctx context.Context, keyID, key string, fencing uint64) error
	// GetClaim returns the claim, with its result when it is completed, never
	// its fencing token. Errors: ErrInvalid, ErrNotFound, ErrSealed.
	GetClaim(ctx context.Context, keyID, key string) (Claim, error)

	// ---- dashboard and metrics ----

	// KeysUsage returns each key of ids with its windows at the store clock
	// and their counters, in the order of ids, in one read transaction.
	// Errors: ErrInvalid (no id, or more than MaxKeysUsage), ErrNotFound
	// (naming the first id that is no key).
	KeysUsage(ctx context.Context, ids []string) ([]KeyWindows, error)
	// DailySpend returns what keyID committed and holds on each day of its
	// billing period, summed from the key's ledger. Errors: ErrNotFound.
	DailySpend(ctx context.Context, keyID string) (SpendReport, error)
	// Overview summarizes the vault at the store clock (see Overview).
	Overview(ctx context.Context, opts OverviewOptions) (Overview, error)
	// SummarizeUsage walks the active keys and their current windows'
	// counters (see UsageSummary) in transactions of a bounded number of
	// keys, so the summary is not one snapshot. Errors: ErrInvalid (a
	// percentage outside 1–100).
	SummarizeUsage(ctx context.Context, nearCapPercent int) (UsageSummary, error)

	// ---- maintenance ----

	// Reap removes what has outlived its use, in small transactions:
	// completed idempotency records IdempotencyTTL after completion (never
	// unknown, in-progress or operator-resolved ones) with their settled
	// holds, daily counters with nothing held long after their day, money
	// objects without exposure unchanged for ObjectRetention, and claims
	// IdempotencyTTL after completion or after their lease lapsed. It also
	// turns in-progress records whose lease lapsed into outcome unknown,
	// keeping their holds (their request's process is gone). It returns how
	// many entries it removed. Running it on several replicas at once is
	// harmless.
	Reap(ctx context.Context) (int, error)
	// CheckInvariant verifies, in one read snapshot, that the counters agree
	// with the holds, the exposure, the ledger and the caps (see
	// docs/ARCHITECTURE.md, "The invariant and its exceptions"). It returns
	// nil, or ErrInvariant joined with one error per violation.
	CheckInvariant(ctx context.Context) error
	// Now is the store's clock: the instant by which it decides windows,
	// leases and expiry, and by which every surface decides whether a key is
	// expired or not yet valid, so that a replica whose own clock is off
	// decides no key differently. bbolt's is the process's; PostgreSQL's is
	// the database's, read as the process's clock plus the offset measured
	// at every transaction's start.
	Now() time.Time
	// Check runs the store's own consistency checks in one read snapshot:
	// the storage engine's structural check where it has one (bbolt: every
	// page reachable once, none both free and in use) and CheckInvariant.
	// Findings are in the report, not in the error, which is a failure to
	// read.
	Check(ctx context.Context) (CheckReport, error)
	// Ping proves the store can commit now: it writes a probe through the
	// hot path (on bbolt as large as a settle's commit, so that a disk with
	// too little space left fails it). Errors: ErrNoSpace, ErrStorage,
	// ErrClosed.
	Ping(ctx context.Context) error
	// CommitError is the storage failure of the last hot-path write
	// transaction, or nil when it committed (ErrNoSpace for a full disk). It
	// reads nothing: Ping is the probe.
	CommitError() error
	// PendingSettles is how many settles whose outcome Stripe gave are kept
	// in memory because their commit failed (a full disk), retried until
	// they are durable (see SettleQueued).
	PendingSettles() int
	// Size is how many bytes the store takes on disk.
	Size(ctx context.Context) (int64, error)
	// Compact gives the space of what the reaper removed back to the file
	// system, and returns the store's size before and after. On bbolt it
	// rewrites the file without its free pages while every other call
	// waits: seconds per gigabyte. Errors: errors.ErrUnsupported from a store
	// whose engine reclaims its own space (PostgreSQL: autovacuum).
	Compact(ctx context.Context) (CompactResult, error)
	// Backup writes a hot, consistent copy of the store to w. Errors:
	// errors.ErrUnsupported from a store that is backed up with its engine's
	// own tools (PostgreSQL: pg_dump).
	Backup(ctx context.Context, w io.Writer) (int64, error)
	// Close releases the store; pending writes finish first. Calls after
	// Close return ErrClosed.
	Close() error
}

// CheckReport is what Check found: nothing when both lists are empty.
type CheckReport struct {
	// Pages is how many pages the structural check walked (0 on a store
	// without one: PostgreSQL).
	Pages int
	// PageProblems are the structural check's findings, one sentence each.
	PageProblems []string
	// Records is how many idempotency records the invariant check read.
	Records int
	// InvariantProblems are CheckInvariant's findings, one sentence each.
	InvariantProblems []string
}

// OK reports whether the check found nothing.
func (r CheckReport) OK() bool { return len(r.PageProblems) == 0 && len(r.InvariantProblems) == 0 }

// CompactResult is the size of a store before and after Compact, in bytes.
type CompactResult struct {
	Before, After int64
}

// KeyRememberer is implemented by a store that can authenticate a token from
// what this process remembers of it, without reading the store, where another
// process may change the key meanwhile (PostgreSQL replicas).
// AuthenticateRemembered answers as Authenticate does; remembered says the key
// came from memory and may be stale. Whoever acts on a remembered key checks
// it first: a Reserve with its versions (ReserveRequest.KeyVersion) checks it
// in the same transaction as the hold, and before anything else reaches
// Stripe or is refused, Authenticate reads it again.
type KeyRememberer interface {
	AuthenticateRemembered(ctx context.Context, token string) (key Key, remembered bool, err error)
}

// SecretKeeper is implemented by a store that may keep unsealed upstream
// secrets in memory. KeepsSecrets reports whether it does: then it forgets a
// secret the moment it changes it (it is the store's only writer), and a
// caller of UpstreamSecret needs no cache of its own, which could only be
// staler.
type SecretKeeper interface {
	KeepsSecrets() bool
}

// ClockReader is implemented by a store whose clock is not the process's
// (PostgreSQL: the database's). ClockOffset says how far the store's clock is
// ahead of the process's as last measured (negative: behind); ok is false
// until it has been measured. A replica whose offset is large has a clock
// that needs fixing: nothing of keybrake's decides by it, but what the
// process writes (log times, tokens it issues) does.
type ClockReader interface {
	ClockOffset() (offset time.Duration, ok bool)
}

// ObjectRetention is how long a metered-object total is kept after its last
// change: longer than a PaymentIntent or an uncaptured Charge stays confirmable
// or capturable at Stripe (at most 30 days with extended authorization).
const ObjectRetention = 35 * 24 * time.Hour

// Defaults of the stores' options.
const (
	DefaultIdempotencyTTL    = 24 * time.Hour
	DefaultUnknownRetryLimit = 23 * time.Hour
	DefaultLease             = 2 * time.Minute
	// DefaultLedgerRetention is how long ledger events are kept: a year and
	// a month, so that a year's spend can be looked at event by event.
	DefaultLedgerRetention = 400 * 24 * time.Hour
)

// MintRequest is what MintKey needs. Policy must already be normalized; MintKey
// validates it with ValidateNew (ErrInvalid wrapping *policy.ValidationError).
type MintRequest struct {
	Name     string
	Upstream string
	Labels   map[string]string
	Policy   policy.Policy
}

// KeyChange is a change of a key's policy and labels made against the key as
// it is (see Store.PatchKey).
type KeyChange struct {
	// IfVersion, when not 0, is the Key.Version the change was made against:
	// a key at another version is left alone (ErrPrecondition).
	IfVersion uint64
	// Apply returns the key's new policy and labels from the key as it is and
	// the store's clock now (which defaults period_start). It runs inside the
	// store's transaction, under the key's lock, and may run more than once
	// (a transaction that collided runs again): it must be a pure function
	// of its arguments, and must never wait on anything outside the process.
	// An error it returns turns the change down.
	Apply func(k Key, now time.Time) (policy.Policy, map[string]string, error)
}

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
	// Tool is the MCP tool that made the request, recorded in its event ("" for
	// none).
	Tool string
	// Ask describes the request to a person, should the key's policy make a
	// metered request wait for approval (policy.Policy.NeedsApproval); nil is
	// an empty description.
	Ask *ApprovalAsk
	// KeyVersion and UpstreamVersion, when KeyVersion is not 0, are the
	// versions of the key and of its upstream as a remembered key had them
	// (KeyRememberer): Reserve then answers ErrKeyChanged, writing nothing,
	// unless they are still the ones its transaction reads.
	KeyVersion, UpstreamVersion uint64
}

// ReserveOutcome says what Reserve did.
type ReserveOutcome int

// Reserve outcomes.
const (
	// ReserveClaimed: a new record (in_progress, with lease) and, if metered, a hold on every window.
	ReserveClaimed ReserveOutcome = iota + 1
	// ReserveReplay: the record is completed; Record.Response is Stripe's stored answer.
	ReserveReplay
	// ReserveInFlight: the record is in_progress under a live lease (409, Retry-After).
	ReserveInFlight
	// ReserveMismatch: same idempotency key, different fingerprint (422).
	ReserveMismatch
	// ReserveResume: the record was unknown (or its lease lapsed); it is in_progress again under a
	// new lease and keeps its existing hold. Forward again with the SAME upstream key.
	ReserveResume
	// ReserveStale: the record is unknown and older than UnknownRetryLimit: not re-forwarded;
	// an operator must resolve it.
	ReserveStale
	// ReserveRefused: the policy refused (Decision says why). Nothing was written except the event.
	ReserveRefused
	// ReserveApproval: the request waits for a person, or a person said no.
	// Approval says which: pending (the record is new, or still waits: its
	// hold is placed and counts against every cap, nothing is forwarded),
	// declined or expired (the hold was released; every retry gets this).
	ReserveApproval
)

// ReserveResult is what Reserve returns. Decision is set for ReserveClaimed (possibly
// with WouldRefuse in report mode) and ReserveRefused. Record is set for every
// outcome but ReserveRefused.
type ReserveResult struct {
	Outcome  ReserveOutcome
	Decision policy.Decision
	Key      Key
	Record   IdempotencyRecord
	Hold     *Hold
	// Approval is set for ReserveApproval, and for a ReserveReplay or
	// ReserveResume of a record that waited for one.
	Approval *Approval
	// Windows and Usage are the key's windows at the store clock and their
	// counters as the Reserve left them (its own hold included), for the
	// outcomes that forward or replay (ReserveClaimed, ReserveResume,
	// ReserveReplay): what is left of each cap, without another read. For a
	// key under a budget they include every budget window of its chain,
	// under their scoped ids ("bud_…/day:…"), for a metered request.
	Windows []policy.Window
	Usage   policy.Usage
}

// SettleOutcome is how a forwarded request ended.
type SettleOutcome string

// Settle outcomes.
const (
	SettleCommit  SettleOutcome = "commit"  // 2xx: held → committed (Amount may differ from the hold)
	SettleRelease SettleOutcome = "release" // definitive 4xx: held → 0; record completed
	SettleUnknown SettleOutcome = "unknown" // 5xx / no answer: stays held; record unknown
	SettleAbandon SettleOutcome = "abandon" // upstream 429 or never forwarded: record back to its previous state; hold unchanged if it pre-existed, released if this claim created it
)

// SettleRequest settles the record (KeyID, IdempotencyKey). Amount is the money the
// request moved, to commit (minor units). It may be lower than what was held (a
// partial capture); it may exceed the hold plus the exposure of ObjectID only with
// AllowOverrun (see Settle). Response is stored for replay with Commit and Release
// (and Unknown when Stripe answered 5xx: Stripe replays 5xx too).
type SettleRequest struct {
	KeyID           string
	IdempotencyKey  string
	Outcome         SettleOutcome
	Amount          int64
	Response        *StoredResponse
	UpstreamStatus  int
	StripeRequestID string
	// ObjectID is the Stripe object the request created or acted on (recorded in
	// the settle event). A commit whose Object is set is settled against that
	// money object (Object says how).
	ObjectID string
	Object   ObjectSettle
	// Tool is the MCP tool that made the request, recorded in the settle event.
	Tool string
	// AllowOverrun lets a commit exceed the hold plus the object's exposure: Stripe
	// reported that the request moved more than keybrake held, because the object
	// was changed outside keybrake between the amount lookup and the request. The
	// money has moved, so it is booked in full; the excess is added to the windows'
	// allowance and recorded in the settle event. Without it such a commit is
	// ErrInvalid.
	AllowOverrun bool
	// Link, on a commit, links the object the request created (a
	// subscription, a Checkout Session, a Payment Link) to the key in the
	// settle's transaction, as RenewalStore.LinkObject does; the store fills
	// in the upstream and the key. Nil for none.
	Link *ObjectLink
	// Request is the request as it was forwarded, kept (sealed) with an
	// unknown outcome only, so that an operator can have it sent again under
	// the same upstream idempotency key (UnknownRequest); ignored by every
	// other outcome, and dropped when the record leaves unknown.
	Request *StoredRequest
}

// StoredRequest is a request as keybrake forwarded it to Stripe: what a retry
// of it sends again. Target is the escaped path with its query; Header holds
// the Stripe headers that change what Stripe does (Stripe-Account,
// Stripe-Context, Stripe-Version) and Content-Type.
type StoredRequest struct {
	Method string
	Target string
	Header http.Header
	Body   []byte
}

// ObjectSettle says how a commit changes the money object ObjectID.
type ObjectSettle struct {
	// Created: the request created the object (it is the key's own from now on).
	Created bool
	// Expose: what the request held and did not commit stays counted as the
	// object's exposure, instead of being released.
	Expose bool
	// Terminal: Stripe's answer proves the object can move no more money; the rest
	// of its exposure (and of the request's hold) is released.
	Terminal bool
	// Moved is the object's cumulative money moved as the answer reports it
	// (MovedKnown false when it does not), kept for later observations.
	Moved      int64
	MovedKnown bool
	// StripeAccount and StripeContext are the request's Stripe-Account and
	// Stripe-Context headers, under which Stripe answered for the object: kept
	// so that a later lookup finds it (Exposure.StripeAccount).
	StripeAccount string
	StripeContext string
}
