package postgres

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
	"github.com/keybrake/keybrake/vault/internal/engine"
	"github.com/keybrake/keybrake/vault/postgres/pgtest"
	"github.com/keybrake/keybrake/vault/vaulttest"
)

// sourceVault is a bbolt vault with what a vault in production holds, and
// what the test needs to find again in its copy.
type sourceVault struct {
	path  string
	clock *vaulttest.Clock
	keys  []vault.Key
	token string // the first key's
	// fencing are the fencing tokens the source handed out.
	fencing []uint64
}

// mustSourceVault writes, through the store's API, keys (one revoked, one
// changed, one rotated), committed, released, unknown and in-flight holds
// over two days, a PaymentIntent's exposure partly captured, a refusal, an
// overrun, claims completed and in progress, and the audit of it all — then
// closes the store and opens it again, as migrate-store does (the in-flight
// request becomes outcome unknown).
func mustSourceVault(t *testing.T) (*bolt.Store, sourceVault) {
	t.Helper()
	ctx := context.Background()
	v := sourceVault{path: filepath.Join(t.TempDir(), "keybrake.db"), clock: vaulttest.NewClock(vaulttest.T0)}
	open := func() *bolt.Store {
		s, err := bolt.Open(v.path, bolt.Options{MasterKey: vaulttest.MasterKey, Now: v.clock.Now, Logger: vaulttest.QuietLogger()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	s := open()
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	a, tok := vaulttest.MustMint(t, s, "a", vaulttest.Policy(t, "500.00", "1000.00", ""), map[string]string{"team": "billing"})
	b, _ := vaulttest.MustMint(t, s, "b", vaulttest.Policy(t, "50.00", "", ""), nil)
	c, _ := vaulttest.MustMint(t, s, "c", vaulttest.Policy(t, "20.00", "", ""), nil)
	v.keys, v.token = []vault.Key{a, b, c}, tok

	answer := func(id string) *vault.StoredResponse {
		return &vault.StoredResponse{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte(`{"id": "` + id + `", "object": "charge"}`)}
	}
	settle := func(key, idem string, out vault.SettleOutcome, amount int64, resp *vault.StoredResponse, obj string, os vault.ObjectSettle) {
		vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: key, IdempotencyKey: idem, Outcome: out, Amount: amount,
			Response: resp, ObjectID: obj, Object: os, UpstreamStatus: http.StatusOK})
	}
	reserve := func(key, idem string, amount int64) vault.ReserveResult {
		return vaulttest.MustReserve(t, s, vaulttest.Charge(key, idem, amount))
	}

	// Day 1.
	reserve(a.ID, "ch-1", 2500)
	settle(a.ID, "ch-1", vault.SettleCommit, 2500, answer("ch_1"), "ch_1", vault.ObjectSettle{})
	reserve(a.ID, "declined", 900)
	settle(a.ID, "declined", vault.SettleRelease, 0, &vault.StoredResponse{Status: http.StatusPaymentRequired,
		Body: []byte(`{"error": {"code": "card_declined"}}`)}, "", vault.ObjectSettle{})
	reserve(a.ID, "pi-create", 6000)
	settle(a.ID, "pi-create", vault.SettleCommit, 0, answer("pi_1"), "pi_1",
		vault.ObjectSettle{Created: true, Expose: true, MovedKnown: true})
	_, err := s.ObserveObject(ctx, a.ID, "pi_1", vault.Observation{Operation: "payment_intents.read", Moved: 1000, MovedKnown: true})
	require.NoError(t, err)
	reserve(b.ID, "b-1", 4000)
	settle(b.ID, "b-1", vault.SettleCommit, 4000, answer("ch_b1"), "ch_b1", vault.ObjectSettle{})
	refused := reserve(b.ID, "b-2", 2000)
	require.Equal(t, vault.ReserveRefused, refused.Outcome, "40 + 20 passes b's daily cap of 50")

	// Day 2.
	v.clock.Advance(24 * time.Hour)
	reserve(a.ID, "ch-2", 1200)
	settle(a.ID, "ch-2", vault.SettleCommit, 1200, answer("ch_2"), "", vault.ObjectSettle{})
	reserve(a.ID, "overrun", 700)
	vaulttest.MustSettle(t, s, vault.SettleRequest{KeyID: a.ID, IdempotencyKey: "overrun", Outcome: vault.SettleCommit,
		Amount: 800, AllowOverrun: true, Response: answer("in_1"), UpstreamStatus: http.StatusOK})
	reserve(a.ID, "unknown", 3000)
	settle(a.ID, "unknown", vault.SettleUnknown, 0, nil, "", vault.ObjectSettle{})
	reserve(a.ID, "in-flight", 1500) // its server dies: never settled
	open1, err := s.Claim(ctx, a.ID, "invoice/2026-09/cus_1", "sha256:1", time.Minute)
	require.NoError(t, err)
	done, err := s.Claim(ctx, a.ID, "invoice/2026-09/cus_2", "sha256:2", time.Minute)
	require.NoError(t, err)
	v.fencing = []uint64{open1.Claim.FencingToken, done.Claim.FencingToken}
	require.NoError(t, s.CompleteClaim(ctx, a.ID, "invoice/2026-09/cus_2", done.Claim.FencingToken, []byte(`{"charge": "ch_9"}`)))
	_, err = s.RevokeKey(ctx, "tester", b.ID)
	require.NoError(t, err)
	p := c.Policy
	p.DailyCap = vaulttest.MustDec(t, "25.00")
	_, err = s.UpdateKey(ctx, "tester", c.ID, p, map[string]string{"team": "growth"})
	require.NoError(t, err)
	_, _, err = s.RotateKey(ctx, "tester", c.ID)
	require.NoError(t, err)

	require.NoError(t, s.Close())
	return open(), v
}

// vaultView is everything the store contract shows of a vault.
type vaultView struct {
	Keys       []vault.Key
	Windows    [][]policy.Window
	Usage      []policy.Usage
	Events     [][]vault.Event
	Spend      vault.SpendReport
	Holds      []vault.Hold
	Counts     map[vault.HoldState]int
	Audit      []vault.AuditEntry
	Claims     []vault.Claim
	Exposure   vault.Exposure
	Upstreams  []vault.Upstream
	Secret     string
	TokenOf    string
	Replay     *vault.StoredResponse
	Unresolved []string
}

// mustView reads v's vault through s.
func mustView(t *testing.T, s vault.Store, v sourceVault) vaultView {
	t.Helper()
	ctx := context.Background()
	var out vaultView
	for _, k := range v.keys {
		key, windows, usage, err := s.KeyUsage(ctx, k.ID)
		require.NoError(t, err)
		out.Keys, out.Windows, out.Usage = append(out.Keys, key), append(out.Windows, windows), append(out.Usage, usage)
		var events []vault.Event
		for cursor := ""; ; {
			page, next, err := s.ListEvents(ctx, k.ID, 2, cursor)
			require.NoError(t, err)
			events = append(events, page...)
			if cursor = next; cursor == "" {
				break
			}
		}
		out.Events = append(out.Events, events)
	}
	var err error
	out.Spend, err = s.DailySpend(ctx, v.keys[0].ID)
	require.NoError(t, err)
	for cursor := ""; ; {
		page, next, err := s.ListHolds(ctx, "", 3, cursor)
		require.NoError(t, err)
		out.Holds = append(out.Holds, page...)
		if cursor = next; cursor == "" {
			break
		}
	}
	out.Counts = map[vault.HoldState]int{}
	for _, state := range []vault.HoldState{vault.HoldHeld, vault.HoldUnknown, vault.HoldCommitted, vault.HoldReleased} {
		out.Counts[state], err = s.CountHolds(ctx, state)
		require.NoError(t, err)
	}
	for cursor := ""; ; {
		page, next, err := s.ListAudit(ctx, 4, cursor)
		require.NoError(t, err)
		out.Audit = append(out.Audit, page...)
		if cursor = next; cursor == "" {
			break
		}
	}
	for _, ck := range []string{"invoice/2026-09/cus_1", "invoice/2026-09/cus_2"} {
		c, err := s.GetClaim(ctx, v.keys[0].ID, ck)
		require.NoError(t, err)
		out.Claims = append(out.Claims, c)
	}
	out.Exposure, _, err = s.ObjectExposure(ctx, v.keys[0].ID, "pi_1")
	require.NoError(t, err)
	out.Upstreams, err = s.ListUpstreams(ctx)
	require.NoError(t, err)
	out.Secret, err = s.UpstreamSecret(ctx, "default")
	require.NoError(t, err)
	k, err := s.Authenticate(ctx, v.token)
	require.NoError(t, err)
	out.TokenOf = k.ID
	res, err := s.Reserve(ctx, vaulttest.Charge(v.keys[0].ID, "ch-1", 2500))
	require.NoError(t, err)
	require.Equal(t, vault.ReserveReplay, res.Outcome)
	out.Replay = res.Record.Response
	return out
}

// TestImportCopiesAVault: a bbolt vault copied into PostgreSQL shows the same
// keys, usage, ledger, holds, audit, claims, exposure and upstreams through
// the store contract; a completed request replays the same answer; the
// invariant holds; and the copy goes on where the source stopped: new ledger
// and audit ids, and fencing tokens, sort after the copied ones.
func TestImportCopiesAVault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, v := mustSourceVault(t)
	want := mustView(t, src, v)
	require.NoError(t, src.CheckInvariant(ctx))
	assert.Zero(t, want.Counts[vault.HoldHeld], "the in-flight hold was recovered as unknown when the source opened")
	assert.Equal(t, 2, want.Counts[vault.HoldUnknown], "the unknown hold and the recovered in-flight one")

	url := pgtest.URL(t)
	stats, err := Import(ctx, url, src, ImportOptions{MasterKey: vaulttest.MasterKey})
	require.NoError(t, err)
	assert.EqualValues(t, 3, stats.Entries["keys"])
	assert.EqualValues(t, 1, stats.Entries["upstreams"])
	assert.EqualValues(t, 2, stats.Entries["claims"])
	assert.EqualValues(t, len(want.Holds), stats.Entries["hold_index"])
	assert.EqualValues(t, 2, stats.Holds[vault.HoldUnknown])
	assert.EqualValues(t, len(want.Audit), stats.Entries["audit"])
	// bbolt appends its records (schema version 2): each record in the
	// records bucket, its idem entry pointing at it; both copied as they are.
	assert.Positive(t, stats.Entries["records"])
	assert.Equal(t, stats.Entries["records"], stats.Entries["idem"])

	dst := mustOpenURL(t, url, vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: v.clock.Now})
	require.NoError(t, dst.CheckInvariant(ctx))
	got := mustView(t, dst, v)
	assert.Equal(t, want, got)

	// The copy goes on from where the source stopped.
	a := v.keys[0].ID
	vaulttest.MustCommit(t, dst, a, "after", 100)
	events, _, err := dst.ListEvents(ctx, a, 1, "")
	require.NoError(t, err)
	require.Len(t, events, 1)
	assert.Greater(t, events[0].ID, want.Events[0][0].ID, "a new event sorts after the copied ones")
	claim, err := dst.Claim(ctx, a, "invoice/2026-10/cus_1", "sha256:3", time.Minute)
	require.NoError(t, err)
	for _, token := range v.fencing {
		assert.Greater(t, claim.Claim.FencingToken, token, "fencing tokens only grow")
	}
	_, err = dst.RevokeKey(ctx, "tester", v.keys[2].ID)
	require.NoError(t, err)
	audit, _, err := dst.ListAudit(ctx, 1, "")
	require.NoError(t, err)
	assert.Greater(t, audit[0].ID, want.Audit[0].ID, "a new audit entry sorts after the copied ones")
	require.NoError(t, dst.CheckInvariant(ctx))
}

