package vaulttest

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

// meteringFixture is a store with one key: daily cap 100.00, period cap 150.00.
type meteringFixture struct {
	s     *Store
	clock *Clock
	key   vault.Key
}

func newMeteringFixture(t *testing.T) *meteringFixture {
	t.Helper()
	return newFixtureWith(t, "k", Policy(t, "100.00", "150.00", ""))
}

// newFixtureWith is a store at T0 with one key, name, of policy p.
func newFixtureWith(t *testing.T, name string, p policy.Policy) *meteringFixture {
	t.Helper()
	clock := NewClock(T0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_abcdef1234")
	k, _ := MustMint(t, s, name, p, nil)
	return &meteringFixture{s: s, clock: clock, key: k}
}

func testReserveClaimsAndHolds(t *testing.T) {
	f := newMeteringFixture(t)
	res := MustReserve(t, f.s, Charge(f.key.ID, "a", 4000))
	require.Equal(t, vault.ReserveClaimed, res.Outcome)
	assert.True(t, res.Decision.Allowed)
	assert.False(t, res.Decision.WouldRefuse)
	assert.Equal(t, f.key.ID, res.Key.ID)

	rec := res.Record
	assert.Equal(t, vault.RecordInProgress, rec.State)
	assert.Equal(t, T0.Add(vault.DefaultLease), rec.LeaseUntil)
	assert.Equal(t, "fp-a", rec.Fingerprint)
	assert.Equal(t, vault.UpstreamKey(f.key.ID, "a"), rec.UpstreamKey)
	assert.Equal(t, vault.HoldID(f.key.ID, "a"), rec.HoldID)

	require.NotNil(t, res.Hold)
	assert.Equal(t, vault.Hold{
		ID: vault.HoldID(f.key.ID, "a"), KeyID: f.key.ID, IdempotencyKey: "a", Operation: "charges.create",
		Currency: "usd", Amount: 4000, WindowIDs: []policy.WindowID{"day:2026-09-14", "period"}, State: vault.HoldHeld, CreatedAt: T0,
	}, *res.Hold)

	daily, period := usageOf(t, f.s, f.key.ID)
	assert.Equal(t, policy.Counter{Held: 4000}, daily)
	assert.Equal(t, policy.Counter{Held: 4000}, period)

	events, _, err := f.s.ListEvents(context.Background(), f.key.ID, 0, "")
	require.NoError(t, err)
	require.Len(t, events, 1)
	assert.Equal(t, vault.DecisionAllowed, events[0].Decision)
	assert.Equal(t, int64(4000), events[0].Amount)
	assert.Equal(t, int64(4000), events[0].HeldDelta)
	assert.Equal(t, vault.HoldHeld, events[0].HoldState)
}

// testReserveReportsUsage: a Reserve that forwards or replays reports the
// key's windows and their counters as it left them, its own hold included, so
// the proxy's remaining-budget headers need no other read.
func testReserveReportsUsage(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	MustCommit(t, f.s, id, "before", 1000)

	res := MustReserve(t, f.s, Charge(id, "a", 4000))
	require.Equal(t, vault.ReserveClaimed, res.Outcome)
	require.Len(t, res.Windows, 2)
	assert.Equal(t, policy.WindowID("day:2026-09-14"), res.Windows[0].ID)
	assert.Equal(t, int64(10000), res.Windows[0].Cap)
	assert.Equal(t, policy.Usage{"day:2026-09-14": {Committed: 1000, Held: 4000}, "period": {Committed: 1000, Held: 4000}}, res.Usage)

	res = MustReserve(t, f.s, vault.ReserveRequest{KeyID: id, IdempotencyKey: "u", Fingerprint: "fp",
		Request: policy.Request{Operation: "customers.read"}})
	require.Equal(t, vault.ReserveClaimed, res.Outcome)
	assert.Equal(t, policy.Counter{Committed: 1000, Held: 4000}, res.Usage["period"], "an unmetered claim reports the counters too")

	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 3000,
		Response: &vault.StoredResponse{Status: http.StatusOK, Body: []byte(`{}`)}})
	res = MustReserve(t, f.s, Charge(id, "a", 4000))
	require.Equal(t, vault.ReserveReplay, res.Outcome)
	assert.Equal(t, policy.Counter{Committed: 4000}, res.Usage["day:2026-09-14"], "a replay reports the counters as they are")

	res = MustReserve(t, f.s, Charge(id, "b", 20000))
	require.Equal(t, vault.ReserveRefused, res.Outcome)
	assert.Nil(t, res.Usage, "a refusal says what is left in its decision")
}

