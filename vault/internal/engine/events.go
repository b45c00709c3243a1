package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// The events the vault's own rules emit, each in the transaction of the
// change it reports. Threshold crossings and refusals are judged per scope —
// a key, or anything else with cap windows (a budget) — so every scope with
// windows plugs into the same rules.

// Scope names what a cap belongs to, as events show it: a key or a budget.
type Scope = policy.Scope

// ScopeWindow is one of a scope's windows with its usage after a change.
type ScopeWindow struct {
	Window    policy.Window
	Committed int64
	Held      int64
}

// thresholdData is budget.threshold_crossed's data.
type thresholdData struct {
	Scope     Scope     `json:"scope"`
	Window    string    `json:"window"`
	Threshold int       `json:"threshold"`
	Currency  string    `json:"currency"`
	Committed string    `json:"committed"`
	Held      string    `json:"held"`
	Cap       string    `json:"cap"`
	ResetAt   time.Time `json:"reset_at"`
}

// refusalData is spend_cap.refused's data.
type refusalData struct {
	Scope     Scope     `json:"scope"`
	Window    string    `json:"window"`
	Currency  string    `json:"currency"`
	Operation string    `json:"operation"`
	Requested string    `json:"requested"`
	Committed string    `json:"committed"`
	Held      string    `json:"held"`
	Cap       string    `json:"cap"`
	Remaining string    `json:"remaining"`
	ResetAt   time.Time `json:"reset_at"`
}

// windowMark names one instance of a scope's window: its id and its start
// (a period window keeps its id when its start is changed).
func windowMark(kind string, sc Scope, w policy.Window) string {
	return markKey(kind, string(sc.Kind), sc.ID, string(w.ID), strconv.FormatInt(w.Start.Unix(), 10))
}

// markUntil is how long a window's mark is kept: a day past its end.
func markUntil(w policy.Window) time.Time { return w.End.Add(24 * time.Hour) }

// NoticeUsage emits budget.threshold_crossed for every threshold an endpoint
// asked for that the scope's committed + held has reached on a capped daily
// or period window — once per scope, window instance and threshold: the mark
// is written in tx, the transaction of the hold that reached it.
func (s *Engine) NoticeUsage(tx Tx, now time.Time, sc Scope, currency string, windows []ScopeWindow) error {
	cfg, err := s.webhooks.get(tx)
	if err != nil || len(cfg.thresholds) == 0 {
		return err
	}
	type crossing struct {
		mark string
		w    ScopeWindow
		t    int
	}
	var found []crossing
	for _, sw := range windows {
		w := sw.Window
		if !w.HasCap || w.Cap <= 0 || (w.Kind != policy.WindowDaily && w.Kind != policy.WindowPeriod) {
			continue
		}
		used := sw.Committed + sw.Held
		for _, t := range cfg.thresholds {
			// used/cap ≥ t/100, in integers: money is never a float.
			if used*100 < int64(t)*w.Cap {
				break
			}
			found = append(found, crossing{markKey(windowMark("threshold", sc, w), strconv.Itoa(t)), sw, t})
		}
	}
	if len(found) == 0 {
		return nil
	}
	marks := make([]string, len(found))
	for i, c := range found {
		marks[i] = c.mark
	}
	fresh := s.webhooks.knownMarks(slices.Clone(marks))
	if len(fresh) == 0 {
		return nil
	}
	keys := make([][]byte, len(fresh))
	for i, m := range fresh {
		keys[i] = []byte(m)
	}
	vals, err := tx.GetMany(BucketMarks, keys)
	if err != nil {
		return err
	}
	var seen []string
	todo := map[string]bool{}
	for i, v := range vals {
		if v != nil {
			seen = append(seen, fresh[i])
		} else {
			todo[fresh[i]] = true
		}
	}
	s.webhooks.sawMarks(seen)
	for _, c := range found {
		if !todo[c.mark] {
			continue
		}
		w := c.w.Window
		data := thresholdData{
			Scope: sc, Window: string(w.Kind), Threshold: c.t, Currency: currency,
			Committed: policy.FormatMinor(currency, c.w.Committed), Held: policy.FormatMinor(currency, c.w.Held),
			Cap: policy.FormatMinor(currency, w.Cap), ResetAt: w.End.UTC(),
		}
		t := c.t
		if _, err := emitOnce(tx, now, c.mark, markUntil(w), vault.EventThresholdCrossed, data, func(h *webhookRec) bool {
			return slices.Contains(h.Thresholds, t)
		}); err != nil {
			return err
		}
	}
	return nil
}

