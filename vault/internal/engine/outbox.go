package engine

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// The outbox: every event keybrake sends to webhook endpoints is written by
// EmitEvent in the transaction that caused it — one delivery entry per
// subscribed endpoint, carrying the exact body every attempt sends — so a
// rollback takes the event with it and a commit makes it durable with the
// change it reports. The deliverer claims due entries under a lease
// (ClaimDeliveries) and records each attempt (FinishDelivery).
//
//	webhooks       endpoint id → webhookRec (JSON; secrets sealed)
//	deliveries     endpoint id NUL seq (8 bytes BE) → deliveryRec (JSON)
//	delivery_due   due unix ns (8 bytes BE) + delivery key → empty: the
//	               pending deliveries in the order they are due
//	delivery_done  done unix ns (8 bytes BE) + delivery key → empty: the
//	               delivered and failed ones, for the pruner
//	event_marks    mark → until unix ns (8 bytes BE): an event that is sent
//	               once (per window instance, threshold…) was sent

// deliveryRec is one event's delivery to one endpoint.
type deliveryRec struct {
	ID        string              `json:"id"`
	WebhookID string              `json:"webhook_id"`
	EventID   string              `json:"event_id"`
	EventType string              `json:"event_type"`
	State     vault.DeliveryState `json:"state"`
	Attempts  int                 `json:"attempts"`
	// NextAt is when the delivery is due: its next attempt, or the end of
	// the lease of the attempt under way (Leased).
	NextAt time.Time `json:"next_at,omitzero"`
	Leased bool      `json:"leased,omitempty"`
	// LastTry says the attempt under way is the last: a retry an operator
	// asked for is one attempt.
	LastTry       bool            `json:"last_try,omitempty"`
	LastAttemptAt time.Time       `json:"last_attempt_at,omitzero"`
	LastStatus    int             `json:"last_status,omitempty"`
	LastError     string          `json:"last_error,omitempty"`
	CreatedAt     time.Time       `json:"created_at"`
	DoneAt        time.Time       `json:"done_at,omitzero"`
	Body          json.RawMessage `json:"body"`
}

func (r *deliveryRec) public() vault.Delivery {
	d := vault.Delivery{
		ID: r.ID, WebhookID: r.WebhookID, EventID: r.EventID, EventType: r.EventType, State: r.State,
		Attempts: r.Attempts, LastAttemptAt: r.LastAttemptAt, LastStatus: r.LastStatus, LastError: r.LastError,
		CreatedAt: r.CreatedAt, DoneAt: r.DoneAt,
	}
	if r.State == vault.DeliveryPending {
		d.NextAttemptAt = r.NextAt
	}
	return d
}