// testSettleQueued: a queued settle (the proxy's) is ordered before every
// later write — a retry's Reserve replays it — and seen by every later read;
// its outcome, a refusal included, reaches done once.
func testSettleQueued(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	require.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, Charge(id, "a", 4000)).Outcome)
	results := make(chan error, 2)
	commit := vault.SettleRequest{KeyID: id, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 3000,
		Response: &vault.StoredResponse{Status: http.StatusOK, Body: []byte(`{"id":"ch_1"}`)}}
	require.NoError(t, f.s.SettleQueued(ctx, commit, func(err error) { results <- err }))

	res := MustReserve(t, f.s, Charge(id, "a", 4000))
	require.Equal(t, vault.ReserveReplay, res.Outcome, "a retry after the settle was queued finds it settled")
	assert.JSONEq(t, `{"id":"ch_1"}`, string(res.Record.Response.Body))
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 3000}, daily, "a read sees the queued settle")
	require.NoError(t, <-results)

	require.NoError(t, f.s.SettleQueued(ctx, commit, func(err error) { results <- err }))
	assert.ErrorIs(t, <-results, vault.ErrConflict, "settling a completed record is refused, through done")
	require.NoError(t, f.s.SettleQueued(ctx, commit, nil), "done may be nil")
	require.NoError(t, f.s.Ping(ctx))
}

func testReserveOutcomes(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID

	// A claimed request in flight.
	require.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, Charge(id, "a", 1000)).Outcome)
	res := MustReserve(t, f.s, Charge(id, "a", 1000))
	assert.Equal(t, vault.ReserveInFlight, res.Outcome)
	assert.Equal(t, vault.RecordInProgress, res.Record.State)
	other := Charge(id, "a", 1000)
	other.Fingerprint = "something else"
	assert.Equal(t, vault.ReserveMismatch, MustReserve(t, f.s, other).Outcome)

	// Completed: replayed with the stored response; a different request is still a mismatch.
	hdr := http.Header{"Request-Id": {"req_1"}}
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 1000,
		Response: &vault.StoredResponse{Status: 200, Header: hdr, Body: []byte(`{"id":"ch_1"}`)}, UpstreamStatus: 200, StripeRequestID: "req_1", ObjectID: "ch_1"})
	res = MustReserve(t, f.s, Charge(id, "a", 1000))
	require.Equal(t, vault.ReserveReplay, res.Outcome)
	require.NotNil(t, res.Record.Response)
	assert.Equal(t, 200, res.Record.Response.Status)
	assert.Equal(t, `{"id":"ch_1"}`, string(res.Record.Response.Body))
	assert.Equal(t, "req_1", res.Record.Response.Header.Get("Request-Id"))
	assert.Equal(t, "req_1", res.Record.RequestID)
	assert.Equal(t, T0, res.Record.CompletedAt)
	assert.Equal(t, vault.HoldCommitted, res.Hold.State)
	assert.Equal(t, vault.ReserveMismatch, MustReserve(t, f.s, other).Outcome, "mismatch even when completed")

	// Refused: nothing but the event is written; a later request with the same key can claim.
	res = MustReserve(t, f.s, Charge(id, "big", 9500))
	require.Equal(t, vault.ReserveRefused, res.Outcome)
	assert.Equal(t, policy.ReasonCapExceeded, res.Decision.Reason)
	assert.Equal(t, policy.WindowDaily, res.Decision.Cap)
	assert.Equal(t, int64(1000), res.Decision.Committed)
	assert.Nil(t, res.Hold)
	assert.Equal(t, 0, recordStates(t, f.s)[vault.RecordInProgress])
	require.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, Charge(id, "big", 9000)).Outcome, "exactly to the daily cap")
	assert.Equal(t, vault.ReserveRefused, MustReserve(t, f.s, Charge(id, "one-more", 1)).Outcome)

	// A lapsed lease: taken over, same hold.
	f.clock.Advance(vault.DefaultLease)
	res = MustReserve(t, f.s, Charge(id, "big", 9000))
	require.Equal(t, vault.ReserveResume, res.Outcome)
	assert.Equal(t, f.clock.Now().Add(vault.DefaultLease), res.Record.LeaseUntil)
	assert.Equal(t, vault.HoldHeld, res.Hold.State)
	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 1000, Held: 9000}, daily, "resume places no second hold")

	// Unknown (with Stripe's 5xx stored): a retry resumes, it is not replayed.
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "big", Outcome: vault.SettleUnknown,
		Response: &vault.StoredResponse{Status: 500, Body: []byte(`{"error":{}}`)}, UpstreamStatus: 500})
	holds, _, err := f.s.ListHolds(ctx, vault.HoldUnknown, 0, "")
	require.NoError(t, err)
	require.Len(t, holds, 1)
	res = MustReserve(t, f.s, Charge(id, "big", 9000))
	require.Equal(t, vault.ReserveResume, res.Outcome)
	assert.Equal(t, vault.HoldHeld, res.Hold.State)

	// Unknown and older than UnknownRetryLimit: stale, for an operator.
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "big", Outcome: vault.SettleUnknown})
	f.clock.Set(T0.Add(vault.DefaultUnknownRetryLimit + time.Minute))
	res = MustReserve(t, f.s, Charge(id, "big", 9000))
	assert.Equal(t, vault.ReserveStale, res.Outcome)
	assert.Equal(t, vault.RecordUnknown, res.Record.State)

	// Errors.
	_, err = f.s.Reserve(ctx, Charge("key_nope", "x", 1))
	assert.ErrorIs(t, err, vault.ErrNotFound)
	_, err = f.s.Reserve(ctx, Charge(id, "", 1))
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = f.s.Reserve(ctx, Charge(id, string(bytes.Repeat([]byte("x"), 256)), 1))
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = f.s.Reserve(ctx, Charge(id, "neg", -1))
	assert.ErrorIs(t, err, vault.ErrInvalid)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = f.s.Reserve(cancelled, Charge(id, "c", 1))
	assert.ErrorIs(t, err, context.Canceled)
}

