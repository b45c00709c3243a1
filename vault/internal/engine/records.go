package engine

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// upstreamRec is an upstream as stored: the secret only sealed.
type upstreamRec struct {
	Name         string    `json:"name"`
	Vendor       string    `json:"vendor"`
	SealedSecret []byte    `json:"sealed_secret"`
	SecretLast4  string    `json:"secret_last4"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
	// Version changes on every write of the upstream (see nextUpstreamVersion);
	// an upstream written before it was kept has none and reads as 1.
	Version uint64 `json:"version,omitempty"`
	// WebhookSecrets are the secrets Stripe signs the upstream's events with,
	// each sealed under webhookSecretAD; WebhookLast4 their last 4 characters.
	WebhookSecrets [][]byte `json:"webhook_secrets,omitempty"`
	WebhookLast4   []string `json:"webhook_last4,omitempty"`
}

func (r *upstreamRec) version() uint64 { return max(r.Version, 1) }

func (r *upstreamRec) public() vault.Upstream {
	return vault.Upstream{Name: r.Name, Vendor: r.Vendor, SecretLast4: r.SecretLast4, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Version: r.version(),
		WebhookSecretsLast4: slices.Clone(r.WebhookLast4)}
}

// keyRec is a vault key as stored.
type keyRec struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Upstream    string            `json:"upstream"`
	Labels      map[string]string `json:"labels,omitempty"`
	Policy      policy.Policy     `json:"policy"`
	Status      vault.KeyStatus   `json:"status"`
	TokenHash   string            `json:"token_hash"`
	TokenPrefix string            `json:"token_prefix"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
	RevokedAt   time.Time         `json:"revoked_at,omitzero"`
	Refused     *refusedRec       `json:"refused,omitempty"`
	// Raises are the key's raises, oldest first (raises.go).
	Raises []raiseRec `json:"raises,omitempty"`
	// Version counts the writes of the key (putKey raises it); a key written
	// before it was kept has none and reads as version 1.
	Version uint64 `json:"version,omitempty"`
}

// refusedRec counts the requests refused for the key's status (RecordKeyRefusal).
type refusedRec struct {
	Count      int64     `json:"count"`
	Code       string    `json:"code"`
	First      time.Time `json:"first"`
	Last       time.Time `json:"last"`
	RemoteAddr string    `json:"remote_addr,omitempty"`
	Path       string    `json:"path,omitempty"`
}

// version is the key's Version as callers see it: at least 1.
func (r *keyRec) version() uint64 { return max(r.Version, 1) }

func (r *keyRec) public() vault.Key {
	p := r.Policy
	p.Operations = slices.Clone(p.Operations)
	p.Customers = slices.Clone(p.Customers)
	p.StripeAccounts = slices.Clone(p.StripeAccounts)
	p.Idempotency.Fields = slices.Clone(p.Idempotency.Fields)
	return vault.Key{
		ID: r.ID, Name: r.Name, Upstream: r.Upstream, Labels: maps.Clone(r.Labels), Policy: p,
		Status: r.Status, TokenHash: r.TokenHash, TokenPrefix: r.TokenPrefix,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, RevokedAt: r.RevokedAt, Version: r.version(),
		Refused: r.refused(),
		Raises:  publicRaises(r.Raises, vault.RaiseScope{Kind: policy.ScopeKey, ID: r.ID}, p.EffectiveCurrency()),
	}
}

func (r *keyRec) refused() vault.KeyRefusals {
	if r.Refused == nil {
		return vault.KeyRefusals{}
	}
	f := r.Refused
	return vault.KeyRefusals{Count: f.Count, Code: f.Code, First: f.First, Last: f.Last, RemoteAddr: f.RemoteAddr, Path: f.Path}
}

// keyView is what audit entries show of a key: never its token or token hash.
type keyView struct {
	ID       string            `json:"id"`
	Name     string            `json:"name"`
	Upstream string            `json:"upstream"`
	Labels   map[string]string `json:"labels,omitempty"`
	Policy   policy.Policy     `json:"policy"`
	Status   vault.KeyStatus   `json:"status"`
}

