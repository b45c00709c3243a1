package vaulttest

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

func testTamperedStoredResponseIsNotReplayed(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	MustReserve(t, f.s, Charge(f.key.ID, "a", 100))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: f.key.ID, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 100,
		Response: &vault.StoredResponse{Status: 200, Body: []byte(`{"id":"ch_1"}`)}})
	require.NoError(t, engine.Update(f.s.e, context.Background(), func(tx engine.Tx, _ time.Time) error {
		r, err := engine.GetRecord(tx, f.key.ID, "a")
		if err != nil {
			return err
		}
		r.Response.SealedBody[20] ^= 1
		return engine.PutRecord(tx, r)
	}))
	_, err := f.s.Reserve(ctx, Charge(f.key.ID, "a", 100))
	assert.ErrorIs(t, err, vault.ErrSealed)
}

// testLongAnswerIsCompressedAndSealed: a Stripe answer long enough is stored
// compressed and sealed — smaller than itself, its text nowhere in the store —
// and replays byte for byte; the record cannot be made to read it as
// uncompressed.
func testLongAnswerIsCompressedAndSealed(t *testing.T) {
	ctx := context.Background()
	f := newMeteringFixture(t)
	body := []byte(`{"id":"ch_long","object":"charge","description":"` + strings.Repeat("a well compressible description ", 200) + `"}`)
	MustReserve(t, f.s, Charge(f.key.ID, "a", 100))
	MustSettle(t, f.s, vault.SettleRequest{KeyID: f.key.ID, IdempotencyKey: "a", Outcome: vault.SettleCommit, Amount: 100,
		Response: &vault.StoredResponse{Status: 200, Header: http.Header{"Request-Id": {"req_1"}}, Body: body}})
	res := MustReserve(t, f.s, Charge(f.key.ID, "a", 100))
	require.Equal(t, vault.ReserveReplay, res.Outcome)
	assert.Equal(t, body, res.Record.Response.Body)

	var stored []byte
	require.NoError(t, engine.View(f.s.e, ctx, func(tx engine.Tx, _ time.Time) error {
		v, _, err := engine.RawRecord(tx, f.key.ID, "a")
		stored = append(stored, v...)
		return err
	}))
	require.NotEmpty(t, stored)
	assert.Less(t, len(stored), len(body)/4, "stored compressed")
	assert.NotContains(t, string(stored), "compressible", "and sealed")

	// Read as if it were not compressed, the sealed body does not open.
	require.NoError(t, engine.Update(f.s.e, ctx, func(tx engine.Tx, _ time.Time) error {
		r, err := engine.GetRecord(tx, f.key.ID, "a")
		if err != nil {
			return err
		}
		r.Response.Codec = 0
		return engine.PutRecord(tx, r)
	}))
	_, err := f.s.Reserve(ctx, Charge(f.key.ID, "a", 100))
	assert.ErrorIs(t, err, vault.ErrSealed)
}
