package vaulttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

var t0 = time.Date(2026, 9, 10, 12, 0, 0, 0, time.UTC)

// MustWebhook creates an endpoint taking events, with thresholds.
func MustWebhook(tb testing.TB, s vault.Store, events []string, thresholds []int) (vault.Webhook, string) {
	tb.Helper()
	w, secret, err := s.CreateWebhook(context.Background(), "tester", vault.WebhookInput{
		URL: "https://hooks.example.com/keybrake", Events: events, Thresholds: thresholds,
	})
	require.NoError(tb, err)
	return w, secret
}

// claimAll claims every due delivery (lease 1 minute).
func claimAll(tb testing.TB, s vault.Store) []vault.DeliveryJob {
	tb.Helper()
	jobs, err := s.ClaimDeliveries(context.Background(), 1000, time.Minute)
	require.NoError(tb, err)
	return jobs
}

// deliverAll claims every due delivery and records it delivered.
func deliverAll(tb testing.TB, s vault.Store) []vault.DeliveryJob {
	tb.Helper()
	jobs := claimAll(tb, s)
	for _, j := range jobs {
		require.NoError(tb, s.FinishDelivery(context.Background(), j, vault.DeliveryResult{Status: 200}))
	}
	return jobs
}

// eventsOf decodes the bodies of jobs of type typ.
func eventsOf(tb testing.TB, jobs []vault.DeliveryJob, typ string) []map[string]any {
	tb.Helper()
	var out []map[string]any
	for _, j := range jobs {
		var body struct {
			Type string         `json:"type"`
			Data map[string]any `json:"data"`
		}
		require.NoError(tb, json.Unmarshal(j.Body, &body))
		require.Equal(tb, j.EventType, body.Type)
		if body.Type == typ {
			out = append(out, body.Data)
		}
	}
	return out
}

