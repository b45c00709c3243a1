package engine

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// The ledger's retention. Every metered request writes two or three events
// that nothing else removes, so the ledger is what grows with traffic: the
// reaper removes events older than the retention (Config.LedgerRetention,
// default vault.DefaultLedgerRetention). What each removed event changed on
// each of its windows is added to that window's roll-up first, so the sums
// that matter survive it: a window's counter still equals its events plus its
// roll-up (CheckInvariant), and the dashboard's spend per day (DailySpend)
// still shows the days whose events are gone. A day's roll-up goes once the
// day's counter is gone and the day is older than any spend chart shows.

// rollup is the sum of the deltas of a window's removed events.
type rollup struct {
	Held, Committed, Allowance int64
}

const rollupLen = 24

func (r rollup) encode() []byte {
	b := make([]byte, rollupLen)
	binary.BigEndian.PutUint64(b[0:], uint64(r.Committed))
	binary.BigEndian.PutUint64(b[8:], uint64(r.Held))
	binary.BigEndian.PutUint64(b[16:], uint64(r.Allowance))
	return b
}

func decodeRollup(k, b []byte) (rollup, error) {
	if len(b) != rollupLen {
		return rollup{}, fmt.Errorf("roll-up %q is %d bytes: %w", k, len(b), vault.ErrStorage)
	}
	return rollup{
		Committed: int64(binary.BigEndian.Uint64(b[0:])),
		Held:      int64(binary.BigEndian.Uint64(b[8:])),
		Allowance: int64(binary.BigEndian.Uint64(b[16:])),
	}, nil
}

// getRollup reads the roll-up of a key's window (zero when none).
func getRollup(tx Tx, keyID string, windowID policy.WindowID) (rollup, error) {
	k := counterKey(keyID, windowID)
	v, err := tx.Get(BucketRollups, k)
	if err != nil || v == nil {
		return rollup{}, err
	}
	return decodeRollup(k, v)
}

// judgeEvent removes an event older than the retention, adding its deltas to
// its windows' roll-ups. A key's events are in the order they were written,
// so at the first one that is not due the scan moves on to the next key.
func (s *Engine) judgeEvent(_ Tx, now time.Time, k, v []byte) (reapVerdict, error) {
	keyID, _, ok := splitNul(k)
	if !ok {
		return reapVerdict{}, fmt.Errorf("event key %q: %w", k, vault.ErrStorage)
	}
	e, err := decodeEvent(k, v)
	if err != nil {
		return reapVerdict{}, err
	}
	if now.Sub(e.Time) <= s.retention {
		return reapVerdict{skipTo: append([]byte(keyID), 1)}, nil // after every event of the key
	}
	k = append([]byte(nil), k...)
	return reapVerdict{owner: keyID, removes: true, apply: func(tx Tx) error {
		for i, w := range e.WindowIDs {
			r, err := getRollup(tx, keyID, w)
			if err != nil {
				return err
			}
			r.Held += e.HeldDelta
			r.Committed += e.CommittedDelta
			if i < len(e.AllowanceDeltas) {
				r.Allowance += e.AllowanceDeltas[i]
			}
			if err := tx.Put(BucketRollups, counterKey(keyID, w), r.encode()); err != nil {
				return fmt.Errorf("put roll-up: %w", err)
			}
		}
		if err := tx.Delete(BucketEvents, k); err != nil {
			return fmt.Errorf("delete event: %w", err)
		}
		return nil
	}}, nil
}

// rollupKeepDays is how long a day's roll-up outlives its day: longer than
// the spend chart reaches back (vault.MaxSpendDays), and the counter of the
// day must be gone.
const rollupKeepDays = vault.MaxSpendDays + 2

// judgeRollup removes the roll-up of a day that no spend chart shows any more
// and whose counter the reaper removed. A period's roll-up stays with its
// counter.
func judgeRollup(tx Tx, now time.Time, k, _ []byte) (reapVerdict, error) {
	keyID, window, ok := splitCounterKey(k)
	if !ok {
		return reapVerdict{}, nil
	}
	day, ok := window.Day()
	if !ok || now.Sub(day) <= rollupKeepDays*24*time.Hour {
		return reapVerdict{}, nil
	}
	if _, exists, err := getCounter(tx, keyID, window); err != nil || exists {
		return reapVerdict{}, err
	}
	return removeEntry(keyID, BucketRollups, k), nil
}