func testReserveLapsedLeaseTooOldIsStale(t *testing.T) {
	f := newMeteringFixture(t)
	require.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, Charge(f.key.ID, "a", 100)).Outcome)
	f.clock.Advance(vault.DefaultUnknownRetryLimit + time.Second)
	res := MustReserve(t, f.s, Charge(f.key.ID, "a", 100))
	assert.Equal(t, vault.ReserveStale, res.Outcome)
	assert.Equal(t, vault.RecordUnknown, res.Record.State, "the lapsed claim is marked unknown")
	assert.Equal(t, vault.HoldUnknown, res.Hold.State)
}

func testReserveUnmetered(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	req := vault.ReserveRequest{KeyID: f.key.ID, IdempotencyKey: "cus", Fingerprint: "fp",
		Request: policy.Request{Operation: "customers.create"}}
	p := f.key.Policy
	p.Operations = []string{"customers.create", "charges.create"}
	_, err := f.s.UpdateKey(ctx, "a", f.key.ID, p, nil)
	require.NoError(t, err)

	res := MustReserve(t, f.s, req)
	require.Equal(t, vault.ReserveClaimed, res.Outcome)
	assert.Nil(t, res.Hold)
	assert.Empty(t, res.Record.HoldID)
	MustSettle(t, f.s, vault.SettleRequest{KeyID: f.key.ID, IdempotencyKey: "cus", Outcome: vault.SettleCommit,
		Response: &vault.StoredResponse{Status: 200, Body: []byte(`{"id":"cus_1"}`)}})
	res = MustReserve(t, f.s, req)
	require.Equal(t, vault.ReserveReplay, res.Outcome)
	assert.Equal(t, `{"id":"cus_1"}`, string(res.Record.Response.Body))

	events, _, err := f.s.ListEvents(ctx, f.key.ID, 0, "")
	require.NoError(t, err)
	assert.Empty(t, events, "unmetered requests are not in the ledger")

	// Refused by the policy's operation list: no record, no event.
	req.IdempotencyKey, req.Request.Operation = "refund", "refunds.create"
	res = MustReserve(t, f.s, req)
	assert.Equal(t, vault.ReserveRefused, res.Outcome)
	assert.Equal(t, policy.ReasonOperationNotAllowed, res.Decision.Reason)
	_, err = f.s.Reserve(ctx, vault.ReserveRequest{KeyID: f.key.ID, IdempotencyKey: "x", Request: policy.Request{Amount: 5}})
	assert.ErrorIs(t, err, vault.ErrInvalid, "an amount on an unmetered request is a caller bug")
}

