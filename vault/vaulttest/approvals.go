package vaulttest

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// approvalFixture is a store with a key whose policy asks for approval above
// 200.00 (daily cap 500.00, timeout 10m), at T0.
type approvalFixture struct{ *meteringFixture }

func newApprovalFixture(t *testing.T) *approvalFixture {
	t.Helper()
	p := Policy(t, "500.00", "", "")
	p.Approval = &policy.Approval{Above: MustDec(t, "200.00"), Timeout: 10 * time.Minute}
	return &approvalFixture{newFixtureWith(t, "approvals", p)}
}

// ask reserves a charge that needs approval and requires a pending one.
func (f *approvalFixture) ask(t *testing.T, idem string, amount int64) vault.Approval {
	t.Helper()
	req := Charge(f.key.ID, idem, amount)
	req.Ask = &vault.ApprovalAsk{Reason: "refund for order 42", Params: []vault.Param{{Name: "amount", Value: "30000"}}}
	res := MustReserve(t, f.s, req)
	require.Equal(t, vault.ReserveApproval, res.Outcome)
	require.NotNil(t, res.Approval)
	require.Equal(t, vault.ApprovalPending, res.Approval.State)
	require.Equal(t, vault.RecordAwaitingApproval, res.Record.State)
	return *res.Approval
}

// testApprovalHoldsThenForwardsOnce: a request above the threshold is held
// (it counts against the cap) and not forwarded; a retry while pending is told
// again; approved, the next retry of the same request is forwarded once
// (resumed under its upstream key) and settles as any request.
func testApprovalHoldsThenForwardsOnce(t *testing.T) {
	f := newApprovalFixture(t)
	ctx := context.Background()
	small := MustReserve(t, f.s, Charge(f.key.ID, "small", 20000))
	require.Equal(t, vault.ReserveClaimed, small.Outcome, "at the threshold: no approval")
	MustSettle(t, f.s, vault.SettleRequest{KeyID: f.key.ID, IdempotencyKey: "small", Outcome: vault.SettleCommit, Amount: 20000})

	a := f.ask(t, "big", 25000)
	assert.Equal(t, "refund for order 42", a.Reason)
	assert.Equal(t, "approvals", a.KeyName)
	assert.Equal(t, T0.Add(10*time.Minute), a.ExpiresAt)
	daily, _ := usageOf(t, f.s, f.key.ID)
	assert.Equal(t, policy.Counter{Committed: 20000, Held: 25000}, daily, "a pending approval holds its amount")

	refused := MustReserve(t, f.s, Charge(f.key.ID, "over", 10000))
	assert.Equal(t, vault.ReserveRefused, refused.Outcome, "the held amount counts against the cap: 200+250+100 > 500")

	again := MustReserve(t, f.s, Charge(f.key.ID, "big", 25000))
	require.Equal(t, vault.ReserveApproval, again.Outcome)
	assert.Equal(t, a.ID, again.Approval.ID)
	assert.Equal(t, vault.ApprovalPending, again.Approval.State)

	other := Charge(f.key.ID, "big", 25000)
	other.Fingerprint = "another request"
	assert.Equal(t, vault.ReserveMismatch, MustReserve(t, f.s, other).Outcome)

	pending, _, err := f.s.ListApprovals(ctx, vault.ApprovalFilter{State: vault.ApprovalPending})
	require.NoError(t, err)
	require.Len(t, pending, 1)
	assert.Equal(t, a.ID, pending[0].ID)

	f.clock.Advance(time.Minute)
	got, err := f.s.DecideApproval(ctx, "alice", a.ID, true, "ok, known customer")
	require.NoError(t, err)
	assert.Equal(t, vault.ApprovalApproved, got.State)
	assert.Equal(t, "alice", got.DecidedBy)
	assert.Equal(t, f.clock.Now().Add(10*time.Minute), got.ExpiresAt, "approved, it waits for the retry for the timeout")

	_, err = f.s.DecideApproval(ctx, "bob", a.ID, false, "")
	require.ErrorIs(t, err, vault.ErrConflict, "decided once")

	fwd := MustReserve(t, f.s, Charge(f.key.ID, "big", 25000))
	require.Equal(t, vault.ReserveResume, fwd.Outcome)
	assert.Equal(t, vault.ApprovalUsed, fwd.Approval.State)
	assert.Equal(t, vault.UpstreamKey(f.key.ID, "big"), fwd.Record.UpstreamKey)
	assert.Equal(t, vault.ReserveInFlight, MustReserve(t, f.s, Charge(f.key.ID, "big", 25000)).Outcome, "forwarded once")
	MustSettle(t, f.s, vault.SettleRequest{KeyID: f.key.ID, IdempotencyKey: "big", Outcome: vault.SettleCommit, Amount: 25000,
		Response: &vault.StoredResponse{Status: 200, Body: []byte(`{"id":"ch_1"}`)}})
	replay := MustReserve(t, f.s, Charge(f.key.ID, "big", 25000))
	require.Equal(t, vault.ReserveReplay, replay.Outcome)
	assert.Equal(t, `{"id":"ch_1"}`, string(replay.Record.Response.Body))
	daily, _ = usageOf(t, f.s, f.key.ID)
	assert.Equal(t, policy.Counter{Committed: 45000}, daily)

	used, err := f.s.GetApproval(ctx, a.ID)
	require.NoError(t, err)
	assert.Equal(t, vault.ApprovalUsed, used.State)
	audit, _, err := f.s.ListAudit(ctx, 10, "")
	require.NoError(t, err)
	assert.Equal(t, "approval.approve", audit[0].Action)
	assert.Equal(t, "alice", audit[0].Actor)
	assert.Contains(t, string(audit[0].After), "ok, known customer")
}