// deliveryKey is the deliveries key of the delivery seq of endpoint id.
func deliveryKey(webhookID string, seq uint64) []byte {
	k := make([]byte, 0, len(webhookID)+9)
	k = append(k, webhookID...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint64(k, seq)
}

// deliveryKeyOf is the key of the delivery id of endpoint webhookID.
func deliveryKeyOf(webhookID, id string) ([]byte, bool) {
	seq, ok := parseSeqID(deliveryIDPrefix, id)
	if !ok {
		return nil, false
	}
	return deliveryKey(webhookID, seq), true
}

const (
	deliveryIDPrefix = "dlv_"
	eventIDPrefix    = "msg_"
	webhookIDPrefix  = "wh_"
)

// timeKey is a unix-ns prefix followed by k: an index ordered by time.
func timeKey(t time.Time, k []byte) []byte {
	out := make([]byte, 0, 8+len(k))
	out = binary.BigEndian.AppendUint64(out, uint64(max(t.UnixNano(), 0)))
	return append(out, k...)
}

// putDelivery writes r under k with its due or done index entry; prev is the
// record as it was before (nil for a new one), whose index entry goes.
func putDelivery(tx Tx, k []byte, prev, r *deliveryRec) error {
	if prev != nil {
		if err := tx.Delete(BucketDeliveryDue, timeKey(prev.NextAt, k)); err != nil {
			return err
		}
		if !prev.DoneAt.IsZero() {
			if err := tx.Delete(BucketDeliveryDone, timeKey(prev.DoneAt, k)); err != nil {
				return err
			}
		}
	}
	switch r.State {
	case vault.DeliveryPending:
		if err := tx.Put(BucketDeliveryDue, timeKey(r.NextAt, k), indexMark); err != nil {
			return err
		}
	default:
		if err := tx.Put(BucketDeliveryDone, timeKey(r.DoneAt, k), indexMark); err != nil {
			return err
		}
	}
	return putJSON(tx, BucketDeliveries, k, r)
}

func getDelivery(tx Tx, k []byte) (*deliveryRec, error) {
	var r deliveryRec
	ok, err := getJSON(tx, BucketDeliveries, k, &r)
	if err != nil || !ok {
		return nil, err
	}
	return &r, nil
}

// eventBody is the JSON every attempt of an event sends.
type eventBody struct {
	Type      string    `json:"type"`
	Timestamp time.Time `json:"timestamp"`
	Data      any       `json:"data"`
}

// EmitEvent writes an event of type typ, with data as its "data", into the
// outbox in tx: a pending delivery, due at once, to every enabled endpoint
// subscribed to typ. It is how any rule that changes state reports it to
// operators: called in the transaction that makes the change, the event is
// durable exactly when the change is. data must encode to a JSON object;
// money in it is a decimal string in the currency's major unit. It returns
// the event's id ("" when no endpoint takes it).
func EmitEvent(tx Tx, now time.Time, typ string, data any) (string, error) {
	return emitTo(tx, now, typ, data, nil)
}

// EmitOnce is EmitEvent the first time mark is seen: mark (say "approval
// pending/apr_…") is recorded in tx until until, and while it is, another
// EmitOnce of it emits nothing. Two transactions that emit the same mark at
// once on PostgreSQL cannot both commit: the second runs again and finds the
// mark. emitted reports whether this call wrote the event.
func EmitOnce(tx Tx, now time.Time, mark string, until time.Time, typ string, data any) (emitted bool, err error) {
	return emitOnce(tx, now, mark, until, typ, data, nil)
}

func emitOnce(tx Tx, now time.Time, mark string, until time.Time, typ string, data any, match func(*webhookRec) bool) (bool, error) {
	v, err := tx.Get(BucketMarks, []byte(mark))
	if err != nil {
		return false, err
	}
	if v != nil {
		return false, nil
	}
	if err := tx.Insert(BucketMarks, []byte(mark), u64(uint64(max(until.UnixNano(), 0)))); err != nil {
		return false, fmt.Errorf("insert event mark: %w", err)
	}
	if _, err := emitTo(tx, now, typ, data, match); err != nil {
		return false, err
	}
	return true, nil
}

// emitTo is EmitEvent for the endpoints match accepts (nil: all).
func emitTo(tx Tx, now time.Time, typ string, data any, match func(*webhookRec) bool) (string, error) {
	hooks, err := readWebhooks(tx)
	if err != nil {
		return "", err
	}
	hooks = slices.DeleteFunc(hooks, func(h *webhookRec) bool {
		return h.Status != vault.WebhookEnabled || !h.Subscribes(typ) || (match != nil && !match(h))
	})
	if len(hooks) == 0 {
		return "", nil
	}
	body, err := json.Marshal(eventBody{Type: typ, Timestamp: now.UTC(), Data: data})
	if err != nil {
		return "", fmt.Errorf("encode %s event: %w", typ, err)
	}
	seq, err := tx.NextSequence(BucketDeliveries)
	if err != nil {
		return "", err
	}
	eventID := seqID(eventIDPrefix, seq)
	for _, h := range hooks {
		if _, err := newDelivery(tx, now, h.ID, eventID, typ, body); err != nil {
			return "", err
		}
	}
	return eventID, nil
}

func newDelivery(tx Tx, now time.Time, webhookID, eventID, typ string, body []byte) (*deliveryRec, error) {
	seq, err := tx.NextSequence(BucketDeliveries)
	if err != nil {
		return nil, err
	}
	r := &deliveryRec{
		ID: seqID(deliveryIDPrefix, seq), WebhookID: webhookID, EventID: eventID, EventType: typ,
		State: vault.DeliveryPending, NextAt: now, CreatedAt: now, Body: body,
	}
	return r, putDelivery(tx, deliveryKey(webhookID, seq), nil, r)
}

// webhookSecret is one signing secret, sealed; Until is when a rotated-out
// secret stops signing (zero for the current one).
type webhookSecret struct {
	Sealed []byte    `json:"sealed"`
	Until  time.Time `json:"until,omitzero"`
}

// webhookRec is an endpoint as stored.
type webhookRec struct {
	vault.Webhook
	Secrets []webhookSecret `json:"secrets"`
}

func webhookAD(id string) []byte { return []byte("keybrake/webhook\x00" + id) }

func (r *webhookRec) public(now time.Time) vault.Webhook {
	w := r.Webhook
	w.Events = slices.Clone(w.Events)
	w.Thresholds = slices.Clone(w.Thresholds)
	if !w.PreviousSecretUntil.After(now) {
		w.PreviousSecretUntil = time.Time{}
	}
	return w
}

func readWebhooks(tx Tx) ([]*webhookRec, error) {
	var out []*webhookRec
	err := forEach(tx, BucketWebhooks, func(k, v []byte) error {
		var r webhookRec
		if err := decodeJSON(k, v, &r); err != nil {
			return err
		}
		out = append(out, &r)
		return nil
	})
	return out, err
}

func getWebhook(tx Tx, id string) (*webhookRec, error) {
	var r webhookRec
	ok, err := getJSON(tx, BucketWebhooks, []byte(id), &r)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("webhook %s: %w", id, vault.ErrNotFound)
	}
	return &r, nil
}

