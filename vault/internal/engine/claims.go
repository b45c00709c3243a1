package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/keybrake/keybrake/vault"
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

// claimRec is a claim as stored.
type claimRec struct {
	KeyID        string           `json:"k"`
	Key          string           `json:"key"`
	Fingerprint  string           `json:"fp"`
	State        vault.ClaimState `json:"st"`
	LeaseUntil   time.Time        `json:"lease,omitzero"`
	Fencing      uint64           `json:"f"`
	SealedResult []byte           `json:"r,omitempty"`
	CreatedAt    time.Time        `json:"c"`
	UpdatedAt    time.Time        `json:"u"`
	CompletedAt  time.Time        `json:"done,omitzero"`
}

// public returns the claim without its result or fencing token.
func (r *claimRec) public() vault.Claim {
	return vault.Claim{
		KeyID: r.KeyID, Key: r.Key, Fingerprint: r.Fingerprint, State: r.State,
		LeaseExpiresAt: r.LeaseUntil, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, CompletedAt: r.CompletedAt,
	}
}

// claimAD binds a sealed result to its key id and claim key.
func claimAD(keyID, key string) []byte {
	return []byte("keybrake/claim-result\x00" + keyID + "\x00" + key)
}

// checkClaimArgs validates the arguments every claim method shares.
func checkClaimArgs(keyID, key string) error {
	if keyID == "" {
		return fmt.Errorf("empty key id: %w", vault.ErrInvalid)
	}
	if !vault.ValidClaimKey(key) {
		return fmt.Errorf("claim key must be 1-%d characters without control characters: %w", vault.MaxClaimKeyLen, vault.ErrInvalid)
	}
	return nil
}

// activeKeyTx re-reads the key in tx: it must exist, not be revoked and not be
// expired at now.
func (s *Engine) activeKeyTx(tx Tx, now time.Time, keyID string) error {
	rec, err := s.keys.get(tx, keyID)
	if err != nil {
		return err
	}
	switch (&vault.Key{Status: rec.Status, Policy: rec.Policy}).StatusAt(now) {
	case vault.KeyRevoked:
		return fmt.Errorf("key %s: %w", keyID, vault.ErrKeyRevoked)
	case vault.KeyExpired:
		return fmt.Errorf("key %s: %w", keyID, vault.ErrKeyExpired)
	}
	return nil
}

// getClaimRec returns the stored claim under k, nil when there is none.
func getClaimRec(tx Tx, k []byte) (*claimRec, error) {
	var r claimRec
	ok, err := getJSON(tx, BucketClaims, k, &r)
	if err != nil || !ok {
		return nil, err
	}
	return &r, nil
}

