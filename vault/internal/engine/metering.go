package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// reservePlan is what a Reserve decided, reading only, and what it must write.
// Keeping the decision apart from the writes lets the mutation test run them in
// two transactions; Reserve always runs both in one.
type reservePlan struct {
	res txResult[vault.ReserveResult]

	// Writes, applied by apply; none when res is rejected.
	record *recordRec // record (with its hold) to put: claim, resume, stale
	claim  bool       // record is new: a fresh claim of its idempotency key
	// appendOrder: a new record is appended to the records bucket (see recordRec).
	appendOrder bool
	newHold     bool // add the record's hold amount to held on every window
	windows     []policy.Window
	// counters are the windows' counters as the plan read them, which the
	// hold is added to.
	counters []counter
	event    *vault.Event
	// velocity are the velocity limits' new hold times to write.
	velocity []velocityWrite
	// key is the key the plan decided under, and chain its budgets', for
	// the events they cause.
	key   *keyRec
	chain *chainPlan
	// approval is the approval to write (put with its open index entry);
	// writes, the other writes of a change of an approval's state.
	approval *vault.Approval
	writes   func(Tx) error
}

func validateReserve(req *vault.ReserveRequest) error {
	switch {
	case req.KeyID == "":
		return fmt.Errorf("empty key id: %w", vault.ErrInvalid)
	case req.IdempotencyKey == "" || len(req.IdempotencyKey) > maxIdemKeyLen:
		return fmt.Errorf("idempotency key must be 1-%d bytes: %w", maxIdemKeyLen, vault.ErrInvalid)
	case req.Request.Amount < 0:
		return fmt.Errorf("negative amount: %w", vault.ErrInvalid)
	case !req.Metered && req.Request.Amount != 0:
		return fmt.Errorf("unmetered request with an amount: %w", vault.ErrInvalid)
	}
	return nil
}

// pairKeys are what a Reserve derives from its pair (key id, idempotency key)
// by hashing, worked out before it enters the committer, which runs every
// write alone.
type pairKeys struct {
	record   []byte // recordKey
	holdID   string // vault.HoldID
	upstream string // vault.UpstreamKey
}

func newPairKeys(keyID, idem string) pairKeys {
	k := recordKey(keyID, idem)
	return pairKeys{record: k, holdID: holdIDOf(k), upstream: vault.UpstreamKey(keyID, idem)}
}

// reserveTx is one Reserve: plan and apply in tx.
func (s *Engine) reserveTx(tx Tx, now time.Time, req *vault.ReserveRequest, pk *pairKeys) (txResult[vault.ReserveResult], error) {
	pl, err := s.planReserve(tx, now, req, pk)
	if err != nil {
		return txResult[vault.ReserveResult]{}, err
	}
	if err := pl.apply(tx); err != nil {
		return txResult[vault.ReserveResult]{}, err
	}
	return pl.res, s.noticeReserve(tx, now, req, pl)
}

// planReserve reads everything Reserve needs in tx and decides. It writes nothing.
func (s *Engine) planReserve(tx Tx, now time.Time, req *vault.ReserveRequest, pk *pairKeys) (*reservePlan, error) {
	if err := validateReserve(req); err != nil {
		return &reservePlan{res: reject[vault.ReserveResult](err)}, nil
	}
	key, err := s.keys.get(tx, req.KeyID)
	if errors.Is(err, vault.ErrNotFound) {
		return &reservePlan{res: reject[vault.ReserveResult](err)}, nil
	} else if err != nil {
		return nil, err
	}
	res := vault.ReserveResult{Key: key.public()}
	if key.Status == vault.KeyRevoked {
		return &reservePlan{res: txResult[vault.ReserveResult]{val: res,
			err: fmt.Errorf("reserve under key %s: %w", key.ID, vault.ErrKeyRevoked)}}, nil
	}
	if changed, err := s.keyChanged(tx, req, key); err != nil {
		return nil, err
	} else if changed {
		return &reservePlan{res: reject[vault.ReserveResult](fmt.Errorf("reserve under key %s: %w", key.ID, vault.ErrKeyChanged))}, nil
	}
	rec, err := getRecordAt(tx, pk.record, req.KeyID, req.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		return s.planExisting(tx, now, req, res, rec, key)
	}
	return s.planNew(tx, now, req, res, key, pk)
}

