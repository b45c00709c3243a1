package main

import (
	"context"
	"encoding/base64"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestServeOnPostgreSQL: two serve processes' worth of Main on one database,
// selected by KEYBRAKE_DATABASE_URL, share keys and usage: a key minted
// through one meters a charge through the other. keybrake backup and rekey
// say that they do not apply to a PostgreSQL store.
func TestServeOnPostgreSQL(t *testing.T) {
	ctx := context.Background()
	fake := proxytest.NewFakeStripe(t, "sk_test_pg")
	dbURL := pgtest.URL(t)
	e := env{
		envStripeKey:            fake.Secret,
		envMasterKey:            base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef")),
		envJWTSecret:            base64.StdEncoding.EncodeToString([]byte("a jwt secret shared by replicas.")),
		envName("database-url"): dbURL,
	}
	a := MustServe(t, t.TempDir(), fake.URL, e)
	b := MustServe(t, t.TempDir(), fake.URL, e)

	adminToken := strings.TrimSpace(MustRunCommand(t, e, "token", "--data-dir", t.TempDir(), "--sub", "pg"))
	mint := map[string]any{
		"name": "shared", "upstream": "default",
		"policy": map[string]any{"vendor": "stripe", "currency": "usd", "daily_cap": "50.00",
			"expires_at": "2099-01-01T00:00:00Z"},
	}
	var minted struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	require.Equal(t, http.StatusCreated, adminDo(t, http.MethodPost, a.AdminURL()+"/api/v1/keys", adminToken, mint, &minted))

	sc := MustStripeClient(t, b.ProxyURL(), minted.Token)
	_, err := sc.V1Charges.Create(ctx, &stripe.ChargeCreateParams{Amount: stripe.Int64(4000), Currency: stripe.String("usd"),
		Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")}})
	require.NoError(t, err)
	_, err = MustStripeClient(t, a.ProxyURL(), minted.Token).V1Charges.Create(ctx, &stripe.ChargeCreateParams{
		Amount: stripe.Int64(2000), Currency: stripe.String("usd"), Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")}})
	var serr *stripe.Error
	require.ErrorAs(t, err, &serr, "40 + 20 passes the cap of 50, whichever replica is asked")
	assert.Equal(t, "spend_cap_exceeded", string(serr.Code))
	assert.Len(t, fake.Charges(), 1)

	var usage usageAnswer
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodGet, a.AdminURL()+"/api/v1/keys/"+minted.ID+"/usage", adminToken, nil, &usage))
	assertMoney(t, "40", usage.Daily.Committed)

	for _, m := range []testMain{a, b} {
		status, body := MustGet(t, m.ProxyURL()+"/readyz", "")
		assert.Equal(t, http.StatusOK, status, string(body))
	}
	status, body := MustGet(t, a.AdminURL()+"/metrics", "")
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, string(body), "keybrake_store_size_bytes ")
	status, body = MustGet(t, a.AdminURL()+"/api/v1/backup", adminToken)
	assert.Equal(t, http.StatusNotImplemented, status)
	assert.Contains(t, string(body), "pg_dump")

	_, err = runCommand(e, "backup", "--out", filepath.Join(t.TempDir(), "x.db"))
	assert.ErrorContains(t, err, "pg_dump")
	_, err = runCommand(e, "rekey", "--new-master-key", base64.StdEncoding.EncodeToString(make([]byte, 32)))
	assert.ErrorContains(t, err, "cannot rekey a PostgreSQL store")
	_, err = runCommand(env{}, "serve", "--database-url", "mysql://x")
	assert.ErrorContains(t, err, "postgres://")
}
