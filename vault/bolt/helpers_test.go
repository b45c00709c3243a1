package bolt

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// TestConformance runs the store contract's conformance suite on bbolt files.
func TestConformance(t *testing.T) {
	t.Parallel()
	vaulttest.Run(t, func(tb testing.TB, o vaulttest.Options) (vault.Store, *engine.Engine) {
		s, err := Open(filepath.Join(tb.TempDir(), "keybrake.db"), Options{
			MasterKey: o.MasterKey, Now: o.Now, IdempotencyTTL: o.IdempotencyTTL,
			UnknownRetryLimit: o.UnknownRetryLimit, Lease: o.Lease, LedgerRetention: o.LedgerRetention,
			Logger: vaulttest.QuietLogger(),
		})
		require.NoError(tb, err)
		return s, s.Engine
	})
}

// MustOpenPath opens a store at path with the test master key and clock; the
// cleanup re-checks the invariant and closes it.
func MustOpenPath(tb testing.TB, path string, clock *vaulttest.Clock, opts ...func(*Options)) *Store {
	tb.Helper()
	o := Options{MasterKey: vaulttest.MasterKey, Now: clock.Now, Logger: vaulttest.QuietLogger()}
	for _, f := range opts {
		f(&o)
	}
	s, err := Open(path, o)
	require.NoError(tb, err)
	tb.Cleanup(func() {
		if s.isClosed() {
			return
		}
		if err := s.CheckInvariant(context.Background()); err != nil {
			tb.Errorf("invariant at cleanup: %v", err)
		}
		if err := s.Close(); err != nil {
			tb.Errorf("close: %v", err)
		}
	})
	return s
}

// MustOpen opens a fresh store in a temporary directory.
func MustOpen(tb testing.TB, clock *vaulttest.Clock, opts ...func(*Options)) (*Store, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "keybrake.db")
	return MustOpenPath(tb, path, clock, opts...), path
}

// meteringFixture is a store with an upstream and one key with caps of $100 a
// day and $150 a period.
type meteringFixture struct {
	s     *Store
	clock *vaulttest.Clock
	key   vault.Key
	path  string
}

func newMeteringFixture(t *testing.T) *meteringFixture {
	t.Helper()
	clock := vaulttest.NewClock(vaulttest.T0)
	s, path := MustOpen(t, clock)
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := vaulttest.MustMint(t, s, "k", vaulttest.Policy(t, "100.00", "150.00", ""), nil)
	return &meteringFixture{s: s, clock: clock, key: k, path: path}
}

// recordStates counts idempotency records by state.
func recordStates(tb testing.TB, s *Store) map[vault.RecordState]int {
	tb.Helper()
	out, err := engine.RecordStates(s.Engine, context.Background())
	require.NoError(tb, err)
	return out
}

// allHolds returns every hold, by id.
func allHolds(tb testing.TB, s *Store) map[string]vault.Hold {
	tb.Helper()
	out, err := engine.AllHolds(s.Engine, context.Background())
	require.NoError(tb, err)
	return out
}

// usageOf returns a key's counters at the store clock.
func usageOf(tb testing.TB, s *Store, keyID string) (daily, period policy.Counter) {
	tb.Helper()
	_, windows, usage, err := s.KeyUsage(context.Background(), keyID)
	require.NoError(tb, err)
	require.Len(tb, windows, 2)
	return usage[windows[0].ID], usage[windows[1].ID]
}

// unsynced runs fill, the setup of a test that asserts nothing about when its
// writes reach the disk, with the store's commits not waiting for it (bbolt's
// NoSync), then syncs the file once: the fixture ends on the disk as if every
// commit had waited, for one fsync instead of one or two per charge. On a
// disk shared with other builds, those fsyncs were most of a fill's time.
// What the test does afterwards commits durably, as in production.
func unsynced(tb testing.TB, s *Store, fill func()) {
	tb.Helper()
	s.dbMu.Lock()
	s.db.NoSync = true
	s.dbMu.Unlock()
	fill()
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	s.db.NoSync = false
	require.NoError(tb, s.db.Sync())
}