func testReserveReportMode(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	p := f.key.Policy
	p.Mode = policy.ModeReport
	_, err := f.s.UpdateKey(ctx, "a", f.key.ID, p, nil)
	require.NoError(t, err)

	res := MustReserve(t, f.s, Charge(f.key.ID, "a", 12000))
	require.Equal(t, vault.ReserveClaimed, res.Outcome)
	assert.True(t, res.Decision.WouldRefuse)
	assert.Equal(t, policy.ReasonCapExceeded, res.Decision.Reason)
	MustSettle(t, f.s, vault.SettleRequest{KeyID: f.key.ID, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 12000})
	events, _, err := f.s.ListEvents(ctx, f.key.ID, 0, "")
	require.NoError(t, err)
	require.Len(t, events, 2)
	assert.Equal(t, vault.DecisionWouldRefuse, events[1].Decision)
	require.NoError(t, f.s.CheckInvariant(ctx), "report-mode overage is excused, not a violation")
}

func testSettle(t *testing.T) {
	type want struct {
		record  vault.RecordState // "" when the record is gone
		hold    vault.HoldState   // "" when the hold is gone
		daily   policy.Counter
		replays bool
	}
	cases := map[string]struct {
		resumed bool // settle a resumed claim rather than a fresh one
		req     vault.SettleRequest
		want    want
	}{
		"commit": {req: vault.SettleRequest{Outcome: vault.SettleCommit, Amount: 3000},
			want: want{vault.RecordCompleted, vault.HoldCommitted, policy.Counter{Committed: 3000}, true}},
		"commit less (captured part)": {req: vault.SettleRequest{Outcome: vault.SettleCommit, Amount: 1200},
			want: want{vault.RecordCompleted, vault.HoldCommitted, policy.Counter{Committed: 1200}, true}},
		"commit more than held, past the cap (an allowed overrun)": {req: vault.SettleRequest{Outcome: vault.SettleCommit, Amount: 11000, AllowOverrun: true},
			want: want{vault.RecordCompleted, vault.HoldCommitted, policy.Counter{Committed: 11000}, true}},
		"release": {req: vault.SettleRequest{Outcome: vault.SettleRelease, Response: &vault.StoredResponse{Status: 402}},
			want: want{vault.RecordCompleted, vault.HoldReleased, policy.Counter{}, true}},
		"unknown": {req: vault.SettleRequest{Outcome: vault.SettleUnknown},
			want: want{vault.RecordUnknown, vault.HoldUnknown, policy.Counter{Held: 3000}, false}},
		"abandon fresh claim": {req: vault.SettleRequest{Outcome: vault.SettleAbandon},
			want: want{"", "", policy.Counter{}, false}},
		"abandon resumed claim": {resumed: true, req: vault.SettleRequest{Outcome: vault.SettleAbandon},
			want: want{vault.RecordUnknown, vault.HoldUnknown, policy.Counter{Held: 3000}, false}},
		"commit resumed claim": {resumed: true, req: vault.SettleRequest{Outcome: vault.SettleCommit, Amount: 3000},
			want: want{vault.RecordCompleted, vault.HoldCommitted, policy.Counter{Committed: 3000}, true}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			f := newMeteringFixture(t)
			id := f.key.ID
			require.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, Charge(id, "a", 3000)).Outcome)
			if tc.resumed {
				MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "a", Outcome: vault.SettleUnknown})
				require.Equal(t, vault.ReserveResume, MustReserve(t, f.s, Charge(id, "a", 3000)).Outcome)
			}
			req := tc.req
			req.KeyID, req.IdempotencyKey = id, "a"
			MustSettle(t, f.s, req)

			daily, period := usageOf(t, f.s, id)
			assert.Equal(t, tc.want.daily, daily)
			assert.Equal(t, tc.want.daily, period, "the period window moves with the day")
			holds := allHolds(t, f.s)
			if tc.want.hold == "" {
				assert.Empty(t, holds)
			} else {
				assert.Equal(t, tc.want.hold, holds[vault.HoldID(id, "a")].State)
			}
			states := recordStates(t, f.s)
			if tc.want.record == "" {
				assert.Empty(t, states)
			} else {
				assert.Equal(t, map[vault.RecordState]int{tc.want.record: 1}, states)
			}

			// What a retry gets now.
			res := MustReserve(t, f.s, Charge(id, "a", 3000))
			switch {
			case tc.want.replays:
				assert.Equal(t, vault.ReserveReplay, res.Outcome)
			case tc.want.record == "":
				assert.Equal(t, vault.ReserveClaimed, res.Outcome, "an abandoned fresh claim starts afresh")
			default:
				assert.Equal(t, vault.ReserveResume, res.Outcome)
			}
			// Settling again is a conflict unless the retry claimed it anew.
			if res.Outcome == vault.ReserveReplay {
				assert.ErrorIs(t, f.s.Settle(ctx, req), vault.ErrConflict)
			}
		})
	}
}

