package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// Renewals (docs/renewals.md): the objects a key's request created
// indirectly are linked to the key (links), and a renewal invoice of a linked
// subscription is metered against it once, in one transaction: held as the
// invoice's exposure under the caps, or over a cap paused at Stripe (a pending
// pause, sent after the transaction by the proxy's worker) or counted. What
// the invoice moves later (paid, voided) is applied to that exposure as any
// read of a money object is.

// RenewalOperation is the operation of the ledger events of a renewal.
const RenewalOperation = "invoices.renewal"

// maxLinkID bounds the ids of a link (Stripe's are far shorter).
const maxLinkID = 255

func linkKey(upstream, objectID string) []byte { return idemKey(upstream, objectID) }

func getLink(tx Tx, upstream, objectID string) (*vault.ObjectLink, error) {
	var l vault.ObjectLink
	ok, err := getJSON(tx, BucketLinks, linkKey(upstream, objectID), &l)
	if err != nil || !ok {
		return nil, err
	}
	return &l, nil
}

func validLinkID(id string) bool {
	return id != "" && len(id) <= maxLinkID && !strings.ContainsRune(id, 0)
}

// LinkObject links an object to a key (vault.RenewalStore).
func (s *Engine) LinkObject(ctx context.Context, l vault.ObjectLink) (vault.ObjectLink, bool, error) {
	if !validLinkID(l.Upstream) || !validLinkID(l.ObjectID) || l.KeyID == "" || (l.Via != "" && !validLinkID(l.Via)) {
		return vault.ObjectLink{}, false, fmt.Errorf("link object: %w", vault.ErrInvalid)
	}
	var (
		out     vault.ObjectLink
		created bool
	)
	err := s.submit(ctx, func(tx Tx, now time.Time) error {
		var err error
		out, created, err = linkObjectTx(tx, now, l)
		return err
	})
	if err != nil {
		return vault.ObjectLink{}, false, fmt.Errorf("link object %s: %w", l.ObjectID, err)
	}
	return out, created, nil
}

// linkObjectTx writes l unless the object is linked already (the first link
// stands).
func linkObjectTx(tx Tx, now time.Time, l vault.ObjectLink) (vault.ObjectLink, bool, error) {
	if err := tx.LockKey(l.KeyID); err != nil {
		return vault.ObjectLink{}, false, err
	}
	key, err := getKey(tx, l.KeyID)
	if err != nil {
		return vault.ObjectLink{}, false, err
	}
	if key.Upstream != l.Upstream {
		return vault.ObjectLink{}, false, fmt.Errorf("key %s spends through upstream %q, not %q: %w", key.ID, key.Upstream, l.Upstream, vault.ErrInvalid)
	}
	old, err := getLink(tx, l.Upstream, l.ObjectID)
	if err != nil {
		return vault.ObjectLink{}, false, err
	}
	if old != nil {
		return *old, false, nil
	}
	l.CreatedAt, l.EndedAt = now, time.Time{}
	return l, true, insertJSON(tx, BucketLinks, linkKey(l.Upstream, l.ObjectID), &l)
}

// GetLink returns an object's link (vault.RenewalStore).
func (s *Engine) GetLink(ctx context.Context, upstream, objectID string) (vault.ObjectLink, error) {
	var out *vault.ObjectLink
	err := s.view(ctx, func(tx Tx, _ time.Time) error {
		var err error
		out, err = getLink(tx, upstream, objectID)
		return err
	})
	if err != nil {
		return vault.ObjectLink{}, fmt.Errorf("get link: %w", err)
	}
	if out == nil {
		return vault.ObjectLink{}, fmt.Errorf("link of %s: %w", objectID, vault.ErrNotFound)
	}
	return *out, nil
}

// EndLink notes that Stripe ended a linked object (vault.RenewalStore).
func (s *Engine) EndLink(ctx context.Context, upstream, objectID string) error {
	err := s.submit(ctx, func(tx Tx, now time.Time) error {
		l, err := getLink(tx, upstream, objectID)
		if err != nil {
			return err
		}
		if l == nil {
			return fmt.Errorf("link of %s: %w", objectID, vault.ErrNotFound)
		}
		if !l.EndedAt.IsZero() {
			return nil
		}
		l.EndedAt = now
		return putJSON(tx, BucketLinks, linkKey(upstream, objectID), l)
	})
	if err != nil {
		return fmt.Errorf("end link: %w", err)
	}
	return nil
}

