package engine

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// checkPolicy normalizes p (defaults only fill what is unset) and validates it as a
// new or changed policy: ErrInvalid wrapping the *policy.ValidationError.
func checkPolicy(p *policy.Policy, now time.Time) error {
	p.Normalize(now)
	if err := p.ValidateNew(now); err != nil {
		return fmt.Errorf("%w: %w", vault.ErrInvalid, err)
	}
	return nil
}

func checkLabels(labels map[string]string) error {
	for k, v := range labels {
		if k == "" || len(k) > maxNameLen || len(v) > 1000 {
			return fmt.Errorf("%w: %w", vault.ErrInvalid, &policy.ValidationError{Errors: []policy.FieldError{
				{Field: "labels", Message: "keys must be 1-200 bytes and values at most 1000 bytes"},
			}})
		}
	}
	return nil
}

func (s *Engine) mintKeyTx(tx Tx, now time.Time, actor string, req vault.MintRequest) (vault.Key, string, error) {
	if !validName(req.Name) {
		return vault.Key{}, "", fmt.Errorf("%w: %w", vault.ErrInvalid, &policy.ValidationError{Errors: []policy.FieldError{
			{Field: "name", Message: "must be 1-200 printable bytes"},
		}})
	}
	if err := checkLabels(req.Labels); err != nil {
		return vault.Key{}, "", err
	}
	p := req.Policy
	if err := checkPolicy(&p, now); err != nil {
		return vault.Key{}, "", err
	}
	upstream := req.Upstream
	if upstream == "" {
		upstream = "default"
	}
	if _, err := getUpstream(tx, upstream); err != nil {
		return vault.Key{}, "", err
	}
	if err := moveKeyBudget(tx, "", &p); err != nil {
		return vault.Key{}, "", err
	}
	taken, err := tx.Get(BucketNames, []byte(req.Name))
	if err != nil {
		return vault.Key{}, "", err
	}
	if taken != nil {
		return vault.Key{}, "", fmt.Errorf("key name %q is taken: %w", req.Name, vault.ErrConflict)
	}
	var newest []byte
	if last, _ := tx.Cursor(BucketKeys).Last(); last != nil {
		newest, _ = decodeKeyID(string(last))
	}
	raw, err := newKeyIDRaw(now, newest)
	if err != nil {
		return vault.Key{}, "", err
	}
	token, err := newToken()
	if err != nil {
		return vault.Key{}, "", err
	}
	rec := &keyRec{
		ID: encodeKeyID(raw), Name: req.Name, Upstream: upstream, Labels: maps.Clone(req.Labels), Policy: p,
		Status: vault.KeyActive, TokenHash: tokenHash(token), TokenPrefix: token[:tokenDisplayLen],
		CreatedAt: now, UpdatedAt: now,
	}
	if err := insertJSON(tx, BucketKeys, []byte(rec.ID), rec); err != nil {
		return vault.Key{}, "", err
	}
	if err := tx.Insert(BucketNames, []byte(rec.Name), []byte(rec.ID)); err != nil {
		return vault.Key{}, "", fmt.Errorf("index key name: %w", err)
	}
	if err := tx.Insert(BucketTokens, []byte(rec.TokenHash), []byte(rec.ID)); err != nil {
		return vault.Key{}, "", fmt.Errorf("index key token: %w", err)
	}
	if err := putAudit(tx, now, actor, "key.mint", rec.ID, nil, rec.view()); err != nil {
		return vault.Key{}, "", err
	}
	return rec.public(), token, nil
}

// authRec is what Authenticate reads for a token: the key, and the version of
// its upstream's secret as of the same transaction (0 when the upstream is
// not registered), which the proxy's secret cache is keyed on.
type authRec struct {
	key             *keyRec // shared with the key cache: read it, or take public()
	upstreamVersion uint64
}