// NoticeRefusal emits spend_cap.refused for a request a scope's window
// refused: at most once per scope and window instance.
func (s *Engine) NoticeRefusal(tx Tx, now time.Time, sc Scope, currency, operation string, requested int64, sw ScopeWindow) error {
	cfg, err := s.webhooks.get(tx)
	if err != nil || !cfg.refusals {
		return err
	}
	w := sw.Window
	mark := windowMark("refused", sc, w)
	if len(s.webhooks.knownMarks([]string{mark})) == 0 {
		return nil
	}
	data := refusalData{
		Scope: sc, Window: string(w.Kind), Currency: currency, Operation: operation,
		Requested: policy.FormatMinor(currency, requested),
		Committed: policy.FormatMinor(currency, sw.Committed), Held: policy.FormatMinor(currency, sw.Held),
		Cap:       policy.FormatMinor(currency, w.Cap),
		Remaining: policy.FormatMinor(currency, max(w.Cap-sw.Committed-sw.Held, 0)), ResetAt: w.End.UTC(),
	}
	emitted, err := emitOnce(tx, now, mark, markUntil(w), vault.EventSpendCapRefused, data, nil)
	if err == nil && !emitted {
		s.webhooks.sawMarks([]string{mark})
	}
	return err
}

// keyScope is a vault key as a scope.
func keyScope(k *keyRec) Scope { return k.scope() }

// noticeReserve emits what a Reserve's plan caused: a threshold its new hold
// reached on the key's windows or on a budget's of its chain, or a refusal by
// one of their cap windows or velocity limits.
func (s *Engine) noticeReserve(tx Tx, now time.Time, req *vault.ReserveRequest, pl *reservePlan) error {
	if pl.key == nil || pl.res.err != nil {
		return nil
	}
	cur := pl.key.Policy.EffectiveCurrency()
	res := pl.res.val
	var links []policy.ChainLink
	if pl.chain != nil {
		links = pl.chain.links
	}
	switch {
	case pl.newHold && pl.record != nil && pl.record.Hold != nil:
		amount := pl.record.Hold.Amount
		after := func(from, n int) []ScopeWindow {
			sws := make([]ScopeWindow, 0, n)
			for i := from; i < from+n && i < len(pl.windows) && i < len(pl.counters); i++ {
				sws = append(sws, ScopeWindow{Window: pl.windows[i], Committed: pl.counters[i].Committed, Held: pl.counters[i].Held + amount})
			}
			return sws
		}
		chainLen := 0
		for _, l := range links {
			chainLen += len(l.Windows)
		}
		at := len(pl.windows) - chainLen
		if err := s.NoticeUsage(tx, now, keyScope(pl.key), cur, after(0, at)); err != nil {
			return err
		}
		for _, l := range links {
			if err := s.NoticeUsage(tx, now, l.Scope, l.Currency, after(at, len(l.Windows))); err != nil {
				return err
			}
			at += len(l.Windows)
		}
	case res.Outcome == vault.ReserveRefused && res.Decision.Reason == policy.ReasonCapExceeded:
		dec := res.Decision
		if dec.Scope.Kind == policy.ScopeBudget {
			for _, l := range links {
				if l.Scope.ID != dec.Scope.ID {
					continue
				}
				for _, w := range l.Windows {
					if w.Kind == dec.Cap {
						u := l.Usage[w.ID]
						return s.NoticeRefusal(tx, now, l.Scope, l.Currency, req.Request.Operation, req.Request.Amount,
							ScopeWindow{Window: w, Committed: u.Committed, Held: u.Held})
					}
				}
			}
			return nil
		}
		windows, err := pl.key.Policy.Windows(now)
		if err != nil {
			return err
		}
		for i, w := range windows {
			if w.Kind != dec.Cap || i >= len(pl.counters) {
				continue
			}
			sw := ScopeWindow{Window: w, Committed: pl.counters[i].Committed, Held: pl.counters[i].Held}
			return s.NoticeRefusal(tx, now, keyScope(pl.key), cur, req.Request.Operation, req.Request.Amount, sw)
		}
	case res.Outcome == vault.ReserveRefused && res.Decision.Reason == policy.ReasonVelocityExceeded:
		return s.noticeVelocity(tx, now, req.Request.Operation, res.Decision)
	}
	return nil
}