// judgeLink removes the link of an object that ended ObjectRetention ago, and
// the link of a renewal invoice once its key keeps nothing of it.
func judgeLink(tx Tx, now time.Time, k, v []byte) (reapVerdict, error) {
	var l vault.ObjectLink
	if err := decodeJSON(k, v, &l); err != nil {
		return reapVerdict{}, err
	}
	switch {
	case !l.EndedAt.IsZero() && now.Sub(l.EndedAt) > vault.ObjectRetention:
	case l.Renewal != "" && now.Sub(l.CreatedAt) > vault.ObjectRetention:
		// A renewal's link is what makes its events apply once: kept while
		// the key's record of the invoice is, and at least ObjectRetention.
		if o, ok, err := getObject(tx, l.KeyID, l.ObjectID); err != nil || (ok && len(o.Parts) > 0) {
			return reapVerdict{}, err
		}
		if p, err := tx.Get(BucketRenewalPauses, k); err != nil || p != nil {
			return reapVerdict{}, err
		}
	default:
		return reapVerdict{}, nil
	}
	return removeEntry("", BucketLinks, k), nil
}

// renewalPausedData is renewal.paused's data.
type renewalPausedData struct {
	InvoiceID      string `json:"invoice_id"`
	SubscriptionID string `json:"subscription_id"`
	Key            Scope  `json:"key"`
	AmountDue      string `json:"amount_due"`
	Currency       string `json:"currency"`
	Cap            string `json:"cap,omitempty"`
	Remaining      string `json:"remaining,omitempty"`
	Reason         string `json:"reason"`
	Message        string `json:"message"`
}

func validateRenewal(r *vault.Renewal) error {
	switch {
	case !validLinkID(r.Upstream) || !validLinkID(r.InvoiceID) || !validLinkID(r.SubscriptionID):
		return fmt.Errorf("renewal without its upstream, invoice or subscription: %w", vault.ErrInvalid)
	case r.AmountDue < 0:
		return fmt.Errorf("renewal of a negative amount: %w", vault.ErrInvalid)
	case r.Currency == "":
		return fmt.Errorf("renewal without a currency: %w", vault.ErrInvalid)
	}
	return nil
}

// ApplyRenewal meters a renewal invoice (vault.RenewalStore).
func (s *Engine) ApplyRenewal(ctx context.Context, r vault.Renewal) (vault.RenewalResult, error) {
	if err := validateRenewal(&r); err != nil {
		return vault.RenewalResult{}, fmt.Errorf("apply renewal: %w", err)
	}
	var res vault.RenewalResult
	err := s.submit(ctx, func(tx Tx, now time.Time) error {
		var err error
		res, err = s.applyRenewalTx(tx, now, r) // a re-run starts over
		return err
	})
	if err != nil {
		return vault.RenewalResult{}, fmt.Errorf("apply renewal %s: %w", r.InvoiceID, err)
	}
	return res, nil
}

// renewalStanding is the operation a renewal is judged as: the key's
// standing to start the subscription it renews, as it started it.
func renewalStanding(via string) string {
	switch {
	case strings.HasPrefix(via, "cs_"):
		return "checkout.sessions.create"
	case strings.HasPrefix(via, "plink_"):
		return "payment_links.create"
	}
	return "subscriptions.create"
}

