package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// raiseRequestPrefix starts every raise request id.
const raiseRequestPrefix = "rr_"

// raiseRequestRec is a raise request as stored.
type raiseRequestRec struct {
	ID        string                  `json:"id"`
	KeyID     string                  `json:"key_id"`
	KeyName   string                  `json:"key_name"`
	Window    policy.WindowKind       `json:"window"`
	Amount    int64                   `json:"amount"`
	Currency  string                  `json:"currency"`
	Until     time.Time               `json:"until"`
	Reason    string                  `json:"reason,omitempty"`
	State     vault.RaiseRequestState `json:"state"`
	CreatedAt time.Time               `json:"created_at"`
	DecidedAt time.Time               `json:"decided_at,omitzero"`
	DecidedBy string                  `json:"decided_by,omitempty"`
	Note      string                  `json:"note,omitempty"`
	RaiseID   string                  `json:"raise_id,omitempty"`
}

func (r *raiseRequestRec) public() vault.RaiseRequest {
	return vault.RaiseRequest{
		ID: r.ID, KeyID: r.KeyID, KeyName: r.KeyName, Window: r.Window, Amount: r.Amount, Currency: r.Currency,
		Until: r.Until, Reason: r.Reason, State: r.State, CreatedAt: r.CreatedAt, DecidedAt: r.DecidedAt,
		DecidedBy: r.DecidedBy, Note: r.Note, RaiseID: r.RaiseID,
	}
}

// keyActor is the audit's actor for what a vault key did itself.
func keyActor(keyID string) string { return "vault_key:" + keyID }

func getRaiseRequest(tx Tx, id string) (*raiseRequestRec, error) {
	if !strings.HasPrefix(id, raiseRequestPrefix) {
		return nil, fmt.Errorf("raise request %q: %w", id, vault.ErrNotFound)
	}
	var r raiseRequestRec
	ok, err := getJSON(tx, BucketRaiseRequests, []byte(id), &r)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("raise request %s: %w", id, vault.ErrNotFound)
	}
	return &r, nil
}

// newRaiseRequestID returns "rr_" + 26 base32 characters of a millisecond
// timestamp and random bits, after the newest id stored, so that ids sort by
// creation.
func newRaiseRequestID(tx Tx, now time.Time) (string, error) {
	var newest []byte
	if last, _ := tx.Cursor(BucketRaiseRequests).Last(); last != nil {
		if raw, err := lowerBase32.DecodeString(strings.TrimPrefix(string(last), raiseRequestPrefix)); err == nil {
			newest = raw
		}
	}
	raw, err := newKeyIDRaw(now, newest)
	if err != nil {
		return "", err
	}
	return raiseRequestPrefix + lowerBase32.EncodeToString(raw), nil
}

// countPending counts key id's pending raise requests. The caller holds the
// key's lock, so the count is exact against every other request of the key.
func countPending(tx Tx, keyID string) int {
	prefix := idemKey(keyID, "")
	n := 0
	c := tx.Cursor(BucketRaisePending)
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		n++
	}
	return n
}

func requestRaiseTx(tx Tx, now time.Time, keyID string, nr vault.NewRaise) (vault.RaiseRequest, error) {
	key, err := getKey(tx, keyID) // locks the key
	if err != nil {
		return vault.RaiseRequest{}, err
	}
	if key.Status == vault.KeyRevoked {
		return vault.RaiseRequest{}, fmt.Errorf("key %s: %w", keyID, vault.ErrKeyRevoked)
	}
	if err := checkNewRaise(nr, &key.Policy, now); err != nil {
		return vault.RaiseRequest{}, err
	}
	if n := countPending(tx, keyID); n >= vault.MaxPendingRaiseRequests {
		return vault.RaiseRequest{}, fmt.Errorf("key %s has %d raise requests pending, the most there may be: %w", keyID, n, vault.ErrConflict)
	}
	id, err := newRaiseRequestID(tx, now)
	if err != nil {
		return vault.RaiseRequest{}, err
	}
	r := &raiseRequestRec{
		ID: id, KeyID: keyID, KeyName: key.Name, Window: nr.Window, Amount: nr.Amount,
		Currency: key.Policy.EffectiveCurrency(), Until: nr.Until.UTC(), Reason: nr.Reason,
		State: vault.RaiseRequestPending, CreatedAt: now,
	}
	if err := insertJSON(tx, BucketRaiseRequests, []byte(id), r); err != nil {
		return vault.RaiseRequest{}, err
	}
	if err := tx.Insert(BucketRaisePending, idemKey(keyID, id), []byte{}); err != nil {
		return vault.RaiseRequest{}, fmt.Errorf("index pending raise request: %w", err)
	}
	if err := putAudit(tx, now, keyActor(keyID), "raise_request.create", id, nil, r); err != nil {
		return vault.RaiseRequest{}, err
	}
	if err := emitRaiseRequest(tx, now, vault.EventRaiseRequestCreated, r); err != nil {
		return vault.RaiseRequest{}, err
	}
	return r.public(), nil
}