func (r *keyRec) view() keyView {
	return keyView{ID: r.ID, Name: r.Name, Upstream: r.Upstream, Labels: r.Labels, Policy: r.Policy, Status: r.Status}
}

// upstreamView is what audit entries show of an upstream: never its secret.
type upstreamView struct {
	Name         string   `json:"name"`
	Vendor       string   `json:"vendor"`
	SecretLast4  string   `json:"secret_last4"`
	WebhookLast4 []string `json:"webhook_secrets_last4,omitempty"`
}

// getKey reads and decodes a key in tx.
func getKey(tx Tx, id string) (*keyRec, error) {
	var r keyRec
	ok, err := getJSON(tx, BucketKeys, []byte(id), &r)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("key %s: %w", id, vault.ErrNotFound)
	}
	return &r, nil
}

// Bounded is a map under a mutex of at most BoundedMax entries, emptied when
// full: what a store keeps to spare a read, a decode or a build, never what
// it decides on. The zero value is empty and ready; it is safe for
// concurrent use.
type Bounded[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]V
}

// BoundedMax bounds a Bounded's entries.
const BoundedMax = 10000

// Get is k's value, if one is kept.
func (b *Bounded[K, V]) Get(k K) (V, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.m[k]
	return v, ok
}

// Put keeps v as k's value, emptying the map first when it is full.
func (b *Bounded[K, V]) Put(k K, v V) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil || len(b.m) >= BoundedMax {
		b.m = make(map[K]V)
	}
	b.m[k] = v
}

// decodedCache keeps, per entry, what its bytes decoded to, with those
// bytes: an entry is decoded once per change of its bytes, and a result is
// used only for the very bytes read in the current transaction, so it is
// never stale.
type decodedCache[T any] struct {
	entries Bounded[string, decoded[T]]
}

type decoded[T any] struct {
	raw []byte
	v   T // never modified once kept: every caller gets it
}

// of is what raw, entry name's bytes as read, decodes to by decode.
func (c *decodedCache[T]) of(name string, raw []byte, decode func(name string, raw []byte) (T, error)) (T, error) {
	if e, ok := c.entries.Get(name); ok && bytes.Equal(e.raw, raw) {
		return e.v, nil
	}
	v, err := decode(name, raw)
	if err != nil {
		return v, err
	}
	c.entries.Put(name, decoded[T]{raw: bytes.Clone(raw), v: v})
	return v, nil
}

// keyCache keeps decoded keys for the hot paths (Reserve, Authenticate): decoding a
// key's policy costs more than the rest of a Reserve. An entry is used only when the
// bytes read in the current transaction equal the bytes it was decoded from, so the
// key is still read in that transaction and a change is seen at once.
type keyCache struct {
	decodedCache[*keyRec]
}

