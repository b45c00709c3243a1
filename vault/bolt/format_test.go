package bolt

import (
	"compress/gzip"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// TestFileWrittenBeforeTheEngineOpens opens a database file written by
// keybrake before the vault's rules moved to the shared engine (commit
// 0c8ca76, schema version 1; gzipped, it is 16 MiB of mostly empty pages):
// an upstream, a key, a committed charge with its stored answer, an unknown
// hold, a money object's exposure, a completed claim, and a request left in
// flight. Everything reads back as it was written, the file's format being
// the engine's, and the in-flight request is recovered as outcome unknown.
func TestFileWrittenBeforeTheEngineOpens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		keyID = "key_06g9viem00sagvfp52htifhso8"
		token = "vk_5iDnbPwOBYnEh2IWkAG60OHTaSo8P2NXMykcPktDu7c"
	)
	path := filepath.Join(t.TempDir(), "keybrake.db")
	gunzip(t, filepath.Join("testdata", "schema1-0c8ca76.db.gz"), path)
	clock := vaulttest.NewClock(vaulttest.T0.Add(time.Hour))
	s := MustOpenPath(t, path, clock)

	secret, err := s.UpstreamSecret(ctx, "default")
	require.NoError(t, err)
	assert.Equal(t, "sk_test_fixture_secret", secret)
	k, err := s.Authenticate(ctx, token)
	require.NoError(t, err)
	assert.Equal(t, keyID, k.ID)
	assert.Equal(t, map[string]string{"customer_id": "cus_1"}, k.Labels)

	res := vaulttest.MustReserve(t, s, vaulttest.Charge(keyID, "committed", 2500))
	require.Equal(t, vault.ReserveReplay, res.Outcome)
	require.NotNil(t, res.Record.Response)
	assert.JSONEq(t, `{"id":"ch_fixture","amount":2500}`, string(res.Record.Response.Body))
	assert.Equal(t, "req_fixture", res.Record.RequestID)

	unknown, _, err := s.ListHolds(ctx, vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	require.Len(t, unknown, 2, "the unknown hold, and the request left in flight, recovered")
	exp, ok, err := s.ObjectExposure(ctx, keyID, "pi_fixture")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, int64(3000), exp.Held)
	_, windows, usage, err := s.KeyUsage(ctx, keyID)
	require.NoError(t, err)
	assert.Equal(t, policy.Counter{Committed: 2500, Held: 1000 + 3000 + 500}, usage[windows[0].ID])
	c, err := s.GetClaim(ctx, keyID, "job")
	require.NoError(t, err)
	assert.JSONEq(t, `{"done":true}`, string(c.Result))
	events, _, err := s.ListEvents(ctx, keyID, 50, "")
	require.NoError(t, err)
	assert.Len(t, events, 7, "four holds and the settles of three")

	// And it goes on: new writes land after the old ones.
	vaulttest.MustCommit(t, s, keyID, "new", 100)
	after, _, err := s.ListEvents(ctx, keyID, 1, "")
	require.NoError(t, err)
	assert.Greater(t, after[0].ID, events[0].ID)

	// Opening upgraded it to schema version 2: the new writes are binary, the
	// old JSON reads as before, and the records were indexed — the in-flight
	// one was recovered from the new index above, and the completed one is
	// reaped from it once its replay window has passed.
	assert.Equal(t, engine.SchemaVersion, schemaVersion(t, s))
	require.NoError(t, engine.View(s.Engine, ctx, func(tx engine.Tx, _ time.Time) error {
		rec, err := engine.GetRecord(tx, keyID, "new")
		require.NoError(t, err)
		raw, appended, err := engine.RawRecord(tx, keyID, "new")
		require.NoError(t, err)
		require.NotEmpty(t, raw)
		assert.NotEqual(t, byte('{'), raw[0], "a new record is not JSON")
		assert.True(t, appended, "a new record is appended to the records bucket")
		_, appended, err = engine.RawRecord(tx, keyID, "committed")
		require.NoError(t, err)
		assert.False(t, appended, "a record of version 1 stays where it is")
		assert.Equal(t, vault.RecordCompleted, rec.State)
		return nil
	}))
	clock.Advance(vault.DefaultIdempotencyTTL + time.Hour)
	_, err = s.Reap(ctx)
	require.NoError(t, err)
	res = vaulttest.MustReserve(t, s, vaulttest.Charge(keyID, "committed", 2500))
	assert.Equal(t, vault.ReserveClaimed, res.Outcome, "the fixture's completed record was reaped through the new index")
	vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: keyID, IdempotencyKey: "committed", Outcome: vault.SettleRelease})
	unknown, _, err = s.ListHolds(ctx, vault.HoldUnknown, 10, "")
	require.NoError(t, err)
	assert.Len(t, unknown, 2, "unknown holds are never reaped")
	require.NoError(t, s.CheckInvariant(ctx))
}

// schemaVersion reads the schema version a store's meta bucket holds.
func schemaVersion(t *testing.T, s *Store) uint64 {
	t.Helper()
	var v uint64
	require.NoError(t, engine.View(s.Engine, context.Background(), func(tx engine.Tx, _ time.Time) error {
		raw, err := tx.Get(engine.BucketMeta, engine.MetaSchemaVersion)
		require.Len(t, raw, 8)
		v = binary.BigEndian.Uint64(raw)
		return err
	}))
	return v
}

// gunzip writes the gzipped file src to dst.
func gunzip(tb testing.TB, src, dst string) {
	tb.Helper()
	in, err := os.Open(src)
	require.NoError(tb, err)
	defer in.Close()
	zr, err := gzip.NewReader(in)
	require.NoError(tb, err)
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	require.NoError(tb, err)
	_, err = io.Copy(out, zr)
	require.NoError(tb, err)
	require.NoError(tb, out.Close())
}