// webhookCache keeps what the hot path needs of the endpoints — the
// thresholds subscribed to and whether anyone takes refusals — so that a
// Reserve does not read them. On a sole writer it is exact: every change of
// an endpoint goes through this engine, which forgets it. On a store shared
// by replicas it is read again after webhookCacheTTL, so an endpoint created
// on another replica takes part within that.
type webhookCache struct {
	mu       sync.Mutex
	gen      uint64
	valid    bool
	loaded   time.Time // wall clock, for the TTL
	cfg      hookConfig
	sole     bool
	marksMu  sync.Mutex
	marks    map[string]struct{} // marks known to be committed
	disabled bool                // tests: read every time
}

// hookConfig is the endpoints' demand, as the hot path sees it.
type hookConfig struct {
	thresholds []int // sorted, distinct
	refusals   bool
	velocity   bool
}

const webhookCacheTTL = 5 * time.Second

func (c *webhookCache) forget() {
	c.mu.Lock()
	c.gen++
	c.valid = false
	c.mu.Unlock()
}

// get returns the demand, reading it in tx when not known.
func (c *webhookCache) get(tx Tx) (hookConfig, error) {
	c.mu.Lock()
	if c.valid && !c.disabled && (c.sole || time.Since(c.loaded) < webhookCacheTTL) {
		cfg := c.cfg
		c.mu.Unlock()
		return cfg, nil
	}
	gen := c.gen
	c.mu.Unlock()
	hooks, err := readWebhooks(tx)
	if err != nil {
		return hookConfig{}, err
	}
	var cfg hookConfig
	for _, h := range hooks {
		if h.Status != vault.WebhookEnabled {
			continue
		}
		if h.Subscribes(vault.EventThresholdCrossed) {
			cfg.thresholds = append(cfg.thresholds, h.Thresholds...)
		}
		if h.Subscribes(vault.EventSpendCapRefused) {
			cfg.refusals = true
		}
		if h.Subscribes(vault.EventVelocityRefused) {
			cfg.velocity = true
		}
	}
	slices.Sort(cfg.thresholds)
	cfg.thresholds = slices.Compact(cfg.thresholds)
	c.mu.Lock()
	if c.gen == gen {
		c.cfg, c.valid, c.loaded = cfg, true, time.Now()
	}
	c.mu.Unlock()
	return cfg, nil
}

// knownMarks drops the marks this engine has seen committed, so that a
// request far past a threshold does not read them again.
func (c *webhookCache) knownMarks(marks []string) []string {
	c.marksMu.Lock()
	defer c.marksMu.Unlock()
	return slices.DeleteFunc(marks, func(m string) bool { _, ok := c.marks[m]; return ok })
}

// sawMarks remembers marks found in the store (committed: they stay until
// their window ends, long after any request that reads them).
func (c *webhookCache) sawMarks(marks []string) {
	c.marksMu.Lock()
	defer c.marksMu.Unlock()
	if c.marks == nil || len(c.marks) > 100_000 {
		c.marks = map[string]struct{}{}
	}
	for _, m := range marks {
		c.marks[m] = struct{}{}
	}
}

// markKey joins a mark's parts with NULs.
func markKey(parts ...string) string {
	var b bytes.Buffer
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(0)
		}
		b.WriteString(p)
	}
	return b.String()
}
