package engine

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// The binary encodings of the values the hot path writes: idempotency records
// (with their hold and stored answer), ledger events and money objects. Schema
// version 1 stored them as JSON; version 2 writes them in these encodings,
// which cost a fraction of encoding/json's time and allocations and keep a
// sealed answer as bytes rather than base64. A value's first byte tells the
// two apart: JSON starts with '{', a binary value with its format tag. Values
// written as JSON stay readable, so an upgraded store needs no rewrite.
//
// Each value is its tag, then its fields in a fixed order: integers as
// varints, strings and byte strings with a uvarint length, times as the
// varint of their Unix nanoseconds (0 for the zero time), a list as its
// uvarint length and its items. A field added later goes at the end under a
// new tag.

// Format tags, the first byte of a binary value.
const (
	tagRecord byte = 1
	tagEvent  byte = 1
	tagObject byte = 1
)

// isJSON reports whether a stored value is in schema version 1's JSON.
func isJSON(v []byte) bool { return len(v) > 0 && v[0] == '{' }

// writer appends a binary value.
type writer struct{ b []byte }

func (w *writer) byte(v byte)    { w.b = append(w.b, v) }
func (w *writer) uint(v uint64)  { w.b = binary.AppendUvarint(w.b, v) }
func (w *writer) int(v int64)    { w.b = binary.AppendVarint(w.b, v) }
func (w *writer) bytes(v []byte) { w.uint(uint64(len(v))); w.b = append(w.b, v...) }
func (w *writer) str(v string)   { w.uint(uint64(len(v))); w.b = append(w.b, v...) }
func (w *writer) bool(v bool) {
	if v {
		w.byte(1)
	} else {
		w.byte(0)
	}
}

func (w *writer) time(t time.Time) {
	if t.IsZero() {
		w.int(0)
		return
	}
	w.int(t.UnixNano())
}

func (w *writer) strs(v []string) {
	w.uint(uint64(len(v)))
	for _, s := range v {
		w.str(s)
	}
}

// windowIDs writes window ids as the bare strings they have always been
// stored as.
func (w *writer) windowIDs(v []policy.WindowID) {
	w.uint(uint64(len(v)))
	for _, s := range v {
		w.str(string(s))
	}
}

func (w *writer) ints(v []int64) {
	w.uint(uint64(len(v)))
	for _, n := range v {
		w.int(n)
	}
}