// TestImportRefusesATargetInUse: a database that holds a vault, or that a
// replica with another master key started on, is refused and left as it
// was; one that a replica with the source's key started on (schema and
// master key check only) is accepted.
func TestImportRefusesATargetInUse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, v := mustSourceVault(t)

	started := migrated.URL(t)
	s := mustOpenURL(t, started, vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: v.clock.Now})
	require.NoError(t, s.Close())
	_, err := Import(ctx, started, src, ImportOptions{MasterKey: vaulttest.MasterKey})
	require.NoError(t, err, "a database a replica only opened counts as empty")

	_, err = Import(ctx, started, src, ImportOptions{MasterKey: vaulttest.MasterKey})
	assert.ErrorIs(t, err, vault.ErrConflict, "a second copy is refused")
	assert.ErrorContains(t, err, "not empty")

	otherKey := migrated.URL(t)
	other := make([]byte, 32)
	copy(other, "another master key, 32 bytes....")
	s = mustOpenURL(t, otherKey, vaulttest.Options{MasterKey: other, Now: v.clock.Now})
	require.NoError(t, s.Close())
	_, err = Import(ctx, otherKey, src, ImportOptions{MasterKey: vaulttest.MasterKey})
	assert.ErrorIs(t, err, vault.ErrSealed)
	assertEntries(t, otherKey, map[string]int64{"meta": 2})

	withKeys := migrated.URL(t)
	s = mustOpenURL(t, withKeys, vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: v.clock.Now})
	vaulttest.MustUpstream(t, s, "sk_test_abcdef1234")
	require.NoError(t, s.Close())
	_, err = Import(ctx, withKeys, src, ImportOptions{MasterKey: vaulttest.MasterKey})
	assert.ErrorIs(t, err, vault.ErrConflict)
	assert.ErrorContains(t, err, "keybrake_upstreams")
	assertEntries(t, withKeys, map[string]int64{"meta": 2, "upstreams": 1, "audit": 1})

	// A replica inside a transaction on the target holds its tables.
	busy := migrated.URL(t)
	s = mustOpenURL(t, busy, vaulttest.Options{MasterKey: vaulttest.MasterKey, Now: v.clock.Now})
	require.NoError(t, s.Close())
	pool := pgtest.NewPool(t, busy)
	ptx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = ptx.Exec(ctx, "SELECT * FROM keybrake_keys FOR UPDATE")
	require.NoError(t, err)
	_, err = Import(ctx, busy, src, ImportOptions{MasterKey: vaulttest.MasterKey, LockTimeout: 200 * time.Millisecond})
	assert.ErrorIs(t, err, vault.ErrConflict)
	assert.ErrorContains(t, err, "stop every replica")
	require.NoError(t, ptx.Rollback(ctx))
	assertEntries(t, busy, map[string]int64{"meta": 2})
}

