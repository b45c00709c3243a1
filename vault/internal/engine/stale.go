package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// Stale exposure: every money object with live exposure is listed in meta
// under the time it was last touched — its record last changed, or the
// background refresher last claimed it — so that the refresher finds the
// exposures nobody touched for a while by walking one ordered range, oldest
// first, instead of every object of every key. The entry is written in the
// transaction that writes the object (putObject), so it never disagrees with
// the record: a record's stored Touched is the time it is listed under, and
// an object whose exposure is all settled is not listed. See
// docs/decisions/0090-stale-exposure-listed-by-its-last-touch.md.

// metaExposureTouched prefixes the entries: the prefix, the touched time
// (unix ns, 8 bytes BE), then the object's key in BucketObjects (key id NUL
// object id) → empty.
var metaExposureTouched = []byte("exposure_touched/")

func touchedKey(at time.Time, objectKey []byte) []byte {
	k := make([]byte, 0, len(metaExposureTouched)+8+len(objectKey))
	k = append(k, metaExposureTouched...)
	k = append(k, u64(uint64(at.UnixNano()))...)
	return append(k, objectKey...)
}

// putObjectTouched writes the object's record and moves its entry of the
// stale list to the latest of its UpdatedAt, its Touched and touched (or
// removes it, when no exposure is left).
func putObjectTouched(tx Tx, keyID, objectID string, o *objectRec, touched time.Time) error {
	ok := idemKey(keyID, objectID)
	var want time.Time
	if len(o.Parts) > 0 {
		want = o.UpdatedAt
		for _, t := range [...]time.Time{o.Touched, touched} {
			if t.After(want) {
				want = t
			}
		}
	}
	if old := o.Touched; !old.Equal(want) {
		if !old.IsZero() {
			if err := tx.Delete(BucketMeta, touchedKey(old, ok)); err != nil {
				return fmt.Errorf("unlist object %s: %w", objectID, err)
			}
		}
		if !want.IsZero() {
			if err := tx.Put(BucketMeta, touchedKey(want, ok), []byte{}); err != nil {
				return fmt.Errorf("list object %s: %w", objectID, err)
			}
		}
		o.Touched = want
	}
	if err := tx.Put(BucketObjects, ok, encodeObject(o)); err != nil {
		return fmt.Errorf("put object %s: %w", objectID, err)
	}
	return nil
}

// StaleExposures lists, oldest first, up to limit money objects with live
// exposure whose record nobody touched for olderThan at the store clock, in
// one read transaction (see vault.Store).
func (s *Engine) StaleExposures(ctx context.Context, olderThan time.Duration, limit int) ([]vault.StaleExposure, error) {
	if olderThan <= 0 {
		return nil, fmt.Errorf("stale exposures: a threshold of %s: %w", olderThan, vault.ErrInvalid)
	}
	limit = clampLimit(limit)
	var out []vault.StaleExposure
	err := s.viewSettled(ctx, "", func(tx Tx, now time.Time) error {
		out = nil // a re-run starts over
		before := now.Add(-olderThan)
		end := touchedKey(before, nil)
		c := tx.Cursor(BucketMeta)
		for k, _ := c.Seek(metaExposureTouched); k != nil && bytes.HasPrefix(k, metaExposureTouched) && len(out) < limit; k, _ = c.Next() {
			if bytes.Compare(k, end) >= 0 || len(k) < len(end) {
				break
			}
			ns := int64(binary.BigEndian.Uint64(k[len(metaExposureTouched):]))
			keyID, objectID, ok := splitNul(k[len(end):])
			if !ok {
				return fmt.Errorf("stale exposure entry %q: %w", k, vault.ErrStorage)
			}
			out = append(out, vault.StaleExposure{KeyID: keyID, ObjectID: objectID, Touched: time.Unix(0, ns).UTC()})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stale exposures: %w", err)
	}
	return out, nil
}

// ClaimStaleExposure claims keyID's exposure on objectID for one lookup at
// Stripe (see vault.Store): under the key's lock, when the object still has
// live exposure untouched for olderThan at the store clock, it is touched now.
func (s *Engine) ClaimStaleExposure(ctx context.Context, keyID, objectID string, olderThan time.Duration) (vault.ExposedObject, bool, error) {
	if keyID == "" || objectID == "" || olderThan <= 0 {
		return vault.ExposedObject{}, false, fmt.Errorf("claim stale exposure: %w", vault.ErrInvalid)
	}
	var (
		exp     vault.ExposedObject
		claimed bool
	)
	err := s.submit(ctx, func(tx Tx, now time.Time) error {
		exp, claimed = vault.ExposedObject{}, false // a re-run starts over
		if err := tx.LockKey(keyID); err != nil {
			return err
		}
		o, ok, err := getObject(tx, keyID, objectID)
		if err != nil || !ok || len(o.Parts) == 0 {
			return err
		}
		if o.Touched.IsZero() {
			o.Touched = o.UpdatedAt // a record written before the list was kept
		}
		if o.Touched.After(now.Add(-olderThan)) {
			return nil // touched since it was listed: by a request, an event or another replica
		}
		if err := putObjectTouched(tx, keyID, objectID, o, now); err != nil {
			return err
		}
		exp, claimed = o.exposed(objectID), true
		return nil
	})
	if err != nil {
		return vault.ExposedObject{}, false, fmt.Errorf("claim stale exposure: %w", err)
	}
	return exp, claimed, nil
}
