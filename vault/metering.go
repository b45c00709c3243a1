package vault

import (
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/keybrake/keybrake/policy"
)

// reservePlan is what a Reserve decided, reading only, and what it must write.
// Keeping the decision apart from the writes lets the mutation test run them in
// two transactions; Reserve always runs both in one.
type reservePlan struct {
	res txResult[ReserveResult]

	// Writes, applied by apply; none when res is rejected.
	record  *recordRec // record (with its hold) to put: claim, resume, stale
	newHold bool       // add the record's hold amount to held on every window
	windows []policy.Window
	event   *Event
}

func validateReserve(req *ReserveRequest) error {
	switch {
	case req.KeyID == "":
		return fmt.Errorf("empty key id: %w", ErrInvalid)
	case req.IdempotencyKey == "" || len(req.IdempotencyKey) > maxIdemKeyLen:
		return fmt.Errorf("idempotency key must be 1-%d bytes: %w", maxIdemKeyLen, ErrInvalid)
	case req.Request.Amount < 0:
		return fmt.Errorf("negative amount: %w", ErrInvalid)
	case !req.Metered && req.Request.Amount != 0:
		return fmt.Errorf("unmetered request with an amount: %w", ErrInvalid)
	}
	return nil
}

// reserveTx is one Reserve: plan and apply in tx.
func (s *Store) reserveTx(tx *bolt.Tx, now time.Time, req *ReserveRequest) (txResult[ReserveResult], error) {
	pl, err := s.planReserve(tx, now, req)
	if err != nil {
		return txResult[ReserveResult]{}, err
	}
	return pl.res, pl.apply(tx)
}

// planReserve reads everything Reserve needs in tx and decides. It writes nothing.
func (s *Store) planReserve(tx *bolt.Tx, now time.Time, req *ReserveRequest) (*reservePlan, error) {
	if err := validateReserve(req); err != nil {
		return &reservePlan{res: reject[ReserveResult](err)}, nil
	}
	key, err := s.keys.get(tx, req.KeyID)
	if errors.Is(err, ErrNotFound) {
		return &reservePlan{res: reject[ReserveResult](err)}, nil
	} else if err != nil {
		return nil, err
	}
	res := ReserveResult{Key: key.public()}
	if key.Status == KeyRevoked {
		return &reservePlan{res: txResult[ReserveResult]{val: res,
			err: fmt.Errorf("reserve under key %s: %w", key.ID, ErrKeyRevoked)}}, nil
	}
	rec, err := getRecord(tx, req.KeyID, req.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		return s.planExisting(now, req, res, rec)
	}
	return s.planNew(tx, now, req, res, key)
}