// keyChanged reports whether a Reserve made with a remembered key
// (req.KeyVersion set) finds, in its transaction, the key or its upstream at
// another version: a rotated token, a changed policy, a replaced secret.
func (s *Engine) keyChanged(tx Tx, req *vault.ReserveRequest, key *keyRec) (bool, error) {
	if req.KeyVersion == 0 {
		return false, nil
	}
	if key.version() != req.KeyVersion {
		return true, nil
	}
	raw, err := tx.Get(BucketUpstreams, []byte(key.Upstream))
	if err != nil || raw == nil {
		return req.UpstreamVersion != 0, err
	}
	version, err := s.upstreamVersions.of(key.Upstream, raw, decodeUpstreamVersion)
	return version != req.UpstreamVersion, err
}

// withUsage fills res's windows at now and their counters, as read in tx (a
// Reserve that forwards or replays reports what is left of each cap): the
// key's, and its budgets' under their scoped ids. A chain that cannot be
// read (a budget gone) leaves the key's alone: this reports, it decides
// nothing.
func withUsage(tx Tx, now time.Time, res *vault.ReserveResult, key *keyRec) error {
	windows, err := keyWindows(tx, key, now)
	if err != nil {
		return err
	}
	usage, err := readUsage(tx, key.ID, windows)
	if err != nil {
		return err
	}
	if key.Policy.Budget != "" {
		chain, err := budgetChain(tx, key.Policy.Budget)
		switch {
		case errors.Is(err, vault.ErrNotFound) || errors.Is(err, vault.ErrInvalid):
		case err != nil:
			return err
		default:
			_, scoped, counters, err := chainLinks(tx, chain, now)
			if err != nil {
				return err
			}
			maps.Copy(usage, usageOf(scoped, counters))
			windows = append(slices.Clip(windows), scoped...)
		}
	}
	res.Windows, res.Usage = windows, usage
	return nil
}

// reserveFromRead answers a Reserve whose record is completed — a replay, or
// a reuse of its key for another request — from a read transaction: such a
// record is final (it changes only when the reaper removes it), so the answer
// is the one a write transaction would give, without one. ok is false when the
// Reserve needs its write transaction (no record, one in flight or unknown, a
// revoked key, or anything to refuse), which decides again from scratch.
func (s *Engine) reserveFromRead(ctx context.Context, req *vault.ReserveRequest, pk *pairKeys) (res vault.ReserveResult, ok bool, err error) {
	if validateReserve(req) != nil || req.KeyVersion != 0 {
		return res, false, nil
	}
	err = s.view(ctx, func(tx Tx, now time.Time) error {
		ok = false // a re-run starts over
		// The record first: most Reserves claim a new key, and then the key
		// need not be read here.
		rec, err := getRecordAt(tx, pk.record, req.KeyID, req.IdempotencyKey)
		if err != nil || rec == nil || rec.State != vault.RecordCompleted {
			return nil // the write transaction says why
		}
		key, err := s.keys.get(tx, req.KeyID)
		if err != nil || key.Status == vault.KeyRevoked {
			return nil
		}
		pl, err := s.planExisting(tx, now, req, vault.ReserveResult{Key: key.public()}, rec, key)
		if err != nil || pl.res.err != nil || pl.record != nil {
			return nil
		}
		res, ok = pl.res.val, true
		return nil
	})
	return res, ok, err
}