// failingSnapshot is a source whose snapshot fails at its last bucket's
// sequence: a copy that breaks after most of the work.
type failingSnapshot struct{ *bolt.Store }

func (f failingSnapshot) Export(ctx context.Context, fn func(engine.Snapshot) error) error {
	return f.Store.Export(ctx, func(snap engine.Snapshot) error { return fn(failingAt{snap}) })
}

type failingAt struct{ engine.Snapshot }

func (f failingAt) Sequence(b engine.Bucket) (uint64, error) {
	if b == engine.NumBuckets-1 {
		return 0, errors.New("the source's disk failed")
	}
	return f.Snapshot.Sequence(b)
}

// TestImportIsOneTransaction: a copy that fails after most buckets were
// written leaves the target empty, and a later copy succeeds.
func TestImportIsOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, _ := mustSourceVault(t)
	url := migrated.URL(t)
	_, err := Import(ctx, url, failingSnapshot{src}, ImportOptions{MasterKey: vaulttest.MasterKey})
	assert.ErrorContains(t, err, "the source's disk failed")
	assertEntries(t, url, map[string]int64{})
	_, err = Import(ctx, url, src, ImportOptions{MasterKey: vaulttest.MasterKey})
	require.NoError(t, err)
}

// TestImportRefusesAnInconsistentSource: a source that fails its invariant
// check is not copied.
func TestImportRefusesAnInconsistentSource(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, v := mustSourceVault(t)
	require.NoError(t, engine.Update(src.Engine, ctx, func(tx engine.Tx, _ time.Time) error {
		c, _, err := engine.GetCounter(tx, v.keys[0].ID, "period")
		if err != nil {
			return err
		}
		c.Committed += 100
		return engine.PutCounter(tx, v.keys[0].ID, "period", c)
	}))
	url := migrated.URL(t)
	_, err := Import(ctx, url, src, ImportOptions{MasterKey: vaulttest.MasterKey})
	assert.ErrorIs(t, err, vault.ErrInvariant)
	assert.ErrorContains(t, err, "nothing was copied")
	assertEntries(t, url, map[string]int64{})
}

// assertEntries checks how many entries each of keybrake's tables at url
// holds (absent from want: none, or no table at all).
func assertEntries(t *testing.T, url string, want map[string]int64) {
	t.Helper()
	pool := pgtest.NewPool(t, url)
	got := map[string]int64{}
	for _, b := range engine.Buckets() {
		var exists bool
		require.NoError(t, pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table(b)).Scan(&exists))
		var n int64
		if exists {
			require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table(b)).Scan(&n))
		}
		if n > 0 {
			got[b.Name()] = n
		}
	}
	assert.Equal(t, want, got)
}
