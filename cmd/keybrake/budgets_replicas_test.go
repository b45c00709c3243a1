package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// TestThreeReplicasShareOneBudget: three keybrake processes on one
// PostgreSQL database meter one budget exactly. 100 concurrent $1 charges
// through the three replicas, across four keys of $100 each under one $20
// budget: exactly 20 reach Stripe, and every refusal names the budget.
func TestThreeReplicasShareOneBudget(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs three real replicas")
	}
	ctx := context.Background()
	dbURL := migrated.URL(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_replica_budget")
	store, masterText := MustPostgresVault(t, dbURL, fake.Secret)
	b := mustCreateBudget(t, store, "fleet", "", 20)
	var keyIDs, tokens []string
	for i := range 4 {
		k, tok := MustMintKeyUnder(t, store, fmt.Sprintf("agent-%d", i), 100, b.ID)
		keyIDs, tokens = append(keyIDs, k.ID), append(tokens, tok)
	}
	rs := MustReplicas(t, 3, dbURL, fake.URL, masterText, "--upstream-timeout", "10s")
	client := &http.Client{Timeout: 30 * time.Second}

	// Charge i through replica i%3 with key i%4: every replica serves every key.
	type answer struct {
		status int
		scope  map[string]any
		code   string
	}
	answers := make([]answer, 100)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			<-start
			ck := fmt.Sprintf("budget-%d", i)
			status, body, err := postForm(ctx, client, rs.proxyURL(i%3)+"/v1/charges", tokens[i%4], ck, chargeForm(100, ck))
			if !assert.NoError(t, err) {
				return
			}
			a := answer{status: status}
			if status != http.StatusOK {
				var e struct {
					Error struct {
						Code     string `json:"code"`
						Keybrake struct {
							Scope map[string]any `json:"scope"`
						} `json:"keybrake"`
					} `json:"error"`
				}
				assert.NoError(t, json.Unmarshal(body, &e), "%s", body)
				a.code, a.scope = e.Error.Code, e.Error.Keybrake.Scope
			}
			answers[i] = a
		})
	}
	close(start)
	wg.Wait()
	count := map[int]int{}
	for i, a := range answers {
		count[a.status]++
		if a.status == http.StatusPaymentRequired {
			assert.Equal(t, "spend_cap_exceeded", a.code, "charge %d", i)
			assert.Equal(t, map[string]any{"kind": "budget", "id": b.ID, "name": "fleet"}, a.scope, "charge %d: the refusal names the budget", i)
		}
	}
	assert.Equal(t, map[int]int{http.StatusOK: 20, http.StatusPaymentRequired: 80}, count)
	assert.Len(t, fake.Charges(), 20, "exactly 20 charges reached Stripe")
	assert.Equal(t, int64(2000), fake.TotalMoved("usd"))

	rs.stopAll()
	fake.WaitIdle(t)
	assertChainMetered(t, store, keyIDs, []string{b.ID}, 2000)
}
