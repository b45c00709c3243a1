package vaulttest

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// MasterKey is a fixed master key for tests.
var MasterKey = []byte("0123456789abcdef0123456789abcdef")

// T0 is the tests' usual "now": mid-period, mid-day in UTC.
var T0 = time.Date(2026, 9, 14, 12, 0, 0, 0, time.UTC)

// Clock is a settable clock for Options.Now.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock set to t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set sets the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Advance moves the clock by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// mustOpen opens a new, empty store of the backend under test, with the test
// master key and clock; the cleanup re-checks the invariant and closes it.
func mustOpen(tb testing.TB, clock *Clock, opts ...func(*Options)) *Store {
	tb.Helper()
	o := Options{MasterKey: MasterKey, Now: clock.Now}
	for _, f := range opts {
		f(&o)
	}
	open := openerOf(tb)
	st, e := open(tb, o)
	s := &Store{Store: st, e: e}
	tb.Cleanup(func() {
		if s.closed {
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

// flip returns another base64url character than c.
func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}

// MustDec parses a decimal amount.
func MustDec(tb testing.TB, v string) *decimal.Decimal {
	tb.Helper()
	d, err := decimal.NewFromString(v)
	require.NoError(tb, err)
	return &d
}

// Policy is a usd policy valid for September 2026 with the given caps ("" for
// none).
func Policy(tb testing.TB, daily, period, perRequest string) policy.Policy {
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
func MustUpstream(tb testing.TB, s vault.Store, secret string) {
	tb.Helper()
	_, _, err := s.PutUpstream(context.Background(), "tester", "default", "stripe", secret)
	require.NoError(tb, err)
}

// MustMint mints a key on the default upstream.
func MustMint(tb testing.TB, s vault.Store, name string, p policy.Policy, labels map[string]string) (vault.Key, string) {
	tb.Helper()
	k, tok, err := s.MintKey(context.Background(), "tester", vault.MintRequest{Name: name, Upstream: "default", Labels: labels, Policy: p})
	require.NoError(tb, err)
	return k, tok
}

// Charge is a metered charges.create request for amount cents.
func Charge(keyID, idem string, amount int64) vault.ReserveRequest {
	return vault.ReserveRequest{
		KeyID: keyID, IdempotencyKey: idem, Fingerprint: "fp-" + idem, Metered: true,
		Request: policy.Request{Operation: "charges.create", Amount: amount, Currency: "usd"},
	}
}

// MustReserve reserves and requires no error.
func MustReserve(tb testing.TB, s vault.Store, req vault.ReserveRequest) vault.ReserveResult {
	tb.Helper()
	res, err := s.Reserve(context.Background(), req)
	require.NoError(tb, err)
	return res
}

// MustSettle settles and requires no error.
func MustSettle(tb testing.TB, s vault.Store, req vault.SettleRequest) {
	tb.Helper()
	require.NoError(tb, s.Settle(context.Background(), req))
}

// MustCommit reserves a charge of amount cents under idem and commits it in full.
func MustCommit(tb testing.TB, s vault.Store, keyID, idem string, amount int64) {
	tb.Helper()
	require.Equal(tb, vault.ReserveClaimed, MustReserve(tb, s, Charge(keyID, idem, amount)).Outcome)
	MustSettle(tb, s, vault.SettleRequest{KeyID: keyID, IdempotencyKey: idem, Outcome: vault.SettleCommit, Amount: amount})
}

// usageOf returns a key's counters at the store clock.
func usageOf(tb testing.TB, s vault.Store, keyID string) (daily, period policy.Counter) {
	tb.Helper()
	_, windows, usage, err := s.KeyUsage(context.Background(), keyID)
	require.NoError(tb, err)
	require.Len(tb, windows, 2)
	return usage[windows[0].ID], usage[windows[1].ID]
}

// recordStates counts idempotency records by state.
func recordStates(tb testing.TB, s *Store) map[vault.RecordState]int {
	tb.Helper()
	out, err := engine.RecordStates(s.e, context.Background())
	require.NoError(tb, err)
	return out
}

// allHolds returns every hold, by id.
func allHolds(tb testing.TB, s *Store) map[string]vault.Hold {
	tb.Helper()
	out, err := engine.AllHolds(s.e, context.Background())
	require.NoError(tb, err)
	return out
}

// QuietLogger drops the store's logs: tests check outcomes, not log lines.
func QuietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func Idem(i int) string { return fmt.Sprintf("idem-%04d", i) }

// rawStore returns every key and value the store holds, as the engine wrote
// them, in one byte slice: what a secret must never be found in.
func rawStore(tb testing.TB, s *Store) []byte {
	tb.Helper()
	var raw []byte
	require.NoError(tb, engine.View(s.e, context.Background(), func(tx engine.Tx, _ time.Time) error {
		raw = raw[:0]
		for _, b := range engine.Buckets() {
			c := tx.Cursor(b)
			for k, v := c.First(); k != nil; k, v = c.Next() {
				raw = append(append(raw, k...), v...)
			}
		}
		return nil
	}))
	return raw
}

// view runs fn in one read transaction of the store's engine.
func (s *Store) view(fn engine.TxFunc) error { return engine.View(s.e, context.Background(), fn) }

// update runs fn in one write transaction of the store's engine.
func (s *Store) update(fn engine.TxFunc) error { return engine.Update(s.e, context.Background(), fn) }

// encodeCursor makes a listing cursor as the store does (base64url of the
// last entry's id), for tests of malformed and foreign cursors.
func encodeCursor(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// TokenHash is the hex SHA-256 of a token, the only form the store keeps.
func TokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// holdCountChunk is the engine's default chunk of CountHolds and
// SummarizeUsage, which tests set back after lowering it.
const holdCountChunk = 10000