// reader reads a binary value; the first malformed field sets err, and every
// later read returns a zero value.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail() {
	if r.err == nil {
		r.err = fmt.Errorf("truncated or malformed value: %w", vault.ErrStorage)
	}
	r.b = nil
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		r.fail()
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) uint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) int() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a length, which cannot exceed the bytes left (each item takes
// at least one).
func (r *reader) count() int {
	n := r.uint()
	if n > uint64(len(r.b)) {
		r.fail()
		return 0
	}
	return int(n)
}

// bytes reads a byte string, copied out of the transaction's memory; nil when
// empty.
func (r *reader) bytes() []byte {
	n := r.count()
	if n == 0 {
		return nil
	}
	v := make([]byte, n)
	copy(v, r.b)
	r.b = r.b[n:]
	return v
}

func (r *reader) str() string {
	n := r.count()
	v := string(r.b[:n])
	r.b = r.b[n:]
	return v
}

func (r *reader) bool() bool { return r.byte() == 1 }

func (r *reader) time() time.Time {
	ns := r.int()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

func (r *reader) strs() []string {
	n := r.count()
	if n == 0 {
		return nil
	}
	out := make([]string, n)
	for i := range out {
		out[i] = r.str()
	}
	return out
}

// windowIDs reads what writer.windowIDs wrote (the same bytes as strs).
func (r *reader) windowIDs() []policy.WindowID {
	n := r.count()
	if n == 0 {
		return nil
	}
	out := make([]policy.WindowID, n)
	for i := range out {
		out[i] = policy.WindowID(r.str())
	}
	return out
}

func (r *reader) ints() []int64 {
	n := r.count()
	if n == 0 {
		return nil
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = r.int()
	}
	return out
}

// done checks that the whole value was read.
func (r *reader) done(tag string, k []byte) error {
	if r.err == nil && len(r.b) != 0 {
		r.fail()
	}
	if r.err != nil {
		return fmt.Errorf("decode %s %q: %w", tag, k, r.err)
	}
	return nil
}

// open starts reading the binary value v, which must carry tag.
func open(v []byte, tag byte) *reader {
	r := &reader{b: v}
	if r.byte() != tag {
		r.fail()
	}
	return r
}

// Record flags.
const (
	recFresh byte = 1 << iota
	recResolved
	recHold
	recResponse
	recApproval // the approval id follows the response
	recRequest  // the sealed request of an unknown outcome follows
)

// encodeRecord is the binary encoding of r.
func encodeRecord(r *recordRec) []byte {
	w := &writer{b: make([]byte, 0, 256+recordBodyLen(r))}
	w.byte(tagRecord)
	w.str(r.KeyID)
	w.str(r.Idem)
	w.str(r.Fingerprint)
	w.str(r.UpstreamKey)
	w.str(string(r.State))
	w.time(r.LeaseUntil)
	w.time(r.CreatedAt)
	w.time(r.UpdatedAt)
	w.time(r.CompletedAt)
	w.str(r.RequestID)
	var flags byte
	if r.Fresh {
		flags |= recFresh
	}
	if r.Resolved {
		flags |= recResolved
	}
	if r.Hold != nil {
		flags |= recHold
	}
	if r.Response != nil {
		flags |= recResponse
	}
	if r.ApprovalID != "" {
		flags |= recApproval
	}
	keepRequest := r.State == vault.RecordUnknown && len(r.SealedRequest) > 0
	if keepRequest {
		flags |= recRequest
	}
	w.byte(flags)
	if h := r.Hold; h != nil {
		w.str(h.Operation)
		w.str(h.Currency)
		w.int(h.Amount)
		w.windowIDs(h.WindowIDs)
		w.str(string(h.State))
		w.time(h.CreatedAt)
		w.time(h.SettledAt)
	}
	if resp := r.Response; resp != nil {
		w.uint(uint64(resp.Status))
		w.uint(uint64(len(resp.Header)))
		for name, vals := range resp.Header {
			w.str(name)
			w.strs(vals)
		}
		w.byte(resp.Codec)
		w.bytes(resp.SealedBody)
	}
	if r.ApprovalID != "" {
		w.str(r.ApprovalID)
	}
	if keepRequest {
		w.bytes(r.SealedRequest)
	}
	return w.b
}

func recordBodyLen(r *recordRec) int {
	if r.Response == nil {
		return 0
	}
	return len(r.Response.SealedBody)
}

// decodeRecordBinary decodes a record written by encodeRecord.
func decodeRecordBinary(k, v []byte) (*recordRec, error) {
	rd := open(v, tagRecord)
	r := &recordRec{
		KeyID: rd.str(), Idem: rd.str(), Fingerprint: rd.str(), UpstreamKey: rd.str(),
		State: vault.RecordState(rd.str()), LeaseUntil: rd.time(), CreatedAt: rd.time(), UpdatedAt: rd.time(),
		CompletedAt: rd.time(), RequestID: rd.str(),
	}
	flags := rd.byte()
	r.Fresh, r.Resolved = flags&recFresh != 0, flags&recResolved != 0
	if flags&recHold != 0 {
		r.Hold = &holdRec{
			Operation: rd.str(), Currency: rd.str(), Amount: rd.int(), WindowIDs: rd.windowIDs(),
			State: vault.HoldState(rd.str()), CreatedAt: rd.time(), SettledAt: rd.time(),
		}
	}
	if flags&recResponse != 0 {
		resp := &responseRec{Status: int(rd.uint())}
		if n := rd.count(); n > 0 {
			resp.Header = make(http.Header, n)
			for range n {
				name := rd.str()
				resp.Header[name] = rd.strs()
			}
		}
		resp.Codec = rd.byte()
		resp.SealedBody = rd.bytes()
		r.Response = resp
	}
	if flags&recApproval != 0 {
		r.ApprovalID = rd.str()
	}
	if flags&recRequest != 0 {
		r.SealedRequest = rd.bytes()
	}
	return r, rd.done("record", k)
}

// encodeEvent is the binary encoding of an event (its id is its key's
// sequence).
func encodeEvent(e *vault.Event) []byte {
	w := &writer{b: make([]byte, 0, 160)}
	w.byte(tagEvent)
	w.time(e.Time)
	w.str(e.KeyID)
	w.str(e.Operation)
	w.int(e.Amount)
	w.str(e.Currency)
	w.str(string(e.Decision))
	w.str(e.Reason)
	w.str(e.HoldID)
	w.str(string(e.HoldState))
	w.int(int64(e.UpstreamStatus))
	w.str(e.StripeRequestID)
	w.str(e.ObjectID)
	w.str(e.Tool)
	w.windowIDs(e.WindowIDs)
	w.int(e.HeldDelta)
	w.int(e.CommittedDelta)
	w.ints(e.AllowanceDeltas)
	// Last, so that an event written before it had the field decodes too.
	w.str(e.IdempotencyKey)
	if e.Scope != "" {
		w.str(e.Scope) // after it, for the same reason
	}
	return w.b
}

// decodeEventBinary decodes an event written by encodeEvent, without its id.
func decodeEventBinary(k, v []byte) (vault.Event, error) {
	rd := open(v, tagEvent)
	e := vault.Event{
		Time: rd.time(), KeyID: rd.str(), Operation: rd.str(), Amount: rd.int(), Currency: rd.str(),
		Decision: vault.Decision(rd.str()), Reason: rd.str(), HoldID: rd.str(), HoldState: vault.HoldState(rd.str()),
		UpstreamStatus: int(rd.int()), StripeRequestID: rd.str(), ObjectID: rd.str(), Tool: rd.str(),
		WindowIDs: rd.windowIDs(), HeldDelta: rd.int(), CommittedDelta: rd.int(), AllowanceDeltas: rd.ints(),
	}
	if rd.err == nil && len(rd.b) > 0 {
		e.IdempotencyKey = rd.str()
	}
	if rd.err == nil && len(rd.b) > 0 {
		e.Scope = rd.str()
	}
	return e, rd.done("event", k)
}

// encodeObject is the binary encoding of a money object's record.
func encodeObject(o *objectRec) []byte {
	w := &writer{b: make([]byte, 0, 64+48*len(o.Parts))}
	w.byte(tagObject)
	w.int(o.Amount)
	w.uint(uint64(len(o.Parts)))
	for _, p := range o.Parts {
		w.str(p.HoldID)
		w.windowIDs(p.WindowIDs)
		w.int(p.Amount)
		w.time(p.CreatedAt)
	}
	w.int(o.Moved)
	w.bool(o.MovedSeen)
	w.bool(o.Own)
	w.bool(o.Closed)
	w.str(o.Currency)
	w.time(o.UpdatedAt)
	w.str(o.StripeAccount)
	w.str(o.StripeContext)
	w.time(o.CreatedAt)
	w.time(o.Touched)
	return w.b
}

// decodeObject decodes a money object's record, binary or JSON.
func decodeObject(k, v []byte) (*objectRec, error) {
	if isJSON(v) {
		var o objectRec
		err := decodeJSON(k, v, &o)
		return &o, err
	}
	rd := open(v, tagObject)
	o := &objectRec{Amount: rd.int()}
	if n := rd.count(); n > 0 {
		o.Parts = make([]exposurePart, n)
		for i := range o.Parts {
			o.Parts[i] = exposurePart{HoldID: rd.str(), WindowIDs: rd.windowIDs(), Amount: rd.int(), CreatedAt: rd.time()}
		}
	}
	o.Moved, o.MovedSeen, o.Own, o.Closed = rd.int(), rd.bool(), rd.bool(), rd.bool()
	o.Currency, o.UpdatedAt = rd.str(), rd.time()
	o.StripeAccount, o.StripeContext, o.CreatedAt = rd.str(), rd.str(), rd.time()
	if rd.err == nil && len(rd.b) > 0 {
		o.Touched = rd.time() // written since the stale list is kept
	}
	return o, rd.done("object", k)
}
