package engine

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

var codecT0 = time.Date(2026, 9, 14, 12, 0, 0, 123456789, time.UTC)

func fullRecord() *recordRec {
	return &recordRec{
		KeyID: "key_1", Idem: "order-42", Fingerprint: "fp", UpstreamKey: "keybrake_x",
		State: vault.RecordCompleted, LeaseUntil: codecT0.Add(time.Minute), CreatedAt: codecT0,
		UpdatedAt: codecT0.Add(time.Second), CompletedAt: codecT0.Add(2 * time.Second), RequestID: "req_1",
		Fresh: true, Resolved: true,
		Hold: &holdRec{Operation: "charges.create", Currency: "usd", Amount: -1 << 40, WindowIDs: []policy.WindowID{"day:2026-09-14", "period"},
			State: vault.HoldCommitted, CreatedAt: codecT0, SettledAt: codecT0.Add(time.Hour)},
		Response: &responseRec{Status: 402, Header: http.Header{"Content-Type": {"application/json"}, "Request-Id": {"req_1", "req_2"}},
			SealedBody: []byte{1, 2, 3, 0, 255}, Codec: codecDeflate},
	}
}

// TestRecordCodecRoundTrips: every field of a record, its hold and its stored
// answer survives the binary encoding; so do a bare record, an event and an
// object.
func TestRecordCodecRoundTrips(t *testing.T) {
	t.Parallel()
	for name, r := range map[string]*recordRec{
		"full": fullRecord(),
		"bare": {KeyID: "key_1", Idem: "i", State: vault.RecordInProgress, CreatedAt: codecT0},
	} {
		got, err := decodeRecordBinary([]byte("k"), encodeRecord(r))
		require.NoError(t, err, name)
		assert.Equal(t, r, got, name)
	}

	e := vault.Event{Time: codecT0, KeyID: "key_1", Operation: "charges.create", Amount: 2500, Currency: "usd",
		Decision: vault.DecisionSettled, Reason: "commit", HoldID: "hold_x", HoldState: vault.HoldCommitted, UpstreamStatus: 200,
		StripeRequestID: "req_1", ObjectID: "ch_1", Tool: "tool", WindowIDs: []policy.WindowID{"day:2026-09-14", "period"},
		HeldDelta: -2500, CommittedDelta: 2500, AllowanceDeltas: []int64{0, 7}, IdempotencyKey: "order-42"}
	enc := encodeEvent(&e)
	gotE, err := decodeEventBinary([]byte("k"), enc)
	require.NoError(t, err)
	assert.Equal(t, e, gotE)
	// An event written before events kept the idempotency key ends one field earlier.
	older := enc[:len(enc)-1-len(e.IdempotencyKey)]
	gotE, err = decodeEventBinary([]byte("k"), older)
	require.NoError(t, err)
	want := e
	want.IdempotencyKey = ""
	assert.Equal(t, want, gotE)

	o := &objectRec{Amount: 100, Parts: []exposurePart{{HoldID: "hold_x", WindowIDs: []policy.WindowID{"period"}, Amount: 50, CreatedAt: codecT0}},
		Moved: 100, MovedSeen: true, Own: true, Closed: true, Currency: "usd", UpdatedAt: codecT0}
	gotO, err := decodeObject([]byte("k"), encodeObject(o))
	require.NoError(t, err)
	assert.Equal(t, o, gotO)
	legacy, err := json.Marshal(o)
	require.NoError(t, err)
	gotO, err = decodeObject([]byte("k"), legacy)
	require.NoError(t, err)
	assert.Equal(t, o, gotO, "schema version 1's JSON reads the same")
}

// TestBodyCompression: a long answer is compressed, a short one is not, and
// both come back as they were.
func TestBodyCompression(t *testing.T) {
	t.Parallel()
	long := []byte(`{"id":"ch_1","object":"charge",` + strings.Repeat(`"metadata_field":"value",`, 100) + `"end":true}`)
	stored, codec := compressBody(long)
	assert.Equal(t, codecDeflate, codec)
	assert.Less(t, len(stored), len(long)/3)
	back, err := decompressBody(stored, codec)
	require.NoError(t, err)
	assert.Equal(t, long, back)

	short := []byte(`{"id":"ch_1"}`)
	stored, codec = compressBody(short)
	assert.Equal(t, codecNone, codec)
	assert.Equal(t, short, stored)

	_, err = decompressBody([]byte("not deflate"), codecDeflate)
	assert.ErrorIs(t, err, vault.ErrStorage)
	_, err = decompressBody(nil, 7)
	assert.ErrorIs(t, err, vault.ErrStorage)
}

// FuzzDecodeBinary: a damaged value is an error, never a panic.
func FuzzDecodeBinary(f *testing.F) {
	f.Add(encodeRecord(fullRecord()))
	f.Add(encodeEvent(&vault.Event{KeyID: "k", WindowIDs: []policy.WindowID{"period"}, AllowanceDeltas: []int64{1}}))
	f.Add(encodeObject(&objectRec{Parts: []exposurePart{{HoldID: "h"}}}))
	f.Fuzz(func(t *testing.T, v []byte) {
		if len(v) == 0 || v[0] == '{' {
			return
		}
		_, _ = decodeRecordBinary([]byte("k"), v)
		_, _ = decodeEventBinary([]byte("k"), v)
		_, _ = decodeObject([]byte("k"), v)
	})
}