// planNew decides a Reserve without an idempotency record: against the key's
// current policy and counters.
func (s *Store) planNew(tx *bolt.Tx, now time.Time, req *ReserveRequest, res ReserveResult, key *keyRec) (*reservePlan, error) {
	windows, err := key.Policy.Windows(now)
	if err != nil {
		return nil, fmt.Errorf("key %s windows: %w", key.ID, err)
	}
	usage := policy.Usage{}
	if req.Metered {
		// An unmetered request holds nothing, so only the non-cap rules may refuse it.
		if usage, err = readUsage(tx, key.ID, windows); err != nil {
			return nil, err
		}
	}
	dec := policy.Decide(&key.Policy, usage, req.Request, now)
	res.Decision = dec
	pl := &reservePlan{}
	if !dec.Allowed {
		res.Outcome = ReserveRefused
		pl.res = accept(res)
		if req.Metered {
			pl.event = &Event{
				Time: now, KeyID: key.ID, Operation: req.Request.Operation, Amount: req.Request.Amount,
				Currency: req.Request.Currency, Decision: DecisionRefused, Reason: string(dec.Reason), Tool: req.Tool,
			}
		}
		return pl, nil
	}
	r := &recordRec{
		KeyID: key.ID, Idem: req.IdempotencyKey,
		Fingerprint: req.Fingerprint, UpstreamKey: UpstreamKey(key.ID, req.IdempotencyKey),
		State: RecordInProgress, LeaseUntil: now.Add(s.lease), CreatedAt: now, UpdatedAt: now, Fresh: true,
	}
	pl.record = r
	res.Outcome = ReserveClaimed
	if req.Metered {
		ids := make([]string, len(windows))
		for i, w := range windows {
			ids[i] = w.ID
		}
		h := &holdRec{
			ID: HoldID(key.ID, req.IdempotencyKey), KeyID: key.ID, IdempotencyKey: req.IdempotencyKey,
			Operation: req.Request.Operation, Currency: req.Request.Currency, Amount: req.Request.Amount,
			WindowIDs: ids, State: HoldHeld, CreatedAt: now,
		}
		r.Hold = h
		pl.newHold, pl.windows = true, windows
		decision := DecisionAllowed
		if dec.WouldRefuse {
			decision = DecisionWouldRefuse
		}
		pl.event = &Event{
			Time: now, KeyID: key.ID, Operation: h.Operation, Amount: h.Amount, Currency: h.Currency,
			Decision: decision, Reason: string(dec.Reason), HoldID: h.ID, HoldState: HoldHeld,
			WindowIDs: ids, HeldDelta: h.Amount, Tool: req.Tool,
		}
		pub := h.public()
		res.Hold = &pub
	}
	res.Record = IdempotencyRecord{
		KeyID: key.ID, IdempotencyKey: req.IdempotencyKey, Fingerprint: r.Fingerprint, UpstreamKey: r.UpstreamKey,
		State: r.State, LeaseUntil: r.LeaseUntil, HoldID: r.holdID(), CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
	}
	pl.res = accept(res)
	return pl, nil
}

// planExisting answers a Reserve whose idempotency record exists.
func (s *Store) planExisting(now time.Time, req *ReserveRequest, res ReserveResult, rec *recordRec) (*reservePlan, error) {
	pl := &reservePlan{}
	hold := rec.Hold
	switch {
	case rec.Fingerprint != req.Fingerprint:
		res.Outcome = ReserveMismatch
	case rec.State == RecordCompleted:
		res.Outcome = ReserveReplay
	case rec.State == RecordInProgress && now.Before(rec.LeaseUntil):
		res.Outcome = ReserveInFlight
	case now.Sub(rec.CreatedAt) > s.unknownLimit:
		// Stripe may have pruned the upstream key by now: an operator decides.
		res.Outcome = ReserveStale
		if rec.State == RecordInProgress {
			rec.State, rec.LeaseUntil, rec.Fresh, rec.UpdatedAt = RecordUnknown, time.Time{}, false, now
			if hold != nil {
				hold.State = HoldUnknown
			}
			pl.record = rec
		}
	default:
		// Unknown, or in_progress under a lapsed lease: forward again with the same
		// upstream key; the hold it already has stays.
		res.Outcome = ReserveResume
		rec.State, rec.LeaseUntil, rec.Fresh, rec.UpdatedAt = RecordInProgress, now.Add(s.lease), false, now
		if hold != nil {
			hold.State = HoldHeld
		}
		pl.record = rec
	}
	pub, err := s.publicRecord(rec)
	if err != nil {
		// A stored response that does not open must not be replayed, nor the
		// record changed.
		return &reservePlan{res: txResult[ReserveResult]{val: ReserveResult{Key: res.Key}, err: err}}, nil
	}
	res.Record = pub
	if hold != nil {
		h := hold.public()
		res.Hold = &h
	}
	pl.res = accept(res)
	return pl, nil
}

// apply writes what planReserve decided: the record, the hold on every window,
// the event (a refusal writes only that).
func (pl *reservePlan) apply(tx *bolt.Tx) error {
	if pl.res.err != nil {
		return nil
	}
	if r := pl.record; r != nil {
		if err := putRecord(tx, r); err != nil {
			return err
		}
		if pl.newHold {
			if err := pl.placeHold(tx); err != nil {
				return err
			}
		}
	}
	if pl.event == nil {
		return nil
	}
	return putEvent(tx, pl.event)
}