// planNew decides a Reserve without an idempotency record: against the key's
// current policy and counters.
func (s *Engine) planNew(tx Tx, now time.Time, req *vault.ReserveRequest, res vault.ReserveResult, key *keyRec, pk *pairKeys) (*reservePlan, error) {
	windows, err := keyWindows(tx, key, now)
	if err != nil {
		return nil, err
	}
	usage := policy.Usage{}
	var counters []counter
	var chain *chainPlan
	if req.Metered {
		// An unmetered request holds nothing, so only the non-cap rules may refuse it.
		if counters, err = getCounters(tx, key.ID, windowIDs(windows)); err != nil {
			return nil, err
		}
		usage = usageOf(windows, counters)
		if chain, err = planChain(tx, key, now); err != nil {
			return nil, err
		}
		if s.prefetches {
			s.budgetHints.note(chain.budgets)
		}
	}
	var dec policy.Decision
	switch {
	case chain != nil && chain.refusal != nil:
		dec = *chain.refusal
	case chain != nil:
		dec = policy.DecideChain(key.decisionPolicy(now), key.scope(), windows, usage, req.Request, now, chain.links)
		if dec.Allowed {
			if refusal, err := chain.checkVelocity(tx, req.Request.Operation, now); err != nil {
				return nil, err
			} else if refusal != nil {
				dec = *refusal
			}
		}
	default:
		dec = policy.DecideIn(key.decisionPolicy(now), windows, usage, req.Request, now)
		dec.Scope = key.scope()
	}
	res.Decision = dec
	pl := &reservePlan{counters: counters, key: key, chain: chain}
	if !dec.Allowed {
		res.Outcome = vault.ReserveRefused
		pl.res = accept(res)
		if req.Metered {
			pl.event = &vault.Event{
				Time: now, KeyID: key.ID, Operation: req.Request.Operation, Amount: req.Request.Amount,
				Currency: req.Request.Currency, Decision: vault.DecisionRefused, Reason: string(dec.Reason), Tool: req.Tool,
				IdempotencyKey: req.IdempotencyKey, Scope: dec.Scope.ID,
			}
		}
		return pl, nil
	}
	if !req.Metered {
		// Nothing was read for the decision: read the counters for the
		// remaining budget the proxy reports.
		if counters, err = getCounters(tx, key.ID, windowIDs(windows)); err != nil {
			return nil, err
		}
		usage = usageOf(windows, counters)
	}
	res.Windows, res.Usage = windows, usage
	r := &recordRec{
		KeyID: key.ID, Idem: req.IdempotencyKey,
		Fingerprint: req.Fingerprint, UpstreamKey: pk.upstream,
		State: vault.RecordInProgress, LeaseUntil: now.Add(s.lease), CreatedAt: now, UpdatedAt: now, Fresh: true,
		key: pk.record,
	}
	pl.record, pl.claim, pl.appendOrder = r, true, s.appendRecords
	res.Outcome = vault.ReserveClaimed
	if req.Metered {
		// The hold is on the key's windows and on every budget's of its
		// chain (scoped ids), all placed in this transaction.
		all := append(slices.Clip(windows), chain.windows...)
		pl.counters = append(slices.Clip(counters), chain.counters...)
		pl.velocity = chain.velocityWrites
		ids := windowIDs(all)
		h := &holdRec{
			ID: pk.holdID, KeyID: key.ID, IdempotencyKey: req.IdempotencyKey,
			Operation: req.Request.Operation, Currency: req.Request.Currency, Amount: req.Request.Amount,
			WindowIDs: ids, State: vault.HoldHeld, CreatedAt: now,
		}
		r.Hold = h
		pl.newHold, pl.windows = true, all
		// What is left is reported on every window the hold is on.
		chainUsage := usageOf(chain.windows, chain.counters)
		maps.Copy(chainUsage, usage)
		res.Windows, res.Usage = all, usageWithHold(all, chainUsage, h.Amount)
		decision := vault.DecisionAllowed
		if dec.WouldRefuse {
			decision = vault.DecisionWouldRefuse
		}
		pl.event = &vault.Event{
			Time: now, KeyID: key.ID, Operation: h.Operation, Amount: h.Amount, Currency: h.Currency,
			Decision: decision, Reason: string(dec.Reason), HoldID: h.ID, HoldState: vault.HoldHeld,
			WindowIDs: ids, HeldDelta: h.Amount, Tool: req.Tool, IdempotencyKey: req.IdempotencyKey,
		}
		pub := h.public()
		res.Hold = &pub
		if needsApproval(req, key, dec) {
			a, err := askApproval(now, req, key, r, pl)
			if err != nil {
				return nil, err
			}
			res.Outcome, res.Approval = vault.ReserveApproval, a
		}
	}
	res.Record = vault.IdempotencyRecord{
		KeyID: key.ID, IdempotencyKey: req.IdempotencyKey, Fingerprint: r.Fingerprint, UpstreamKey: r.UpstreamKey,
		State: r.State, LeaseUntil: r.LeaseUntil, HoldID: r.holdID(), CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
		ApprovalID: r.ApprovalID,
	}
	pl.res = accept(res)
	return pl, nil
}