// authenticateTx reads the key of the token whose hash is hash (revoked or
// not): ErrKeyInvalid when there is none. The result shares maps and slices
// with the cache of decoded keys: read it, or take public().
//
// Where tx reads a third entry with the token and its key
// (ThroughWithGetter: one statement on PostgreSQL), the upstream the token's
// key named when this replica last authenticated it is read with them; it
// is only a hint of which entry to read. The version returned is always the
// one of the upstream the key read now names, read as of the key's moment or
// after it: when the hint names another upstream (or there is none), that
// one is read next, as without the hint.
func (s *Engine) authenticateTx(tx Tx, hash string) (authRec, error) {
	var (
		id, raw, up []byte
		err         error
	)
	g, withOK := tx.(ThroughWithGetter)
	hint := ""
	if withOK {
		hint, _ = s.authHints.Get(hash)
	}
	if hint != "" {
		id, raw, up, err = g.GetThroughWith(BucketTokens, []byte(hash), BucketKeys, Read{Bucket: BucketUpstreams, Key: []byte(hint)})
	} else {
		// The token and its key in one read: a token is written with its
		// key and names it for good.
		id, raw, err = getThrough(tx, BucketTokens, []byte(hash), BucketKeys)
	}
	if err != nil {
		return authRec{}, err
	}
	if id == nil {
		return authRec{}, vault.ErrKeyInvalid
	}
	rec, err := s.keys.decode(string(id), raw)
	if err != nil {
		return authRec{}, err
	}
	if hint == "" || rec.Upstream != hint {
		if up, err = tx.Get(BucketUpstreams, []byte(rec.Upstream)); err != nil {
			return authRec{}, err
		}
		if withOK {
			s.authHints.Put(hash, rec.Upstream)
		}
	}
	if up == nil {
		return authRec{key: rec}, nil
	}
	version, err := s.upstreamVersions.of(rec.Upstream, up, decodeUpstreamVersion)
	if err != nil {
		return authRec{}, err
	}
	return authRec{key: rec, upstreamVersion: version}, nil
}

// decodeUpstreamVersion is the version of upstream name's entry raw:
// Authenticate decodes it once per change of its bytes (upstreamVersions),
// not on every request.
func decodeUpstreamVersion(name string, raw []byte) (uint64, error) {
	var rec upstreamRec
	if err := decodeJSON([]byte(name), raw, &rec); err != nil {
		return 0, err
	}
	return rec.version(), nil
}

func listKeysTx(tx Tx, now time.Time, f vault.KeyFilter) ([]vault.Key, string, error) {
	switch f.Status {
	case "", vault.KeyActive, vault.KeyRevoked, vault.KeyExpired:
	default:
		return nil, "", fmt.Errorf("key status %q: %w", f.Status, vault.ErrInvalid)
	}
	after, err := decodeCursor(f.Cursor)
	if err != nil {
		return nil, "", err
	}
	limit := clampLimit(f.Limit)
	out := []vault.Key{}
	c := tx.Cursor(BucketKeys)
	for k, v := firstAfter(c, after); k != nil; k, v = c.Next() {
		var rec keyRec
		if err := decodeJSON(k, v, &rec); err != nil {
			return nil, "", err
		}
		key := rec.public()
		if !keyMatches(&key, now, f) {
			continue
		}
		if len(out) == limit {
			// There is at least one more match: the page ends at the last one returned.
			return out, encodeCursor(out[len(out)-1].ID), nil
		}
		out = append(out, key)
	}
	return out, "", nil
}

func keyMatches(k *vault.Key, now time.Time, f vault.KeyFilter) bool {
	if f.Status != "" && k.StatusAt(now) != f.Status {
		return false
	}
	if f.Upstream != "" && k.Upstream != f.Upstream {
		return false
	}
	if f.NamePrefix != "" && !strings.HasPrefix(k.Name, f.NamePrefix) {
		return false
	}
	for lk, lv := range f.Labels {
		if got, ok := k.Labels[lk]; !ok || got != lv {
			return false
		}
	}
	return true
}

func updateKeyTx(tx Tx, now time.Time, actor, id string, p policy.Policy, labels map[string]string) (vault.Key, error) {
	rec, err := getKey(tx, id)
	if err != nil {
		return vault.Key{}, err
	}
	return changeKeyTx(tx, now, actor, rec, p, labels)
}

// patchKeyTx applies change to the key id as this transaction reads it: the
// read takes the key's lock (on PostgreSQL getKey reads the row FOR UPDATE),
// so no other write of the key comes between the read that Apply sees and the
// write. Apply's own error is returned in refused, with nothing written, so
// that the transaction commits empty and the error reaches the caller as it
// is; the vault's errors are the transaction's.
func patchKeyTx(tx Tx, now time.Time, actor, id string, change vault.KeyChange) (key vault.Key, refused, err error) {
	rec, err := getKey(tx, id)
	if err != nil {
		return vault.Key{}, nil, err
	}
	if v := rec.version(); change.IfVersion != 0 && change.IfVersion != v {
		return vault.Key{}, nil, fmt.Errorf("key %s is at version %d, not %d: %w", id, v, change.IfVersion, vault.ErrPrecondition)
	}
	p, labels, refused := change.Apply(rec.public(), now)
	if refused != nil {
		return vault.Key{}, refused, nil
	}
	key, err = changeKeyTx(tx, now, actor, rec, p, labels)
	return key, nil, err
}

