package engine

import (
	"context"
	"errors"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// Bucket names one keyspace of the store. The engine writes every record as a
// value under a key in one of them; a backend keeps each bucket's entries in
// key order (bbolt: a bucket of the file; PostgreSQL: a table).
type Bucket uint8

// The buckets, with their key layouts and values. Schema version 2 writes
// records, events and objects in binary (codec.go) and added the last four
// buckets; values written as JSON by version 1 stay readable:
//
//	meta        "schema_version" → uint64 BE; "master_key_check" → sealed constant;
//	            "env_upstream/" + name → salted fingerprint (envupstream.go)
//	upstreams   name → upstreamRec (JSON; secret sealed)
//	keys        key id → keyRec (JSON)
//	key_tokens  hex SHA-256 of token → key id
//	key_names   name → key id; "\x00budget\x00" + parent id + "\x00" + name →
//	            budget id (a budget's name among its siblings, budgets.go; a
//	            key's name has no control character, so the two never meet)
//	idem        16-byte hash of (key id, idempotency key), as in HoldID → recordRec
//	            (binary, with the hold of a metered request; response body
//	            compressed and sealed), or the 8-byte records key it is under
//	records     sequence (8 bytes BE) → recordRec, on a store that appends its
//	            records (bbolt; see recordRec)
//	hold_index  created-at unix ns (8 bytes BE) + hold id → hold state
//	counters    key id "/" window id → counter (binary, 33 bytes)
//	events      key id NUL seq (8 bytes BE) → Event (binary); seq from the bucket sequence
//	audit       seq (8 bytes BE) → AuditEntry (JSON)
//	objects     key id NUL Stripe object id → objectRec (binary)
//	claims      key id NUL claim key → claimRec (JSON; result sealed); the bucket
//	            sequence is the fencing-token counter
//	inflight    idem key of each in_progress record → its lease end (unix ns, 8 bytes BE)
//	completions completed-at unix ns (8 bytes BE) + idem key of each completed
//	            record the reaper will remove → empty
//	rollups     key id "/" window id → the summed deltas of the ledger events the
//	            retention removed (binary, 24 bytes)
//	budgets     budget id → budgetRec (JSON); a Get in a write transaction
//	            locks the budget, as one from keys locks the key
//	velocity    scope id NUL velocity limit key → the times of the last holds
//	            counted against it (unix ns, 8 bytes BE each, oldest first)
//	webhooks, deliveries, delivery_due, delivery_done, event_marks: the
//	            endpoints and the outbox (outbox.go)
//	raise_requests  raise request id ("rr_…", sorts by creation) → raiseRequestRec (JSON)
//	raise_pending   key id NUL raise request id of each pending request → empty
//
// A budget's counters are in counters too, under budget id "/" window id; a
// hold's window ids name them so ("bud_…/day:2026-09-14"), see counterKey.
//
//	approvals   approval id ("apr_…", sortable by creation) → vault.Approval (JSON)
//	approvals_open approval id of each pending or approved approval → its
//	            expiry (unix ns, 8 bytes BE) + key id: what the reaper expires
//
// Stripe's events (stripeevents.go):
//
//	stripe_events  upstream NUL Stripe event id → stripeEventRec (JSON): the
//	            events applied, kept vault.StripeEventRetention
//	object_keys Stripe object id NUL key id → empty: the keys that count a
//	            money object (objects, the other way round)
//	unknown_keys upstream idempotency key of an unknown hold → hold id
//
// Renewals (renewals.go):
//
//	object_links   upstream NUL Stripe object id → vault.ObjectLink (JSON): the
//	            objects a key created indirectly (subscriptions, their renewal
//	            invoices), removed ObjectRetention after they end
//	renewal_pauses upstream NUL invoice id → vault.RenewalPause (JSON): the
//	            auto_advance=false calls owed to Stripe
const (
	BucketMeta Bucket = iota
	BucketUpstreams
	BucketKeys
	BucketTokens
	BucketNames
	BucketIdem
	BucketHoldIndex
	BucketCounters
	BucketEvents
	BucketAudit
	BucketObjects
	BucketClaims
	BucketInflight
	BucketCompletions
	BucketRollups
	BucketRecords
	BucketBudgets
	BucketVelocity
	BucketWebhooks
	BucketDeliveries
	BucketDeliveryDue
	BucketDeliveryDone
	BucketMarks
	BucketRaiseRequests
	BucketRaisePending
	// Approvals (approvals.go).
	BucketApprovals
	BucketApprovalsOpen
	// Stripe's events (stripeevents.go).
	BucketStripeEvents
	BucketObjectKeys
	BucketUnknownKeys
	// Renewals (renewals.go).
	BucketLinks
	BucketRenewalPauses
	// NumBuckets counts the buckets.
	NumBuckets
)

var bucketLabels = [NumBuckets]string{
	"meta", "upstreams", "keys", "key_tokens", "key_names", "idem",
	"hold_index", "counters", "events", "audit", "objects", "claims",
	"inflight", "completions", "rollups", "records",
	"budgets", "velocity",
	"webhooks", "deliveries", "delivery_due", "delivery_done", "event_marks",
	"raise_requests", "raise_pending",
	"approvals", "approvals_open",
	"stripe_events", "object_keys", "unknown_keys",
	"object_links", "renewal_pauses",
}

// Name is the bucket's name (bbolt's bucket name).
func (b Bucket) Name() string { return bucketLabels[b] }

// Buckets lists every bucket.
func Buckets() []Bucket {
	out := make([]Bucket, NumBuckets)
	for i := range out {
		out[i] = Bucket(i)
	}
	return out
}

// LocksOnRead reports whether a Get from b in a write transaction locks the
// entry until the transaction ends, on a backend with concurrent writers: the
// entries that a read-modify-write changes under no vault key's lock (keys and
// upstreams, webhook endpoints, deliveries).
func LocksOnRead(b Bucket) bool {
	switch b {
	case BucketKeys, BucketUpstreams, BucketBudgets, BucketWebhooks, BucketDeliveries:
		return true
	}
	return false
}

// Tx is one transaction of a backend: an ordered key-value store of buckets.
// The engine runs every rule of the vault against it, so the rules are written
// once, whichever backend stores the bytes.
//
// Values returned by Get and by cursors are valid only until the transaction
// ends; the engine decodes or copies them before. A backend whose reads can
// fail (a network) records the first failure of a cursor, returns nil from it
// as at the end of the bucket, and fails the whole transaction with it.
type Tx interface {
	// Get returns the value under k, nil when there is none. In a write
	// transaction, a Get from a bucket LocksOnRead names locks the entry
	// until the transaction ends (see LockKey).
	Get(b Bucket, k []byte) ([]byte, error)
	// GetMany returns the values under keys, in their order: nil where there
	// is none. A backend over a network reads them in one round trip.
	GetMany(b Bucket, keys [][]byte) ([][]byte, error)
	// Put writes v under k, replacing any value.
	Put(b Bucket, k, v []byte) error
	// Insert writes v under k, which the engine has found to be free in this
	// transaction. A backend where another writer can take the key in between
	// detects it and runs the whole transaction again.
	Insert(b Bucket, k, v []byte) error
	// Delete removes k; deleting a missing key is no error.
	Delete(b Bucket, k []byte) error
	// Append writes v under prefix followed by the bucket's next sequence
	// number (8 bytes, big-endian): an entry that sorts after every entry of
	// prefix written before it.
	Append(b Bucket, prefix, v []byte) error
	// NextSequence returns the bucket's next sequence number: greater than
	// every number it returned before, never handed out twice (gaps allowed).
	NextSequence(b Bucket) (uint64, error)
	// Cursor iterates over the bucket in key order (bytewise).
	Cursor(b Bucket) Cursor
	// LockKey locks the vault key id until the transaction ends, so that every
	// transaction that reads or writes a key's records, counters, objects or
	// claims after locking it sees the writes of those before it. The engine
	// locks a key before it reads anything of the key's in a write
	// transaction; a Get of the key itself from BucketKeys locks it too. A
	// backend with one writer at a time (bbolt) has nothing to do.
	LockKey(id string) error
}

// firstAfter moves c to the first key after after ("": the first key), where
// a page of a cursored list starts.
func firstAfter(c Cursor, after string) (k, v []byte) {
	if after == "" {
		return c.First()
	}
	k, v = c.Seek([]byte(after))
	if k != nil && string(k) == after {
		k, v = c.Next()
	}
	return k, v
}

// Cursor walks a bucket in key order. Each method returns the entry it moves
// to, or nil at either end.
type Cursor interface {
	First() (k, v []byte)
	Last() (k, v []byte)
	// Seek moves to the first key at or after seek.
	Seek(seek []byte) (k, v []byte)
	Next() (k, v []byte)
	Prev() (k, v []byte)
}

// TxFunc is the body of one transaction; now is the store clock, read once for
// the transaction. A write transaction's body may run more than once (a batch
// rolled back, a retry after a serialization failure): it must start over each
// time, keeping no state from an earlier run.
type TxFunc func(tx Tx, now time.Time) error

// Backend runs transactions. It translates its own errors into the vault's
// sentinels (ErrStorage, ErrClosed, …) and passes the vault's own through.
type Backend interface {
	// View runs fn in a read-only transaction that sees one consistent
	// snapshot.
	View(ctx context.Context, fn TxFunc) error
	// Update runs fn in a durable write transaction.
	Update(ctx context.Context, fn TxFunc) error
	// Submit runs fn in a durable write transaction of the hot path (Reserve,
	// Settle, ObserveObject, the claims API, Ping); a backend may commit
	// several callers' bodies in one transaction (bbolt's group committer).
	// Once fn has been handed over, Submit waits for its outcome even if ctx
	// ends, so that a durable write is never reported lost.
	Submit(ctx context.Context, fn TxFunc) error
	// Queue is Submit for a caller that does not wait for durability: it
	// queues fn behind every hot-path write queued before it and ahead of
	// every one queued after, returns, and calls done with fn's outcome once
	// its transaction is durable or has failed. done runs on the backend's
	// committer and must return at once. A backend shared by replicas
	// (PostgreSQL) waits until fn's transaction is durable before it returns.
	// Queue returns an error, and never calls done, only when fn was not
	// queued (a closed store, ctx ended before).
	Queue(ctx context.Context, fn TxFunc, done func(error)) error
}

// Reader is a Backend that can run a body whose reads need no common
// snapshot outside a transaction: each read sees what is committed when it
// runs, and the body writes nothing. On PostgreSQL it saves the BEGIN, the
// clock and the COMMIT (two round trips, and the server's transaction) of a
// read the hot path makes on every request. now is the process's clock.
type Reader interface {
	Read(ctx context.Context, fn TxFunc) error
}

// ThroughGetter is a Tx that reads an entry and the entry of another bucket
// its value names in one step (one statement on PostgreSQL): ref is the
// value of k in b (nil when there is none), v the value of ref in via (nil
// when there is none), both as of one moment.
type ThroughGetter interface {
	GetThrough(b Bucket, k []byte, via Bucket) (ref, v []byte, err error)
}

// ThroughWithGetter is a ThroughGetter that reads one more entry, named
// ahead, in the same step: with's value (nil when there is none), as of the
// same moment as ref and v. Authenticate reads a token's key and the
// upstream it expects the key to name in one statement on PostgreSQL.
type ThroughWithGetter interface {
	GetThroughWith(b Bucket, k []byte, via Bucket, with Read) (ref, v, withV []byte, err error)
}

// getThrough is ThroughGetter.GetThrough, as two reads where tx cannot.
func getThrough(tx Tx, b Bucket, k []byte, via Bucket) (ref, v []byte, err error) {
	if g, ok := tx.(ThroughGetter); ok {
		return g.GetThrough(b, k, via)
	}
	if ref, err = tx.Get(b, k); err != nil || ref == nil {
		return ref, nil, err
	}
	v, err = tx.Get(via, ref)
	return ref, v, err
}

// forEach calls fn for every entry of b in key order until fn fails.
func forEach(tx Tx, b Bucket, fn func(k, v []byte) error) error {
	c := tx.Cursor(b)
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}

// IsVaultError reports whether err is one of the vault's sentinels or a
// context's error, which a backend passes on as it is.
func IsVaultError(err error) bool {
	for _, known := range []error{vault.ErrNotFound, vault.ErrConflict, vault.ErrInvalid, vault.ErrKeyInvalid,
		vault.ErrKeyRevoked, vault.ErrKeyExpired, vault.ErrSealed, vault.ErrClosed, vault.ErrLocked,
		vault.ErrSchemaVersion, vault.ErrStorage, vault.ErrInvariant, vault.ErrPrecondition, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, known) {
			return true
		}
	}
	return false
}
