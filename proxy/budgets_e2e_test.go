package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// postAll sends n charges of amount cents at once, the i-th through
// tokens[i%len(tokens)] under its own idempotency key, and returns the replies.
func (e *env) postAll(t *testing.T, tokens []string, n int, amount string) []reply {
	t.Helper()
	out := make([]reply, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = e.Post(t, "/v1/charges", tokens[i%len(tokens)], fmt.Sprintf("c-%03d", i),
				form("amount", amount, "currency", "usd", "source", "tok_visa"))
		})
	}
	close(start)
	wg.Wait()
	return out
}

// charges counts the charges that reached the fake Stripe.
func (e *env) charges() int {
	return e.Fake.CountWhere(func(r Request) bool { return r.Method == http.MethodPost && r.Path == "/v1/charges" })
}

// TestBudgetSharedByFourKeys: 100 concurrent 1.00 charges through four keys
// under one 20.00 budget: exactly 20 reach Stripe, and every refusal is a 402
// spend_cap_exceeded that names the budget.
func TestBudgetSharedByFourKeys(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	cap := decimal.RequireFromString("20.00")
	b, err := e.Store.CreateBudget(context.Background(), "test", vault.BudgetSpec{
		Name: "fleet", Currency: "usd", DailyCap: &cap, PeriodStart: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	var tokens []string
	for range 4 {
		tok, _ := e.MustKey(t, Policy("1000.00", func(p *policy.Policy) { p.Budget = b.ID }))
		tokens = append(tokens, tok)
	}
	ok := 0
	for _, r := range e.postAll(t, tokens, 100, "100") {
		if r.Status == http.StatusOK {
			ok++
			continue
		}
		AssertRefusal(t, r, http.StatusPaymentRequired, "spend_cap_exceeded")
		assert.Equal(t, "false", r.Header.Get("Stripe-Should-Retry"))
		assert.Equal(t, map[string]any{"kind": "budget", "id": b.ID, "name": "fleet"}, r.Keybrake()["scope"], "body %s", r.Raw)
		assert.Equal(t, "20.00", r.Keybrake()["limit"])
		assert.Contains(t, r.ErrMessage(), `budget "fleet"`)
	}
	assert.Equal(t, 20, ok)
	assert.Equal(t, 20, e.charges())

	// The real SDK sees Stripe's error shape.
	_, err = e.Client(tokens[0], 0).V1Charges.Create(context.Background(), chargeParams(100, "usd", "sdk"))
	se := StripeErr(t, err)
	assert.Equal(t, http.StatusPaymentRequired, se.HTTPStatusCode)
	assert.Equal(t, "spend_cap_exceeded", string(se.Code))
}

// TestVelocityLimitThroughTheProxy: a count limit of 20 a minute lets
// exactly 20 of 60 concurrent money requests through; the rest are 429
// velocity_exceeded with Retry-After, Stripe-Should-Retry: false and the
// limit named.
func TestVelocityLimitThroughTheProxy(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	tok, key := e.MustKey(t, Policy("1000.00", func(p *policy.Policy) {
		p.Velocity = []policy.Velocity{{Count: 20, Per: "1m"}}
	}))
	ok := 0
	for _, r := range e.postAll(t, []string{tok}, 60, "100") {
		if r.Status == http.StatusOK {
			ok++
			continue
		}
		AssertRefusal(t, r, http.StatusTooManyRequests, "velocity_exceeded")
		assert.Equal(t, "rate_limit_error", r.ErrType())
		assert.Equal(t, "false", r.Header.Get("Stripe-Should-Retry"))
		secs, err := strconv.Atoi(r.Header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After %q", r.Header.Get("Retry-After"))
		assert.True(t, secs >= 1 && secs <= 60, "Retry-After %d", secs)
		kb := r.Keybrake()
		assert.Equal(t, map[string]any{"kind": "key", "id": key.ID, "name": key.Name}, kb["scope"])
		assert.EqualValues(t, 20, kb["count"])
		assert.Equal(t, "1m", kb["per"])
		at, err := time.Parse(time.RFC3339Nano, kb["retry_at"].(string))
		require.NoError(t, err)
		assert.WithinDuration(t, time.Now().Add(time.Minute), at, time.Minute)
	}
	assert.Equal(t, 20, ok)
	assert.Equal(t, 20, e.charges())

	// A read moves no money and is not limited.
	r := e.MustSend(t, http.MethodGet, "/v1/charges/ch_1", tok, nil, "")
	assert.NotEqual(t, http.StatusTooManyRequests, r.Status)
}

// TestRemainingHeadersAcrossTheChain: Keybrake-Remaining-Daily and -Period
// show the tightest of the key's window and every budget's of its chain, per
// kind: the answer to a charge, its replay, and a read.
func TestRemainingHeadersAcrossTheChain(t *testing.T) {
	t.Parallel()
	e := MustEnv(t)
	ctx := context.Background()
	orgPeriod, teamDaily := decimal.RequireFromString("500.00"), decimal.RequireFromString("20.00")
	start := time.Now().Add(-time.Hour)
	org, err := e.Store.CreateBudget(ctx, "test", vault.BudgetSpec{Name: "org", Currency: "usd", PeriodCap: &orgPeriod, PeriodStart: start})
	require.NoError(t, err)
	team, err := e.Store.CreateBudget(ctx, "test", vault.BudgetSpec{Name: "team", Parent: org.ID, Currency: "usd", DailyCap: &teamDaily, PeriodStart: start})
	require.NoError(t, err)
	// The key's own daily cap is looser than the team's; its period cap is
	// tighter than the organisation's.
	tok, _ := e.MustKey(t, Policy("100.00", func(p *policy.Policy) {
		pc := decimal.RequireFromString("150.00")
		p.PeriodCap, p.Budget = &pc, team.ID
	}))
	other, _ := e.MustKey(t, Policy("100.00", func(p *policy.Policy) { p.Budget = team.ID }))

	r := e.Post(t, "/v1/charges", tok, "a", form("amount", "600", "currency", "usd", "source", "tok_visa"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "14.00", r.Header.Get("Keybrake-Remaining-Daily"), "the team's 20.00 less 6.00, not the key's 94.00")
	assert.Equal(t, "144.00", r.Header.Get("Keybrake-Remaining-Period"), "the key's 150.00 less 6.00, not the organisation's 494.00")

	// Another key of the team spends; the first key's replay and a read see it.
	r = e.Post(t, "/v1/charges", other, "b", form("amount", "1000", "currency", "usd", "source", "tok_visa"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "4.00", r.Header.Get("Keybrake-Remaining-Daily"))
	assert.Equal(t, "484.00", r.Header.Get("Keybrake-Remaining-Period"), "the other key has no period cap: the organisation's")
	r = e.Post(t, "/v1/charges", tok, "a", form("amount", "600", "currency", "usd", "source", "tok_visa"))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, "4.00", r.Header.Get("Keybrake-Remaining-Daily"))
	r = e.MustSend(t, http.MethodGet, "/v1/charges", tok, nil, "")
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Raw)
	assert.Equal(t, "4.00", r.Header.Get("Keybrake-Remaining-Daily"))
	assert.Equal(t, "144.00", r.Header.Get("Keybrake-Remaining-Period"))
}
