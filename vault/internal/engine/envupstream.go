package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// envFingerprintPrefix prefixes the meta key of the fingerprint of the
// environment's value for an upstream.
const envFingerprintPrefix = "env_upstream/"

// envFingerprint is a salted SHA-256 of a secret: 16 bytes of salt, then the
// digest of salt || secret. It tells whether a value changed without storing it.
func envFingerprint(secret string, salt []byte) []byte {
	h := sha256.New()
	h.Write(salt)
	h.Write([]byte(secret))
	return h.Sum(bytes.Clone(salt))
}

// envFingerprintMatches reports whether stored is the fingerprint of secret.
func envFingerprintMatches(stored []byte, secret string) bool {
	if len(stored) != 16+sha256.Size {
		return false
	}
	return subtle.ConstantTimeCompare(stored, envFingerprint(secret, stored[:16])) == 1
}

// SyncEnvUpstream registers secret, given to the process at start (the
// STRIPE_SECRET_KEY of serve), as the upstream name only when it is new: when
// there is no such upstream, or when the value changed since the last start. An
// upstream an admin changed through the API is therefore not overwritten by an
// environment that did not change. Only a salted fingerprint of the value is
// kept, never the value. One write transaction; a registration or replacement
// writes an audit entry under actor. It returns the upstream as it now is.
// Errors: ErrInvalid (see PutUpstream).
func (s *Engine) SyncEnvUpstream(ctx context.Context, actor, name, vendor, secret string) (vault.Upstream, vault.EnvUpstreamAction, error) {
	var (
		up     vault.Upstream
		action vault.EnvUpstreamAction
	)
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		up, action, err = s.syncEnvUpstreamTx(tx, now, actor, name, vendor, secret)
		return err
	})
	if err != nil {
		return vault.Upstream{}, "", fmt.Errorf("sync upstream %s from the environment: %w", name, err)
	}
	return up, action, nil
}

func (s *Engine) syncEnvUpstreamTx(tx Tx, now time.Time, actor, name, vendor, secret string) (vault.Upstream, vault.EnvUpstreamAction, error) {
	fpKey := []byte(envFingerprintPrefix + name)
	rec, err := getUpstream(tx, name)
	switch {
	case errors.Is(err, vault.ErrNotFound):
	case err != nil:
		return vault.Upstream{}, "", err
	default:
		fp, err := tx.Get(BucketMeta, fpKey)
		if err != nil {
			return vault.Upstream{}, "", err
		}
		if envFingerprintMatches(fp, secret) {
			return rec.public(), vault.EnvUpstreamKept, nil
		}
	}
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return vault.Upstream{}, "", fmt.Errorf("fingerprint salt: %w", err)
	}
	if err := tx.Put(BucketMeta, fpKey, envFingerprint(secret, salt)); err != nil {
		return vault.Upstream{}, "", fmt.Errorf("put fingerprint: %w", err)
	}
	if rec != nil {
		current, err := s.seal.open(rec.SealedSecret, upstreamAD(name))
		if err == nil && subtle.ConstantTimeCompare(current, []byte(secret)) == 1 {
			return rec.public(), vault.EnvUpstreamUnchanged, nil
		}
	}
	up, _, err := s.putUpstreamTx(tx, now, actor, name, vendor, secret)
	if err != nil {
		return vault.Upstream{}, "", err
	}
	if rec == nil {
		return up, vault.EnvUpstreamRegistered, nil
	}
	return up, vault.EnvUpstreamReplaced, nil
}
