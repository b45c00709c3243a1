package vault

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// schemaVersion is the version of the bucket layout and record encodings this code
// reads and writes. Open refuses a database with a newer version.
const schemaVersion uint64 = 1

// The bucket registry: every bucket the Store uses, created on Open. Key layouts:
//
//	meta        "schema_version" → uint64 BE; "master_key_check" → sealed constant;
//	            "env_upstream/" + name → salted fingerprint (envupstream.go)
//	upstreams   name → upstreamRec (JSON; secret sealed)
//	keys        key id → keyRec (JSON)
//	key_tokens  hex SHA-256 of token → key id
//	key_names   name → key id
//	idem        16-byte hash of (key id, idempotency key), as in HoldID → recordRec
//	            (JSON, with the hold of a metered request; response body sealed)
//	hold_index  created-at unix ns (8 bytes BE) + hold id → hold state
//	counters    key id "/" window id → counter (binary, 33 bytes)
//	events      key id NUL seq (8 bytes BE) → Event (JSON); seq from the bucket sequence
//	audit       seq (8 bytes BE) → AuditEntry (JSON)
//	objects     key id NUL Stripe object id → objectRec (JSON)
var (
	bucketMeta      = []byte("meta")
	bucketUpstreams = []byte("upstreams")
	bucketKeys      = []byte("keys")
	bucketTokens    = []byte("key_tokens")
	bucketNames     = []byte("key_names")
	bucketIdem      = []byte("idem")
	bucketHoldIndex = []byte("hold_index")
	bucketCounters  = []byte("counters")
	bucketEvents    = []byte("events")
	bucketAudit     = []byte("audit")
	bucketObjects   = []byte("objects")

	allBuckets = [][]byte{
		bucketMeta, bucketUpstreams, bucketKeys, bucketTokens, bucketNames, bucketIdem,
		bucketHoldIndex, bucketCounters, bucketEvents, bucketAudit, bucketObjects,
		bucketClaims, // claims.go: key id NUL claim key → claimRec (JSON; result sealed)
	}

	metaSchemaVersion = []byte("schema_version")
	metaMasterCheck   = []byte("master_key_check")
)

// initBuckets creates every registered bucket, checks or writes the schema version
// and checks (or, on a new database, writes) the master key check value.
func (s *Store) initBuckets(tx *bolt.Tx) error {
	for _, name := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	meta := tx.Bucket(bucketMeta)
	if v := meta.Get(metaSchemaVersion); v != nil {
		if len(v) != 8 {
			return fmt.Errorf("schema version is %d bytes long: %w", len(v), ErrSchemaVersion)
		}
		if got := binary.BigEndian.Uint64(v); got > schemaVersion {
			return fmt.Errorf("database schema version %d is newer than this keybrake's %d: %w", got, schemaVersion, ErrSchemaVersion)
		}
	}
	if err := meta.Put(metaSchemaVersion, u64(schemaVersion)); err != nil {
		return fmt.Errorf("write schema version: %w", err)
	}
	if v := meta.Get(metaMasterCheck); v != nil {
		pt, err := s.seal.open(v, checkAD)
		if err != nil || string(pt) != string(checkPlaintext) {
			return fmt.Errorf("master key does not match the database: %w", ErrSealed)
		}
		return nil
	}
	sealed, err := s.seal.seal(checkPlaintext, checkAD)
	if err != nil {
		return err
	}
	if err := meta.Put(metaMasterCheck, sealed); err != nil {
		return fmt.Errorf("write master key check: %w", err)
	}
	return nil
}

// translate maps bbolt's errors to the vault's vocabulary so that nothing above this
// package sees bbolt. Errors that already belong to the vault pass through.
func translate(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, bolterrors.ErrDatabaseNotOpen), errors.Is(err, bolterrors.ErrTxClosed):
		return ErrClosed
	case errors.Is(err, bolterrors.ErrTimeout):
		return ErrLocked
	case errors.Is(err, bolterrors.ErrKeyTooLarge), errors.Is(err, bolterrors.ErrKeyRequired),
		errors.Is(err, bolterrors.ErrValueTooLarge):
		return fmt.Errorf("%w: %s", ErrInvalid, err.Error())
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrVersionMismatch),
		errors.Is(err, bolterrors.ErrChecksum), errors.Is(err, bolterrors.ErrDatabaseReadOnly),
		errors.Is(err, bolterrors.ErrTxNotWritable), errors.Is(err, bolterrors.ErrBucketNotFound),
		errors.Is(err, bolterrors.ErrIncompatibleValue), errors.Is(err, bolterrors.ErrMaxSizeReached):
		return fmt.Errorf("%w: %s", ErrStorage, err.Error())
	}
	for _, known := range []error{ErrNotFound, ErrConflict, ErrInvalid, ErrKeyInvalid, ErrKeyRevoked,
		ErrKeyExpired, ErrSealed, ErrClosed, ErrLocked, ErrSchemaVersion, ErrStorage, ErrInvariant} {
		if errors.Is(err, known) {
			return err
		}
	}
	// I/O errors and anything else from the engine: keep the text, not the chain.
	return fmt.Errorf("%w: %s", ErrStorage, err.Error())
}