// usageWithHold is usage with amount added to held on every window.
func usageWithHold(windows []policy.Window, usage policy.Usage, amount int64) policy.Usage {
	out := make(policy.Usage, len(windows))
	for _, w := range windows {
		c := usage[w.ID]
		c.Held += amount
		out[w.ID] = c
	}
	return out
}

// planExisting answers a Reserve whose idempotency record exists.
func (s *Engine) planExisting(tx Tx, now time.Time, req *vault.ReserveRequest, res vault.ReserveResult, rec *recordRec, key *keyRec) (*reservePlan, error) {
	if rec.State == vault.RecordAwaitingApproval && rec.Fingerprint == req.Fingerprint {
		return s.planAwaiting(tx, now, res, rec, key)
	}
	pl := &reservePlan{}
	hold := rec.Hold
	switch {
	case rec.Fingerprint != req.Fingerprint:
		res.Outcome = vault.ReserveMismatch
	case rec.State == vault.RecordCompleted:
		res.Outcome = vault.ReserveReplay
	case rec.State == vault.RecordInProgress && now.Before(rec.LeaseUntil):
		res.Outcome = vault.ReserveInFlight
	case now.Sub(rec.CreatedAt) > s.unknownLimit:
		// Stripe may have pruned the upstream key by now: an operator decides.
		res.Outcome = vault.ReserveStale
		if rec.State == vault.RecordInProgress {
			rec.State, rec.LeaseUntil, rec.Fresh, rec.UpdatedAt = vault.RecordUnknown, time.Time{}, false, now
			if hold != nil {
				hold.State = vault.HoldUnknown
			}
			pl.record = rec
		}
	default:
		// Unknown, or in_progress under a lapsed lease: forward again with the same
		// upstream key; the hold it already has stays.
		res.Outcome = vault.ReserveResume
		rec.State, rec.LeaseUntil, rec.Fresh, rec.UpdatedAt = vault.RecordInProgress, now.Add(s.lease), false, now
		if hold != nil {
			hold.State = vault.HoldHeld
		}
		pl.record = rec
	}
	pub, err := s.publicRecord(rec)
	if err != nil {
		// A stored response that does not open must not be replayed, nor the
		// record changed.
		return &reservePlan{res: txResult[vault.ReserveResult]{val: vault.ReserveResult{Key: res.Key}, err: err}}, nil
	}
	res.Record = pub
	if hold != nil {
		h := hold.public()
		res.Hold = &h
	}
	if rec.ApprovalID != "" && res.Outcome == vault.ReserveReplay {
		// A declined or expired request's replay is worded from its approval.
		if res.Approval, err = getApproval(tx, rec.ApprovalID); err != nil {
			return nil, err
		}
	}
	switch res.Outcome {
	case vault.ReserveReplay, vault.ReserveResume:
		if err := withUsage(tx, now, &res, key); err != nil {
			return nil, err
		}
	}
	pl.res = accept(res)
	return pl, nil
}

// apply writes what planReserve decided: the record, the hold on every window,
// the event (a refusal writes only that).
func (pl *reservePlan) apply(tx Tx) error {
	if pl.res.err != nil {
		return nil
	}
	if r := pl.record; r != nil {
		var err error
		if pl.claim {
			err = insertRecord(tx, r, pl.appendOrder)
		} else {
			err = putRecord(tx, r)
		}
		if err != nil {
			return err
		}
		if pl.newHold {
			if err := pl.placeHold(tx); err != nil {
				return err
			}
			for _, w := range pl.velocity {
				if err := tx.Put(BucketVelocity, w.key, encodeStamps(w.stamps)); err != nil {
					return fmt.Errorf("put velocity %q: %w", w.key, err)
				}
			}
		}
	}
	if a := pl.approval; a != nil {
		if err := putApproval(tx, a); err != nil {
			return err
		}
		if a.State == vault.ApprovalPending {
			if err := emitApproval(tx, pl.record.UpdatedAt, vault.EventApprovalPending, a); err != nil {
				return err
			}
		}
	}
	if pl.writes != nil {
		if err := pl.writes(tx); err != nil {
			return err
		}
	}
	if pl.event == nil {
		return nil
	}
	return putEvent(tx, pl.event)
}

