package vault

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/policy"
)

// testMasterKey is a fixed master key for tests.
var testMasterKey = []byte("0123456789abcdef0123456789abcdef")

// t0 is the tests' usual "now": mid-period, mid-day in UTC.
var t0 = time.Date(2026, 9, 14, 12, 0, 0, 0, time.UTC)

// testClock is a settable clock for Options.Now.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *testClock { return &testClock{t: t} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// MustOpenPath opens a store at path with the test master key and clock; the
// cleanup re-checks the invariant and closes it.
func MustOpenPath(tb testing.TB, path string, clock *testClock, opts ...func(*Options)) *Store {
	tb.Helper()
	o := Options{MasterKey: testMasterKey, Now: clock.Now, Logger: quietLogger()}
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
func MustOpen(tb testing.TB, clock *testClock, opts ...func(*Options)) (*Store, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "keybrake.db")
	return MustOpenPath(tb, path, clock, opts...), path
}

// MustDec parses a decimal amount.
func MustDec(tb testing.TB, v string) *decimal.Decimal {
	tb.Helper()
	d, err := decimal.NewFromString(v)
	require.NoError(tb, err)
	return &d
}

// testPolicy is a usd policy valid for September 2026 with the given caps ("" for
// none).
func testPolicy(tb testing.TB, daily, period, perRequest string) policy.Policy {
	tb.Helper()
	p := policy.Policy{
		Vendor:      policy.VendorStripe,
		Currency:    "usd",
		PeriodStart: time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC),
		ExpiresAt:   time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC),
		Timezone:    "UTC",
	}
	if daily != "" {
		p.DailyCap = MustDec(tb, daily)
	}
	if period != "" {
		p.PeriodCap = MustDec(tb, period)
	}
	if perRequest != "" {
		p.PerRequestCap = MustDec(tb, perRequest)
	}
	return p
}

// MustUpstream registers the "default" upstream.
func MustUpstream(tb testing.TB, s *Store, secret string) {
	tb.Helper()
	_, err := s.PutUpstream(context.Background(), "tester", "default", "stripe", secret)
	require.NoError(tb, err)
}

// MustMint mints a key on the default upstream.
func MustMint(tb testing.TB, s *Store, name string, p policy.Policy, labels map[string]string) (Key, string) {
	tb.Helper()
	k, tok, err := s.MintKey(context.Background(), "tester", MintRequest{Name: name, Upstream: "default", Labels: labels, Policy: p})
	require.NoError(tb, err)
	return k, tok
}

// charge is a metered charges.create request for amount cents.
func charge(keyID, idem string, amount int64) ReserveRequest {
	return ReserveRequest{
		KeyID: keyID, IdempotencyKey: idem, Fingerprint: "fp-" + idem, Metered: true,
		Request: policy.Request{Operation: "charges.create", Amount: amount, Currency: "usd"},
	}
}

// MustReserve reserves and requires no error.
func MustReserve(tb testing.TB, s *Store, req ReserveRequest) ReserveResult {
	tb.Helper()
	res, err := s.Reserve(context.Background(), req)
	require.NoError(tb, err)
	return res
}

// MustSettle settles and requires no error.
func MustSettle(tb testing.TB, s *Store, req SettleRequest) {
	tb.Helper()
	require.NoError(tb, s.Settle(context.Background(), req))
}

// MustCommit reserves a charge of amount cents under idem and commits it in full.
func MustCommit(tb testing.TB, s *Store, keyID, idem string, amount int64) {
	tb.Helper()
	require.Equal(tb, ReserveClaimed, MustReserve(tb, s, charge(keyID, idem, amount)).Outcome)
	MustSettle(tb, s, SettleRequest{KeyID: keyID, IdempotencyKey: idem, Outcome: SettleCommit, Amount: amount})
}

// usageOf returns a key's counters at the store clock.
func usageOf(tb testing.TB, s *Store, keyID string) (daily, period policy.Counter) {
	tb.Helper()
	_, windows, usage, err := s.KeyUsage(context.Background(), keyID)
	require.NoError(tb, err)
	require.Len(tb, windows, 2)
	return usage[windows[0].ID], usage[windows[1].ID]
}

// recordStates counts idempotency records by state, reading the file directly.
func recordStates(tb testing.TB, s *Store) map[RecordState]int {
	tb.Helper()
	out := map[RecordState]int{}
	require.NoError(tb, s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketIdem).ForEach(func(k, v []byte) error {
			r, err := decodeRecord(k, v)
			if err != nil {
				return err
			}
			out[r.State]++
			return nil
		})
	}))
	return out
}

// allHolds returns every hold, by id, reading the file directly.
func allHolds(tb testing.TB, s *Store) map[string]Hold {
	tb.Helper()
	out := map[string]Hold{}
	require.NoError(tb, s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketIdem).ForEach(func(k, v []byte) error {
			r, err := decodeRecord(k, v)
			if err != nil || r.Hold == nil {
				return err
			}
			out[r.Hold.ID] = r.Hold.public()
			return nil
		})
	}))
	return out
}

// quietLogger drops the store's logs: tests check outcomes, not log lines.
func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

type boltTx = bolt.Tx

func writeFile(path string, data []byte) error { return os.WriteFile(path, data, 0o600) }

func idem(i int) string { return fmt.Sprintf("idem-%04d", i) }
