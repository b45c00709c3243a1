package vaulttest

import (
	"context"
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