// putJSON encodes v into bucket b under key.
func putJSON(b *bolt.Bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	if err := b.Put(key, data); err != nil {
		return fmt.Errorf("put %q: %w", key, err)
	}
	return nil
}

// getJSON decodes the value under key into v; ok is false when there is none. The
// decode copies everything out of bbolt's memory.
func getJSON(b *bolt.Bucket, key []byte, v any) (bool, error) {
	data := b.Get(key)
	if data == nil {
		return false, nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("decode %q: %w", key, err)
	}
	return true, nil
}

// decodeJSON decodes a value read from bbolt (k names it in errors).
func decodeJSON(k, v []byte, into any) error {
	if err := json.Unmarshal(v, into); err != nil {
		return fmt.Errorf("decode %q: %w", k, err)
	}
	return nil
}

// idemKey joins a key id and another id with a NUL (objects bucket keys).
func idemKey(keyID, idem string) []byte {
	k := make([]byte, 0, len(keyID)+1+len(idem))
	k = append(k, keyID...)
	k = append(k, 0)
	return append(k, idem...)
}

// splitNul splits a "a NUL b" bucket key.
func splitNul(k []byte) (string, string, bool) {
	for i, c := range k {
		if c == 0 {
			return string(k[:i]), string(k[i+1:]), true
		}
	}
	return "", "", false
}

// counterKey is the counters bucket key of a key's window.
func counterKey(keyID, windowID string) []byte { return []byte(keyID + "/" + windowID) }

// counter is one window's usage plus what CheckInvariant needs to judge it.
type counter struct {
	Committed int64
	Held      int64
	// CapPeak is the highest cap in force for this window when any hold was placed.
	CapPeak int64
	// Allowance is what this window may legitimately exceed CapPeak by: commits above
	// their hold (the money moved) and report-mode holds past the cap.
	Allowance int64
	// Uncapped is set when a hold was placed while the window had no cap.
	Uncapped bool
}

const counterLen = 33

func (c counter) encode() []byte {
	b := make([]byte, counterLen)
	binary.BigEndian.PutUint64(b[0:], uint64(c.Committed))
	binary.BigEndian.PutUint64(b[8:], uint64(c.Held))
	binary.BigEndian.PutUint64(b[16:], uint64(c.CapPeak))
	binary.BigEndian.PutUint64(b[24:], uint64(c.Allowance))
	if c.Uncapped {
		b[32] = 1
	}
	return b
}

func decodeCounter(b []byte) (counter, error) {
	if len(b) != counterLen {
		return counter{}, fmt.Errorf("counter is %d bytes: %w", len(b), ErrStorage)
	}
	return counter{
		Committed: int64(binary.BigEndian.Uint64(b[0:])),
		Held:      int64(binary.BigEndian.Uint64(b[8:])),
		CapPeak:   int64(binary.BigEndian.Uint64(b[16:])),
		Allowance: int64(binary.BigEndian.Uint64(b[24:])),
		Uncapped:  b[32] == 1,
	}, nil
}

func getCounter(tx *bolt.Tx, keyID, windowID string) (counter, bool, error) {
	v := tx.Bucket(bucketCounters).Get(counterKey(keyID, windowID))
	if v == nil {
		return counter{}, false, nil
	}
	c, err := decodeCounter(v)
	return c, true, err
}

func putCounter(tx *bolt.Tx, keyID, windowID string, c counter) error {
	if err := tx.Bucket(bucketCounters).Put(counterKey(keyID, windowID), c.encode()); err != nil {
		return fmt.Errorf("put counter %s/%s: %w", keyID, windowID, err)
	}
	return nil
}
