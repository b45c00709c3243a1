package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// An approval is one more state of a hold: the request's record is
// awaiting_approval, its hold held on every window (it counts against every
// cap), and nothing was forwarded. The approval itself lives in the approvals
// bucket under its id (JSON), and, while it still holds money and waits for
// someone (pending, approved), in approvals_open under its id with its expiry,
// which the reaper walks. Every change of an approval is written in the
// transaction that changes its record and hold, under the key's lock.

const approvalIDPrefix = "apr_"

// newApprovalID returns "apr_" + 26 base32 characters of a millisecond
// timestamp and 80 random bits: ids sort by creation.
func newApprovalID(now time.Time) (string, error) {
	raw, err := newKeyIDRaw(now, nil)
	if err != nil {
		return "", err
	}
	return approvalIDPrefix + lowerBase32.EncodeToString(raw), nil
}

// getApproval returns the approval id, nil when there is none.
func getApproval(tx Tx, id string) (*vault.Approval, error) {
	var a vault.Approval
	ok, err := getJSON(tx, BucketApprovals, []byte(id), &a)
	if err != nil || !ok {
		return nil, err
	}
	return &a, nil
}

// putApproval writes a and its entry in the open index: id → expiry (unix ns,
// 8 bytes BE) + key id, while it is open; none once it is closed.
func putApproval(tx Tx, a *vault.Approval) error {
	if err := putJSON(tx, BucketApprovals, []byte(a.ID), a); err != nil {
		return err
	}
	if !a.State.Open() {
		return tx.Delete(BucketApprovalsOpen, []byte(a.ID))
	}
	v := append(u64(uint64(a.ExpiresAt.UnixNano())), a.KeyID...)
	return tx.Put(BucketApprovalsOpen, []byte(a.ID), v)
}

// askApproval turns the new claim r of planNew, whose hold is placed, into one
// that waits for a person: the record awaits approval (no lease: nobody is
// forwarding it), the approval is pending until now plus the policy's timeout.
// It is the approval threshold's half of planNew, beside the caps' Decide.
func askApproval(now time.Time, req *vault.ReserveRequest, key *keyRec, r *recordRec, pl *reservePlan) (*vault.Approval, error) {
	id, err := newApprovalID(now)
	if err != nil {
		return nil, err
	}
	timeout := key.Policy.Approval.EffectiveTimeout()
	a := &vault.Approval{
		ID: id, KeyID: key.ID, KeyName: key.Name, IdempotencyKey: req.IdempotencyKey, HoldID: r.holdID(),
		Operation: req.Request.Operation, Amount: req.Request.Amount, Currency: req.Request.Currency,
		Customer: req.Request.Customer, Account: req.Request.Account,
		State: vault.ApprovalPending, Timeout: timeout, CreatedAt: now, ExpiresAt: now.Add(timeout),
	}
	if req.Ask != nil {
		a.Reason, a.Params = req.Ask.Reason, req.Ask.Params
		if len(a.Reason) > vault.MaxApprovalReason {
			a.Reason = a.Reason[:vault.MaxApprovalReason]
		}
	}
	r.State, r.LeaseUntil, r.Fresh, r.ApprovalID = vault.RecordAwaitingApproval, time.Time{}, false, id
	pl.approval = a
	if pl.event != nil {
		pl.event.Reason = "approval_required"
	}
	return a, nil
}

// needsApproval is the approval threshold check, beside the caps': a metered
// request the policy allowed, that the policy makes a person decide on.
func needsApproval(req *vault.ReserveRequest, key *keyRec, dec policy.Decision) bool {
	return req.Metered && !dec.WouldRefuse && key.Policy.NeedsApproval(req.Request)
}