func testSettleErrorsAndObjects(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	assert.ErrorIs(t, f.s.Settle(ctx, vault.SettleRequest{KeyID: id, IdempotencyKey: "none", Outcome: vault.SettleCommit}), vault.ErrNotFound)
	MustReserve(t, f.s, Charge(id, "a", 500))
	assert.ErrorIs(t, f.s.Settle(ctx, vault.SettleRequest{KeyID: id, IdempotencyKey: "a", Outcome: "maybe"}), vault.ErrInvalid)
	assert.ErrorIs(t, f.s.Settle(ctx, vault.SettleRequest{KeyID: id, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: -5}), vault.ErrInvalid)
	assert.ErrorIs(t, f.s.Settle(ctx, vault.SettleRequest{KeyID: id, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 501}), vault.ErrInvalid, "a commit above its hold is refused unless it is an allowed overrun")
	assert.ErrorIs(t, f.s.Settle(ctx, vault.SettleRequest{KeyID: id, IdempotencyKey: "a", Outcome: vault.SettleCommit,
		Object: vault.ObjectSettle{Expose: true}}), vault.ErrInvalid, "an object change needs an object id")

	_, ok, err := f.s.ObjectExposure(ctx, id, "pi_1")
	require.NoError(t, err)
	assert.False(t, ok)
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 500, ObjectID: "pi_1",
		Object: vault.ObjectSettle{Terminal: true}})
	MustReserve(t, f.s, Charge(id, "b", 300))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "b", Outcome: vault.SettleCommit, Amount: 300, ObjectID: "pi_1",
		Object: vault.ObjectSettle{Terminal: true}})
	exp, ok, err := f.s.ObjectExposure(ctx, id, "pi_1")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, vault.Exposure{Committed: 800, Closed: true}, exp)
	_, ok, err = f.s.ObjectExposure(ctx, "key_other", "pi_1")
	require.NoError(t, err)
	assert.False(t, ok, "object totals are per key")

	events, _, err := f.s.ListEvents(ctx, id, 1, "")
	require.NoError(t, err)
	require.Len(t, events, 1)
	e := events[0]
	assert.Equal(t, vault.DecisionSettled, e.Decision)
	assert.Equal(t, "commit", e.Reason)
	assert.Equal(t, "pi_1", e.ObjectID)
	assert.Equal(t, int64(300), e.Amount)
	assert.Equal(t, int64(-300), e.HeldDelta)
	assert.Equal(t, int64(300), e.CommittedDelta)
	assert.Equal(t, vault.HoldCommitted, e.HoldState)

	MustReserve(t, f.s, Charge(id, "c", 100))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "c", Outcome: vault.SettleCommit, Amount: 100, ObjectID: "re_1"})
	_, ok, err = f.s.ObjectExposure(ctx, id, "re_1")
	require.NoError(t, err)
	assert.False(t, ok, "money that moved at once keeps no object record")
}