// testApprovalDeclinedReleasesAndIsReplayed: declined, the hold is released
// and every retry is told so from the stored record.
func testApprovalDeclinedReleasesAndIsReplayed(t *testing.T) {
	f := newApprovalFixture(t)
	ctx := context.Background()
	a := f.ask(t, "big", 30000)
	got, err := f.s.DecideApproval(ctx, "alice", a.ID, false, "not this month")
	require.NoError(t, err)
	assert.Equal(t, vault.ApprovalDeclined, got.State)
	daily, _ := usageOf(t, f.s, f.key.ID)
	assert.Equal(t, policy.Counter{}, daily, "the hold is released")
	for range 2 {
		res := MustReserve(t, f.s, Charge(f.key.ID, "big", 30000))
		require.Equal(t, vault.ReserveReplay, res.Outcome)
		require.NotNil(t, res.Approval)
		assert.Equal(t, vault.ApprovalDeclined, res.Approval.State)
		assert.Nil(t, res.Record.Response)
	}
	assert.Equal(t, map[vault.RecordState]int{vault.RecordCompleted: 1}, recordStates(t, f.s))
	_, err = f.s.DecideApproval(ctx, "bob", a.ID, true, "")
	require.ErrorIs(t, err, vault.ErrConflict)
}

// testApprovalExpiresByTheStoreClock: undecided within the timeout, or
// approved and not retried within it, the approval expires (on the store's
// clock: by the reaper, or by the retry that comes first), its hold released.
func testApprovalExpiresByTheStoreClock(t *testing.T) {
	f := newApprovalFixture(t)
	ctx := context.Background()
	pending := f.ask(t, "pending", 25000)
	approved := f.ask(t, "approved", 21000)
	_, err := f.s.DecideApproval(ctx, "alice", approved.ID, true, "")
	require.NoError(t, err)

	f.clock.Advance(10*time.Minute - time.Nanosecond)
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	daily, _ := usageOf(t, f.s, f.key.ID)
	assert.Equal(t, int64(46000), daily.Held, "not yet")

	f.clock.Advance(time.Nanosecond)
	list, _, err := f.s.ListApprovals(ctx, vault.ApprovalFilter{State: vault.ApprovalExpired})
	require.NoError(t, err)
	assert.Len(t, list, 2, "a reader sees them expired at once")
	_, err = f.s.DecideApproval(ctx, "alice", pending.ID, true, "")
	require.ErrorIs(t, err, vault.ErrConflict, "too late to approve")

	res := MustReserve(t, f.s, Charge(f.key.ID, "approved", 21000))
	require.Equal(t, vault.ReserveApproval, res.Outcome, "the retry came after the timeout")
	assert.Equal(t, vault.ApprovalExpired, res.Approval.State)
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)
	daily, _ = usageOf(t, f.s, f.key.ID)
	assert.Equal(t, policy.Counter{}, daily, "both holds released")
	for _, idem := range []string{"pending", "approved"} {
		res := MustReserve(t, f.s, Charge(f.key.ID, idem, map[string]int64{"pending": 25000, "approved": 21000}[idem]))
		require.Equal(t, vault.ReserveReplay, res.Outcome, idem)
		assert.Equal(t, vault.ApprovalExpired, res.Approval.State, idem)
	}
}