// changeKeyTx gives rec the policy p and labels, validated as a changed key's.
func changeKeyTx(tx Tx, now time.Time, actor string, rec *keyRec, p policy.Policy, labels map[string]string) (vault.Key, error) {
	id := rec.ID
	if rec.Status == vault.KeyRevoked {
		return vault.Key{}, fmt.Errorf("key %s is revoked: %w", id, vault.ErrConflict)
	}
	if err := checkLabels(labels); err != nil {
		return vault.Key{}, err
	}
	if err := checkPolicy(&p, now); err != nil {
		return vault.Key{}, err
	}
	// Counters are kept in minor units of the key's currency; a different currency
	// would make every stored amount mean something else.
	if p.Currency != rec.Policy.Currency {
		return vault.Key{}, fmt.Errorf("%w: %w", vault.ErrInvalid, &policy.ValidationError{Errors: []policy.FieldError{
			{Field: "currency", Message: fmt.Sprintf("cannot be changed (the key meters %s)", rec.Policy.Currency)},
		}})
	}
	if err := moveKeyBudget(tx, rec.Policy.Budget, &p); err != nil {
		return vault.Key{}, err
	}
	if err := carryDailyUsage(tx, now, rec, &p); err != nil {
		return vault.Key{}, err
	}
	before := rec.view()
	rec.Policy = p
	rec.Labels = maps.Clone(labels)
	rec.UpdatedAt = now
	if err := putKey(tx, rec); err != nil {
		return vault.Key{}, err
	}
	if err := putAudit(tx, now, actor, "key.update", id, before, rec.view()); err != nil {
		return vault.Key{}, err
	}
	return rec.public(), nil
}

// carryDailyUsage keeps a change of time zone from opening a fresh daily
// budget. Daily counters are keyed by the local date, so a new zone can put now
// in another day's window; what the current window of the old zone has used
// (committed and held) is then carried into the current window of the new
// zone as committed usage, topped up rather than added when that window has
// usage already. The new window resets at the new zone's next midnight. Holds
// still settle on the windows they were placed on, so carried money stays
// counted until the new window ends even if its hold is released. The carry is
// a ledger event ("carried", reason "timezone_changed") so that the ledger
// still sums to the counters, and a carry above the new window's cap is booked
// as allowance (the money was spent under the old zone's window).
func carryDailyUsage(tx Tx, now time.Time, rec *keyRec, p *policy.Policy) error {
	return carryDay(tx, now, rec.ID, &rec.Policy, p, p.EffectiveCurrency(), func(w policy.WindowID) policy.WindowID { return w })
}

// carryDay is carryDailyUsage for the scope owner (a key, or a budget whose
// window ids name turns scoped) going from the policy from to the policy to;
// the carried event is in owner's ledger.
func carryDay(tx Tx, now time.Time, owner string, from, to *policy.Policy, currency string, name func(policy.WindowID) policy.WindowID) error {
	fw, err := from.Windows(now)
	if err != nil {
		return fmt.Errorf("%s windows: %w", owner, err)
	}
	tw, err := to.Windows(now)
	if err != nil {
		return fmt.Errorf("%s windows: %w", owner, err)
	}
	oldDay, newDay := fw[0], tw[0] // Windows puts the daily window first
	if oldDay.ID == newDay.ID {
		return nil
	}
	oldID, newID := name(oldDay.ID), name(newDay.ID)
	used, _, err := getCounter(tx, owner, oldID)
	if err != nil {
		return err
	}
	c, _, err := getCounter(tx, owner, newID)
	if err != nil {
		return err
	}
	carry := used.Committed + used.Held - (c.Committed + c.Held)
	if carry <= 0 {
		return nil
	}
	c.Committed += carry
	var excused int64
	if newDay.HasCap {
		c.CapPeak = max(c.CapPeak, newDay.Cap)
		excused = max(0, c.Committed+c.Held-c.CapPeak-c.Allowance)
		c.Allowance += excused
	} else {
		c.Uncapped = true
	}
	if err := putCounter(tx, owner, newID, c); err != nil {
		return err
	}
	op := "key.update"
	if strings.HasPrefix(owner, policy.BudgetIDPrefix) {
		op = "budget.update"
	}
	return putEvent(tx, &vault.Event{
		Time: now, KeyID: owner, Operation: op, Amount: carry, Currency: currency,
		Decision: vault.DecisionCarried, Reason: "timezone_changed", WindowIDs: []policy.WindowID{newID}, CommittedDelta: carry,
		AllowanceDeltas: []int64{excused},
	})
}

