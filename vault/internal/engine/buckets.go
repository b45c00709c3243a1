package engine

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// SchemaVersion is the version of the bucket layout and record encodings this
// code reads and writes. InitMeta refuses a store with a newer version and
// upgrades an older one. Version 2 writes records, events and objects in
// binary (codec.go) and indexes the records in flight and the completed ones
// (kv.go); it reads version 1's JSON values as they are.
const SchemaVersion uint64 = 2

// Meta keys of the schema version and the master key check; of Ping's
// probe; of migrate-store's mark on a bbolt vault it copied into PostgreSQL.
var (
	MetaSchemaVersion = []byte("schema_version")
	MetaMasterCheck   = []byte("master_key_check")
	MetaPing          = []byte("ping")
	MetaMigrated      = []byte("migrated_to")
)

// InitMeta checks or writes the schema version and checks (or, in a new
// store, writes) the master key check value. Errors: ErrSchemaVersion (a
// newer or malformed version), ErrSealed (another master key).
func (s *Engine) InitMeta(tx Tx) error {
	v, err := tx.Get(BucketMeta, MetaSchemaVersion)
	if err != nil {
		return err
	}
	if v != nil {
		if len(v) != 8 {
			return fmt.Errorf("schema version is %d bytes long: %w", len(v), vault.ErrSchemaVersion)
		}
		got := binary.BigEndian.Uint64(v)
		if got > SchemaVersion {
			return fmt.Errorf("database schema version %d is newer than this keybrake's %d: %w", got, SchemaVersion, vault.ErrSchemaVersion)
		}
		// An older version migrates here, in this transaction: a crash leaves
		// the old version.
		if got < 2 {
			if err := indexRecords(tx); err != nil {
				return fmt.Errorf("upgrade to schema version 2: %w", err)
			}
		}
	}
	if err := tx.Put(BucketMeta, MetaSchemaVersion, u64(SchemaVersion)); err != nil {
		return fmt.Errorf("write schema version: %w", err)
	}
	check, err := tx.Get(BucketMeta, MetaMasterCheck)
	if err != nil {
		return err
	}
	if check != nil {
		return s.seal.CheckMaster(check)
	}
	sealed, err := s.seal.seal(checkPlaintext, checkAD)
	if err != nil {
		return err
	}
	// Insert: two replicas starting on a new database must not each write
	// the check of their own master key.
	if err := tx.Insert(BucketMeta, MetaMasterCheck, sealed); err != nil {
		return fmt.Errorf("write master key check: %w", err)
	}
	return nil
}

// indexRecords builds the indexes schema version 2 keeps of the idempotency
// records (the ones in flight, the completed ones by completion time) from the
// records themselves: the one read of every record an upgrade costs.
func indexRecords(tx Tx) error {
	return forEachRecord(tx, func(k []byte, r *recordRec) error {
		return putIndexes(tx, bytes.Clone(k), r)
	})
}

// putJSON encodes v into bucket b under key.
func putJSON(tx Tx, b Bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	if err := tx.Put(b, key, data); err != nil {
		return fmt.Errorf("put %q: %w", key, err)
	}
	return nil
}

// insertJSON encodes v into bucket b under key, which must be free (Tx.Insert).
func insertJSON(tx Tx, b Bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	if err := tx.Insert(b, key, data); err != nil {
		return fmt.Errorf("insert %q: %w", key, err)
	}
	return nil
}

// getJSON decodes the value under key into v; ok is false when there is none. The
// decode copies everything out of the transaction's memory.
func getJSON(tx Tx, b Bucket, key []byte, v any) (bool, error) {
	data, err := tx.Get(b, key)
	if err != nil || data == nil {
		return false, err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("decode %q: %w", key, err)
	}
	return true, nil
}

// decodeJSON decodes a value read from the store (k names it in errors).
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

// counterKey is the counters bucket key of a key's window. A budget's window
// is named by its scoped id, budget id "/" window id (scopedWindowID), which
// is its counter key whichever key's hold it is on.
func counterKey(keyID string, windowID policy.WindowID) []byte {
	if strings.HasPrefix(string(windowID), policy.BudgetIDPrefix) {
		return []byte(windowID)
	}
	// Appended, not concatenated and converted: one allocation, not two
	// (every hold and settle makes one per window, more than once).
	k := make([]byte, 0, len(keyID)+1+len(windowID))
	k = append(k, keyID...)
	k = append(k, '/')
	return append(k, windowID...)
}

// scopedWindowID names a budget's window in a hold, an event or an exposure.
func scopedWindowID(budgetID string, windowID policy.WindowID) policy.WindowID {
	return policy.WindowID(budgetID + "/" + string(windowID))
}

// splitCounterKey splits a counters (or roll-ups) bucket key into its key id
// (or budget id) and window id.
func splitCounterKey(k []byte) (string, policy.WindowID, bool) {
	keyID, window, ok := strings.Cut(string(k), "/")
	return keyID, policy.WindowID(window), ok
}

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
		return counter{}, fmt.Errorf("counter is %d bytes: %w", len(b), vault.ErrStorage)
	}
	return counter{
		Committed: int64(binary.BigEndian.Uint64(b[0:])),
		Held:      int64(binary.BigEndian.Uint64(b[8:])),
		CapPeak:   int64(binary.BigEndian.Uint64(b[16:])),
		Allowance: int64(binary.BigEndian.Uint64(b[24:])),
		Uncapped:  b[32] == 1,
	}, nil
}

func getCounter(tx Tx, keyID string, windowID policy.WindowID) (counter, bool, error) {
	v, err := tx.Get(BucketCounters, counterKey(keyID, windowID))
	if err != nil || v == nil {
		return counter{}, false, err
	}
	c, err := decodeCounter(v)
	return c, true, err
}

// getCounters reads the counters of a key's windows in one go; a window
// without one has a zero counter.
func getCounters(tx Tx, keyID string, windowIDs []policy.WindowID) ([]counter, error) {
	keys := make([][]byte, len(windowIDs))
	for i, id := range windowIDs {
		keys[i] = counterKey(keyID, id)
	}
	vals, err := tx.GetMany(BucketCounters, keys)
	if err != nil {
		return nil, err
	}
	out := make([]counter, len(windowIDs))
	for i, v := range vals {
		if v == nil {
			continue
		}
		if out[i], err = decodeCounter(v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func putCounter(tx Tx, keyID string, windowID policy.WindowID, c counter) error {
	if err := tx.Put(BucketCounters, counterKey(keyID, windowID), c.encode()); err != nil {
		return fmt.Errorf("put counter %s/%s: %w", keyID, windowID, err)
	}
	return nil
}