// placeHold adds a new hold's amount to held on each of its windows, raising each
// counter's CapPeak to the cap in force (see CheckInvariant).
func (pl *reservePlan) placeHold(tx *bolt.Tx) error {
	r := pl.record
	amount := r.Hold.Amount
	var excused []int64
	for i, w := range pl.windows {
		c, _, err := getCounter(tx, r.KeyID, w.ID)
		if err != nil {
			return err
		}
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

// addToWindows moves money on a hold's windows.
func addToWindows(tx *bolt.Tx, keyID string, windowIDs []string, heldDelta, committedDelta, allowance int64) error {
	for _, id := range windowIDs {
		c, _, err := getCounter(tx, keyID, id)
		if err != nil {
			return err
		}
		c.Held += heldDelta
		c.Committed += committedDelta
		c.Allowance += allowance
		if err := putCounter(tx, keyID, id, c); err != nil {
			return err
		}
	}
	return nil
}

// settleTx applies a Settle. Every reason to turn it down is found before any write.
func (s *Store) settleTx(tx *bolt.Tx, now time.Time, req *SettleRequest) (txResult[noValue], error) {
	switch req.Outcome {
	case SettleCommit, SettleRelease, SettleUnknown, SettleAbandon:
	default:
		return reject[noValue](fmt.Errorf("outcome %q: %w", req.Outcome, ErrInvalid)), nil
	}
	if req.Amount < 0 || req.Object.Moved < 0 {
		return reject[noValue](fmt.Errorf("negative amount: %w", ErrInvalid)), nil
	}
	if req.ObjectID == "" && req.Object != (ObjectSettle{}) {
		return reject[noValue](fmt.Errorf("an object change without an object id: %w", ErrInvalid)), nil
	}
	rec, err := getRecord(tx, req.KeyID, req.IdempotencyKey)
	if err != nil {
		return txResult[noValue]{}, err
	}
	if rec == nil {
		return reject[noValue](fmt.Errorf("idempotency record of key %s: %w", req.KeyID, ErrNotFound)), nil
	}
	if rec.State != RecordInProgress {
		return reject[noValue](fmt.Errorf("idempotency record of key %s is %s: %w", req.KeyID, rec.State, ErrConflict)), nil
	}
	hold := rec.Hold
	var obj *objectRec
	if req.Outcome == SettleCommit {
		// A commit that says nothing about its object (money that moved at once)
		// is only recorded in the ledger with the object's id.
		if req.ObjectID != "" && hold != nil && req.Object != (ObjectSettle{}) {
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
			return reject[noValue](fmt.Errorf("commit of %d above the %d held for it: %w", req.Amount, avail, ErrInvalid)), nil
		}
	}

	// From here on, only writes.
	return accept(noValue{}), s.settleWrites(tx, now, req, rec, obj)
}

// settleWrites writes what a Settle does to rec (and to the money object obj of
// a commit, if any), and its ledger events.
func (s *Store) settleWrites(tx *bolt.Tx, now time.Time, req *SettleRequest, rec *recordRec, obj *objectRec) error {
	hold := rec.Hold
	var resp *responseRec
	var err error
	if req.Response != nil && req.Outcome != SettleAbandon {
		if resp, err = s.sealResponse(req.KeyID, req.IdempotencyKey, req.Response); err != nil {
			return err
		}
	}
	ev := &Event{
		Time: now, KeyID: req.KeyID, Decision: DecisionSettled, Reason: string(req.Outcome),
		UpstreamStatus: req.UpstreamStatus, StripeRequestID: req.StripeRequestID, ObjectID: req.ObjectID,
		Tool: req.Tool,
	}
	if hold != nil {
		ev.Operation, ev.Currency, ev.HoldID, ev.WindowIDs = hold.Operation, hold.Currency, hold.ID, hold.WindowIDs
		ev.Amount = hold.Amount
	}
	switch req.Outcome {
	case SettleCommit, SettleRelease:
		rec.State, rec.LeaseUntil, rec.Fresh, rec.CompletedAt = RecordCompleted, time.Time{}, false, now
		rec.Response, rec.RequestID = resp, req.StripeRequestID
		switch {
		case obj != nil: // a commit with a hold, against a money object
			if err := commitObject(tx, now, req, hold, obj, ev); err != nil {
				return err
			}
		case hold != nil && req.Outcome == SettleCommit:
			// At most the hold (checked above), unless an allowed overrun.
			held, over := hold.Amount, max(0, req.Amount-hold.Amount)
			hold.State, hold.Amount, hold.SettledAt = HoldCommitted, req.Amount, now
			ev.HeldDelta, ev.CommittedDelta, ev.Amount = -held, req.Amount, req.Amount
			ev.AllowanceDeltas = sameForEach(hold.WindowIDs, over)
			if err := addToWindows(tx, hold.KeyID, hold.WindowIDs, -held, req.Amount, over); err != nil {
				return err
			}
		case hold != nil:
			ev.HeldDelta = -hold.Amount
			hold.State, hold.SettledAt = HoldReleased, now
			if err := addToWindows(tx, hold.KeyID, hold.WindowIDs, -hold.Amount, 0, 0); err != nil {
				return err
			}
		}
	case SettleUnknown:
		rec.State, rec.LeaseUntil, rec.Fresh = RecordUnknown, time.Time{}, false
		if resp != nil {
			rec.Response, rec.RequestID = resp, req.StripeRequestID
		}
		if hold != nil {
			hold.State = HoldUnknown
		}
	case SettleAbandon:
		if rec.Fresh {
			// This claim created the record and its hold: forget both, so a retry
			// starts afresh.
			if hold != nil {
				ev.HeldDelta, ev.HoldState = -hold.Amount, HoldReleased
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
		rec.State, rec.LeaseUntil = RecordUnknown, time.Time{}
		if hold != nil {
			hold.State = HoldUnknown
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
func commitObject(tx *bolt.Tx, now time.Time, req *SettleRequest, hold *holdRec, obj *objectRec, ev *Event) error {
	amount, ch := req.Amount, req.Object
	fromParts := min(amount, obj.held())
	changes := obj.commit(fromParts)
	held := hold.Amount
	fromHold := min(amount-fromParts, held)
	over := amount - fromParts - fromHold
	var toPart int64
	if ch.Expose && !ch.Terminal {
		toPart = held - fromHold
	}
	hold.State, hold.Amount, hold.SettledAt = HoldCommitted, fromHold+over, now
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
	obj.Amount += amount
	obj.Own = obj.Own || ch.Created
	if ch.MovedKnown {
		obj.Moved, obj.MovedSeen = ch.Moved, true
	}
	obj.UpdatedAt = now
	if err := putObject(tx, req.KeyID, req.ObjectID, obj); err != nil {
		return err
	}
	return applyPartChanges(tx, now, req.KeyID, req.ObjectID, ev.Operation, obj.Currency, changes)
}

// sameForEach is n for each of ids, or nil when n is 0 (events leave it out).
func sameForEach(ids []string, n int64) []int64 {
	if n == 0 {
		return nil
	}
	out := make([]int64, len(ids))
	for i := range out {
		out[i] = n
	}
	return out
}

func (s *Store) resolveHoldTx(tx *bolt.Tx, now time.Time, actor, holdID string, outcome HoldState) (Hold, error) {
	if outcome != HoldCommitted && outcome != HoldReleased {
		return Hold{}, fmt.Errorf("resolve outcome %q (committed or released): %w", outcome, ErrInvalid)
	}
	rec, err := getRecordByHold(tx, holdID)
	if err != nil {
		return Hold{}, err
	}
	hold := rec.Hold
	lapsed := rec.State == RecordInProgress && !now.Before(rec.LeaseUntil)
	if hold.State != HoldUnknown && !(hold.State == HoldHeld && lapsed) {
		return Hold{}, fmt.Errorf("hold %s is %s: %w", holdID, hold.State, ErrConflict)
	}
	before := hold.public()
	ev := &Event{
		Time: now, KeyID: hold.KeyID, Operation: hold.Operation, Amount: hold.Amount, Currency: hold.Currency,
		Decision: DecisionResolved, Reason: "operator:" + string(outcome), HoldID: hold.ID, HoldState: outcome,
		WindowIDs: hold.WindowIDs, HeldDelta: -hold.Amount,
	}
	committed := int64(0)
	if outcome == HoldCommitted {
		committed = hold.Amount
		ev.CommittedDelta = hold.Amount
	}
	if err := addToWindows(tx, hold.KeyID, hold.WindowIDs, -hold.Amount, committed, 0); err != nil {
		return Hold{}, err
	}
	hold.State, hold.SettledAt = outcome, now
	// No answer is stored: keybrake never saw Stripe's. A retry is told what the
	// operator decided (IdempotencyRecord.Resolved, and the hold's state).
	rec.State, rec.LeaseUntil, rec.Fresh, rec.Resolved = RecordCompleted, time.Time{}, false, true
	rec.Response, rec.RequestID, rec.CompletedAt, rec.UpdatedAt = nil, "", now, now
	if err := putRecord(tx, rec); err != nil {
		return Hold{}, err
	}
	if err := putEvent(tx, ev); err != nil {
		return Hold{}, err
	}
	after := hold.public()
	if err := putAudit(tx, now, actor, "hold.resolve", hold.ID, before, after); err != nil {
		return Hold{}, err
	}
	return after, nil
}

// listHoldsTx pages through the hold index (creation time, then hold id) newest
// first, keeping the holds in state ("" for all). The cursor is the index key of
// the last hold of the previous page.
func listHoldsTx(tx *bolt.Tx, state HoldState, limit int, cursor string) ([]Hold, string, error) {
	switch state {
	case "", HoldHeld, HoldCommitted, HoldReleased, HoldUnknown:
	default:
		return nil, "", fmt.Errorf("hold state %q: %w", state, ErrInvalid)
	}
	start := []byte{0xff} // after every index key: they start with a creation time in 2262 or before
	if cursor != "" {
		before, err := decodeCursor(cursor)
		if err != nil {
			return nil, "", err
		}
		start = []byte(before)
	}
	return pageNewestFirst(tx.Bucket(bucketHoldIndex), nil, start, limit, newestFirst[Hold]{
		keep: func(_, v []byte) bool { return state == "" || string(v) == string(state) },
		decode: func(k, _ []byte) (Hold, error) {
			rec, err := getRecordByHold(tx, string(k[8:]))
			if err != nil {
				return Hold{}, fmt.Errorf("hold index: %w", err)
			}
			return rec.Hold.public(), nil
		},
		cursor: func(k []byte, _ Hold) string { return string(k) },
	})
}

// recoverInProgress turns every in_progress record into unknown (their holds stay,
// counted as held): the process that claimed them is gone, so nobody knows whether
// Stripe got the request.
func recoverInProgress(tx *bolt.Tx, now time.Time) (int, error) {
	var todo []*recordRec
	err := tx.Bucket(bucketIdem).ForEach(func(k, v []byte) error {
		r, err := decodeRecord(k, v)
		if err != nil {
			return err
		}
		if r.State == RecordInProgress {
			todo = append(todo, r)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, r := range todo {
		r.State, r.LeaseUntil, r.Fresh, r.UpdatedAt = RecordUnknown, time.Time{}, false, now
		if r.Hold != nil {
			r.Hold.State = HoldUnknown
		}
		if err := putRecord(tx, r); err != nil {
			return 0, err
		}
	}
	return len(todo), nil
}