// testWebhookLifecycle: create shows the secret once and validates; patch
// is conditional on the version; rotation signs with both secrets for 24 h;
// delete removes.
func testWebhookLifecycle(t *testing.T) {
	clock := NewClock(t0)
	s := mustOpen(t, clock)
	ctx := context.Background()
	for name, in := range map[string]vault.WebhookInput{
		"no events":     {URL: "https://a.example/", Events: nil},
		"unknown event": {URL: "https://a.example/", Events: []string{"nope"}},
		"ftp":           {URL: "ftp://a.example/", Events: []string{"*"}},
		"credentials":   {URL: "https://u:p@a.example/", Events: []string{"*"}},
		"threshold 0":   {URL: "https://a.example/", Events: []string{"*"}, Thresholds: []int{0}},
		"threshold 101": {URL: "https://a.example/", Events: []string{"*"}, Thresholds: []int{101}},
	} {
		_, _, err := s.CreateWebhook(ctx, "tester", in)
		assert.ErrorIs(t, err, vault.ErrInvalid, name)
	}
	w, secret := MustWebhook(t, s, []string{vault.EventThresholdCrossed}, nil)
	assert.Regexp(t, `^whsec_[A-Za-z0-9+/]{43}=$`, secret)
	assert.Equal(t, []int{80, 100}, w.Thresholds)
	assert.Equal(t, vault.WebhookEnabled, w.Status)
	assert.Equal(t, secret[len(secret)-4:], w.SecretLast4)

	desc := "ops channel"
	_, err := s.PatchWebhook(ctx, "tester", w.ID, vault.WebhookChange{Description: &desc, IfVersion: w.Version + 1})
	require.ErrorIs(t, err, vault.ErrPrecondition)
	w2, err := s.PatchWebhook(ctx, "tester", w.ID, vault.WebhookChange{Description: &desc, IfVersion: w.Version})
	require.NoError(t, err)
	assert.Equal(t, desc, w2.Description)
	assert.Equal(t, w.Version+1, w2.Version)
	bad := []int{200}
	_, err = s.PatchWebhook(ctx, "tester", w.ID, vault.WebhookChange{Thresholds: &bad})
	require.ErrorIs(t, err, vault.ErrInvalid)
	got, err := s.GetWebhook(ctx, w.ID)
	require.NoError(t, err)
	assert.Equal(t, w2, got, "a refused change changes nothing")

	_, err = s.TestWebhook(ctx, "tester", w.ID)
	require.NoError(t, err)
	jobs := claimAll(t, s)
	require.Len(t, jobs, 1)
	assert.Equal(t, []string{secret}, jobs[0].Secrets)
	require.NoError(t, s.FinishDelivery(ctx, jobs[0], vault.DeliveryResult{Status: 204}))

	w3, secret2, err := s.RotateWebhookSecret(ctx, "tester", w.ID)
	require.NoError(t, err)
	assert.NotEqual(t, secret, secret2)
	assert.Equal(t, t0.Add(24*time.Hour), w3.PreviousSecretUntil)
	_, err = s.TestWebhook(ctx, "tester", w.ID)
	require.NoError(t, err)
	jobs = claimAll(t, s)
	require.Len(t, jobs, 1)
	assert.Equal(t, []string{secret2, secret}, jobs[0].Secrets, "the new secret first, the old beside it")
	require.NoError(t, s.FinishDelivery(ctx, jobs[0], vault.DeliveryResult{Status: 200}))

	clock.Advance(24*time.Hour + time.Second)
	_, err = s.TestWebhook(ctx, "tester", w.ID)
	require.NoError(t, err)
	jobs = claimAll(t, s)
	require.Len(t, jobs, 1)
	assert.Equal(t, []string{secret2}, jobs[0].Secrets, "the old secret stops signing after 24 h")

	audit, _, err := s.ListAudit(ctx, 50, "")
	require.NoError(t, err)
	actions := map[string]bool{}
	for _, a := range audit {
		actions[a.Action] = true
		assert.NotContains(t, string(a.After), secret)
		assert.NotContains(t, string(a.After), secret2)
	}
	for _, a := range []string{"webhook.create", "webhook.update", "webhook.rotate_secret", "webhook.test"} {
		assert.True(t, actions[a], a)
	}
	require.NoError(t, s.DeleteWebhook(ctx, "tester", w.ID))
	_, err = s.GetWebhook(ctx, w.ID)
	require.ErrorIs(t, err, vault.ErrNotFound)
	require.NoError(t, s.FinishDelivery(ctx, jobs[0], vault.DeliveryResult{Status: 500}))
	clock.Advance(time.Hour)
	assert.Empty(t, claimAll(t, s), "a deleted endpoint's deliveries fail")
}

// testThresholdOnceUnderConcurrency: 100 concurrent holds on one key, 1.00
// each against a daily cap of 100.00: the 50% and 100% thresholds are each
// crossed by exactly one of them, and each is reported once.
func testThresholdOnceUnderConcurrency(t *testing.T) {
	clock := NewClock(t0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_x")
	key, _ := MustMint(t, s, "cust_1", Policy(t, "100.00", "", ""), nil)
	MustWebhook(t, s, []string{vault.EventThresholdCrossed}, []int{50, 100})
	other, _ := MustWebhook(t, s, []string{vault.EventThresholdCrossed}, []int{100})
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			res, err := s.Reserve(context.Background(), Charge(key.ID, Idem(i), 100))
			if assert.NoError(t, err) {
				assert.Equal(t, vault.ReserveClaimed, res.Outcome)
			}
		})
	}
	wg.Wait()
	// Past the cap: refused, and no crossing again.
	res := MustReserve(t, s, Charge(key.ID, "over", 100))
	require.Equal(t, vault.ReserveRefused, res.Outcome)
	jobs := deliverAll(t, s)
	crossings := eventsOf(t, jobs, vault.EventThresholdCrossed)
	require.Len(t, crossings, 3, "50% to one endpoint, 100% to both")
	byThreshold := map[float64]int{}
	for _, c := range crossings {
		byThreshold[c["threshold"].(float64)]++
		assert.Equal(t, map[string]any{"kind": "key", "id": key.ID, "name": "cust_1"}, c["scope"])
		assert.Equal(t, "daily", c["window"])
		assert.Equal(t, "100.00", c["cap"])
	}
	assert.Equal(t, map[float64]int{50: 1, 100: 2}, byThreshold)
	for _, c := range crossings {
		if c["threshold"].(float64) == 50 {
			assert.Equal(t, "50.00", c["held"], "the hold that reached 50% is counted")
		}
	}
	n := 0
	for _, j := range jobs {
		if j.WebhookID == other.ID {
			n++
		}
	}
	assert.Equal(t, 1, n)
	// The next day is a new window instance.
	clock.Advance(24 * time.Hour)
	for i := range 50 {
		MustReserve(t, s, Charge(key.ID, fmt.Sprintf("d2-%d", i), 100))
	}
	assert.Len(t, eventsOf(t, deliverAll(t, s), vault.EventThresholdCrossed), 1)
}