// planAwaiting answers a Reserve of the same request (fingerprint) as a record
// that awaits approval, by the approval's state at now: still pending, an
// answer and no write; approved, the record is claimed for forwarding under
// the upstream key it always had (ReserveResume: abandoning it keeps the hold,
// as for any request that may have left) and the approval is used; past its
// expiry, it expires here (the reaper would, a moment later), the hold
// released.
func (s *Engine) planAwaiting(tx Tx, now time.Time, res vault.ReserveResult, rec *recordRec, key *keyRec) (*reservePlan, error) {
	a, err := getApproval(tx, rec.ApprovalID)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, fmt.Errorf("record of %s awaits approval %s, which is missing: %w", rec.KeyID, rec.ApprovalID, vault.ErrStorage)
	}
	pl := &reservePlan{}
	res.Outcome = vault.ReserveApproval
	switch {
	case a.State.Open() && !now.Before(a.ExpiresAt):
		pl.writes = func(tx Tx) error { return closeApproval(tx, now, rec, a, vault.ApprovalExpired) }
		a.State = vault.ApprovalExpired // what closeApproval writes, for the answer
	case a.State == vault.ApprovalApproved:
		res.Outcome = vault.ReserveResume
		rec.State, rec.LeaseUntil, rec.Fresh, rec.UpdatedAt = vault.RecordInProgress, now.Add(s.lease), false, now
		a.State, a.UsedAt = vault.ApprovalUsed, now
		pl.record, pl.approval = rec, a
		if err := withUsage(tx, now, &res, key); err != nil {
			return nil, err
		}
	}
	pub, err := s.publicRecord(rec)
	if err != nil {
		return nil, err
	}
	res.Record, res.Approval = pub, a
	if rec.Hold != nil {
		h := rec.Hold.public()
		res.Hold = &h
	}
	pl.res = accept(res)
	return pl, nil
}

// closeApproval closes the open approval a of the record rec, which awaits it,
// as declined or expired: the hold is released on its windows (a "settled"
// event whose reason is "approval_declined" or "approval_expired"), the record
// completed without an answer, so that every retry is told why for the
// idempotency TTL, and the approval leaves the open index.
func closeApproval(tx Tx, now time.Time, rec *recordRec, a *vault.Approval, state vault.ApprovalState) error {
	if h := rec.Hold; h != nil && h.State == vault.HoldHeld {
		ev := &vault.Event{
			Time: now, KeyID: rec.KeyID, Operation: h.Operation, Amount: h.Amount, Currency: h.Currency,
			Decision: vault.DecisionSettled, Reason: "approval_" + string(state), HoldID: h.ID, HoldState: vault.HoldReleased,
			WindowIDs: h.WindowIDs, HeldDelta: -h.Amount, IdempotencyKey: rec.Idem,
		}
		if err := addToWindows(tx, rec.KeyID, h.WindowIDs, -h.Amount, 0, 0); err != nil {
			return err
		}
		h.State, h.SettledAt = vault.HoldReleased, now
		if err := putEvent(tx, ev); err != nil {
			return err
		}
	}
	rec.State, rec.LeaseUntil, rec.Fresh, rec.CompletedAt, rec.UpdatedAt = vault.RecordCompleted, time.Time{}, false, now, now
	rec.Response, rec.RequestID = nil, ""
	if err := putRecord(tx, rec); err != nil {
		return err
	}
	a.State = state
	if err := putApproval(tx, a); err != nil {
		return err
	}
	return emitApproval(tx, now, vault.EventApprovalDecided, a)
}

// approvalEventData is the data of the approval.pending and approval.decided
// events.
type approvalEventData struct {
	ID             string    `json:"id"`
	Key            Scope     `json:"key"`
	IdempotencyKey string    `json:"idempotency_key"`
	Operation      string    `json:"operation"`
	Amount         string    `json:"amount"`
	Currency       string    `json:"currency"`
	Customer       string    `json:"customer,omitempty"`
	Reason         string    `json:"reason"`
	State          string    `json:"state"`
	ExpiresAt      time.Time `json:"expires_at"`
	DecidedBy      string    `json:"decided_by,omitempty"`
	Note           string    `json:"note,omitempty"`
}

// emitApproval writes the event typ about a into the outbox of tx: the
// transaction that made the change it reports.
func emitApproval(tx Tx, now time.Time, typ string, a *vault.Approval) error {
	_, err := EmitEvent(tx, now, typ, approvalEventData{
		ID: a.ID, Key: Scope{Kind: "key", ID: a.KeyID, Name: a.KeyName}, IdempotencyKey: a.IdempotencyKey,
		Operation: a.Operation, Amount: policy.FormatMinor(a.Currency, a.Amount), Currency: a.Currency,
		Customer: a.Customer, Reason: a.Reason, State: string(a.State), ExpiresAt: a.ExpiresAt,
		DecidedBy: a.DecidedBy, Note: a.Note,
	})
	return err
}

