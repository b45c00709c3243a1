package vault

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
)

// sealVersion is the first byte of every sealed value, so the format can change
// (e.g. master key rotation) without guessing.
const sealVersion = 1

// sealer seals values with AES-256-GCM under the master key. Every sealed value is
// version byte || 12-byte random nonce || ciphertext+tag, and is bound to its place
// by associated data, so a ciphertext copied to another upstream or record does not
// open.
type sealer struct {
	aead cipher.AEAD
}

func newSealer(masterKey []byte) (*sealer, error) {
	if len(masterKey) != 32 {
		return nil, fmt.Errorf("master key must be 32 bytes, got %d: %w", len(masterKey), ErrInvalid)
	}
	block, err := aes.NewCipher(masterKey)
	if err != nil {
		return nil, fmt.Errorf("master key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("master key: %w", err)
	}
	return &sealer{aead: aead}, nil
}

func (s *sealer) seal(plaintext, ad []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	out := make([]byte, 1+ns, 1+ns+len(plaintext)+s.aead.Overhead())
	out[0] = sealVersion
	if _, err := rand.Read(out[1 : 1+ns]); err != nil {
		return nil, fmt.Errorf("read nonce: %w", err)
	}
	return s.aead.Seal(out, out[1:1+ns], plaintext, ad), nil
}

func (s *sealer) open(sealed, ad []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	if len(sealed) < 1+ns+s.aead.Overhead() || sealed[0] != sealVersion {
		return nil, ErrSealed
	}
	pt, err := s.aead.Open(nil, sealed[1:1+ns], sealed[1+ns:], ad)
	if err != nil {
		return nil, ErrSealed
	}
	return pt, nil
}

// Associated data for each kind of sealed value.

func upstreamAD(name string) []byte { return []byte("keybrake/upstream\x00" + name) }

func responseAD(keyID, idemKey string) []byte {
	return []byte("keybrake/response\x00" + keyID + "\x00" + idemKey)
}

// checkAD binds the master-key check value in the meta bucket.
var checkAD = []byte("keybrake/master-key-check")

// checkPlaintext is sealed once into meta so Open can tell a wrong master key at once.
var checkPlaintext = []byte("keybrake master key check v1")
