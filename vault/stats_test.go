package vault

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCountHolds(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	want := map[HoldState]int{}
	for i := range 23 {
		f.clock.Advance(time.Second)
		MustReserve(t, f.s, charge(id, idem(i), 100))
		switch i % 3 {
		case 0:
			MustSettle(t, f.s, SettleRequest{KeyID: id, IdempotencyKey: idem(i), Outcome: SettleUnknown})
			want[HoldUnknown]++
		case 1:
			MustSettle(t, f.s, SettleRequest{KeyID: id, IdempotencyKey: idem(i), Outcome: SettleCommit, Amount: 100})
			want[HoldCommitted]++
		default:
			want[HoldHeld]++ // in flight
		}
	}
	// Chunk sizes that split the 23 entries unevenly, exactly, and not at all.
	for _, chunk := range []int{1, 4, 23, holdCountChunk} {
		f.s.countChunk = chunk
		for _, st := range []HoldState{HoldHeld, HoldCommitted, HoldReleased, HoldUnknown} {
			n, err := f.s.CountHolds(ctx, st)
			require.NoError(t, err)
			assert.Equal(t, want[st], n, "state %s, chunk %d", st, chunk)
		}
	}

	holds, _, err := f.s.ListHolds(ctx, HoldUnknown, 500, "")
	require.NoError(t, err)
	assert.Len(t, holds, want[HoldUnknown], "CountHolds agrees with ListHolds")

	_, err = f.s.CountHolds(ctx, "")
	assert.ErrorIs(t, err, ErrInvalid, "the empty state is not a state")
	_, err = f.s.CountHolds(ctx, "bogus")
	assert.ErrorIs(t, err, ErrInvalid)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = f.s.CountHolds(cancelled, HoldUnknown)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestStatsCountGroupCommits(t *testing.T) {
	f := newMeteringFixture(t)
	before := f.s.Stats()
	const n = 5
	for i := range n {
		MustReserve(t, f.s, charge(f.key.ID, idem(i), 100))
		MustSettle(t, f.s, SettleRequest{KeyID: f.key.ID, IdempotencyKey: idem(i), Outcome: SettleCommit, Amount: 100})
	}
	after := f.s.Stats()
	// One caller at a time: every operation is a batch of its own.
	assert.Equal(t, int64(2*n), after.Ops-before.Ops, "a Reserve and a Settle per request")
	assert.Equal(t, int64(2*n), after.Commits-before.Commits)
}