// placeHold adds a new hold's amount to held on each of its windows, raising each
// counter's CapPeak to the cap in force (see CheckInvariant).
func (pl *reservePlan) placeHold(tx Tx) error {
	r := pl.record
	amount := r.Hold.Amount
	var excused []int64
	for i, w := range pl.windows {
		c := pl.counters[i]
		if w.HasCap {
			c.CapPeak = max(c.CapPeak, w.Cap)
			if pl.res.val.Decision.WouldRefuse {
				// Report mode lets this hold pass the cap: excuse what it adds
				// beyond, and say so in the ledger.
				if over := c.Committed + c.Held + amount - w.Cap; over > 0 {
					if excused == nil {
						excused = make([]int64, len(pl.windows))
					}
					excused[i] = min(over, amount)
					c.Allowance += excused[i]
				}
			}
		} else {
			c.Uncapped = true
		}
		c.Held += amount
		if err := putCounter(tx, r.KeyID, w.ID, c); err != nil {
			return err
		}
	}
	if pl.event != nil {
		pl.event.AllowanceDeltas = excused
	}
	return nil
}

// addToWindows moves money on a hold's windows. A budget's windows are
// changed under the budget's lock, taken here in the hold's order (the key's
// windows, then its chain's closest first) after the caller took the key's.
func addToWindows(tx Tx, keyID string, windowIDs []policy.WindowID, heldDelta, committedDelta, allowance int64) error {
	if err := lockBudgetsOf(tx, windowIDs); err != nil {
		return err
	}
	counters, err := getCounters(tx, keyID, windowIDs)
	if err != nil {
		return err
	}
	for i, id := range windowIDs {
		c := counters[i]
		c.Held += heldDelta
		c.Committed += committedDelta
		c.Allowance += allowance
		if err := putCounter(tx, keyID, id, c); err != nil {
			return err
		}
	}
	return nil
}

// settleTx applies a Settle to the record under k, recordKey(req.KeyID,
// req.IdempotencyKey). Every reason to turn it down is found before any write.
func (s *Engine) settleTx(tx Tx, now time.Time, req *vault.SettleRequest, sealed settleSealed, k []byte) (txResult[noValue], error) {
	switch req.Outcome {
	case vault.SettleCommit, vault.SettleRelease, vault.SettleUnknown, vault.SettleAbandon:
	default:
		return reject[noValue](fmt.Errorf("outcome %q: %w", req.Outcome, vault.ErrInvalid)), nil
	}
	if req.Amount < 0 || req.Object.Moved < 0 {
		return reject[noValue](fmt.Errorf("negative amount: %w", vault.ErrInvalid)), nil
	}
	if req.ObjectID == "" && req.Object != (vault.ObjectSettle{}) {
		return reject[noValue](fmt.Errorf("an object change without an object id: %w", vault.ErrInvalid)), nil
	}
	if err := tx.LockKey(req.KeyID); err != nil {
		return txResult[noValue]{}, err
	}
	rec, err := getRecordAt(tx, k, req.KeyID, req.IdempotencyKey)
	if err != nil {
		return txResult[noValue]{}, err
	}
	if rec == nil {
		return reject[noValue](fmt.Errorf("idempotency record of key %s: %w", req.KeyID, vault.ErrNotFound)), nil
	}
	if rec.State != vault.RecordInProgress {
		return reject[noValue](fmt.Errorf("idempotency record of key %s is %s: %w", req.KeyID, rec.State, vault.ErrConflict)), nil
	}
	hold := rec.Hold
	var obj *objectRec
	if req.Outcome == vault.SettleCommit {
		// A commit that says nothing about its object (money that moved at once)
		// is only recorded in the ledger with the object's id.
		if req.ObjectID != "" && hold != nil && req.Object != (vault.ObjectSettle{}) {
			if obj, _, err = getObject(tx, req.KeyID, req.ObjectID); err != nil {
				return txResult[noValue]{}, err
			}
		}
		var avail int64
		if hold != nil {
			avail = hold.Amount
		}
		if obj != nil {
			avail += obj.held()
		}
		if req.Amount > avail && (!req.AllowOverrun || hold == nil) {
			return reject[noValue](fmt.Errorf("commit of %d above the %d held for it: %w", req.Amount, avail, vault.ErrInvalid)), nil
		}
	}

	// From here on, only writes.
	if err := settleWrites(tx, now, req, rec, obj, sealed); err != nil {
		return txResult[noValue]{}, err
	}
	return accept(noValue{}), settleLink(tx, now, req)
}

