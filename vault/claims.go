package vault

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"
)

// Claims: the claims API's pre-flight table, for work that does not pass through
// the proxy (the seed's `INSERT … ON CONFLICT DO NOTHING` billing_records table).
//
// A claim is scoped to a vault key. Its bucket, registered in buckets.go:
//
//	claims  key id NUL claim key → claimRec (JSON; result sealed under the master
//	        key, bound to the key id and claim key); the bucket sequence is the
//	        fencing-token counter
//
// Fencing tokens come from the bucket's sequence, so they increase across every
// claim of every key: a token is never handed out twice, not even after a claim was
// released (deleted) or reaped and then claimed again. Each change of ownership (a
// new claim, or a lapsed lease taken over) takes the next one, and only the holder
// of the current token may complete or release the claim.
//
// Retention: Reap deletes a completed claim IdempotencyTTL after its completion,
// and an in-progress claim IdempotencyTTL after its lease lapsed (its owner is gone;
// whoever claims it again gets a fresh, higher token).
var bucketClaims = []byte("claims")

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

// claimRec is a claim as stored.
type claimRec struct {
	KeyID        string     `json:"k"`
	Key          string     `json:"key"`
	Fingerprint  string     `json:"fp"`
	State        ClaimState `json:"st"`
	LeaseUntil   time.Time  `json:"lease,omitzero"`
	Fencing      uint64     `json:"f"`
	SealedResult []byte     `json:"r,omitempty"`
	CreatedAt    time.Time  `json:"c"`
	UpdatedAt    time.Time  `json:"u"`
	CompletedAt  time.Time  `json:"done,omitzero"`
}

// public returns the claim without its result or fencing token.
func (r *claimRec) public() Claim {
	return Claim{
		KeyID: r.KeyID, Key: r.Key, Fingerprint: r.Fingerprint, State: r.State,
		LeaseExpiresAt: r.LeaseUntil, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, CompletedAt: r.CompletedAt,
	}
}

