package engine

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"fmt"

	"github.com/keybrake/keybrake/vault"
)

// sealVersion is the first byte of every sealed value, so the format can change
// (e.g. master key rotation) without guessing.
const sealVersion = 1

// Sealer seals values with AES-256-GCM under the master key. Every sealed value is
// version byte || 12-byte random nonce || ciphertext+tag, and is bound to its place
// by associated data, so a ciphertext copied to another upstream or record does not
// open.
type Sealer struct {
	aead cipher.AEAD
}

// NewSealer returns a sealer under masterKey. Errors: ErrInvalid (not 32
// bytes).
func NewSealer(masterKey []byte) (*Sealer, error) {
	if len(masterKey) != 32 {
		return nil, fmt.Errorf("master key must be 32 bytes, got %d: %w", len(masterKey), vault.ErrInvalid)
	}
	block, err := aes.NewCipher(masterKey)
	if err != nil {
		return nil, fmt.Errorf("master key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("master key: %w", err)
	}
	return &Sealer{aead: aead}, nil
}

func (s *Sealer) seal(plaintext, ad []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	out := make([]byte, 1+ns, 1+ns+len(plaintext)+s.aead.Overhead())
	out[0] = sealVersion
	if _, err := rand.Read(out[1 : 1+ns]); err != nil {
		return nil, fmt.Errorf("read nonce: %w", err)
	}
	return s.aead.Seal(out, out[1:1+ns], plaintext, ad), nil
}

func (s *Sealer) open(sealed, ad []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	if len(sealed) < 1+ns+s.aead.Overhead() || sealed[0] != sealVersion {
		return nil, vault.ErrSealed
	}
	pt, err := s.aead.Open(nil, sealed[1:1+ns], sealed[1+ns:], ad)
	if err != nil {
		return nil, vault.ErrSealed
	}
	return pt, nil
}

// Associated data for each kind of sealed value.

func upstreamAD(name string) []byte { return []byte("keybrake/upstream\x00" + name) }

// webhookSecretAD binds an upstream's webhook secret to the upstream, apart
// from its API secret.
func webhookSecretAD(name string) []byte { return []byte("keybrake/upstream-webhook\x00" + name) }

// responseAD binds a stored answer to its record and to how its body was
// compressed, so a body cannot be passed off as another's, nor read with
// another codec.
func responseAD(keyID, idemKey string, codec byte) []byte {
	kind := "keybrake/response"
	if codec == codecDeflate {
		kind = "keybrake/response-deflate"
	}
	return []byte(kind + "\x00" + keyID + "\x00" + idemKey)
}

// checkAD binds the master-key check value in the meta bucket.
var checkAD = []byte("keybrake/master-key-check")

// checkPlaintext is sealed once into meta so Open can tell a wrong master key at once.
var checkPlaintext = []byte("keybrake master key check v1")

// CheckMaster checks that the stored master key check value opens with this
// sealer's key: ErrSealed when it does not.
func (s *Sealer) CheckMaster(stored []byte) error {
	pt, err := s.open(stored, checkAD)
	if err != nil || string(pt) != string(checkPlaintext) {
		return fmt.Errorf("master key does not match the database: %w", vault.ErrSealed)
	}
	return nil
}

// Resealed says which kind of sealed value Reseal sealed again.
type Resealed int

// Kinds of sealed values.
const (
	ResealedNothing       Resealed = iota // the entry holds nothing sealed
	ResealedMasterCheck                   // the master key check
	ResealedUpstream                      // an upstream's secret
	ResealedResponse                      // a stored Stripe answer
	ResealedClaimResult                   // a completed claim's result
	ResealedWebhookSecret                 // a webhook endpoint's signing secrets
)

// Reseal returns the value to write for the entry k, v of bucket b when the
// master key changes: the entry with its sealed value opened by from and sealed
// by to, or v as it is when it holds nothing sealed. Every value sealed
// anywhere in the store is handled here (a test holds the list and the
// package's sealing calls together).
func Reseal(b Bucket, k, v []byte, from, to *Sealer) ([]byte, Resealed, error) {
	again := func(sealed, ad []byte) ([]byte, error) {
		pt, err := from.open(sealed, ad)
		if err != nil {
			return nil, err
		}
		return to.seal(pt, ad)
	}
	switch {
	case b == BucketMeta && bytes.Equal(k, MetaMasterCheck):
		out, err := again(v, checkAD)
		return out, ResealedMasterCheck, err
	case b == BucketUpstreams:
		var r upstreamRec
		if err := decodeJSON(k, v, &r); err != nil {
			return nil, 0, err
		}
		var err error
		if r.SealedSecret, err = again(r.SealedSecret, upstreamAD(string(k))); err != nil {
			return nil, 0, fmt.Errorf("upstream %s: %w", k, err)
		}
		for i := range r.WebhookSecrets {
			if r.WebhookSecrets[i], err = again(r.WebhookSecrets[i], webhookSecretAD(string(k))); err != nil {
				return nil, 0, fmt.Errorf("upstream %s: webhook secret: %w", k, err)
			}
		}
		out, err := json.Marshal(&r)
		return out, ResealedUpstream, err
	case b == BucketIdem && len(v) == seqLen:
		return v, ResealedNothing, nil // where the record is appended
	case b == BucketIdem, b == BucketRecords:
		r, err := decodeRecord(k, v)
		if err != nil {
			return nil, 0, err
		}
		if r.Response == nil || r.Response.SealedBody == nil {
			return v, ResealedNothing, nil
		}
		if r.Response.SealedBody, err = again(r.Response.SealedBody, responseAD(r.KeyID, r.Idem, r.Response.Codec)); err != nil {
			return nil, 0, fmt.Errorf("stored response of %s: %w", r.KeyID, err)
		}
		return encodeRecord(r), ResealedResponse, nil
	case b == BucketClaims:
		var r claimRec
		if err := decodeJSON(k, v, &r); err != nil {
			return nil, 0, err
		}
		if r.SealedResult == nil {
			return v, ResealedNothing, nil
		}
		var err error
		if r.SealedResult, err = again(r.SealedResult, claimAD(r.KeyID, r.Key)); err != nil {
			return nil, 0, fmt.Errorf("claim result of %s: %w", r.KeyID, err)
		}
		out, err := json.Marshal(&r)
		return out, ResealedClaimResult, err
	case b == BucketWebhooks:
		var r webhookRec
		if err := decodeJSON(k, v, &r); err != nil {
			return nil, 0, err
		}
		for i := range r.Secrets {
			var err error
			if r.Secrets[i].Sealed, err = again(r.Secrets[i].Sealed, webhookAD(string(k))); err != nil {
				return nil, 0, fmt.Errorf("webhook %s secret: %w", k, err)
			}
		}
		out, err := json.Marshal(&r)
		return out, ResealedWebhookSecret, err
	}
	return v, ResealedNothing, nil
}

// BucketByName returns the bucket named name.
func BucketByName(name string) (Bucket, bool) {
	for i, n := range bucketLabels {
		if n == name {
			return Bucket(i), true
		}
	}
	return 0, false
}