// velocityData is velocity.refused's data.
type velocityData struct {
	Scope     Scope     `json:"scope"`
	Count     int       `json:"count"`
	Per       string    `json:"per"`
	Operation string    `json:"operation"`
	RetryAt   time.Time `json:"retry_at"`
}

// noticeVelocity emits velocity.refused at most once per scope and minute.
func (s *Engine) noticeVelocity(tx Tx, now time.Time, operation string, dec policy.Decision) error {
	cfg, err := s.webhooks.get(tx)
	if err != nil || !cfg.velocity {
		return err
	}
	minute := now.UTC().Truncate(time.Minute)
	mark := markKey("velocity", string(dec.Scope.Kind), dec.Scope.ID, strconv.FormatInt(minute.Unix(), 10))
	if len(s.webhooks.knownMarks([]string{mark})) == 0 {
		return nil
	}
	data := velocityData{Scope: dec.Scope, Count: dec.Velocity.Count, Per: dec.Velocity.Per, Operation: operation, RetryAt: dec.RetryAt.UTC()}
	emitted, err := emitOnce(tx, now, mark, minute.Add(time.Hour), vault.EventVelocityRefused, data, nil)
	if err == nil && !emitted {
		s.webhooks.sawMarks([]string{mark})
	}
	return err
}

// holdUnknownData is hold.unknown's data.
type holdUnknownData struct {
	HoldID         string    `json:"hold_id"`
	Key            Scope     `json:"key"`
	Operation      string    `json:"operation"`
	Currency       string    `json:"currency"`
	Amount         string    `json:"amount"`
	IdempotencyKey string    `json:"idempotency_key"`
	Since          time.Time `json:"since"`
}

// noticeUnknown emits hold.unknown for a hold whose outcome became unknown,
// once per hold.
func noticeUnknown(tx Tx, now time.Time, h *holdRec) error {
	keyName := ""
	if k, err := getKey(tx, h.KeyID); err == nil {
		keyName = k.Name
	} else if !isNotFound(err) {
		return err
	}
	data := holdUnknownData{
		HoldID: h.ID, Key: Scope{Kind: policy.ScopeKey, ID: h.KeyID, Name: keyName}, Operation: h.Operation,
		Currency: h.Currency, Amount: policy.FormatMinor(h.Currency, h.Amount), IdempotencyKey: h.IdempotencyKey, Since: now.UTC(),
	}
	if _, err := EmitOnce(tx, now, markKey("hold.unknown", h.ID), now.Add(48*time.Hour), vault.EventHoldUnknown, data); err != nil {
		return err
	}
	return indexUnknown(tx, h)
}

// keyExpiringData is key.expiring's data.
type keyExpiringData struct {
	Key       Scope             `json:"key"`
	ExpiresAt time.Time         `json:"expires_at"`
	Within    string            `json:"within"` // "7d" or "1d"
	Labels    map[string]string `json:"labels,omitempty"`
}