// claimAD binds a sealed result to its key id and claim key.
func claimAD(keyID, key string) []byte {
	return []byte("keybrake/claim-result\x00" + keyID + "\x00" + key)
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

// checkClaimArgs validates the arguments every claim method shares.
func checkClaimArgs(keyID, key string) error {
	if keyID == "" {
		return fmt.Errorf("empty key id: %w", ErrInvalid)
	}
	if !ValidClaimKey(key) {
		return fmt.Errorf("claim key must be 1-%d characters without control characters: %w", MaxClaimKeyLen, ErrInvalid)
	}
	return nil
}

// activeKeyTx re-reads the key in tx: it must exist, not be revoked and not be
// expired at now.
func (s *Store) activeKeyTx(tx *bolt.Tx, now time.Time, keyID string) error {
	rec, err := s.keys.get(tx, keyID)
	if err != nil {
		return err
	}
	switch (&Key{Status: rec.Status, Policy: rec.Policy}).StatusAt(now) {
	case KeyRevoked:
		return fmt.Errorf("key %s: %w", keyID, ErrKeyRevoked)
	case KeyExpired:
		return fmt.Errorf("key %s: %w", keyID, ErrKeyExpired)
	}
	return nil
}

// getClaimRec returns the stored claim under k, nil when there is none.
func getClaimRec(tx *bolt.Tx, k []byte) (*claimRec, error) {
	var r claimRec
	ok, err := getJSON(tx.Bucket(bucketClaims), k, &r)
	if err != nil || !ok {
		return nil, err
	}
	return &r, nil
}

// openResult unseals a completed claim's result.
func (s *Store) openResult(r *claimRec) ([]byte, error) {
	if r.SealedResult == nil {
		return nil, nil
	}
	res, err := s.seal.open(r.SealedResult, claimAD(r.KeyID, r.Key))
	if err != nil {
		return nil, fmt.Errorf("result of claim under %s: %w", r.KeyID, err)
	}
	return res, nil
}

// Claim claims the unit of work key under the vault key keyID for lease, in one
// group-committed write transaction that re-reads the key:
//
//	no claim                                → new claim, next fencing token    Claimed
//	another fingerprint                     → unchanged                        FingerprintMismatch
//	completed                               → unchanged, with its result       Completed
//	in_progress, lease live                 → unchanged                        InProgress
//	in_progress, lease lapsed               → new lease, next fencing token    Claimed (TookOver)
//
// Business outcomes are results, not errors. Errors: ErrInvalid (bad key, a
// fingerprint over MaxClaimFingerprintLen, a lease that is not positive),
// ErrNotFound (no such vault key), ErrKeyRevoked, ErrKeyExpired, ErrSealed (a stored
// result does not open), ErrClosed, ctx's error before the call is queued.
func (s *Store) Claim(ctx context.Context, keyID, key, fingerprint string, lease time.Duration) (ClaimResult, error) {
	if err := checkClaimArgs(keyID, key); err != nil {
		return ClaimResult{}, fmt.Errorf("claim: %w", err)
	}
	if len(fingerprint) > MaxClaimFingerprintLen {
		return ClaimResult{}, fmt.Errorf("claim: fingerprint longer than %d bytes: %w", MaxClaimFingerprintLen, ErrInvalid)
	}
	if lease <= 0 {
		return ClaimResult{}, fmt.Errorf("claim: lease must be positive: %w", ErrInvalid)
	}
	res, err := submitResult(ctx, s, func(tx *bolt.Tx, now time.Time) (txResult[ClaimResult], error) {
		return s.claimTx(tx, now, keyID, key, fingerprint, lease)
	})
	if err != nil {
		return ClaimResult{}, fmt.Errorf("claim: %w", err)
	}
	return res, nil
}

// claimTx applies a Claim. Every reason to turn it down is found before any write.
func (s *Store) claimTx(tx *bolt.Tx, now time.Time, keyID, key, fingerprint string, lease time.Duration) (txResult[ClaimResult], error) {
	if err := s.activeKeyTx(tx, now, keyID); err != nil {
		return reject[ClaimResult](err), nil
	}
	k := idemKey(keyID, key)
	rec, err := getClaimRec(tx, k)
	if err != nil {
		return txResult[ClaimResult]{}, err
	}
	var res ClaimResult
	if rec != nil {
		switch {
		case rec.Fingerprint != fingerprint:
			return accept(ClaimResult{Outcome: ClaimOutcomeFingerprintMismatch, Claim: rec.public()}), nil
		case rec.State == ClaimCompleted:
			result, err := s.openResult(rec)
			if err != nil {
				return reject[ClaimResult](err), nil
			}
			c := rec.public()
			c.Result = result
			return accept(ClaimResult{Outcome: ClaimOutcomeCompleted, Claim: c}), nil
		case now.Before(rec.LeaseUntil):
			return accept(ClaimResult{Outcome: ClaimOutcomeInProgress, Claim: rec.public()}), nil
		}
		// The lease lapsed: compare-and-set in this transaction, so exactly one of
		// the callers racing for it becomes the owner.
		res.TookOver = true
	} else {
		rec = &claimRec{KeyID: keyID, Key: key, Fingerprint: fingerprint, State: ClaimInProgress, CreatedAt: now}
	}
	b := tx.Bucket(bucketClaims)
	seq, err := b.NextSequence()
	if err != nil {
		return txResult[ClaimResult]{}, fmt.Errorf("fencing token: %w", err)
	}
	rec.Fencing, rec.LeaseUntil, rec.UpdatedAt = seq, now.Add(lease), now
	if err := putJSON(b, k, rec); err != nil {
		return txResult[ClaimResult]{}, err
	}
	res.Outcome = ClaimOutcomeClaimed
	res.Claim = rec.public()
	res.Claim.FencingToken = rec.Fencing
	return accept(res), nil
}

// CompleteClaim stores result (JSON) as the outcome of the claim and marks it
// completed, in one group-committed write transaction that re-reads the key. Only
// the current owner may complete: fencing must be the token its Claim returned. A
// lapsed lease that nobody took over still belongs to its owner. Completing again
// with the same token and the same result succeeds (a retried request).
//
// Errors: ErrInvalid (bad key, result not JSON or over MaxClaimResultBytes),
// ErrNotFound (no such claim or vault key), ErrConflict (a stale owner: the claim
// changed owner, or is already completed), ErrKeyRevoked, ErrKeyExpired, ErrClosed.
func (s *Store) CompleteClaim(ctx context.Context, keyID, key string, fencing uint64, result []byte) error {
	if err := checkClaimArgs(keyID, key); err != nil {
		return fmt.Errorf("complete claim: %w", err)
	}
	if len(result) > MaxClaimResultBytes || !json.Valid(result) {
		return fmt.Errorf("complete claim: result must be JSON of at most %d bytes: %w", MaxClaimResultBytes, ErrInvalid)
	}
	// Sealed outside the transaction: the writer is held for as short as possible.
	sealed, err := s.seal.seal(result, claimAD(keyID, key))
	if err != nil {
		return fmt.Errorf("complete claim: %w", err)
	}
	err = s.submitOwnedClaim(ctx, keyID, key, fencing, func(tx *bolt.Tx, now time.Time, owned ownedClaim) (txResult[noValue], error) {
		return s.completeClaimTx(tx, now, owned, result, sealed)
	})
	if err != nil {
		return fmt.Errorf("complete claim: %w", err)
	}
	return nil
}

func (s *Store) completeClaimTx(tx *bolt.Tx, now time.Time, owned ownedClaim, result, sealed []byte) (txResult[noValue], error) {
	rec := owned.rec
	if rec.State == ClaimCompleted {
		stored, err := s.openResult(rec)
		if err != nil {
			return reject[noValue](err), nil
		}
		if !bytes.Equal(stored, result) {
			return reject[noValue](fmt.Errorf("claim is already completed with another result: %w", ErrConflict)), nil
		}
		return accept(noValue{}), nil // the owner's retry: already done
	}
	rec.State, rec.SealedResult = ClaimCompleted, sealed
	rec.LeaseUntil, rec.CompletedAt, rec.UpdatedAt = time.Time{}, now, now
	return accept(noValue{}), putJSON(tx.Bucket(bucketClaims), owned.k, rec)
}

// submitOwnedClaim runs op, in one group-committed write, on the claim (keyID,
// key) when the holder of fencing owns it (ownedClaimTx); otherwise the call is
// turned down as ownedClaimTx says.
func (s *Store) submitOwnedClaim(ctx context.Context, keyID, key string, fencing uint64,
	op func(tx *bolt.Tx, now time.Time, owned ownedClaim) (txResult[noValue], error)) error {
	_, err := submitResult(ctx, s, func(tx *bolt.Tx, now time.Time) (txResult[noValue], error) {
		owned, err := s.ownedClaimTx(tx, now, keyID, key, fencing)
		switch {
		case err != nil:
			return txResult[noValue]{}, err
		case owned.err != nil:
			return reject[noValue](owned.err), nil
		}
		return op(tx, now, owned.val)
	})
	return err
}

// ownedClaim is a stored claim and its bucket key.
type ownedClaim struct {
	k   []byte
	rec *claimRec
}

// ownedClaimTx reads the claim (keyID, key) for the owner holding fencing; it is
// turned down with ErrNotFound without a claim and ErrConflict for a stale owner.
func (s *Store) ownedClaimTx(tx *bolt.Tx, now time.Time, keyID, key string, fencing uint64) (txResult[ownedClaim], error) {
	if err := s.activeKeyTx(tx, now, keyID); err != nil {
		return reject[ownedClaim](err), nil
	}
	k := idemKey(keyID, key)
	rec, err := getClaimRec(tx, k)
	switch {
	case err != nil:
		return txResult[ownedClaim]{}, err
	case rec == nil:
		return reject[ownedClaim](fmt.Errorf("claim under %s: %w", keyID, ErrNotFound)), nil
	case rec.Fencing != fencing:
		return reject[ownedClaim](fmt.Errorf("fencing token %d is not the claim's current owner: %w", fencing, ErrConflict)), nil
	}
	return accept(ownedClaim{k: k, rec: rec}), nil
}

// ReleaseClaim gives an in-progress claim up (a transient failure): it is deleted,
// so the work can be claimed again at once (with a new, higher fencing token). One
// group-committed write transaction that re-reads the key.
//
// Errors: ErrInvalid, ErrNotFound (no such claim or vault key), ErrConflict (a
// stale owner, or the claim is completed), ErrKeyRevoked, ErrKeyExpired, ErrClosed.
func (s *Store) ReleaseClaim(ctx context.Context, keyID, key string, fencing uint64) error {
	if err := checkClaimArgs(keyID, key); err != nil {
		return fmt.Errorf("release claim: %w", err)
	}
	err := s.submitOwnedClaim(ctx, keyID, key, fencing, func(tx *bolt.Tx, _ time.Time, owned ownedClaim) (txResult[noValue], error) {
		return releaseClaimTx(tx, owned)
	})
	if err != nil {
		return fmt.Errorf("release claim: %w", err)
	}
	return nil
}

func releaseClaimTx(tx *bolt.Tx, owned ownedClaim) (txResult[noValue], error) {
	if owned.rec.State == ClaimCompleted {
		return reject[noValue](fmt.Errorf("claim is completed and cannot be released: %w", ErrConflict)), nil
	}
	if err := tx.Bucket(bucketClaims).Delete(owned.k); err != nil {
		return txResult[noValue]{}, fmt.Errorf("delete claim: %w", err)
	}
	return accept(noValue{}), nil
}

// GetClaim returns the claim key of the vault key keyID, with its result when it is
// completed, but never its fencing token. Errors: ErrInvalid, ErrNotFound, ErrSealed.
func (s *Store) GetClaim(ctx context.Context, keyID, key string) (Claim, error) {
	if err := checkClaimArgs(keyID, key); err != nil {
		return Claim{}, fmt.Errorf("get claim: %w", err)
	}
	var c Claim
	err := s.view(func(tx *bolt.Tx, now time.Time) error {
		rec, err := getClaimRec(tx, idemKey(keyID, key))
		if err != nil {
			return err
		}
		if rec == nil {
			return fmt.Errorf("claim under %s: %w", keyID, ErrNotFound)
		}
		c = rec.public()
		c.Result, err = s.openResult(rec)
		return err
	})
	if err != nil {
		return Claim{}, fmt.Errorf("get claim: %w", err)
	}
	return c, nil
}

// deadClaim is Reap's predicate for the claims bucket: completed claims
// IdempotencyTTL after completion, and in-progress claims IdempotencyTTL after
// their lease lapsed (their owner is gone).
func (s *Store) deadClaim(tx *bolt.Tx, now time.Time, k, v []byte) (bool, func(tx *bolt.Tx) error, error) {
	var r claimRec
	if err := decodeJSON(k, v, &r); err != nil {
		return false, nil, err
	}
	since := r.LeaseUntil
	if r.State == ClaimCompleted {
		since = r.CompletedAt
	}
	return now.Sub(since) > s.ttl, nil, nil
}