func testHoldStaysOnItsDay(t *testing.T) {
	f := newMeteringFixture(t)
	f.clock.Set(time.Date(2026, 9, 14, 23, 59, 0, 0, time.UTC))
	MustReserve(t, f.s, Charge(f.key.ID, "late", 700))
	f.clock.Set(time.Date(2026, 9, 15, 0, 1, 0, 0, time.UTC))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: f.key.ID, IdempotencyKey: "late", Outcome: vault.SettleCommit, Amount: 700})
	daily, period := usageOf(t, f.s, f.key.ID)
	assert.Equal(t, policy.Counter{}, daily, "the new day starts at zero")
	assert.Equal(t, policy.Counter{Committed: 700}, period)
	require.NoError(t, f.s.view(func(tx engine.Tx, now time.Time) error {
		c, ok, err := engine.GetCounter(tx, f.key.ID, "day:2026-09-14")
		require.True(t, ok)
		assert.Equal(t, int64(700), c.Committed, "committed on the day it was held")
		return err
	}))
}

func testResolveHold(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	for _, k := range []string{"c", "r", "live"} {
		MustReserve(t, f.s, Charge(id, k, 1000))
	}
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "c", Outcome: vault.SettleUnknown})
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "r", Outcome: vault.SettleUnknown})

	_, err := f.s.ResolveHold(ctx, "op", vault.HoldID(id, "live"), vault.HoldCommitted)
	assert.ErrorIs(t, err, vault.ErrConflict, "a hold under a live lease is not the operator's")
	_, err = f.s.ResolveHold(ctx, "op", vault.HoldID(id, "c"), vault.HoldUnknown)
	assert.ErrorIs(t, err, vault.ErrInvalid)
	_, err = f.s.ResolveHold(ctx, "op", "hold_nope", vault.HoldCommitted)
	assert.ErrorIs(t, err, vault.ErrNotFound)

	h, err := f.s.ResolveHold(ctx, "op", vault.HoldID(id, "c"), vault.HoldCommitted)
	require.NoError(t, err)
	assert.Equal(t, vault.HoldCommitted, h.State)
	assert.Equal(t, T0, h.SettledAt)
	_, err = f.s.ResolveHold(ctx, "op", vault.HoldID(id, "r"), vault.HoldReleased)
	require.NoError(t, err)
	_, err = f.s.ResolveHold(ctx, "op", vault.HoldID(id, "c"), vault.HoldReleased)
	assert.ErrorIs(t, err, vault.ErrConflict, "resolved once")

	f.clock.Advance(vault.DefaultLease)
	_, err = f.s.ResolveHold(ctx, "op", vault.HoldID(id, "live"), vault.HoldReleased)
	require.NoError(t, err, "a held hold whose lease lapsed can be resolved")

	daily, _ := usageOf(t, f.s, id)
	assert.Equal(t, policy.Counter{Committed: 1000}, daily)

	// A retry is a replay of what the operator decided (the proxy words it).
	res := MustReserve(t, f.s, Charge(id, "c", 1000))
	require.Equal(t, vault.ReserveReplay, res.Outcome)
	assert.True(t, res.Record.Resolved)
	assert.Nil(t, res.Record.Response, "keybrake never saw Stripe's answer: none is stored")
	require.NotNil(t, res.Hold)
	assert.Equal(t, vault.HoldID(id, "c"), res.Hold.ID)
	assert.Equal(t, vault.HoldCommitted, res.Hold.State)

	entries, _, err := f.s.ListAudit(ctx, 3, "")
	require.NoError(t, err)
	require.Len(t, entries, 3)
	e := entries[2]
	assert.Equal(t, "hold.resolve", e.Action)
	assert.Equal(t, vault.HoldID(id, "c"), e.Target)
	assert.Equal(t, "op", e.Actor)
	var before, after vault.Hold
	require.NoError(t, json.Unmarshal(e.Before, &before))
	require.NoError(t, json.Unmarshal(e.After, &after))
	assert.Equal(t, vault.HoldUnknown, before.State)
	assert.Equal(t, vault.HoldCommitted, after.State)
}