// decideApprovalTx approves or declines the pending approval id (see
// Store.DecideApproval). A rejected result carries the approval as it is.
func decideApprovalTx(tx Tx, now time.Time, actor, id string, approve bool, note string) (txResult[vault.Approval], error) {
	if len(note) > vault.MaxApprovalReason {
		return reject[vault.Approval](fmt.Errorf("note over %d bytes: %w", vault.MaxApprovalReason, vault.ErrInvalid)), nil
	}
	a, err := getApproval(tx, id)
	if err != nil {
		return txResult[vault.Approval]{}, err
	}
	if a == nil {
		return reject[vault.Approval](fmt.Errorf("approval %q: %w", id, vault.ErrNotFound)), nil
	}
	// Lock the key, then read again: another decision may have committed
	// under that lock since the first read.
	if err := tx.LockKey(a.KeyID); err != nil {
		return txResult[vault.Approval]{}, err
	}
	if a, err = getApproval(tx, id); err != nil {
		return txResult[vault.Approval]{}, err
	}
	if a.State == vault.ApprovalPending && !now.Before(a.ExpiresAt) {
		a.State = vault.ApprovalExpired // the reaper or a retry writes it
	}
	if a.State != vault.ApprovalPending {
		return txResult[vault.Approval]{val: *a, err: fmt.Errorf("approval %s is %s: %w", id, a.State, vault.ErrConflict)}, nil
	}
	rec, err := getRecord(tx, a.KeyID, a.IdempotencyKey)
	if err != nil {
		return txResult[vault.Approval]{}, err
	}
	if rec == nil || rec.State != vault.RecordAwaitingApproval || rec.ApprovalID != a.ID {
		return txResult[vault.Approval]{}, fmt.Errorf("approval %s is pending but its record is not waiting for it: %w", id, vault.ErrStorage)
	}
	before := *a
	a.DecidedAt, a.DecidedBy, a.Note = now, actor, note
	action := "approval.decline"
	if approve {
		action = "approval.approve"
		a.State, a.ExpiresAt = vault.ApprovalApproved, now.Add(a.Timeout)
		if err := putApproval(tx, a); err != nil {
			return txResult[vault.Approval]{}, err
		}
		if err := emitApproval(tx, now, vault.EventApprovalDecided, a); err != nil {
			return txResult[vault.Approval]{}, err
		}
	} else if err := closeApproval(tx, now, rec, a, vault.ApprovalDeclined); err != nil {
		return txResult[vault.Approval]{}, err
	}
	if err := putAudit(tx, now, actor, action, a.ID, auditApproval(&before), auditApproval(a)); err != nil {
		return txResult[vault.Approval]{}, err
	}
	return accept(*a), nil
}

// auditApproval is what the audit keeps of an approval: its decision, not the
// request's parameters.
func auditApproval(a *vault.Approval) map[string]any {
	return map[string]any{
		"state": a.State, "key_id": a.KeyID, "hold_id": a.HoldID, "operation": a.Operation,
		"amount": policy.FormatMinor(a.Currency, a.Amount), "currency": a.Currency,
		"decided_by": a.DecidedBy, "note": a.Note,
	}
}

// DecideApproval approves or declines a pending approval (see
// vault.Store.DecideApproval), then wakes this process's waiters on it.
func (s *Engine) DecideApproval(ctx context.Context, actor, id string, approve bool, note string) (vault.Approval, error) {
	var a vault.Approval
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		r, err := decideApprovalTx(tx, now, actor, id, approve, note)
		if err != nil {
			return err
		}
		a = r.val
		return r.err
	})
	if err != nil {
		return a, fmt.Errorf("decide approval: %w", err)
	}
	s.watch.notify(id)
	return a, nil
}

// GetApproval returns the approval id. Errors: ErrNotFound.
func (s *Engine) GetApproval(ctx context.Context, id string) (vault.Approval, error) {
	var a *vault.Approval
	err := s.view(ctx, func(tx Tx, _ time.Time) error {
		var err error
		a, err = getApproval(tx, id)
		return err
	})
	if err != nil {
		return vault.Approval{}, fmt.Errorf("get approval: %w", err)
	}
	if a == nil {
		return vault.Approval{}, fmt.Errorf("approval %q: %w", id, vault.ErrNotFound)
	}
	return *a, nil
}