// raiseRequestEventData is the data of the raise_request.created and
// raise_request.decided events (docs/webhooks.md).
type raiseRequestEventData struct {
	ID        string            `json:"raise_request_id"`
	Scope     Scope             `json:"scope"`
	Window    policy.WindowKind `json:"window"`
	Amount    string            `json:"amount"`
	Currency  string            `json:"currency"`
	Until     time.Time         `json:"until"`
	Reason    string            `json:"reason"`
	State     string            `json:"state,omitempty"`
	DecidedBy string            `json:"decided_by,omitempty"`
	Note      string            `json:"note,omitempty"`
}

// emitRaiseRequest writes the event typ about r into the outbox of tx, the
// transaction that made the change it reports.
func emitRaiseRequest(tx Tx, now time.Time, typ string, r *raiseRequestRec) error {
	d := raiseRequestEventData{
		ID: r.ID, Scope: Scope{Kind: policy.ScopeKey, ID: r.KeyID, Name: r.KeyName}, Window: r.Window,
		Amount: policy.FormatMinor(r.Currency, r.Amount), Currency: r.Currency, Until: r.Until, Reason: r.Reason,
	}
	if typ == vault.EventRaiseRequestDecided {
		d.State, d.DecidedBy, d.Note = string(r.State), r.DecidedBy, r.Note
	}
	_, err := EmitEvent(tx, now, typ, d)
	return err
}

func (s *Engine) decideRaiseRequestTx(tx Tx, now time.Time, actor, id string, approve bool, note string) (vault.RaiseRequest, error) {
	if len(note) > vault.MaxRaiseReasonLen {
		return vault.RaiseRequest{}, raiseInvalid("note", fmt.Sprintf("must be at most %d bytes", vault.MaxRaiseReasonLen))
	}
	r, err := getRaiseRequest(tx, id)
	if err != nil {
		return vault.RaiseRequest{}, err
	}
	// Under the key's lock, read the request again: of two decisions at once
	// the second sees the first's.
	if err := tx.LockKey(r.KeyID); err != nil {
		return vault.RaiseRequest{}, err
	}
	if r, err = getRaiseRequest(tx, id); err != nil {
		return vault.RaiseRequest{}, err
	}
	if r.State != vault.RaiseRequestPending {
		return vault.RaiseRequest{}, fmt.Errorf("raise request %s was %s by %s: %w", id, r.State, r.DecidedBy, vault.ErrConflict)
	}
	before := *r
	r.DecidedAt, r.DecidedBy, r.Note = now, actor, note
	action := "raise_request.decline"
	r.State = vault.RaiseRequestDeclined
	if approve {
		action, r.State = "raise_request.approve", vault.RaiseRequestApproved
		raise, err := addRaiseTx(tx, now, actor, vault.RaiseScope{Kind: policy.ScopeKey, ID: r.KeyID}, vault.NewRaise{Window: r.Window, Amount: r.Amount, Until: r.Until, Reason: r.Reason}, r.ID)
		if err != nil {
			return vault.RaiseRequest{}, err
		}
		r.RaiseID = raise.ID
	}
	if err := putJSON(tx, BucketRaiseRequests, []byte(id), r); err != nil {
		return vault.RaiseRequest{}, err
	}
	if err := tx.Delete(BucketRaisePending, idemKey(r.KeyID, id)); err != nil {
		return vault.RaiseRequest{}, fmt.Errorf("unindex pending raise request: %w", err)
	}
	if err := putAudit(tx, now, actor, action, id, &before, r); err != nil {
		return vault.RaiseRequest{}, err
	}
	if err := emitRaiseRequest(tx, now, vault.EventRaiseRequestDecided, r); err != nil {
		return vault.RaiseRequest{}, err
	}
	return r.public(), nil
}

