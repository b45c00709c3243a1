package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// The real binary: PaymentIntents created through keybrake hold their amounts;
// one is cancelled and one confirmed at Stripe directly, where keybrake sees
// neither; an operator lists the key's exposures and refreshes both: the
// cancelled one is released, the confirmed one committed — the key's usage,
// its ledger and the audit log say so, and the store's invariant holds.
func TestEndToEndRefreshExposureFromStripe(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	bin := MustBuildBinary(t)
	fake := proxytest.NewFakeStripe(t, "sk_test_exposures")
	dataDir := t.TempDir()
	masterText, err := newMasterKeyText()
	require.NoError(t, err)
	const jwtSecret = "exposures-jwt-secret-exposures-jwt-secret"
	c := startChild(t, bin, []string{"serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--stripe-url", fake.URL, "--log-format", "json"},
		childEnviron(envMasterKey+"="+masterText, envJWTSecret+"="+jwtSecret, envStripeKey+"="+fake.Secret))
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.exited
	})
	proxyURL := "http://" + c.waitReady(t)
	admin := "http://" + *c.admin.Load() + "/api/v1"
	token := strings.TrimSpace(MustRunCommand(t, env{envJWTSecret: jwtSecret}, "token", "--sub", "oncall@example.com"))
	ctx := context.Background()

	var key struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	require.Equal(t, http.StatusCreated, adminDo(t, http.MethodPost, admin+"/keys", token, map[string]any{
		"name": "checkout-agent", "policy": map[string]any{"vendor": "stripe", "currency": "usd", "daily_cap": "80.00",
			"period_cap": "100.00", "expires_at": time.Now().Add(72 * time.Hour).UTC().Format(time.RFC3339)},
	}, &key))
	sc := MustStripeClient(t, proxyURL, key.Token)
	create := func(cents int64) string {
		pi, err := sc.V1PaymentIntents.Create(ctx, &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(cents), Currency: stripe.String("usd")})
		require.NoError(t, err)
		return pi.ID
	}
	abandoned, paid := create(4000), create(2500)
	usage := func() usageAnswer {
		var u usageAnswer
		require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, admin+"/keys/"+key.ID+"/usage", token, nil, &u))
		return u
	}
	u := usage()
	assertMoney(t, "65", u.Period.Held)
	assertMoney(t, "65", u.Daily.Held)
	assertMoney(t, "0", u.Period.Committed)
	_, err = sc.V1PaymentIntents.Create(ctx, &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(2000), Currency: stripe.String("usd")})
	var serr *stripe.Error
	require.ErrorAs(t, err, &serr, "65 held + 20 passes the daily cap of 80")
	assert.Equal(t, "spend_cap_exceeded", string(serr.Code))

	var list struct {
		Exposures []struct {
			ObjectID string `json:"object_id"`
			Kind     string `json:"kind"`
			Exposure string `json:"exposure"`
		} `json:"exposures"`
	}
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, admin+"/keys/"+key.ID+"/exposures", token, nil, &list))
	require.Len(t, list.Exposures, 2)
	got := map[string]string{}
	for _, e := range list.Exposures {
		assert.Equal(t, "payment_intent", e.Kind)
		got[e.ObjectID] = e.Exposure
	}
	assert.Equal(t, map[string]string{abandoned: "40.00", paid: "25.00"}, got)

	// At Stripe directly: the abandoned one is cancelled in the Dashboard, the
	// other confirmed in the customer's browser.
	direct := MustStripeClient(t, fake.URL, fake.Secret)
	_, err = direct.V1PaymentIntents.Cancel(ctx, abandoned, &stripe.PaymentIntentCancelParams{})
	require.NoError(t, err)
	_, err = direct.V1PaymentIntents.Confirm(ctx, paid, &stripe.PaymentIntentConfirmParams{PaymentMethod: stripe.String("pm_card_visa")})
	require.NoError(t, err)
	assertMoney(t, "65", usage().Period.Held) // keybrake saw neither

	var change struct {
		Changed   bool   `json:"changed"`
		Committed string `json:"committed"`
		Released  string `json:"released"`
	}
	refresh := func(id string) {
		t.Helper()
		require.Equal(t, http.StatusOK, adminDo(t, http.MethodPost, admin+"/keys/"+key.ID+"/exposures/"+id+"/refresh", token, nil, &change))
	}
	refresh(abandoned)
	assert.True(t, change.Changed)
	assertMoney(t, "40", change.Released)
	assertMoney(t, "0", change.Committed)
	u = usage()
	assertMoney(t, "25", u.Period.Held)
	assertMoney(t, "25", u.Daily.Held)
	assertMoney(t, "0", u.Period.Committed)

	refresh(paid)
	assertMoney(t, "25", change.Committed)
	assertMoney(t, "0", change.Released)
	u = usage()
	assertMoney(t, "0", u.Period.Held)
	assertMoney(t, "25", u.Period.Committed)
	assert.Equal(t, int64(2500), fake.TotalMoved("usd"), "keybrake's committed is what Stripe moved")

	// The freed budget is spendable again.
	create(5000)

	var events struct {
		Events []struct {
			Operation string `json:"operation"`
			Decision  string `json:"decision"`
			Reason    string `json:"reason"`
			ObjectID  string `json:"object_id"`
			Amount    string `json:"amount"`
		} `json:"events"`
	}
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, admin+"/keys/"+key.ID+"/events", token, nil, &events))
	var refreshed []string
	for _, e := range events.Events {
		if e.Operation == "exposure.refresh" {
			refreshed = append(refreshed, fmt.Sprintf("%s %s %s %s", e.Decision, e.Reason, e.ObjectID, e.Amount))
		}
	}
	assert.Equal(t, []string{"exposure commit " + paid + " 25.00", "exposure release " + abandoned + " 40.00"}, refreshed)
	var audit struct {
		Entries []struct {
			Actor  string `json:"actor"`
			Action string `json:"action"`
			Target string `json:"target"`
		} `json:"entries"`
	}
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, admin+"/audit", token, nil, &audit))
	require.GreaterOrEqual(t, len(audit.Entries), 2)
	for _, e := range audit.Entries[:2] {
		assert.Equal(t, "exposure.refresh", e.Action)
		assert.Equal(t, "oncall@example.com", e.Actor)
		assert.Equal(t, key.ID, e.Target)
	}

	require.NoError(t, c.signalAndWait(t, syscall.SIGTERM, 30*time.Second), "logs:\n%s", c.logs())
	assert.False(t, c.raceSeen.Load(), "data race in the child:\n%s", c.logs())
	masterKey, err := decodeMasterKey(masterText)
	require.NoError(t, err)
	s := MustOpenStore(t, filepath.Join(dataDir, databaseFile), masterKey)
	require.NoError(t, s.CheckInvariant(ctx))
	exposed, _, err := s.ListExposures(ctx, key.ID, 0, "")
	require.NoError(t, err)
	require.Len(t, exposed, 1, "only the PaymentIntent created after the refreshes")
	assert.Equal(t, int64(5000), exposed[0].Held)
}