func revokeKeyTx(tx Tx, now time.Time, actor, id string) (vault.Key, error) {
	rec, err := getKey(tx, id)
	if err != nil {
		return vault.Key{}, err
	}
	if rec.Status == vault.KeyRevoked {
		return rec.public(), nil
	}
	// A revoked key moves no more money: it stops counting as a key of its
	// budget, which can then be deleted (its holds still settle there).
	if b := rec.Policy.Budget; b != "" {
		br, err := getBudget(tx, b)
		if err != nil && !errors.Is(err, vault.ErrNotFound) {
			return vault.Key{}, err
		}
		if br != nil {
			br.Keys--
			if err := putBudget(tx, br); err != nil {
				return vault.Key{}, err
			}
		}
	}
	before := rec.view()
	rec.Status = vault.KeyRevoked
	rec.RevokedAt = now
	rec.UpdatedAt = now
	if err := putKey(tx, rec); err != nil {
		return vault.Key{}, err
	}
	// The token index entry stays, so the revoked token is answered "revoked", not "invalid".
	if err := putAudit(tx, now, actor, "key.revoke", id, before, rec.view()); err != nil {
		return vault.Key{}, err
	}
	return rec.public(), nil
}

func rotateKeyTx(tx Tx, now time.Time, actor, id string) (vault.Key, string, error) {
	rec, err := getKey(tx, id)
	if err != nil {
		return vault.Key{}, "", err
	}
	if rec.Status == vault.KeyRevoked {
		return vault.Key{}, "", fmt.Errorf("key %s is revoked: %w", id, vault.ErrConflict)
	}
	token, err := newToken()
	if err != nil {
		return vault.Key{}, "", err
	}
	got, err := tx.Get(BucketTokens, []byte(rec.TokenHash))
	if err != nil {
		return vault.Key{}, "", err
	}
	if got != nil && bytes.Equal(got, []byte(rec.ID)) {
		if err := tx.Delete(BucketTokens, []byte(rec.TokenHash)); err != nil {
			return vault.Key{}, "", fmt.Errorf("unindex old token: %w", err)
		}
	}
	before := rec.view()
	rec.TokenHash = tokenHash(token)
	rec.TokenPrefix = token[:tokenDisplayLen]
	rec.UpdatedAt = now
	if err := putKey(tx, rec); err != nil {
		return vault.Key{}, "", err
	}
	if err := tx.Insert(BucketTokens, []byte(rec.TokenHash), []byte(rec.ID)); err != nil {
		return vault.Key{}, "", fmt.Errorf("index new token: %w", err)
	}
	if err := putAudit(tx, now, actor, "key.rotate", id, before, rec.view()); err != nil {
		return vault.Key{}, "", err
	}
	return rec.public(), token, nil
}

// keyUsageTx reads a key's windows at now and their counters (the key through
// the cache of decoded keys).
func (s *Engine) keyUsageTx(tx Tx, now time.Time, id string) (vault.Key, []policy.Window, policy.Usage, error) {
	rec, err := s.keys.get(tx, id)
	if err != nil {
		return vault.Key{}, nil, nil, err
	}
	windows, err := keyWindows(tx, rec, now)
	if err != nil {
		return vault.Key{}, nil, nil, err
	}
	usage, err := readUsage(tx, id, windows)
	if err != nil {
		return vault.Key{}, nil, nil, err
	}
	return rec.public(), windows, usage, nil
}

// readUsage reads the counters of windows into a policy.Usage.
func readUsage(tx Tx, keyID string, windows []policy.Window) (policy.Usage, error) {
	counters, err := getCounters(tx, keyID, windowIDs(windows))
	if err != nil {
		return nil, err
	}
	return usageOf(windows, counters), nil
}

// usageOf is the policy's view of the counters of windows.
func usageOf(windows []policy.Window, counters []counter) policy.Usage {
	usage := make(policy.Usage, len(windows))
	for i, w := range windows {
		if c := counters[i]; c != (counter{}) {
			usage[w.ID] = policy.Counter{Committed: c.Committed, Held: c.Held}
		}
	}
	return usage
}

// windowIDs lists the ids of windows.
func windowIDs(windows []policy.Window) []policy.WindowID {
	ids := make([]policy.WindowID, len(windows))
	for i, w := range windows {
		ids[i] = w.ID
	}
	return ids
}