// applyRenewalTx is ApplyRenewal in tx: the decision and every write of it.
func (s *Engine) applyRenewalTx(tx Tx, now time.Time, r vault.Renewal) (vault.RenewalResult, error) {
	sub, err := getLink(tx, r.Upstream, r.SubscriptionID)
	if err != nil {
		return vault.RenewalResult{}, err
	}
	if sub == nil {
		return vault.RenewalResult{}, fmt.Errorf("subscription %s is linked to no key: %w", r.SubscriptionID, vault.ErrNotFound)
	}
	if err := tx.LockKey(sub.KeyID); err != nil {
		return vault.RenewalResult{}, err
	}
	if old, err := getLink(tx, r.Upstream, r.InvoiceID); err != nil || old != nil {
		if old != nil {
			return vault.RenewalResult{Link: *old}, nil // decided before: once per invoice
		}
		return vault.RenewalResult{}, err
	}
	key, err := s.keys.get(tx, sub.KeyID)
	if err != nil {
		return vault.RenewalResult{}, err
	}
	link := vault.ObjectLink{
		Upstream: r.Upstream, ObjectID: r.InvoiceID, KeyID: key.ID, StripeAccount: r.StripeAccount, Via: r.SubscriptionID,
		Amount: r.AmountDue, Currency: r.Currency, EventID: r.EventID, CreatedAt: now,
	}
	windows, err := keyWindows(tx, key, now)
	if err != nil {
		return vault.RenewalResult{}, err
	}
	counters, err := getCounters(tx, key.ID, windowIDs(windows))
	if err != nil {
		return vault.RenewalResult{}, err
	}
	chain, err := planChain(tx, key, now)
	if err != nil {
		return vault.RenewalResult{}, err
	}
	req := policy.Request{Operation: renewalStanding(sub.Via), Amount: r.AmountDue, Currency: r.Currency,
		Customer: r.Customer, Account: r.StripeAccount}
	var dec policy.Decision
	switch {
	case key.Status == vault.KeyRevoked:
		dec = policy.Decision{Reason: policy.ReasonExpired, Message: "the key is revoked"}
	case chain.refusal != nil:
		dec = *chain.refusal
	default:
		dec = policy.DecideChain(key.decisionPolicy(now), key.scope(), windows, usageOf(windows, counters), req, now, chain.links)
	}
	cur := key.Policy.EffectiveCurrency()
	over := !dec.Allowed || dec.WouldRefuse
	mode := key.Policy.EffectiveRenewals()
	res := vault.RenewalResult{Applied: true}
	if over {
		res.Message = dec.Message
	}
	switch {
	case over && r.Currency != cur:
		// Money the key's counters cannot hold: never counted, so paused
		// whatever the mode says (it cannot be metered and alerted on).
		link.Renewal = vault.RenewalPaused
		if res.Message == "" {
			res.Message = fmt.Sprintf("the renewal is in %s; the key counts %s", r.Currency, cur)
		}
	case over && mode == policy.RenewalsPauseOverCap && r.Draft && !dec.Allowed:
		// (Allowed with WouldRefuse is report mode: nothing is enforced, so
		// nothing is paused either; it is counted as report mode counts.)
		link.Renewal = vault.RenewalPaused
	case over:
		link.Renewal = vault.RenewalCounted
		if !r.Draft && mode == policy.RenewalsPauseOverCap {
			res.Message += "; the invoice was finalised before keybrake heard of it, so it is counted, not paused"
		}
	default:
		link.Renewal = vault.RenewalHeld
	}
	if link.Renewal == vault.RenewalPaused {
		if err := s.pauseRenewalTx(tx, now, key, r, dec, res.Message); err != nil {
			return vault.RenewalResult{}, err
		}
	} else {
		all := append(slices.Clip(windows), chain.windows...)
		cs := append(slices.Clip(counters), chain.counters...)
		if err := s.holdRenewalTx(tx, now, key, r, all, cs, len(windows), chain.links, dec); err != nil {
			return vault.RenewalResult{}, err
		}
	}
	if err := insertJSON(tx, BucketLinks, linkKey(r.Upstream, r.InvoiceID), &link); err != nil {
		return vault.RenewalResult{}, err
	}
	res.Link = link
	return res, nil
}