// settleWrites writes what a Settle does to rec (and to the money object obj of
// a commit, if any), and its ledger events; resp is the answer to store,
// sealed.
func settleWrites(tx Tx, now time.Time, req *vault.SettleRequest, rec *recordRec, obj *objectRec, sealed settleSealed) error {
	ev := &vault.Event{
		Time: now, KeyID: req.KeyID, Decision: vault.DecisionSettled, Reason: string(req.Outcome),
		UpstreamStatus: req.UpstreamStatus, StripeRequestID: req.StripeRequestID, ObjectID: req.ObjectID,
		Tool: req.Tool, IdempotencyKey: req.IdempotencyKey,
	}
	return settleWritesAs(tx, now, req, rec, obj, sealed, ev)
}

// settleWritesAs is settleWrites with the ledger event of the hold's settle
// begun as ev (a hold settled by Stripe's event says so).
func settleWritesAs(tx Tx, now time.Time, req *vault.SettleRequest, rec *recordRec, obj *objectRec, sealed settleSealed, ev *vault.Event) error {
	hold, resp := rec.Hold, sealed.resp
	if hold != nil {
		ev.Operation, ev.Currency, ev.HoldID, ev.WindowIDs = hold.Operation, hold.Currency, hold.ID, hold.WindowIDs
		ev.Amount = hold.Amount
	}
	switch req.Outcome {
	case vault.SettleCommit, vault.SettleRelease:
		rec.State, rec.LeaseUntil, rec.Fresh, rec.CompletedAt = vault.RecordCompleted, time.Time{}, false, now
		rec.Response, rec.RequestID = resp, req.StripeRequestID
		switch {
		case obj != nil: // a commit with a hold, against a money object
			if err := commitObject(tx, now, req, hold, obj, ev); err != nil {
				return err
			}
		case hold != nil && req.Outcome == vault.SettleCommit:
			// At most the hold (checked above), unless an allowed overrun.
			held, over := hold.Amount, max(0, req.Amount-hold.Amount)
			hold.State, hold.Amount, hold.SettledAt = vault.HoldCommitted, req.Amount, now
			ev.HeldDelta, ev.CommittedDelta, ev.Amount = -held, req.Amount, req.Amount
			ev.AllowanceDeltas = sameForEach(hold.WindowIDs, over)
			if err := addToWindows(tx, hold.KeyID, hold.WindowIDs, -held, req.Amount, over); err != nil {
				return err
			}
		case hold != nil:
			ev.HeldDelta = -hold.Amount
			hold.State, hold.SettledAt = vault.HoldReleased, now
			if err := addToWindows(tx, hold.KeyID, hold.WindowIDs, -hold.Amount, 0, 0); err != nil {
				return err
			}
		}
	case vault.SettleUnknown:
		rec.State, rec.LeaseUntil, rec.Fresh = vault.RecordUnknown, time.Time{}, false
		if sealed.request != nil {
			rec.SealedRequest = sealed.request
		}
		if resp != nil {
			rec.Response, rec.RequestID = resp, req.StripeRequestID
		}
		if hold != nil {
			hold.State = vault.HoldUnknown
			if err := noticeUnknown(tx, now, hold); err != nil {
				return err
			}
		}
	case vault.SettleAbandon:
		if rec.Fresh {
			// This claim created the record and its hold: forget both, so a retry
			// starts afresh.
			if hold != nil {
				ev.HeldDelta, ev.HoldState = -hold.Amount, vault.HoldReleased
				if err := addToWindows(tx, hold.KeyID, hold.WindowIDs, -hold.Amount, 0, 0); err != nil {
					return err
				}
				if err := putEvent(tx, ev); err != nil {
					return err
				}
			}
			return deleteRecord(tx, rec)
		}
		// A resumed claim: the earlier attempt may have moved money.
		rec.State, rec.LeaseUntil = vault.RecordUnknown, time.Time{}
		if hold != nil {
			hold.State = vault.HoldUnknown
			if err := noticeUnknown(tx, now, hold); err != nil {
				return err
			}
		}
	}
	rec.UpdatedAt = now
	if err := putRecord(tx, rec); err != nil {
		return err
	}
	if hold == nil {
		return nil
	}
	ev.HoldState = hold.State
	return putEvent(tx, ev)
}