// NoticeExpiringKeys emits key.expiring 7 days and 1 day before an active
// key's expires_at, once each (a key whose expiry is moved is told again
// about the new one).
func (s *Engine) NoticeExpiringKeys(ctx context.Context) (int, error) {
	type cand struct{ id string }
	var cands []cand
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		cands = cands[:0]
		return forEach(tx, BucketKeys, func(k, v []byte) error {
			var r keyRec
			if err := decodeJSON(k, v, &r); err != nil {
				return err
			}
			left := r.Policy.ExpiresAt.Sub(now)
			if r.Status == vault.KeyActive && left > 0 && left <= 7*24*time.Hour {
				cands = append(cands, cand{r.ID})
			}
			return nil
		})
	})
	if err != nil {
		return 0, fmt.Errorf("expiring keys: %w", err)
	}
	n := 0
	for _, c := range cands {
		err := s.b.Update(ctx, func(tx Tx, now time.Time) error {
			if err := tx.LockKey(c.id); err != nil {
				return err
			}
			r, err := getKey(tx, c.id)
			if err != nil {
				return err
			}
			exp := r.Policy.ExpiresAt
			left := exp.Sub(now)
			if r.Status != vault.KeyActive || left <= 0 {
				return nil
			}
			within := ""
			switch {
			case left <= 24*time.Hour:
				within = "1d"
			case left <= 7*24*time.Hour:
				within = "7d"
			default:
				return nil
			}
			data := keyExpiringData{Key: keyScope(r), ExpiresAt: exp.UTC(), Within: within, Labels: r.Labels}
			mark := markKey("key.expiring", r.ID, strconv.FormatInt(exp.Unix(), 10), within)
			emitted, err := EmitOnce(tx, now, mark, exp.Add(24*time.Hour), vault.EventKeyExpiring, data)
			if emitted {
				n++
			}
			return err
		})
		if err != nil && !isNotFound(err) {
			return n, fmt.Errorf("expiring key %s: %w", c.id, err)
		}
	}
	return n, nil
}

const pruneBatch = 500

// PruneDeliveries removes the deliveries done longer ago than the ledger
// retention, and the once-marks past their time, in transactions of at most
// pruneBatch deletions.
func (s *Engine) PruneDeliveries(ctx context.Context) (int, error) {
	n := 0
	for {
		removed := 0
		err := s.b.Update(ctx, func(tx Tx, now time.Time) error {
			removed = 0
			limit := uint64(max(now.Add(-s.retention).UnixNano(), 0))
			c := tx.Cursor(BucketDeliveryDone)
			var done [][]byte
			for k, _ := c.First(); k != nil && len(done) < pruneBatch; k, _ = c.Next() {
				if len(k) < 8 || binary.BigEndian.Uint64(k) >= limit {
					break
				}
				done = append(done, bytes.Clone(k))
			}
			for _, k := range done {
				if err := tx.Delete(BucketDeliveries, k[8:]); err != nil {
					return err
				}
				if err := tx.Delete(BucketDeliveryDone, k); err != nil {
					return err
				}
			}
			var marks [][]byte
			mc := tx.Cursor(BucketMarks)
			for k, v := mc.First(); k != nil && len(done)+len(marks) < pruneBatch; k, v = mc.Next() {
				if len(v) == 8 && int64(binary.BigEndian.Uint64(v)) < now.UnixNano() {
					marks = append(marks, bytes.Clone(k))
				}
			}
			for _, k := range marks {
				if err := tx.Delete(BucketMarks, k); err != nil {
					return err
				}
			}
			removed = len(done) + len(marks)
			return nil
		})
		n += removed
		if err != nil {
			return n, fmt.Errorf("prune deliveries: %w", err)
		}
		if removed < pruneBatch {
			return n, nil
		}
	}
}

// upstreamAuthData is upstream.auth_failed's data.
type upstreamAuthData struct {
	Upstream  string    `json:"upstream"`
	Status    int       `json:"status"`
	KeyID     string    `json:"key_id"`
	Operation string    `json:"operation"`
	At        time.Time `json:"at"`
}

// NoticeUpstreamAuthFailed emits upstream.auth_failed at most once per
// upstream and hour: a wrong secret fails every request, and one event an
// hour says so without a flood. The refusal itself changes nothing in the
// store (the attempt is abandoned in its own settle), so the event has a
// transaction of its own.
func (s *Engine) NoticeUpstreamAuthFailed(ctx context.Context, upstream string, status int, keyID, operation string) error {
	err := s.b.Update(ctx, func(tx Tx, now time.Time) error {
		hour := now.UTC().Truncate(time.Hour)
		data := upstreamAuthData{Upstream: upstream, Status: status, KeyID: keyID, Operation: operation, At: now.UTC()}
		_, err := EmitOnce(tx, now, markKey("upstream.auth_failed", upstream, strconv.FormatInt(hour.Unix(), 10)),
			hour.Add(2*time.Hour), vault.EventUpstreamAuthFailed, data)
		return err
	})
	if err != nil {
		return fmt.Errorf("notice upstream auth failure: %w", err)
	}
	return nil
}