// testSpendCapRefusedOnce: refusals by one window instance are reported once.
func testSpendCapRefusedOnce(t *testing.T) {
	clock := NewClock(t0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_x")
	key, _ := MustMint(t, s, "cust_2", Policy(t, "10.00", "", ""), nil)
	MustWebhook(t, s, []string{vault.EventSpendCapRefused}, nil)
	for i := range 3 {
		require.Equal(t, vault.ReserveRefused, MustReserve(t, s, Charge(key.ID, Idem(i), 2000)).Outcome)
	}
	refusals := eventsOf(t, deliverAll(t, s), vault.EventSpendCapRefused)
	require.Len(t, refusals, 1)
	assert.Equal(t, "20.00", refusals[0]["requested"])
	assert.Equal(t, "10.00", refusals[0]["remaining"])
	clock.Advance(24 * time.Hour)
	MustReserve(t, s, Charge(key.ID, "next-day", 2000))
	assert.Len(t, eventsOf(t, claimAll(t, s), vault.EventSpendCapRefused), 1, "a new day, a new window")
}

// testEmitEventInItsTransaction: an event is durable with the transaction
// that emits it, and gone with one that rolls back.
func testEmitEventInItsTransaction(t *testing.T) {
	clock := NewClock(t0)
	s := mustOpen(t, clock)
	MustWebhook(t, s, []string{vault.EventApprovalPending}, nil)
	MustWebhook(t, s, []string{vault.EventHoldUnknown}, nil)
	boom := errors.New("boom")
	err := s.update(func(tx engine.Tx, now time.Time) error {
		if _, err := engine.EmitEvent(tx, now, vault.EventApprovalPending, map[string]string{"approval_id": "apr_1"}); err != nil {
			return err
		}
		return boom
	})
	require.ErrorContains(t, err, "boom")
	assert.Empty(t, claimAll(t, s), "rolled back with its transaction")
	var id string
	require.NoError(t, s.update(func(tx engine.Tx, now time.Time) error {
		var err error
		id, err = engine.EmitEvent(tx, now, vault.EventApprovalPending, map[string]string{"approval_id": "apr_2"})
		return err
	}))
	for range 2 {
		require.NoError(t, s.update(func(tx engine.Tx, now time.Time) error {
			_, err := engine.EmitOnce(tx, now, "approval-once", now.Add(time.Hour), vault.EventApprovalPending, map[string]string{"approval_id": "apr_3"})
			return err
		}))
	}
	jobs := claimAll(t, s)
	require.Len(t, jobs, 2, "one endpoint takes approval.pending; EmitOnce emits once")
	assert.Equal(t, id, jobs[0].EventID)
	assert.JSONEq(t, `{"approval_id":"apr_2"}`, string(mustField(t, jobs[0].Body, "data")))
}

func mustField(tb testing.TB, body []byte, field string) json.RawMessage {
	tb.Helper()
	var m map[string]json.RawMessage
	require.NoError(tb, json.Unmarshal(body, &m))
	return m[field]
}

// testDeliveryLeaseAndSchedule: a claimed delivery is not claimed again
// before its lease ends; a stale attempt changes nothing; failures follow
// the schedule; 410 disables the endpoint; a failed delivery is retried on
// request, once.
func testDeliveryLeaseAndSchedule(t *testing.T) {
	clock := NewClock(t0)
	s := mustOpen(t, clock)
	ctx := context.Background()
	w, _ := MustWebhook(t, s, []string{"*"}, nil)
	_, err := s.TestWebhook(ctx, "tester", w.ID)
	require.NoError(t, err)
	first := claimAll(t, s)
	require.Len(t, first, 1)
	assert.Equal(t, 1, first[0].Attempt)
	assert.Empty(t, claimAll(t, s), "leased")
	clock.Advance(time.Minute + time.Second)
	second := claimAll(t, s)
	require.Len(t, second, 1, "the lease lapsed: a crashed deliverer's row is taken over")
	assert.Equal(t, 2, second[0].Attempt)
	assert.Equal(t, first[0].EventID, second[0].EventID, "the same event id on every attempt")
	require.NoError(t, s.FinishDelivery(ctx, first[0], vault.DeliveryResult{Status: 200}))
	ds, _, err := s.ListDeliveries(ctx, w.ID, 10, "")
	require.NoError(t, err)
	require.Len(t, ds, 1)
	assert.Equal(t, vault.DeliveryPending, ds[0].State, "an attempt that lost its lease records nothing")

	// Failures (a redirect among them) follow the schedule, then the
	// delivery fails.
	job := second[0]
	for {
		require.NoError(t, s.FinishDelivery(ctx, job, vault.DeliveryResult{Status: 302, Err: "redirect"}))
		if job.Attempt > len(engine.RetrySchedule) {
			break
		}
		wait := engine.RetrySchedule[job.Attempt-1]
		next, err := s.NextDeliveryAt(ctx)
		require.NoError(t, err)
		assert.InDelta(t, float64(wait), float64(next.Sub(clock.Now())), float64(wait)/10+1, "after attempt %d", job.Attempt)
		clock.Set(next)
		jobs := claimAll(t, s)
		require.Len(t, jobs, 1, "attempt %d", job.Attempt+1)
		job = jobs[0]
	}
	ds, _, err = s.ListDeliveries(ctx, w.ID, 10, "")
	require.NoError(t, err)
	require.Len(t, ds, 1)
	assert.Equal(t, len(engine.RetrySchedule)+1, ds[0].Attempts)
	assert.Equal(t, vault.DeliveryFailed, ds[0].State, "after the last attempt")
	assert.Equal(t, 302, ds[0].LastStatus)
	nextAt, err := s.NextDeliveryAt(ctx)
	require.NoError(t, err)
	assert.True(t, nextAt.IsZero(), "nothing is due")

	_, err = s.RetryDelivery(ctx, "tester", w.ID, "dlv_nope")
	require.ErrorIs(t, err, vault.ErrNotFound)
	_, err = s.RetryDelivery(ctx, "tester", w.ID, ds[0].ID)
	require.NoError(t, err)
	_, err = s.RetryDelivery(ctx, "tester", w.ID, ds[0].ID)
	require.ErrorIs(t, err, vault.ErrConflict, "already pending")
	jobs := claimAll(t, s)
	require.Len(t, jobs, 1)
	require.NoError(t, s.FinishDelivery(ctx, jobs[0], vault.DeliveryResult{Status: 503}))
	ds, _, _ = s.ListDeliveries(ctx, w.ID, 10, "")
	assert.Equal(t, vault.DeliveryFailed, ds[0].State, "a retry on request is one attempt")

	// 410 disables the endpoint.
	_, err = s.TestWebhook(ctx, "tester", w.ID)
	require.NoError(t, err)
	jobs = claimAll(t, s)
	require.Len(t, jobs, 1)
	require.NoError(t, s.FinishDelivery(ctx, jobs[0], vault.DeliveryResult{Status: 410}))
	got, err := s.GetWebhook(ctx, w.ID)
	require.NoError(t, err)
	assert.Equal(t, vault.WebhookDisabled, got.Status)
	assert.Contains(t, got.DisabledReason, "410")
	_, err = s.TestWebhook(ctx, "tester", w.ID)
	require.ErrorIs(t, err, vault.ErrConflict)

	// Newest first, paged.
	enabled := vault.WebhookEnabled
	_, err = s.PatchWebhook(ctx, "tester", w.ID, vault.WebhookChange{Status: &enabled})
	require.NoError(t, err)
	for range 3 {
		_, err = s.TestWebhook(ctx, "tester", w.ID)
		require.NoError(t, err)
	}
	page1, next, err := s.ListDeliveries(ctx, w.ID, 2, "")
	require.NoError(t, err)
	require.Len(t, page1, 2)
	require.NotEmpty(t, next)
	page2, _, err := s.ListDeliveries(ctx, w.ID, 10, next)
	require.NoError(t, err)
	require.Len(t, page2, 3)
	assert.Greater(t, page1[0].ID, page1[1].ID)
	assert.Greater(t, page1[1].ID, page2[0].ID)
}

// testKeyExpiringAndPrune: key.expiring 7 days and 1 day before, once each;
// done deliveries go after the ledger retention.
func testKeyExpiringAndPrune(t *testing.T) {
	clock := NewClock(time.Date(2026, 9, 23, 0, 0, 0, 0, time.UTC))
	s := mustOpen(t, clock, func(o *Options) { o.LedgerRetention = 10 * 24 * time.Hour })
	ctx := context.Background()
	MustUpstream(t, s, "sk_test_x")
	key, _ := MustMint(t, s, "cust_3", Policy(t, "10.00", "", ""), nil) // expires 2026-10-01
	w, _ := MustWebhook(t, s, []string{vault.EventKeyExpiring}, nil)
	for range 2 {
		n, err := s.NoticeExpiringKeys(ctx)
		require.NoError(t, err)
		assert.Equal(t, 0, n, "8 days before")
	}
	clock.Advance(24*time.Hour + time.Second)
	for want := range []int{1, 0} {
		n, err := s.NoticeExpiringKeys(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1-want, n)
	}
	clock.Set(time.Date(2026, 9, 30, 1, 0, 0, 0, time.UTC))
	n, err := s.NoticeExpiringKeys(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	jobs := claimAll(t, s)
	exp := eventsOf(t, jobs, vault.EventKeyExpiring)
	require.Len(t, exp, 2)
	assert.Equal(t, "7d", exp[0]["within"])
	assert.Equal(t, "1d", exp[1]["within"])
	assert.Equal(t, key.ID, exp[0]["key"].(map[string]any)["id"])
	for _, j := range jobs {
		require.NoError(t, s.FinishDelivery(ctx, j, vault.DeliveryResult{Status: 200}))
	}
	clock.Advance(9 * 24 * time.Hour)
	_, err = s.PruneDeliveries(ctx)
	require.NoError(t, err)
	ds, _, err := s.ListDeliveries(ctx, w.ID, 10, "")
	require.NoError(t, err)
	assert.Len(t, ds, 2, "kept within the retention")
	clock.Advance(2 * 24 * time.Hour)
	removed, err := s.PruneDeliveries(ctx)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, removed, 2)
	ds, _, err = s.ListDeliveries(ctx, w.ID, 10, "")
	require.NoError(t, err)
	assert.Empty(t, ds)
}

// testUpstreamAuthFailedHourly: upstream.auth_failed at most once per
// upstream and hour.
func testUpstreamAuthFailedHourly(t *testing.T) {
	clock := NewClock(t0)
	s := mustOpen(t, clock)
	ctx := context.Background()
	MustWebhook(t, s, []string{vault.EventUpstreamAuthFailed}, nil)
	for range 3 {
		require.NoError(t, s.NoticeUpstreamAuthFailed(ctx, "default", 401, "key_1", "charges.create"))
	}
	require.NoError(t, s.NoticeUpstreamAuthFailed(ctx, "other", 403, "key_2", "refunds.create"))
	got := eventsOf(t, deliverAll(t, s), vault.EventUpstreamAuthFailed)
	require.Len(t, got, 2)
	assert.Equal(t, "default", got[0]["upstream"])
	assert.Equal(t, float64(401), got[0]["status"])
	clock.Advance(time.Hour)
	require.NoError(t, s.NoticeUpstreamAuthFailed(ctx, "default", 401, "key_1", "charges.create"))
	assert.Len(t, eventsOf(t, deliverAll(t, s), vault.EventUpstreamAuthFailed), 1, "the next hour")
}

// testHoldUnknownEvent: a settle that leaves the outcome unknown emits
// hold.unknown, once per hold.
func testHoldUnknownEvent(t *testing.T) {
	clock := NewClock(t0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_x")
	key, _ := MustMint(t, s, "cust_4", Policy(t, "100.00", "", ""), nil)
	MustWebhook(t, s, []string{vault.EventHoldUnknown}, nil)
	res := MustReserve(t, s, Charge(key.ID, "u1", 1234))
	MustSettle(t, s, vault.SettleRequest{KeyID: key.ID, IdempotencyKey: "u1", Outcome: vault.SettleUnknown})
	got := eventsOf(t, deliverAll(t, s), vault.EventHoldUnknown)
	require.Len(t, got, 1)
	assert.Equal(t, res.Hold.ID, got[0]["hold_id"])
	assert.Equal(t, "12.34", got[0]["amount"])
	assert.Equal(t, "cust_4", got[0]["key"].(map[string]any)["name"])
	// Resumed and unknown again: the same hold, no second event.
	require.Equal(t, vault.ReserveResume, MustReserve(t, s, Charge(key.ID, "u1", 1234)).Outcome)
	MustSettle(t, s, vault.SettleRequest{KeyID: key.ID, IdempotencyKey: "u1", Outcome: vault.SettleUnknown})
	assert.Empty(t, eventsOf(t, deliverAll(t, s), vault.EventHoldUnknown))
}

// testBudgetEvents: a budget shared by two keys crosses its threshold once,
// named as the budget; a refusal by the budget's cap names the budget; a
// velocity refusal is reported once per scope and minute.
func testBudgetEvents(t *testing.T) {
	clock := NewClock(t0)
	s := mustOpen(t, clock)
	MustUpstream(t, s, "sk_test_x")
	b := MustBudget(t, s, "team", "", "10.00", "")
	k1, _ := MustMint(t, s, "k1", underBudget(t, b.ID), nil)
	k2, _ := MustMint(t, s, "k2", underBudget(t, b.ID), nil)
	MustWebhook(t, s, []string{vault.EventThresholdCrossed, vault.EventSpendCapRefused, vault.EventVelocityRefused}, []int{50})
	for i := range 4 {
		MustReserve(t, s, Charge(k1.ID, Idem(i), 100))
		MustReserve(t, s, Charge(k2.ID, Idem(i), 100))
	}
	require.Equal(t, vault.ReserveRefused, MustReserve(t, s, Charge(k2.ID, "over", 500)).Outcome)
	jobs := deliverAll(t, s)
	crossings := eventsOf(t, jobs, vault.EventThresholdCrossed)
	require.Len(t, crossings, 1, "the budget's 50%, once, whichever key's hold reached it")
	assert.Equal(t, map[string]any{"kind": "budget", "id": b.ID, "name": "team"}, crossings[0]["scope"])
	assert.Equal(t, "5.00", crossings[0]["held"])
	refusals := eventsOf(t, jobs, vault.EventSpendCapRefused)
	require.Len(t, refusals, 1)
	assert.Equal(t, "budget", refusals[0]["scope"].(map[string]any)["kind"])

	p := Policy(t, "1000.00", "", "")
	p.Velocity = []policy.Velocity{{Count: 2, Per: "1m"}}
	fast, _ := MustMint(t, s, "fast", p, nil)
	for i := range 5 {
		MustReserve(t, s, Charge(fast.ID, fmt.Sprintf("v%d", i), 100))
	}
	v := eventsOf(t, deliverAll(t, s), vault.EventVelocityRefused)
	require.Len(t, v, 1, "three refusals in one minute, one event")
	assert.Equal(t, float64(2), v[0]["count"])
	assert.Equal(t, fast.ID, v[0]["scope"].(map[string]any)["id"])
}