// holdRenewalTx holds a renewal's amount as the invoice's exposure on every
// window (the key's, then its budgets'), excusing what it adds beyond a cap
// as report mode does, and emits the thresholds it reaches.
func (s *Engine) holdRenewalTx(tx Tx, now time.Time, key *keyRec, r vault.Renewal, windows []policy.Window, counters []counter,
	keyWindowsN int, links []policy.ChainLink, dec policy.Decision) error {
	amount := r.AmountDue
	ids := windowIDs(windows)
	var excused []int64
	for i, w := range windows {
		c := counters[i]
		if w.HasCap {
			c.CapPeak = max(c.CapPeak, w.Cap)
			if over := c.Committed + c.Held + amount - w.Cap; over > 0 {
				if excused == nil {
					excused = make([]int64, len(windows))
				}
				excused[i] = min(over, amount)
				c.Allowance += excused[i]
			}
		} else {
			c.Uncapped = true
		}
		c.Held += amount
		if err := putCounter(tx, key.ID, w.ID, c); err != nil {
			return err
		}
	}
	o, _, err := getObject(tx, key.ID, r.InvoiceID)
	if err != nil {
		return err
	}
	o.addPart("", ids, amount, now)
	o.Own, o.MovedSeen, o.Closed = true, true, false
	o.Currency, o.StripeAccount = r.Currency, r.StripeAccount
	if o.CreatedAt.IsZero() {
		o.CreatedAt = now
	}
	o.UpdatedAt = now
	if err := putObject(tx, key.ID, r.InvoiceID, o); err != nil {
		return err
	}
	if err := indexObject(tx, key.ID, r.InvoiceID); err != nil {
		return err
	}
	decision, reason := vault.DecisionAllowed, "renewal"
	if excused != nil || dec.WouldRefuse || !dec.Allowed {
		decision, reason = vault.DecisionWouldRefuse, string(dec.Reason)
		if reason == "" {
			reason = string(policy.ReasonCapExceeded)
		}
	}
	ev := &vault.Event{
		Time: now, KeyID: key.ID, Operation: RenewalOperation, Amount: amount, Currency: r.Currency,
		Decision: decision, Reason: reason, ObjectID: r.InvoiceID, WindowIDs: ids, HeldDelta: amount,
		AllowanceDeltas: excused, StripeRequestID: r.EventID,
	}
	if err := putEvent(tx, ev); err != nil {
		return err
	}
	after := func(from, n int) []ScopeWindow {
		out := make([]ScopeWindow, 0, n)
		for i := from; i < from+n && i < len(windows); i++ {
			out = append(out, ScopeWindow{Window: windows[i], Committed: counters[i].Committed, Held: counters[i].Held + amount})
		}
		return out
	}
	if err := s.NoticeUsage(tx, now, key.scope(), key.Policy.EffectiveCurrency(), after(0, keyWindowsN)); err != nil {
		return err
	}
	at := keyWindowsN
	for _, l := range links {
		if err := s.NoticeUsage(tx, now, l.Scope, l.Currency, after(at, len(l.Windows))); err != nil {
			return err
		}
		at += len(l.Windows)
	}
	return nil
}

// pauseRenewalTx queues the pause of a renewal over a cap, records the
// refusal in the key's ledger and emits renewal.paused.
func (s *Engine) pauseRenewalTx(tx Tx, now time.Time, key *keyRec, r vault.Renewal, dec policy.Decision, msg string) error {
	p := vault.RenewalPause{Upstream: r.Upstream, InvoiceID: r.InvoiceID, KeyID: key.ID, StripeAccount: r.StripeAccount,
		NextAt: now, CreatedAt: now}
	if err := insertJSON(tx, BucketRenewalPauses, linkKey(r.Upstream, r.InvoiceID), &p); err != nil {
		return err
	}
	reason := string(dec.Reason)
	if reason == "" {
		reason = string(policy.ReasonCurrencyNotAllowed)
	}
	ev := &vault.Event{
		Time: now, KeyID: key.ID, Operation: RenewalOperation, Amount: r.AmountDue, Currency: r.Currency,
		Decision: vault.DecisionRefused, Reason: reason, ObjectID: r.InvoiceID, StripeRequestID: r.EventID,
		Scope: dec.Scope.ID,
	}
	if err := putEvent(tx, ev); err != nil {
		return err
	}
	data := renewalPausedData{
		InvoiceID: r.InvoiceID, SubscriptionID: r.SubscriptionID, Key: key.scope(),
		AmountDue: policy.FormatMinor(r.Currency, r.AmountDue), Currency: r.Currency, Reason: reason, Message: msg,
	}
	if dec.Reason == policy.ReasonCapExceeded && dec.Limit > 0 {
		data.Cap = policy.FormatMinor(r.Currency, dec.Limit)
		data.Remaining = policy.FormatMinor(r.Currency, max(dec.Remaining, 0))
	}
	_, err := EmitEvent(tx, now, vault.EventRenewalPaused, data)
	return err
}

