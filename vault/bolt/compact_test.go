package bolt

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// fillAndReap writes n completed charges with long answers under the key, then
// moves the clock past the replay window and reaps them: the file keeps its
// size, full of free pages.
func fillAndReap(t *testing.T, s *Store, clock *vaulttest.Clock, keyID string, n int) {
	t.Helper()
	ctx := context.Background()
	body := []byte(`{"id":"ch","padding":"` + strings.Repeat("x", 3000) + `"}`)
	unsynced(t, s, func() {
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := w; i < n; i += 16 {
					idem := fmt.Sprintf("fill-%d", i)
					vaulttest.MustReserve(t, s, vaulttest.Charge(keyID, idem, 1))
					vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: keyID, IdempotencyKey: idem, Outcome: vault.SettleRelease,
						Response: &vault.StoredResponse{Status: 402, Body: body}})
				}
			})
		}
		wg.Wait()
	})
	clock.Advance(vault.DefaultIdempotencyTTL + time.Hour)
	removed, err := s.Reap(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, removed, n)
}

// TestCompactWhileServing: compacting a running store gives the reaped space
// back while requests go on; nothing they did is lost, and the store reads
// and writes the compacted file afterwards.
func TestCompactWhileServing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newMeteringFixture(t)
	fillAndReap(t, f.s, f.clock, f.key.ID, 2000)
	before, err := f.s.Size(ctx)
	require.NoError(t, err)

	// Charges keep coming while the file is swapped: some before Compact
	// starts, some after it returns.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var committed atomic.Int64
	progress := make(chan struct{}, 1) // a charge was committed
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				idem := fmt.Sprintf("during-%d-%d", w, i)
				res, err := f.s.Reserve(ctx, vaulttest.Charge(f.key.ID, idem, 1))
				if !assert.NoError(t, err) || res.Outcome != vault.ReserveClaimed {
					return
				}
				if !assert.NoError(t, f.s.SettleQueued(ctx, vault.SettleRequest{KeyID: f.key.ID, IdempotencyKey: idem,
					Outcome: vault.SettleCommit, Amount: 1}, nil)) {
					return
				}
				committed.Add(1)
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		})
	}
	stopped := make(chan struct{}) // every charger returned
	go func() {
		wg.Wait()
		close(stopped)
	}()
	// charged waits for n more commits, or for the chargers to give up.
	charged := func(n int64) {
		for want := committed.Load() + n; committed.Load() < want; {
			select {
			case <-progress:
			case <-stopped:
				return
			}
		}
	}
	charged(4)
	res, err := f.s.Compact(ctx)
	require.NoError(t, err)
	charged(4)
	close(stop)
	<-stopped

	assert.Equal(t, before, res.Before)
	assert.Less(t, res.After, before/2, "the reaped records' pages are given back")
	size, err := f.s.Size(ctx)
	require.NoError(t, err)
	assert.LessOrEqual(t, size, res.After+allocStep+1<<20, "the store runs on the compacted file (grown by bbolt's allocation step at most)")
	_, period := usageOf(t, f.s, f.key.ID)
	assert.GreaterOrEqual(t, committed.Load(), int64(8))
	assert.Equal(t, committed.Load(), period.Committed, "every charge made during the compaction is there")
	vaulttest.MustCommit(t, f.s, f.key.ID, "after", 5)
	require.NoError(t, f.s.CheckInvariant(ctx))

	// And the compacted file is the one on disk: it opens again.
	require.NoError(t, f.s.Close())
	again := MustOpenPath(t, f.path, f.clock)
	_, period = usageOf(t, again, f.key.ID)
	assert.Equal(t, committed.Load()+5, period.Committed)
}

// TestCompactOffline: keybrake compact's work on a stopped server's file: the
// same result, refused while a server holds the file.
func TestCompactOffline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newMeteringFixture(t)
	fillAndReap(t, f.s, f.clock, f.key.ID, 1000)
	_, err := Compact(ctx, f.path, 50*time.Millisecond)
	assert.ErrorIs(t, err, vault.ErrLocked, "a running server holds the file")
	require.NoError(t, f.s.Close())

	res, err := Compact(ctx, f.path, time.Second)
	require.NoError(t, err)
	assert.Less(t, res.After, res.Before/2)
	s := MustOpenPath(t, f.path, f.clock)
	vaulttest.MustCommit(t, s, f.key.ID, "after", 5)
	_, period := usageOf(t, s, f.key.ID)
	assert.Equal(t, int64(5), period.Committed)

	_, err = Compact(ctx, f.path+".missing", time.Second)
	assert.ErrorIs(t, err, vault.ErrNotFound)
}