func listRaiseRequestsTx(tx Tx, state vault.RaiseRequestState, limit int, cursor string) ([]vault.RaiseRequest, string, error) {
	switch state {
	case "", vault.RaiseRequestPending, vault.RaiseRequestApproved, vault.RaiseRequestDeclined:
	default:
		return nil, "", fmt.Errorf("raise request state %q: %w", state, vault.ErrInvalid)
	}
	start := []byte(raiseRequestPrefix + "~") // after every id: "~" sorts after base32
	if cursor != "" {
		before, err := decodeCursor(cursor)
		if err != nil {
			return nil, "", err
		}
		start = []byte(before)
	}
	return pageNewestFirst(tx, BucketRaiseRequests, []byte(raiseRequestPrefix), start, limit, newestFirst[vault.RaiseRequest]{
		decode: func(k, v []byte) (vault.RaiseRequest, error) {
			var r raiseRequestRec
			if err := decodeJSON(k, v, &r); err != nil {
				return vault.RaiseRequest{}, err
			}
			return r.public(), nil
		},
		keep: func(_, v []byte) bool {
			var only struct {
				State vault.RaiseRequestState `json:"state"`
			}
			return state == "" || (json.Unmarshal(v, &only) == nil && only.State == state)
		},
		cursor: func(k []byte, _ vault.RaiseRequest) string { return string(k) },
	})
}

// RequestRaise records a vault key asking for a raise (see
// vault.Store.RequestRaise).
func (s *Engine) RequestRaise(ctx context.Context, keyID string, nr vault.NewRaise) (vault.RaiseRequest, error) {
	var out vault.RaiseRequest
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		out, err = requestRaiseTx(tx, now, keyID, nr)
		return err
	})
	if err != nil {
		return vault.RaiseRequest{}, fmt.Errorf("request raise: %w", err)
	}
	return out, nil
}

// GetRaiseRequest returns one raise request.
func (s *Engine) GetRaiseRequest(ctx context.Context, id string) (vault.RaiseRequest, error) {
	var out vault.RaiseRequest
	err := s.view(ctx, func(tx Tx, _ time.Time) error {
		r, err := getRaiseRequest(tx, id)
		if err != nil {
			return err
		}
		out = r.public()
		return nil
	})
	if err != nil {
		return vault.RaiseRequest{}, fmt.Errorf("get raise request: %w", err)
	}
	return out, nil
}

// ListRaiseRequests lists raise requests newest first (see
// vault.Store.ListRaiseRequests).
func (s *Engine) ListRaiseRequests(ctx context.Context, state vault.RaiseRequestState, limit int, cursor string) ([]vault.RaiseRequest, string, error) {
	var (
		out  []vault.RaiseRequest
		next string
	)
	err := s.view(ctx, func(tx Tx, _ time.Time) error {
		var err error
		out, next, err = listRaiseRequestsTx(tx, state, limit, cursor)
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list raise requests: %w", err)
	}
	return out, next, nil
}

// DecideRaiseRequest approves or declines a pending raise request (see
// vault.Store.DecideRaiseRequest).
func (s *Engine) DecideRaiseRequest(ctx context.Context, actor, id string, approve bool, note string) (vault.RaiseRequest, error) {
	var out vault.RaiseRequest
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		out, err = s.decideRaiseRequestTx(tx, now, actor, id, approve, note)
		return err
	})
	if err != nil {
		return vault.RaiseRequest{}, fmt.Errorf("decide raise request: %w", err)
	}
	return out, nil
}