// commitObject books a commit against the money object obj (see Store.Settle):
// Amount comes from the object's exposure first, then from the request's hold, then
// (an allowed overrun) beyond both; the rest of the hold becomes exposure or is
// released. It fills ev, the settle event of the request's hold.
func commitObject(tx Tx, now time.Time, req *vault.SettleRequest, hold *holdRec, obj *objectRec, ev *vault.Event) error {
	amount, ch := req.Amount, req.Object
	if ch.MovedKnown && obj.MovedSeen {
		// What moved since the key last saw the object, as of this transaction:
		// a Stripe event applied while the request was in flight has committed
		// its share already (the request measured from an older sight of it).
		amount = min(amount, max(0, ch.Moved-obj.Moved))
	}
	fromParts := min(amount, obj.held())
	changes := obj.commit(fromParts)
	held := hold.Amount
	fromHold := min(amount-fromParts, held)
	over := amount - fromParts - fromHold
	var toPart int64
	if ch.Expose && !ch.Terminal {
		toPart = held - fromHold
	}
	hold.State, hold.Amount, hold.SettledAt = vault.HoldCommitted, fromHold+over, now
	ev.Amount, ev.HeldDelta, ev.CommittedDelta = amount, -held+toPart, fromHold+over
	ev.AllowanceDeltas = sameForEach(hold.WindowIDs, over)
	if err := addToWindows(tx, hold.KeyID, hold.WindowIDs, -held+toPart, fromHold+over, over); err != nil {
		return err
	}
	if ch.Terminal {
		changes = append(changes, obj.releaseAll()...)
		obj.Closed = true
	} else if toPart > 0 {
		obj.addPart(hold.ID, hold.WindowIDs, toPart, now)
		obj.Closed = false
	}
	if obj.Currency == "" {
		obj.Currency = hold.Currency
	}
	if obj.CreatedAt.IsZero() {
		// The object's first count (or its first since keybrake kept the
		// time): Stripe's events find it through the index from here on.
		obj.CreatedAt = now
		if err := indexObject(tx, req.KeyID, req.ObjectID); err != nil {
			return err
		}
	}
	obj.StripeAccount, obj.StripeContext = ch.StripeAccount, ch.StripeContext
	obj.Amount += amount
	obj.Own = obj.Own || ch.Created
	if ch.MovedKnown {
		// What an object moved only grows: a Stripe event applied while the
		// request was in flight may have shown more than its answer does.
		obj.Moved, obj.MovedSeen = max(obj.Moved, ch.Moved), true
	}
	obj.UpdatedAt = now
	if err := putObject(tx, req.KeyID, req.ObjectID, obj); err != nil {
		return err
	}
	return applyPartChanges(tx, now, req.KeyID, req.ObjectID, ev.Operation, obj.Currency, changes)
}

// sameForEach is n for each of ids, or nil when n is 0 (events leave it out).
func sameForEach(ids []policy.WindowID, n int64) []int64 {
	if n == 0 {
		return nil
	}
	out := make([]int64, len(ids))
	for i := range out {
		out[i] = n
	}
	return out
}

