package engine

import (
	"bytes"
	"fmt"

	"github.com/keybrake/keybrake/vault"
)

// listEventsTx pages through a key's ledger newest first. The cursor is the id of
// the last event of the previous page.
func listEventsTx(tx Tx, keyID string, limit int, cursor string) ([]vault.Event, string, error) {
	if keyID == "" {
		return nil, "", fmt.Errorf("list events: empty key id: %w", vault.ErrInvalid)
	}
	prefix := append([]byte(keyID), 0)
	start := append([]byte(keyID), 1) // sorts after every event of the key
	if cursor != "" {
		id, err := decodeCursor(cursor)
		if err != nil {
			return nil, "", err
		}
		seq, ok := parseSeqID("evt_", id)
		if !ok {
			return nil, "", fmt.Errorf("event cursor: %w", vault.ErrInvalid)
		}
		start = append(append([]byte(nil), prefix...), u64(seq)...)
	}
	return pageNewestFirst(tx, BucketEvents, prefix, start, limit, newestFirst[vault.Event]{
		decode: decodeEvent,
		cursor: func(_ []byte, e vault.Event) string { return e.ID },
	})
}

// listAuditTx pages through the audit log newest first.
func listAuditTx(tx Tx, limit int, cursor string) ([]vault.AuditEntry, string, error) {
	start := bytes.Repeat([]byte{0xff}, 9) // after every 8-byte sequence key
	if cursor != "" {
		id, err := decodeCursor(cursor)
		if err != nil {
			return nil, "", err
		}
		seq, ok := parseSeqID("aud_", id)
		if !ok {
			return nil, "", fmt.Errorf("audit cursor: %w", vault.ErrInvalid)
		}
		start = u64(seq)
	}
	return pageNewestFirst(tx, BucketAudit, nil, start, limit, newestFirst[vault.AuditEntry]{
		decode: func(k, v []byte) (vault.AuditEntry, error) {
			var e vault.AuditEntry
			err := decodeJSON(k, v, &e)
			return e, err
		},
		cursor: func(_ []byte, e vault.AuditEntry) string { return e.ID },
	})
}

// newestFirst says how pageNewestFirst reads the entries of one listing.
type newestFirst[T any] struct {
	// keep, when set, picks the entries to list; the others are skipped without
	// being decoded.
	keep   func(k, v []byte) bool
	decode func(k, v []byte) (T, error)
	// cursor is what the next page starts after: the id of the entry e stored
	// under k (made opaque by encodeCursor).
	cursor func(k []byte, e T) string
}

// pageNewestFirst reads one page of at most limit entries with prefix that sort
// before start, newest first, and the cursor of the next page: "" when no entry
// to list is left.
func pageNewestFirst[T any](tx Tx, b Bucket, prefix, start []byte, limit int, r newestFirst[T]) ([]T, string, error) {
	limit = clampLimit(limit)
	out := []T{}
	var lastKey []byte
	next := ""
	err := pageBackward(tx, b, prefix, start, func(k, v []byte) (bool, error) {
		if r.keep != nil && !r.keep(k, v) {
			return true, nil
		}
		if len(out) == limit {
			// One more entry to list: the page ends at the last one it holds.
			next = encodeCursor(r.cursor(lastKey, out[len(out)-1]))
			return false, nil
		}
		e, err := r.decode(k, v)
		if err != nil {
			return false, err
		}
		out = append(out, e)
		lastKey = append(lastKey[:0], k...)
		return true, nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, next, nil
}

// pageBackward calls fn for every key with prefix that sorts strictly before start,
// newest (greatest) first, until fn returns false.
func pageBackward(tx Tx, b Bucket, prefix, start []byte, fn func(k, v []byte) (bool, error)) error {
	c := tx.Cursor(b)
	var k, v []byte
	if k, _ = c.Seek(start); k == nil {
		k, v = c.Last()
	} else {
		k, v = c.Prev()
	}
	for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Prev() {
		if bytes.Compare(k, start) >= 0 {
			continue
		}
		more, err := fn(k, v)
		if err != nil || !more {
			return err
		}
	}
	return nil
}