// Records an operator resolved under earlier builds carry the answer those
// stored for replay: they replay it as stored.
func testResolvedRecordOfAnEarlierVersionReplaysItsAnswer(t *testing.T) {
	f := newMeteringFixture(t)
	id := f.key.ID
	MustReserve(t, f.s, Charge(id, "old", 1000))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "old", Outcome: vault.SettleUnknown})
	stored := &vault.StoredResponse{Status: http.StatusConflict, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"error":{"code":"idempotency_key_resolved"}}`)}
	_, err := f.s.ResolveHold(context.Background(), "op", vault.HoldID(id, "old"), vault.HoldReleased)
	require.NoError(t, err)
	require.NoError(t, f.s.update(func(tx engine.Tx, now time.Time) error { // as earlier builds left it
		rec, err := engine.GetRecord(tx, id, "old")
		if err != nil {
			return err
		}
		if rec.Response, err = engine.SealResponse(f.s.e, id, "old", stored); err != nil {
			return err
		}
		return engine.PutRecord(tx, rec)
	}))
	res := MustReserve(t, f.s, Charge(id, "old", 1000))
	require.Equal(t, vault.ReserveReplay, res.Outcome)
	assert.True(t, res.Record.Resolved)
	require.NotNil(t, res.Record.Response)
	assert.Equal(t, stored.Body, res.Record.Response.Body)
	assert.Equal(t, http.StatusConflict, res.Record.Response.Status)
}

func testListHoldsAndEventsPaginate(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	var unknown []string
	for i := range 23 {
		f.clock.Advance(time.Second)
		MustReserve(t, f.s, Charge(id, Idem(i), 100))
		if i%2 == 0 {
			MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: Idem(i), Outcome: vault.SettleUnknown})
			unknown = append([]string{vault.HoldID(id, Idem(i))}, unknown...) // newest first
		} else {
			MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: Idem(i), Outcome: vault.SettleCommit, Amount: 100})
		}
	}
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		require.Less(t, page, 10)
		holds, next, err := f.s.ListHolds(ctx, vault.HoldUnknown, 5, cursor)
		require.NoError(t, err)
		for _, h := range holds {
			assert.Equal(t, vault.HoldUnknown, h.State)
			got = append(got, h.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	assert.Equal(t, unknown, got)
	all, _, err := f.s.ListHolds(ctx, "", 500, "")
	require.NoError(t, err)
	assert.Len(t, all, 23)
	_, _, err = f.s.ListHolds(ctx, "bogus", 0, "")
	assert.ErrorIs(t, err, vault.ErrInvalid)

	// 23 reserves and 23 settles: 46 events, newest first, across pages.
	var ids []string
	cursor = ""
	for page := 0; ; page++ {
		require.Less(t, page, 10)
		events, next, err := f.s.ListEvents(ctx, id, 10, cursor)
		require.NoError(t, err)
		for _, e := range events {
			ids = append(ids, e.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	require.Len(t, ids, 46)
	for i := 1; i < len(ids); i++ {
		assert.Greater(t, ids[i-1], ids[i])
	}
	events, next, err := f.s.ListEvents(ctx, "key_other", 10, "")
	require.NoError(t, err)
	assert.Empty(t, events)
	assert.Empty(t, next)
	_, _, err = f.s.ListEvents(ctx, id, 10, encodeCursor("evt_nothex"))
	assert.ErrorIs(t, err, vault.ErrInvalid)
}

func testReap(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	MustReserve(t, f.s, Charge(id, "old", 100))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "old", Outcome: vault.SettleCommit, Amount: 100, ObjectID: "pi_old",
		Object: vault.ObjectSettle{Terminal: true}})
	MustReserve(t, f.s, Charge(id, "unknown", 200))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "unknown", Outcome: vault.SettleUnknown})

	f.clock.Advance(23 * time.Hour)
	MustReserve(t, f.s, Charge(id, "recent", 300)) // day:2026-09-15
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "recent", Outcome: vault.SettleRelease})

	n, err := f.s.Reap(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing is old enough yet")

	f.clock.Advance(2 * time.Hour) // "old" completed 25h ago
	n, err = f.s.Reap(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, map[vault.RecordState]int{vault.RecordUnknown: 1, vault.RecordCompleted: 1}, recordStates(t, f.s))
	_, ok := allHolds(t, f.s)[vault.HoldID(id, "old")]
	assert.False(t, ok, "the settled hold goes with its record")
	require.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, Charge(id, "old", 100)).Outcome, "a reaped key claims afresh")
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "old", Outcome: vault.SettleRelease})

	// Days later: day:2026-09-14 still holds the unknown 200, so it stays;
	// day:2026-09-15 is empty and old: gone. Objects stay 35 days.
	f.clock.Set(time.Date(2026, 9, 20, 0, 0, 0, 0, time.UTC))
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[vault.RecordState]int{vault.RecordUnknown: 1}, recordStates(t, f.s), "unknown records are never reaped")
	require.NoError(t, f.s.view(func(tx engine.Tx, now time.Time) error {
		_, ok14, _ := engine.GetCounter(tx, id, "day:2026-09-14")
		_, ok15, _ := engine.GetCounter(tx, id, "day:2026-09-15")
		_, okP, _ := engine.GetCounter(tx, id, "period")
		assert.True(t, ok14, "a day with something held stays")
		assert.False(t, ok15)
		assert.True(t, okP)
		return nil
	}))
	_, ok, err = f.s.ObjectExposure(ctx, id, "pi_old")
	require.NoError(t, err)
	assert.True(t, ok)

	f.clock.Set(T0.Add(vault.ObjectRetention + time.Hour))
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	_, ok, err = f.s.ObjectExposure(ctx, id, "pi_old")
	require.NoError(t, err)
	assert.False(t, ok)
}

func testReapInSmallTransactions(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID
	engine.SetReapBatch(f.s.e, 50)
	const n = 2*50 + 10
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 64 {
				req := Charge(id, Idem(i), 0)
				MustReserve(t, f.s, req)
				MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: Idem(i), Outcome: vault.SettleRelease})
			}
		}()
	}
	wg.Wait()
	f.clock.Advance(vault.DefaultIdempotencyTTL + time.Minute)
	got, txs, err := engine.ReapCountingTransactions(f.s.e, ctx)
	require.NoError(t, err)
	assert.Equal(t, n, got)
	assert.Equal(t, 3, txs, "at most 50 deletions per write transaction; the passes that find nothing write nothing")
	assert.Empty(t, recordStates(t, f.s))
	assert.Empty(t, allHolds(t, f.s))
}

func testLoweredCapIsNotAViolation(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	MustReserve(t, f.s, Charge(f.key.ID, "a", 8000))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: f.key.ID, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 8000})
	_, err := f.s.UpdateKey(ctx, "op", f.key.ID, Policy(t, "50.00", "150.00", ""), nil)
	require.NoError(t, err)
	require.NoError(t, f.s.CheckInvariant(ctx), "usage above a lowered cap was within the cap when it was placed")
	res := MustReserve(t, f.s, Charge(f.key.ID, "b", 1))
	assert.Equal(t, vault.ReserveRefused, res.Outcome, "the lowered cap is enforced from now on")
	daily, _ := usageOf(t, f.s, f.key.ID)
	assert.Equal(t, policy.Counter{Committed: 8000}, daily, "usage is never reset by a change")
}

// testEventsRecordTheTool checks that the MCP tool of a request reaches every event
// it writes — refusal, hold and settle — and survives the store's encoding, while a
// request without a tool leaves the field empty.
func testEventsRecordTheTool(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	id := f.key.ID

	req := Charge(id, "mcp-1", 4000)
	req.Tool = "create_payment_intent"
	require.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, req).Outcome)
	MustSettle(t, f.s, vault.SettleRequest{KeyID: id, IdempotencyKey: "mcp-1", Outcome: vault.SettleCommit, Amount: 4000,
		Tool: "create_payment_intent"})

	over := Charge(id, "mcp-2", 9000) // 40 + 90 passes the daily cap of 100
	over.Tool = "stripe_request"
	require.Equal(t, vault.ReserveRefused, MustReserve(t, f.s, over).Outcome)

	require.Equal(t, vault.ReserveClaimed, MustReserve(t, f.s, Charge(id, "direct", 100)).Outcome)

	events, _, err := f.s.ListEvents(ctx, id, 0, "")
	require.NoError(t, err)
	got := make([]string, len(events))
	for i, e := range events {
		got[i] = string(e.Decision) + ":" + e.Tool
	}
	assert.Equal(t, []string{"allowed:", "refused:stripe_request", "settled:create_payment_intent", "allowed:create_payment_intent"}, got)
}