// ListApprovals lists the approvals f selects, newest first (by id).
func (s *Engine) ListApprovals(ctx context.Context, f vault.ApprovalFilter) ([]vault.Approval, string, error) {
	if f.State != "" && !f.State.Valid() {
		return nil, "", fmt.Errorf("list approvals: state %q: %w", f.State, vault.ErrInvalid)
	}
	start := []byte{0xff} // after every id
	if f.Cursor != "" {
		c, err := decodeCursor(f.Cursor)
		if err != nil {
			return nil, "", fmt.Errorf("list approvals: %w", err)
		}
		start = []byte(c)
	}
	var (
		out  []vault.Approval
		next string
	)
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		var err error
		out, next, err = pageNewestFirst(tx, BucketApprovals, []byte(approvalIDPrefix), start, f.Limit, newestFirst[vault.Approval]{
			keep: func(_, v []byte) bool {
				var a vault.Approval
				if decodeJSON(nil, v, &a) != nil {
					return true // decode reports it
				}
				return (f.State == "" || approvalStateAt(&a, now) == f.State) && (f.KeyID == "" || a.KeyID == f.KeyID)
			},
			decode: func(k, v []byte) (vault.Approval, error) {
				var a vault.Approval
				if err := decodeJSON(k, v, &a); err != nil {
					return a, err
				}
				a.State = approvalStateAt(&a, now)
				return a, nil
			},
			cursor: func(k []byte, _ vault.Approval) string { return string(k) },
		})
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list approvals: %w", err)
	}
	return out, next, nil
}

// approvalStateAt is a's state as a reader sees it at now: an open approval
// past its expiry is expired, whether or not the reaper wrote it yet.
func approvalStateAt(a *vault.Approval, now time.Time) vault.ApprovalState {
	if a.State.Open() && !now.Before(a.ExpiresAt) {
		return vault.ApprovalExpired
	}
	return a.State
}

// judgeApproval judges an entry of the open approvals index: an approval
// past its expiry expires (closeApproval), its hold released.
func (s *Engine) judgeApproval(tx Tx, now time.Time, k, v []byte) (reapVerdict, error) {
	if len(v) < 8 || now.Before(time.Unix(0, int64(binary.BigEndian.Uint64(v)))) {
		return reapVerdict{}, nil
	}
	owner := string(v[8:])
	a, err := getApproval(tx, string(k))
	if err != nil || a == nil || !a.State.Open() || now.Before(a.ExpiresAt) {
		return reapVerdict{}, err
	}
	rec, err := getRecord(tx, a.KeyID, a.IdempotencyKey)
	if err != nil {
		return reapVerdict{}, err
	}
	id := bytes.Clone(k)
	if rec == nil || rec.State != vault.RecordAwaitingApproval || rec.ApprovalID != a.ID {
		// Nothing waits on it any more: only the index entry goes.
		return removeEntry(owner, BucketApprovalsOpen, id), nil
	}
	return reapVerdict{owner: owner, removes: true, apply: func(tx Tx) error {
		if err := closeApproval(tx, now, rec, a, vault.ApprovalExpired); err != nil {
			return err
		}
		s.watch.notifyLater(a.ID)
		return nil
	}}, nil
}

// approvalWatch wakes the requests of this process that wait for a decision
// (Keybrake-Approval-Wait).
type approvalWatch struct {
	mu sync.Mutex
	m  map[string]map[chan struct{}]struct{}
	// later are the ids to notify once the reaper's transaction is over.
	later []string
}

// WatchApproval returns a channel closed at the next decision on id in this
// process, and a function that stops watching.
func (s *Engine) WatchApproval(id string) (<-chan struct{}, func()) {
	w := &s.watch
	ch := make(chan struct{})
	w.mu.Lock()
	if w.m == nil {
		w.m = map[string]map[chan struct{}]struct{}{}
	}
	if w.m[id] == nil {
		w.m[id] = map[chan struct{}]struct{}{}
	}
	w.m[id][ch] = struct{}{}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if set := w.m[id]; set != nil {
			if _, ok := set[ch]; ok {
				delete(set, ch)
				if len(set) == 0 {
					delete(w.m, id)
				}
			}
		}
	}
}

// notify wakes every watcher of id.
func (w *approvalWatch) notify(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.m[id] {
		close(ch)
	}
	delete(w.m, id)
}

// notifyLater remembers id for flushLater (a transaction may run again: the
// wake-up waits until it is over).
func (w *approvalWatch) notifyLater(id string) {
	w.mu.Lock()
	w.later = append(w.later, id)
	w.mu.Unlock()
}

// flushLater wakes the watchers notifyLater remembered.
func (w *approvalWatch) flushLater() {
	w.mu.Lock()
	ids := w.later
	w.later = nil
	w.mu.Unlock()
	for _, id := range ids {
		w.notify(id)
	}
}