// testApprovalTwoAdminsAtOnce: an approve and a decline at once: exactly one
// wins, the other gets ErrConflict with the state it lost to.
func testApprovalTwoAdminsAtOnce(t *testing.T) {
	f := newApprovalFixture(t)
	ctx := context.Background()
	for round := range 8 {
		a := f.ask(t, Idem(round), 25000)
		var (
			wg      sync.WaitGroup
			results [2]vault.Approval
			errs    [2]error
		)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = f.s.DecideApproval(ctx, []string{"alice", "bob"}[i], a.ID, i == 0, "")
			}()
		}
		wg.Wait()
		won := 0
		for i := range 2 {
			if errs[i] == nil {
				won++
				continue
			}
			require.ErrorIs(t, errs[i], vault.ErrConflict)
			assert.Contains(t, []vault.ApprovalState{vault.ApprovalApproved, vault.ApprovalDeclined}, results[i].State, "the loser is told the state")
		}
		require.Equal(t, 1, won, "round %d", round)
		final, err := f.s.GetApproval(ctx, a.ID)
		require.NoError(t, err)
		if final.State == vault.ApprovalApproved {
			_, err := f.s.DecideApproval(ctx, "carol", a.ID, false, "")
			require.True(t, errors.Is(err, vault.ErrConflict))
			require.Equal(t, vault.ReserveResume, MustReserve(t, f.s, Charge(f.key.ID, Idem(round), 25000)).Outcome)
			MustSettle(t, f.s, vault.SettleRequest{KeyID: f.key.ID, IdempotencyKey: Idem(round), Outcome: vault.SettleRelease})
		}
	}
	_, err := f.s.DecideApproval(ctx, "alice", "apr_nope", true, "")
	require.ErrorIs(t, err, vault.ErrNotFound)
}

// testApprovalEventsInTheirTransactions: approval.pending is written with the
// hold that waits, approval.decided with the decision (approved, declined,
// expired by the reaper, pending or approved), each in the outbox of the transaction that made it.
func testApprovalEventsInTheirTransactions(t *testing.T) {
	f := newApprovalFixture(t)
	ctx := context.Background()
	MustWebhook(t, f.s, []string{vault.EventApprovalPending, vault.EventApprovalDecided}, nil)
	approved := f.ask(t, "a", 21000)
	declined := f.ask(t, "b", 21000)
	_, err := f.s.DecideApproval(ctx, "alice", approved.ID, true, "fine")
	require.NoError(t, err)
	_, err = f.s.DecideApproval(ctx, "alice", declined.ID, false, "no")
	require.NoError(t, err)
	expired := f.ask(t, "c", 21000)
	f.clock.Advance(11 * time.Minute)
	_, err = f.s.Reap(ctx)
	require.NoError(t, err)

	type ev struct{ typ, id, state string }
	var got []ev
	for _, j := range claimAll(t, f.s) {
		var body struct {
			Type string `json:"type"`
			Data struct {
				ID        string `json:"id"`
				State     string `json:"state"`
				Amount    string `json:"amount"`
				DecidedBy string `json:"decided_by"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal(j.Body, &body))
		assert.Equal(t, "210.00", body.Data.Amount)
		got = append(got, ev{body.Type, body.Data.ID, body.Data.State})
	}
	assert.ElementsMatch(t, []ev{
		{vault.EventApprovalPending, approved.ID, "pending"},
		{vault.EventApprovalPending, declined.ID, "pending"},
		{vault.EventApprovalPending, expired.ID, "pending"},
		{vault.EventApprovalDecided, approved.ID, "approved"},
		{vault.EventApprovalDecided, declined.ID, "declined"},
		{vault.EventApprovalDecided, expired.ID, "expired"},
		{vault.EventApprovalDecided, approved.ID, "expired"}, // approved, and not retried within the timeout
	}, got)
}