func decodeKey(id string, raw []byte) (*keyRec, error) {
	rec := &keyRec{}
	if err := decodeJSON([]byte(id), raw, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// peek is the last decoded copy of key id, nil when there is none: possibly
// stale, so only for hints (Prefetch), never for a decision.
func (c *keyCache) peek(id string) *keyRec {
	e, _ := c.entries.Get(id)
	return e.v
}

// get reads key id in tx, decoding it only when the cache has no entry for these
// bytes. The result is the cached record itself, shared with every caller:
// read it, or take public(); never modify it.
func (c *keyCache) get(tx Tx, id string) (*keyRec, error) {
	raw, err := tx.Get(BucketKeys, []byte(id))
	if err != nil {
		return nil, err
	}
	return c.decode(id, raw)
}

// decode is get of raw, key id's bytes as read (nil: there is no such key).
func (c *keyCache) decode(id string, raw []byte) (*keyRec, error) {
	if raw == nil {
		return nil, fmt.Errorf("key %s: %w", id, vault.ErrNotFound)
	}
	return c.of(id, raw, decodeKey)
}

// putKey writes a changed key, one version up.
func putKey(tx Tx, r *keyRec) error {
	r.Version = r.version() + 1
	return putJSON(tx, BucketKeys, []byte(r.ID), r)
}

// responseRec is a stored response; the body is sealed, compressed first when
// Codec says so (schema version 1 never compressed).
type responseRec struct {
	Status     int         `json:"s"`
	Header     http.Header `json:"h,omitempty"`
	SealedBody []byte      `json:"b,omitempty"`
	Codec      byte        `json:"-"`
}

// recordRec is an idempotency record as stored, with its hold when the request is
// metered. The idem bucket key is recordKey(KeyID, Idem): the 16 bytes HoldID
// encodes, so a hold id leads straight to its record. Under that key the idem
// bucket holds either the record itself (schema version 1's layout, and
// PostgreSQL's) or, on a store that appends its records (bbolt), the 8-byte
// sequence number under which the records bucket keeps it: a claim then appends
// its record after the newest, and the settle a few milliseconds later
// rewrites a page near the end of the file, where the other requests of its
// batch write too, instead of a random page each; only the small index entry
// lands at random (docs/decisions).
type recordRec struct {
	KeyID       string            `json:"k"`
	Idem        string            `json:"i"`
	Fingerprint string            `json:"fp"`
	UpstreamKey string            `json:"uk"`
	State       vault.RecordState `json:"st"`
	LeaseUntil  time.Time         `json:"lease,omitzero"`
	Hold        *holdRec          `json:"hold,omitempty"`
	Response    *responseRec      `json:"resp,omitempty"`
	RequestID   string            `json:"rid,omitempty"`
	CreatedAt   time.Time         `json:"c"`
	UpdatedAt   time.Time         `json:"u"`
	CompletedAt time.Time         `json:"done,omitzero"`
	// Fresh is true while the current in_progress claim is the one that created the
	// record (and its hold). SettleAbandon then deletes both; after a ReserveResume it is
	// false and abandoning puts the record back to unknown, keeping the hold.
	Fresh bool `json:"fresh,omitempty"`
	// Resolved is set when an operator settled the record's hold (ResolveHold):
	// such a record is kept for good, so that a retry keeps being told so.
	Resolved bool `json:"resolved,omitempty"`
	// ApprovalID is the approval the request waits for, or waited for.
	ApprovalID string `json:"apr,omitempty"`
	// SealedRequest is the request as it was forwarded (vault.StoredRequest,
	// JSON, sealed), kept while the record is unknown only: encodeRecord
	// drops it in any other state.
	SealedRequest []byte `json:"req,omitempty"`

	// seq is the records bucket key the record lives under, 0 when it lives
	// in the idem bucket under its hash. Not stored in the record.
	seq uint64
	// key is the idem bucket key once known (idemKey). Not stored.
	key []byte
}

func (r *recordRec) holdID() string {
	if r.Hold == nil {
		return ""
	}
	return r.Hold.ID
}

// recordKey is the idem bucket key of (keyID, idempotency key).
func recordKey(keyID, idem string) []byte {
	k := vault.HoldHash(keyID, idem)
	return k[:]
}

// idemKey is r's idem bucket key, recordKey(r.KeyID, r.Idem), hashed once per
// record in memory: a Reserve and a Settle each need it more than once.
func (r *recordRec) idemKey() []byte {
	if r.key == nil {
		r.key = recordKey(r.KeyID, r.Idem)
	}
	return r.key
}

// holdIDOf is the hold id of the pair whose record key is k: vault.HoldID
// from the hash it already made.
func holdIDOf(k []byte) string { return "hold_" + lowerBase32.EncodeToString(k) }

// recordKeyOfHold is the idem bucket key of the record a hold id belongs to.
func recordKeyOfHold(holdID string) ([]byte, bool) {
	rest, ok := strings.CutPrefix(holdID, "hold_")
	if !ok || len(rest) != lowerBase32.EncodedLen(16) {
		return nil, false
	}
	k, err := lowerBase32.DecodeString(rest)
	if err != nil || len(k) != 16 {
		return nil, false
	}
	return k, true
}

// decodeRecord decodes a stored record, binary or JSON (see codec.go), and
// fills in what its hold does not store.
func decodeRecord(k, v []byte) (*recordRec, error) {
	var r *recordRec
	if isJSON(v) {
		r = &recordRec{}
		if err := decodeJSON(k, v, r); err != nil {
			return nil, err
		}
	} else {
		var err error
		if r, err = decodeRecordBinary(k, v); err != nil {
			return nil, err
		}
	}
	if r.Hold != nil {
		r.Hold.ID, r.Hold.KeyID, r.Hold.IdempotencyKey = vault.HoldID(r.KeyID, r.Idem), r.KeyID, r.Idem
	}
	return r, nil
}

// seqLen is the length of an idem bucket value that is a records bucket key.
const seqLen = 8

// readRecord reads the record whose idem bucket key is k, wherever it lives;
// nil when there is none.
func readRecord(tx Tx, k []byte) (*recordRec, error) {
	v, err := tx.Get(BucketIdem, k)
	if err != nil || v == nil {
		return nil, err
	}
	var seq uint64
	if len(v) == seqLen {
		seq = binary.BigEndian.Uint64(v)
		if v, err = tx.Get(BucketRecords, v); err != nil {
			return nil, err
		}
		if v == nil {
			return nil, fmt.Errorf("idempotency record %x points at record %d, which is missing: %w", k, seq, vault.ErrStorage)
		}
	}
	r, err := decodeRecord(k, v)
	if err != nil {
		return nil, err
	}
	r.seq = seq
	return r, nil
}

// forEachRecord calls fn with every idempotency record and its idem bucket
// key, those kept in place and those appended.
func forEachRecord(tx Tx, fn func(k []byte, r *recordRec) error) error {
	err := forEach(tx, BucketIdem, func(k, v []byte) error {
		if len(v) == seqLen {
			return nil // appended: read below
		}
		r, err := decodeRecord(k, v)
		if err != nil {
			return err
		}
		return fn(k, r)
	})
	if err != nil {
		return err
	}
	return forEach(tx, BucketRecords, func(k, v []byte) error {
		r, err := decodeRecord(k, v)
		if err != nil {
			return err
		}
		if len(k) != seqLen {
			return fmt.Errorf("record key %x: %w", k, vault.ErrStorage)
		}
		r.seq = binary.BigEndian.Uint64(k)
		return fn(recordKey(r.KeyID, r.Idem), r)
	})
}

// getRecord returns the record of (keyID, idem), nil when there is none.
func getRecord(tx Tx, keyID, idem string) (*recordRec, error) {
	return getRecordAt(tx, recordKey(keyID, idem), keyID, idem)
}

// getRecordAt is getRecord for a caller that has k, recordKey(keyID, idem).
func getRecordAt(tx Tx, k []byte, keyID, idem string) (*recordRec, error) {
	r, err := readRecord(tx, k)
	if err != nil || r == nil {
		return nil, err
	}
	if r.KeyID != keyID || r.Idem != idem {
		// Two pairs with one 128-bit hash: refuse rather than mix them up.
		return nil, fmt.Errorf("idempotency record of %s collides with one of %s: %w", keyID, r.KeyID, vault.ErrConflict)
	}
	r.key = k
	return r, nil
}

// getRecordByHold returns the record a hold belongs to (ErrNotFound).
func getRecordByHold(tx Tx, holdID string) (*recordRec, error) {
	k, ok := recordKeyOfHold(holdID)
	if !ok {
		return nil, fmt.Errorf("hold %q: %w", holdID, vault.ErrNotFound)
	}
	r, err := readRecord(tx, k)
	if err != nil {
		return nil, err
	}
	if r == nil || r.Hold == nil || r.Hold.ID != holdID {
		return nil, fmt.Errorf("hold %s: %w", holdID, vault.ErrNotFound)
	}
	return r, nil
}

// putRecord writes the record and, when it has a hold, the hold's index entry (its
// value is the hold's state, so ListHolds filters without decoding records).
func putRecord(tx Tx, r *recordRec) error {
	k := r.idemKey()
	var err error
	if r.seq != 0 {
		err = tx.Put(BucketRecords, u64(r.seq), encodeRecord(r))
	} else {
		err = tx.Put(BucketIdem, k, encodeRecord(r))
	}
	if err != nil {
		return fmt.Errorf("put idempotency record: %w", err)
	}
	return putIndexes(tx, k, r)
}

// putIndexes writes the index entries of the record r stored under k: its
// hold's, and whether it is in flight or waits for the reaper.
func putIndexes(tx Tx, k []byte, r *recordRec) error {
	if err := putHoldIndex(tx, r); err != nil {
		return err
	}
	var err error
	if r.State == vault.RecordInProgress {
		err = tx.Put(BucketInflight, k, u64(uint64(r.LeaseUntil.UnixNano())))
	} else {
		err = tx.Delete(BucketInflight, k)
	}
	if err == nil && reapable(r) {
		err = tx.Put(BucketCompletions, completionKey(k, r), indexMark)
	}
	if err != nil {
		return fmt.Errorf("index idempotency record: %w", err)
	}
	return nil
}

// indexMark is the value of an index entry whose key says it all.
var indexMark = []byte{1}

// reapable reports whether the reaper removes r once its replay window has
// passed: a completed record, unless an operator resolved it (kept for good).
func reapable(r *recordRec) bool { return r.State == vault.RecordCompleted && !r.Resolved }

// doneAt is when r was completed (records of the first versions may lack it).
func doneAt(r *recordRec) time.Time {
	if r.CompletedAt.IsZero() {
		return r.UpdatedAt
	}
	return r.CompletedAt
}

// completionKey is the completions index key of r, stored under k.
func completionKey(k []byte, r *recordRec) []byte {
	return append(u64(uint64(doneAt(r).UnixNano())), k...)
}

// insertRecord writes a new record (a fresh claim of its idempotency key) and
// its hold's index entry: like putRecord, but the record's key must be free
// (Tx.Insert), so that no two claims of one idempotency key can both commit.
func insertRecord(tx Tx, r *recordRec, appendOrder bool) error {
	k := r.idemKey()
	v := encodeRecord(r)
	if appendOrder {
		seq, err := tx.NextSequence(BucketRecords)
		if err != nil {
			return fmt.Errorf("record sequence: %w", err)
		}
		if err := tx.Put(BucketRecords, u64(seq), v); err != nil {
			return fmt.Errorf("insert idempotency record: %w", err)
		}
		r.seq, v = seq, u64(seq)
	}
	if err := tx.Insert(BucketIdem, k, v); err != nil {
		return fmt.Errorf("insert idempotency record: %w", err)
	}
	return putIndexes(tx, k, r)
}

// putHoldIndex writes the index entry of r's hold, if it has one: its value is
// the hold's state, so ListHolds filters without decoding records.
func putHoldIndex(tx Tx, r *recordRec) error {
	if r.Hold == nil {
		return nil
	}
	if err := tx.Put(BucketHoldIndex, holdIndexKey(r.Hold), []byte(r.Hold.State)); err != nil {
		return fmt.Errorf("put hold index %s: %w", r.Hold.ID, err)
	}
	return nil
}

// deleteRecord deletes the record and its index entries.
func deleteRecord(tx Tx, r *recordRec) error {
	k := r.idemKey()
	if err := tx.Delete(BucketIdem, k); err != nil {
		return fmt.Errorf("delete idempotency record: %w", err)
	}
	if r.seq != 0 {
		if err := tx.Delete(BucketRecords, u64(r.seq)); err != nil {
			return fmt.Errorf("delete idempotency record: %w", err)
		}
	}
	if err := tx.Delete(BucketInflight, k); err != nil {
		return fmt.Errorf("delete idempotency record: %w", err)
	}
	if reapable(r) {
		if err := tx.Delete(BucketCompletions, completionKey(k, r)); err != nil {
			return fmt.Errorf("delete idempotency record: %w", err)
		}
	}
	if r.Hold == nil {
		return nil
	}
	if err := tx.Delete(BucketHoldIndex, holdIndexKey(r.Hold)); err != nil {
		return fmt.Errorf("delete hold index %s: %w", r.Hold.ID, err)
	}
	return nil
}

// publicRecord turns a stored record into an IdempotencyRecord, unsealing its
// response.
func (s *Engine) publicRecord(r *recordRec) (vault.IdempotencyRecord, error) {
	keyID, idem := r.KeyID, r.Idem
	out := vault.IdempotencyRecord{
		KeyID: keyID, IdempotencyKey: idem, Fingerprint: r.Fingerprint, UpstreamKey: r.UpstreamKey,
		State: r.State, LeaseUntil: r.LeaseUntil, HoldID: r.holdID(), RequestID: r.RequestID, Resolved: r.Resolved,
		ApprovalID: r.ApprovalID,
		CreatedAt:  r.CreatedAt, UpdatedAt: r.UpdatedAt, CompletedAt: r.CompletedAt,
	}
	if r.Response != nil {
		resp := &vault.StoredResponse{Status: r.Response.Status, Header: r.Response.Header.Clone()}
		if r.Response.SealedBody != nil {
			body, err := s.openBody(r.Response, keyID, idem)
			if err != nil {
				return vault.IdempotencyRecord{}, fmt.Errorf("stored response of %s: %w", keyID, err)
			}
			resp.Body = body
		}
		out.Response = resp
	}
	return out, nil
}

// sealResponse prepares a response for storage: its body compressed when that
// pays (see compressBody) and sealed, bound to its record and to how it was
// compressed.
func (s *Engine) sealResponse(keyID, idem string, resp *vault.StoredResponse) (*responseRec, error) {
	if resp == nil {
		return nil, nil
	}
	out := &responseRec{Status: resp.Status, Header: resp.Header.Clone()}
	if resp.Body != nil {
		body, codec := compressBody(resp.Body)
		sealed, err := s.seal.seal(body, responseAD(keyID, idem, codec))
		if err != nil {
			return nil, err
		}
		out.SealedBody, out.Codec = sealed, codec
	}
	return out, nil
}

// sealRequest seals a request kept with an unknown outcome, bound to its
// record.
func (s *Engine) sealRequest(keyID, idem string, req *vault.StoredRequest) ([]byte, error) {
	if req == nil {
		return nil, nil
	}
	pt, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	return s.seal.seal(pt, requestAD(keyID, idem))
}

// openRequest unseals a request sealRequest sealed.
func (s *Engine) openRequest(r *recordRec) (vault.StoredRequest, error) {
	pt, err := s.seal.open(r.SealedRequest, requestAD(r.KeyID, r.Idem))
	if err != nil {
		return vault.StoredRequest{}, err
	}
	var out vault.StoredRequest
	if err := json.Unmarshal(pt, &out); err != nil {
		return vault.StoredRequest{}, fmt.Errorf("stored request: %w", vault.ErrStorage)
	}
	return out, nil
}

// openBody unseals and decompresses a stored response's body.
func (s *Engine) openBody(r *responseRec, keyID, idem string) ([]byte, error) {
	body, err := s.seal.open(r.SealedBody, responseAD(keyID, idem, r.Codec))
	if err != nil {
		return nil, err
	}
	return decompressBody(body, r.Codec)
}

// holdRec is a hold as stored inside its record; ID, KeyID and IdempotencyKey come
// from the record.
type holdRec struct {
	ID             string            `json:"-"`
	KeyID          string            `json:"-"`
	IdempotencyKey string            `json:"-"`
	Operation      string            `json:"op"`
	Currency       string            `json:"cur,omitempty"`
	Amount         int64             `json:"amt"`
	WindowIDs      []policy.WindowID `json:"w"`
	State          vault.HoldState   `json:"st"`
	CreatedAt      time.Time         `json:"c"`
	SettledAt      time.Time         `json:"s,omitzero"`
}

func (h *holdRec) public() vault.Hold {
	return vault.Hold{
		ID: h.ID, KeyID: h.KeyID, IdempotencyKey: h.IdempotencyKey, Operation: h.Operation,
		Currency: h.Currency, Amount: h.Amount, WindowIDs: append([]policy.WindowID(nil), h.WindowIDs...),
		State: h.State, CreatedAt: h.CreatedAt, SettledAt: h.SettledAt,
	}
}

func holdIndexKey(h *holdRec) []byte {
	k := make([]byte, 0, 8+len(h.ID))
	k = append(k, u64(uint64(h.CreatedAt.UnixNano()))...)
	return append(k, h.ID...)
}

// eventRec is an Event as stored: short names, empty fields left out. The id is
// the bucket key's sequence.
type eventRec struct {
	Time            time.Time         `json:"t"`
	KeyID           string            `json:"k"`
	Operation       string            `json:"op,omitempty"`
	Amount          int64             `json:"amt,omitempty"`
	Currency        string            `json:"cur,omitempty"`
	Decision        vault.Decision    `json:"d"`
	Reason          string            `json:"r,omitempty"`
	HoldID          string            `json:"h,omitempty"`
	HoldState       vault.HoldState   `json:"hs,omitempty"`
	UpstreamStatus  int               `json:"us,omitempty"`
	StripeRequestID string            `json:"rid,omitempty"`
	ObjectID        string            `json:"obj,omitempty"`
	Tool            string            `json:"tool,omitempty"`
	WindowIDs       []policy.WindowID `json:"w,omitempty"`
	HeldDelta       int64             `json:"dh,omitempty"`
	CommittedDelta  int64             `json:"dc,omitempty"`
	AllowanceDeltas []int64           `json:"da,omitempty"`
}

// putEvent appends an event to its key's ledger, assigning its id: its key is
// the key id and a NUL (idemKey's, in one allocation), then the sequence.
func putEvent(tx Tx, e *vault.Event) error {
	if err := tx.Append(BucketEvents, idemKey(e.KeyID, ""), encodeEvent(e)); err != nil {
		return fmt.Errorf("append event: %w", err)
	}
	return nil
}

// decodeEvent decodes a stored event, binary or JSON (see codec.go); k is its
// events bucket key.
func decodeEvent(k, v []byte) (vault.Event, error) {
	if len(k) < 9 {
		return vault.Event{}, fmt.Errorf("event key %q: %w", k, vault.ErrStorage)
	}
	var e vault.Event
	if isJSON(v) {
		var r eventRec
		if err := decodeJSON(k, v, &r); err != nil {
			return vault.Event{}, err
		}
		e = vault.Event{
			Time: r.Time, KeyID: r.KeyID,
			Operation: r.Operation, Amount: r.Amount, Currency: r.Currency, Decision: r.Decision, Reason: r.Reason,
			HoldID: r.HoldID, HoldState: r.HoldState, UpstreamStatus: r.UpstreamStatus,
			StripeRequestID: r.StripeRequestID, ObjectID: r.ObjectID, Tool: r.Tool, WindowIDs: r.WindowIDs,
			HeldDelta: r.HeldDelta, CommittedDelta: r.CommittedDelta, AllowanceDeltas: r.AllowanceDeltas,
		}
	} else {
		var err error
		if e, err = decodeEventBinary(k, v); err != nil {
			return vault.Event{}, err
		}
	}
	e.ID = seqID("evt_", binary.BigEndian.Uint64(k[len(k)-8:]))
	return e, nil
}

// putAudit appends an audit entry, assigning its id. before and after are encoded
// to JSON here (nil stays empty).
func putAudit(tx Tx, now time.Time, actor, action, target string, before, after any) error {
	seq, err := tx.NextSequence(BucketAudit)
	if err != nil {
		return fmt.Errorf("audit sequence: %w", err)
	}
	e := vault.AuditEntry{ID: seqID("aud_", seq), Time: now, Actor: actor, Action: action, Target: target}
	if before != nil {
		if e.Before, err = json.Marshal(before); err != nil {
			return fmt.Errorf("encode audit before: %w", err)
		}
	}
	if after != nil {
		if e.After, err = json.Marshal(after); err != nil {
			return fmt.Errorf("encode audit after: %w", err)
		}
	}
	return putJSON(tx, BucketAudit, u64(seq), &e)
}