// openResult unseals a completed claim's result.
func (s *Engine) openResult(r *claimRec) ([]byte, error) {
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
// hot-path write transaction that re-reads the key:
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
func (s *Engine) Claim(ctx context.Context, keyID, key, fingerprint string, lease time.Duration) (vault.ClaimResult, error) {
	if err := checkClaimArgs(keyID, key); err != nil {
		return vault.ClaimResult{}, fmt.Errorf("claim: %w", err)
	}
	if len(fingerprint) > vault.MaxClaimFingerprintLen {
		return vault.ClaimResult{}, fmt.Errorf("claim: fingerprint longer than %d bytes: %w", vault.MaxClaimFingerprintLen, vault.ErrInvalid)
	}
	if lease <= 0 {
		return vault.ClaimResult{}, fmt.Errorf("claim: lease must be positive: %w", vault.ErrInvalid)
	}
	res, err := submitResult(ctx, s, func(tx Tx, now time.Time) (txResult[vault.ClaimResult], error) {
		return s.claimTx(tx, now, keyID, key, fingerprint, lease)
	})
	if err != nil {
		return vault.ClaimResult{}, fmt.Errorf("claim: %w", err)
	}
	return res, nil
}

// claimTx applies a Claim. Every reason to turn it down is found before any write.
func (s *Engine) claimTx(tx Tx, now time.Time, keyID, key, fingerprint string, lease time.Duration) (txResult[vault.ClaimResult], error) {
	if err := s.activeKeyTx(tx, now, keyID); err != nil {
		return reject[vault.ClaimResult](err), nil
	}
	k := idemKey(keyID, key)
	rec, err := getClaimRec(tx, k)
	if err != nil {
		return txResult[vault.ClaimResult]{}, err
	}
	var res vault.ClaimResult
	if rec != nil {
		switch {
		case rec.Fingerprint != fingerprint:
			return accept(vault.ClaimResult{Outcome: vault.ClaimOutcomeFingerprintMismatch, Claim: rec.public()}), nil
		case rec.State == vault.ClaimCompleted:
			result, err := s.openResult(rec)
			if err != nil {
				return reject[vault.ClaimResult](err), nil
			}
			c := rec.public()
			c.Result = result
			return accept(vault.ClaimResult{Outcome: vault.ClaimOutcomeCompleted, Claim: c}), nil
		case now.Before(rec.LeaseUntil):
			return accept(vault.ClaimResult{Outcome: vault.ClaimOutcomeInProgress, Claim: rec.public()}), nil
		}
		// The lease lapsed: compare-and-set in this transaction, so exactly one of
		// the callers racing for it becomes the owner.
		res.TookOver = true
	}
	seq, err := tx.NextSequence(BucketClaims)
	if err != nil {
		return txResult[vault.ClaimResult]{}, fmt.Errorf("fencing token: %w", err)
	}
	if rec == nil {
		rec = &claimRec{KeyID: keyID, Key: key, Fingerprint: fingerprint, State: vault.ClaimInProgress, CreatedAt: now}
		err = insertJSON(tx, BucketClaims, k, withFencing(rec, seq, now, lease))
	} else {
		err = putJSON(tx, BucketClaims, k, withFencing(rec, seq, now, lease))
	}
	if err != nil {
		return txResult[vault.ClaimResult]{}, err
	}
	res.Outcome = vault.ClaimOutcomeClaimed
	res.Claim = rec.public()
	res.Claim.FencingToken = rec.Fencing
	return accept(res), nil
}

// withFencing gives rec to a new owner: the fencing token seq and a lease from
// now.
func withFencing(rec *claimRec, seq uint64, now time.Time, lease time.Duration) *claimRec {
	rec.Fencing, rec.LeaseUntil, rec.UpdatedAt = seq, now.Add(lease), now
	return rec
}

// CompleteClaim stores result (JSON) as the outcome of the claim and marks it
// completed, in one hot-path write transaction that re-reads the key. Only
// the current owner may complete: fencing must be the token its Claim returned. A
// lapsed lease that nobody took over still belongs to its owner. Completing again
// with the same token and the same result succeeds (a retried request).
//
// Errors: ErrInvalid (bad key, result not JSON or over MaxClaimResultBytes),
// ErrNotFound (no such claim or vault key), ErrConflict (a stale owner: the claim
// changed owner, or is already completed), ErrKeyRevoked, ErrKeyExpired, ErrClosed.
func (s *Engine) CompleteClaim(ctx context.Context, keyID, key string, fencing uint64, result []byte) error {
	if err := checkClaimArgs(keyID, key); err != nil {
		return fmt.Errorf("complete claim: %w", err)
	}
	if len(result) > vault.MaxClaimResultBytes || !json.Valid(result) {
		return fmt.Errorf("complete claim: result must be JSON of at most %d bytes: %w", vault.MaxClaimResultBytes, vault.ErrInvalid)
	}
	// Sealed outside the transaction: the writer is held for as short as possible.
	sealed, err := s.seal.seal(result, claimAD(keyID, key))
	if err != nil {
		return fmt.Errorf("complete claim: %w", err)
	}
	err = s.submitOwnedClaim(ctx, keyID, key, fencing, func(tx Tx, now time.Time, owned ownedClaim) (txResult[noValue], error) {
		return s.completeClaimTx(tx, now, owned, result, sealed)
	})
	if err != nil {
		return fmt.Errorf("complete claim: %w", err)
	}
	return nil
}

func (s *Engine) completeClaimTx(tx Tx, now time.Time, owned ownedClaim, result, sealed []byte) (txResult[noValue], error) {
	rec := owned.rec
	if rec.State == vault.ClaimCompleted {
		stored, err := s.openResult(rec)
		if err != nil {
			return reject[noValue](err), nil
		}
		if !bytes.Equal(stored, result) {
			return reject[noValue](fmt.Errorf("claim is already completed with another result: %w", vault.ErrConflict)), nil
		}
		return accept(noValue{}), nil // the owner's retry: already done
	}
	rec.State, rec.SealedResult = vault.ClaimCompleted, sealed
	rec.LeaseUntil, rec.CompletedAt, rec.UpdatedAt = time.Time{}, now, now
	return accept(noValue{}), putJSON(tx, BucketClaims, owned.k, rec)
}

// submitOwnedClaim runs op, in one hot-path write, on the claim (keyID,
// key) when the holder of fencing owns it (ownedClaimTx); otherwise the call is
// turned down as ownedClaimTx says.
func (s *Engine) submitOwnedClaim(ctx context.Context, keyID, key string, fencing uint64,
	op func(tx Tx, now time.Time, owned ownedClaim) (txResult[noValue], error)) error {
	_, err := submitResult(ctx, s, func(tx Tx, now time.Time) (txResult[noValue], error) {
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
func (s *Engine) ownedClaimTx(tx Tx, now time.Time, keyID, key string, fencing uint64) (txResult[ownedClaim], error) {
	if err := s.activeKeyTx(tx, now, keyID); err != nil {
		return reject[ownedClaim](err), nil
	}
	k := idemKey(keyID, key)
	rec, err := getClaimRec(tx, k)
	switch {
	case err != nil:
		return txResult[ownedClaim]{}, err
	case rec == nil:
		return reject[ownedClaim](fmt.Errorf("claim under %s: %w", keyID, vault.ErrNotFound)), nil
	case rec.Fencing != fencing:
		return reject[ownedClaim](fmt.Errorf("fencing token %d is not the claim's current owner: %w", fencing, vault.ErrConflict)), nil
	}
	return accept(ownedClaim{k: k, rec: rec}), nil
}

// ReleaseClaim gives an in-progress claim up (a transient failure): it is deleted,
// so the work can be claimed again at once (with a new, higher fencing token). One
// hot-path write transaction that re-reads the key.
//
// Errors: ErrInvalid, ErrNotFound (no such claim or vault key), ErrConflict (a
// stale owner, or the claim is completed), ErrKeyRevoked, ErrKeyExpired, ErrClosed.
func (s *Engine) ReleaseClaim(ctx context.Context, keyID, key string, fencing uint64) error {
	if err := checkClaimArgs(keyID, key); err != nil {
		return fmt.Errorf("release claim: %w", err)
	}
	err := s.submitOwnedClaim(ctx, keyID, key, fencing, func(tx Tx, _ time.Time, owned ownedClaim) (txResult[noValue], error) {
		return releaseClaimTx(tx, owned)
	})
	if err != nil {
		return fmt.Errorf("release claim: %w", err)
	}
	return nil
}

func releaseClaimTx(tx Tx, owned ownedClaim) (txResult[noValue], error) {
	if owned.rec.State == vault.ClaimCompleted {
		return reject[noValue](fmt.Errorf("claim is completed and cannot be released: %w", vault.ErrConflict)), nil
	}
	if err := tx.Delete(BucketClaims, owned.k); err != nil {
		return txResult[noValue]{}, fmt.Errorf("delete claim: %w", err)
	}
	return accept(noValue{}), nil
}

// GetClaim returns the claim key of the vault key keyID, with its result when it is
// completed, but never its fencing token. Errors: ErrInvalid, ErrNotFound, ErrSealed.
func (s *Engine) GetClaim(ctx context.Context, keyID, key string) (vault.Claim, error) {
	if err := checkClaimArgs(keyID, key); err != nil {
		return vault.Claim{}, fmt.Errorf("get claim: %w", err)
	}
	var c vault.Claim
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		rec, err := getClaimRec(tx, idemKey(keyID, key))
		if err != nil {
			return err
		}
		if rec == nil {
			return fmt.Errorf("claim under %s: %w", keyID, vault.ErrNotFound)
		}
		c = rec.public()
		c.Result, err = s.openResult(rec)
		return err
	})
	if err != nil {
		return vault.Claim{}, fmt.Errorf("get claim: %w", err)
	}
	return c, nil
}

// judgeClaim is Reap's judge of the claims bucket: it removes completed
// claims IdempotencyTTL after completion, and in-progress claims
// IdempotencyTTL after their lease lapsed (their owner is gone).
func (s *Engine) judgeClaim(_ Tx, now time.Time, k, v []byte) (reapVerdict, error) {
	var r claimRec
	if err := decodeJSON(k, v, &r); err != nil {
		return reapVerdict{}, err
	}
	since := r.LeaseUntil
	if r.State == vault.ClaimCompleted {
		since = r.CompletedAt
	}
	if now.Sub(since) <= s.ttl {
		return reapVerdict{}, nil
	}
	return removeEntry(r.KeyID, BucketClaims, k), nil
}