func (s *Engine) resolveHoldTx(tx Tx, now time.Time, actor, holdID string, outcome vault.HoldState) (vault.Hold, error) {
	if outcome != vault.HoldCommitted && outcome != vault.HoldReleased {
		return vault.Hold{}, fmt.Errorf("resolve outcome %q (committed or released): %w", outcome, vault.ErrInvalid)
	}
	rec, err := getRecordByHold(tx, holdID)
	if err != nil {
		return vault.Hold{}, err
	}
	// Lock the hold's key, then read the record again: the first read may
	// predate a change made under that lock.
	if err := tx.LockKey(rec.KeyID); err != nil {
		return vault.Hold{}, err
	}
	if rec, err = getRecordByHold(tx, holdID); err != nil {
		return vault.Hold{}, err
	}
	hold := rec.Hold
	lapsed := rec.State == vault.RecordInProgress && !now.Before(rec.LeaseUntil)
	if hold.State != vault.HoldUnknown && !(hold.State == vault.HoldHeld && lapsed) {
		return vault.Hold{}, fmt.Errorf("hold %s is %s: %w", holdID, hold.State, vault.ErrConflict)
	}
	before := hold.public()
	ev := &vault.Event{
		Time: now, KeyID: hold.KeyID, Operation: hold.Operation, Amount: hold.Amount, Currency: hold.Currency,
		Decision: vault.DecisionResolved, Reason: "operator:" + string(outcome), HoldID: hold.ID, HoldState: outcome,
		WindowIDs: hold.WindowIDs, HeldDelta: -hold.Amount, IdempotencyKey: hold.IdempotencyKey,
	}
	committed := int64(0)
	if outcome == vault.HoldCommitted {
		committed = hold.Amount
		ev.CommittedDelta = hold.Amount
	}
	if err := addToWindows(tx, hold.KeyID, hold.WindowIDs, -hold.Amount, committed, 0); err != nil {
		return vault.Hold{}, err
	}
	hold.State, hold.SettledAt = outcome, now
	// No answer is stored: keybrake never saw Stripe's. A retry is told what the
	// operator decided (IdempotencyRecord.Resolved, and the hold's state).
	rec.State, rec.LeaseUntil, rec.Fresh, rec.Resolved = vault.RecordCompleted, time.Time{}, false, true
	rec.Response, rec.RequestID, rec.CompletedAt, rec.UpdatedAt = nil, "", now, now
	if err := putRecord(tx, rec); err != nil {
		return vault.Hold{}, err
	}
	if err := putEvent(tx, ev); err != nil {
		return vault.Hold{}, err
	}
	after := hold.public()
	if err := putAudit(tx, now, actor, "hold.resolve", hold.ID, before, after); err != nil {
		return vault.Hold{}, err
	}
	return after, nil
}

// listHoldsTx pages through the hold index (creation time, then hold id) newest
// first, keeping the holds in state ("" for all). The cursor is the index key of
// the last hold of the previous page.
func listHoldsTx(tx Tx, state vault.HoldState, limit int, cursor string) ([]vault.Hold, string, error) {
	switch state {
	case "", vault.HoldHeld, vault.HoldCommitted, vault.HoldReleased, vault.HoldUnknown:
	default:
		return nil, "", fmt.Errorf("hold state %q: %w", state, vault.ErrInvalid)
	}
	start := []byte{0xff} // after every index key: they start with a creation time in 2262 or before
	if cursor != "" {
		before, err := decodeCursor(cursor)
		if err != nil {
			return nil, "", err
		}
		start = []byte(before)
	}
	return pageNewestFirst(tx, BucketHoldIndex, nil, start, limit, newestFirst[vault.Hold]{
		keep: func(_, v []byte) bool { return state == "" || string(v) == string(state) },
		decode: func(k, _ []byte) (vault.Hold, error) {
			rec, err := getRecordByHold(tx, string(k[8:]))
			if err != nil {
				return vault.Hold{}, fmt.Errorf("hold index: %w", err)
			}
			return rec.Hold.public(), nil
		},
		cursor: func(k []byte, _ vault.Hold) string { return string(k) },
	})
}

// RecoverInProgress turns every in_progress record into unknown, keeping
// their holds (recoverRecord), and returns how many: for a store only one
// process opens, whose previous process is gone with every request it had in
// flight. It reads only the records the in-flight index lists, not the
// completed ones.
func RecoverInProgress(tx Tx, now time.Time) (int, error) {
	var todo []*recordRec
	err := forEach(tx, BucketInflight, func(k, _ []byte) error {
		r, err := readRecord(tx, k)
		if err != nil || r == nil {
			return err
		}
		if r.State == vault.RecordInProgress {
			todo = append(todo, r)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, r := range todo {
		if err := recoverRecord(tx, now, r); err != nil {
			return 0, err
		}
	}
	return len(todo), nil
}

// recoverRecord turns the in_progress record r into unknown, its hold still
// counted as held: the process that claimed it is gone, so nobody knows whether
// Stripe got the request. A retry with the same idempotency key resumes it
// under the same upstream key; otherwise an operator resolves it.
func recoverRecord(tx Tx, now time.Time, r *recordRec) error {
	r.State, r.LeaseUntil, r.Fresh, r.UpdatedAt = vault.RecordUnknown, time.Time{}, false, now
	if r.Hold != nil {
		r.Hold.State = vault.HoldUnknown
		if err := noticeUnknown(tx, now, r.Hold); err != nil {
			return err
		}
	}
	return putRecord(tx, r)
}
