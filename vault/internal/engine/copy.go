package engine

// Snapshot is a whole store as one read transaction sees it, for copying the
// store into another (keybrake migrate-store): the entries of every bucket, in
// key order, and every bucket's sequence. The entries are the engine's own
// encoding, the same bytes in every store, so a copy moves them unchanged.
type Snapshot interface {
	// Cursor iterates over b in key order.
	Cursor(b Bucket) Cursor
	// Sequence is the last number b's NextSequence or Append handed out, 0
	// when none was: a copy carries it over, so that the target hands out
	// only numbers above it (event and audit ids, fencing tokens).
	Sequence(b Bucket) (uint64, error)
}