// DuePauses lists the pending pauses that are due (vault.RenewalStore).
func (s *Engine) DuePauses(ctx context.Context, limit int) ([]vault.RenewalPause, error) {
	if limit <= 0 {
		limit = 50
	}
	var out []vault.RenewalPause
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		out = out[:0] // a re-run starts over
		return forEach(tx, BucketRenewalPauses, func(k, v []byte) error {
			var p vault.RenewalPause
			if err := decodeJSON(k, v, &p); err != nil {
				return err
			}
			if !p.NextAt.After(now) {
				out = append(out, p)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("due pauses: %w", err)
	}
	slices.SortFunc(out, func(a, b vault.RenewalPause) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out[:min(limit, len(out))], nil
}

// PauseSent removes a pending pause (vault.RenewalStore).
func (s *Engine) PauseSent(ctx context.Context, upstream, invoiceID, lastError string) error {
	err := s.submit(ctx, func(tx Tx, now time.Time) error {
		k := linkKey(upstream, invoiceID)
		var p vault.RenewalPause
		ok, err := getJSON(tx, BucketRenewalPauses, k, &p)
		if err != nil || !ok {
			return err
		}
		if err := tx.LockKey(p.KeyID); err != nil {
			return err
		}
		if lastError != "" {
			// Stripe will collect it: counted after all, so its payment is.
			if err := s.countUnpausedTx(tx, now, p); err != nil {
				return err
			}
			return tx.Delete(BucketRenewalPauses, k)
		}
		ev := &vault.Event{Time: now, KeyID: p.KeyID, Operation: RenewalOperation, Decision: vault.DecisionRefused,
			Reason: "auto_advance_false", ObjectID: invoiceID}
		if err := putEvent(tx, ev); err != nil {
			return err
		}
		return tx.Delete(BucketRenewalPauses, k)
	})
	if err != nil {
		return fmt.Errorf("pause sent: %w", err)
	}
	return nil
}

// countUnpausedTx counts a renewal whose pause Stripe refused for good (the
// draft was finalised meanwhile): it is held as a counted renewal, the excess
// over the caps as an allowance, so that the money Stripe collects is
// committed from it.
func (s *Engine) countUnpausedTx(tx Tx, now time.Time, p vault.RenewalPause) error {
	l, err := getLink(tx, p.Upstream, p.InvoiceID)
	if err != nil || l == nil || l.Renewal != vault.RenewalPaused {
		return err
	}
	key, err := getKey(tx, p.KeyID)
	if isNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if l.Currency != key.Policy.EffectiveCurrency() {
		return nil // it cannot be counted in the key's currency
	}
	windows, err := keyWindows(tx, key, now)
	if err != nil {
		return err
	}
	counters, err := getCounters(tx, key.ID, windowIDs(windows))
	if err != nil {
		return err
	}
	chain, err := planChain(tx, key, now)
	if err != nil {
		return err
	}
	all := append(slices.Clip(windows), chain.windows...)
	cs := append(slices.Clip(counters), chain.counters...)
	r := vault.Renewal{Upstream: p.Upstream, InvoiceID: p.InvoiceID, SubscriptionID: l.Via, StripeAccount: l.StripeAccount,
		AmountDue: l.Amount, Currency: l.Currency, EventID: l.EventID}
	dec := policy.Decision{Allowed: true, WouldRefuse: true, Reason: policy.ReasonCapExceeded}
	if err := s.holdRenewalTx(tx, now, key, r, all, cs, len(windows), chain.links, dec); err != nil {
		return err
	}
	l.Renewal = vault.RenewalCounted
	return putJSON(tx, BucketLinks, linkKey(p.Upstream, p.InvoiceID), l)
}

// PauseFailed records a failed attempt at a pause (vault.RenewalStore).
func (s *Engine) PauseFailed(ctx context.Context, upstream, invoiceID string, retryAt time.Time, lastError string) error {
	err := s.submit(ctx, func(tx Tx, _ time.Time) error {
		k := linkKey(upstream, invoiceID)
		var p vault.RenewalPause
		ok, err := getJSON(tx, BucketRenewalPauses, k, &p)
		if err != nil || !ok {
			return err
		}
		p.Attempts++
		p.NextAt, p.LastError = retryAt, lastError
		return putJSON(tx, BucketRenewalPauses, k, &p)
	})
	if err != nil {
		return fmt.Errorf("pause failed: %w", err)
	}
	return nil
}

// applyIndirectTx applies ev.Indirect in the transaction of the event's id:
// what it links is added to res.Linked, a renewal's decision to res.Renewal.
// known says the event concerned an object linked to a key. An object
// linked to no key (or to a key since deleted) is skipped.
func (s *Engine) applyIndirectTx(tx Tx, now time.Time, ev vault.StripeEvent, res *vault.StripeEventResult) (known bool, err error) {
	in := ev.Indirect
	if in == nil {
		return false, nil
	}
	link := func(l vault.ObjectLink) error {
		_, created, err := linkObjectTx(tx, now, l)
		if isNotFound(err) || errors.Is(err, vault.ErrInvalid) {
			return nil // a key deleted, or of another upstream: nobody's
		}
		if created {
			res.Linked = append(res.Linked, l.ObjectID)
		}
		known = known || err == nil
		return err
	}
	if r := in.Renewal; r != nil {
		r.Upstream, r.EventID, r.StripeAccount = ev.Upstream, ev.ID, in.Account
		if err := validateRenewal(r); err != nil {
			return false, nil // nothing keybrake can meter: the event says too little
		}
		rr, err := s.applyRenewalTx(tx, now, *r)
		if isNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if rr.Applied {
			res.Linked = append(res.Linked, r.InvoiceID)
		}
		res.Renewal = rr.Link.Renewal
		return true, nil
	}
	if in.InvoiceID != "" && validLinkID(in.InvoiceID) && validLinkID(in.SubscriptionID) {
		sub, err := getLink(tx, ev.Upstream, in.SubscriptionID)
		if err != nil || sub == nil {
			return false, err
		}
		return known, link(vault.ObjectLink{Upstream: ev.Upstream, ObjectID: in.InvoiceID, KeyID: sub.KeyID,
			StripeAccount: in.Account, Via: in.SubscriptionID, EventID: ev.ID})
	}
	if in.Started != "" && validLinkID(in.Started) && validLinkID(in.SessionID) {
		via := in.SessionID
		from, err := getLink(tx, ev.Upstream, via)
		if err == nil && from == nil && validLinkID(in.PaymentLinkID) {
			via = in.PaymentLinkID
			from, err = getLink(tx, ev.Upstream, via)
		}
		if err != nil || from == nil {
			return false, err
		}
		return known, link(vault.ObjectLink{Upstream: ev.Upstream, ObjectID: in.Started, KeyID: from.KeyID,
			StripeAccount: in.Account, Via: via, EventID: ev.ID})
	}
	if in.Ended != "" && validLinkID(in.Ended) {
		l, err := getLink(tx, ev.Upstream, in.Ended)
		if err != nil || l == nil {
			return false, err
		}
		if l.EndedAt.IsZero() {
			l.EndedAt = now
			if err := putJSON(tx, BucketLinks, linkKey(ev.Upstream, in.Ended), l); err != nil {
				return false, err
			}
		}
		return true, nil
	}
	return false, nil
}

// settleLink writes a committed Settle's link (SettleRequest.Link) to the
// key, of the key's upstream; an id that cannot be linked is left unlinked.
func settleLink(tx Tx, now time.Time, req *vault.SettleRequest) error {
	if req.Link == nil || req.Outcome != vault.SettleCommit || !validLinkID(req.Link.ObjectID) {
		return nil
	}
	key, err := getKey(tx, req.KeyID)
	if err != nil {
		return err
	}
	l := *req.Link
	l.Upstream, l.KeyID = key.Upstream, key.ID
	_, _, err = linkObjectTx(tx, now, l)
	return err
}
