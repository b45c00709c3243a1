package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// The admin API answers with these view structs, never with vault types: the wire
// format is the API's contract, and storage fields (token hashes, sealed bytes) have
// no way into a response.

// upstreamView is a registered upstream. The secret is never shown, only its
// last 4 and whether it is a test or a live key.
type upstreamView struct {
	Name        string `json:"name"`
	Vendor      string `json:"vendor"`
	SecretLast4 string `json:"secret_last4"`
	// Mode is "test" or "live" from the secret's prefix ("" when it has neither).
	Mode string `json:"mode"`
	// BaseURL is where keybrake sends the upstream's requests (--stripe-url).
	BaseURL string `json:"base_url"`
	// WebhookSecretsLast4 are the last 4 characters of each webhook secret
	// Stripe signs the upstream's events with (never the secrets).
	WebhookSecretsLast4 []string  `json:"webhook_secrets_last4"`
	CreatedAt           time.Time `json:"created_at"`
	UpdatedAt           time.Time `json:"updated_at"`
}

func newUpstreamView(u vault.Upstream, mode, baseURL string) upstreamView {
	return upstreamView{
		Name:                u.Name,
		Vendor:              u.Vendor,
		SecretLast4:         u.SecretLast4,
		Mode:                mode,
		BaseURL:             baseURL,
		WebhookSecretsLast4: append([]string{}, u.WebhookSecretsLast4...),
		CreatedAt:           u.CreatedAt.UTC(),
		UpdatedAt:           u.UpdatedAt.UTC(),
	}
}

// secretMode is "live" or "test" for a Stripe secret or restricted key of that
// mode, "" otherwise.
func secretMode(secret string) string {
	for _, mode := range []string{"live", "test"} {
		if strings.HasPrefix(secret, "sk_"+mode+"_") || strings.HasPrefix(secret, "rk_"+mode+"_") {
			return mode
		}
	}
	return ""
}

// keyView is a vault key without its token.
type keyView struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Upstream    string            `json:"upstream"`
	Labels      map[string]string `json:"labels"`
	Policy      policy.Policy     `json:"policy"`
	Status      string            `json:"status"`
	TokenPrefix string            `json:"token_prefix"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
	RevokedAt   *time.Time        `json:"revoked_at,omitempty"`
	// Refused counts the requests refused because the key was revoked or had
	// expired; absent while there is none.
	Refused *refusedView `json:"refused,omitempty"`
	Usage   *usageView   `json:"usage,omitempty"`
	// Warnings, only in the answers of a mint and a change, name caps of the
	// policy that can never bind.
	Warnings []string `json:"warnings,omitempty"`
}

func newKeyView(k vault.Key, now time.Time) keyView {
	return keyView{
		ID:          k.ID,
		Name:        k.Name,
		Upstream:    k.Upstream,
		Labels:      labelsOf(k),
		Policy:      k.Policy,
		Status:      string(k.StatusAt(now)),
		TokenPrefix: k.TokenPrefix,
		CreatedAt:   k.CreatedAt.UTC(),
		UpdatedAt:   k.UpdatedAt.UTC(),
		RevokedAt:   optionalTime(k.RevokedAt),
		Refused:     newRefusedView(k.Refused),
	}
}

// refusedView is a key's count of requests refused for its status.
type refusedView struct {
	Count      int64     `json:"count"`
	Code       string    `json:"code"`
	First      time.Time `json:"first"`
	Last       time.Time `json:"last"`
	RemoteAddr string    `json:"remote_addr"`
	Path       string    `json:"path"`
}

func newRefusedView(r vault.KeyRefusals) *refusedView {
	if r.Count == 0 {
		return nil
	}
	return &refusedView{Count: r.Count, Code: r.Code, First: r.First.UTC(), Last: r.Last.UTC(), RemoteAddr: r.RemoteAddr, Path: r.Path}
}

// labelsOf returns the key's labels, empty rather than nil so that they are {} in
// JSON, never null.
func labelsOf(k vault.Key) map[string]string {
	if k.Labels == nil {
		return map[string]string{}
	}
	return k.Labels
}

// keyWithTokenView is a key as minted or rotated: the only answers that carry the
// token, shown once.
type keyWithTokenView struct {
	keyView
	Token   string `json:"token"`
	BaseURL string `json:"base_url"`
}

// windowView is one cap window's usage; money as decimal strings in the key's
// currency, cap and remaining null when the window has no cap. Cap is the
// effective cap (the policy's plus the raises active now); BaseCap is the
// policy's, present only while a raise adds to it.
type windowView struct {
	Start time.Time `json:"start"`
	// End and ResetAt are null for a window that never ends: the period of
	// a budget without expires_at.
	End       *time.Time `json:"end"`
	Cap       *string    `json:"cap"`
	BaseCap   *string    `json:"base_cap,omitempty"`
	Committed string     `json:"committed"`
	Held      string     `json:"held"`
	Remaining *string    `json:"remaining"`
	ResetAt   *time.Time `json:"reset_at"`
}

// perRequestView is the per-request cap (null when none), effective as
// windowView's.
type perRequestView struct {
	Cap     *string `json:"cap"`
	BaseCap *string `json:"base_cap,omitempty"`
}

// usageView is a key's usage per window.
type usageView struct {
	Currency   string         `json:"currency"`
	Daily      *windowView    `json:"daily"`
	Period     *windowView    `json:"period"`
	PerRequest perRequestView `json:"per_request"`
	// Raises are the raises active now, which the caps include.
	Raises []raiseView `json:"raises"`
}

// newUsageView shows a key's windows (their caps effective at now, as the store
// computed them) and counters.
func newUsageView(k vault.Key, windows []policy.Window, usage policy.Usage, now time.Time) *usageView {
	cur := k.Policy.Currency
	base, _ := k.Policy.Windows(now)
	v := newWindowsUsage(cur, windows, usage, base, k.Raises, now)
	if c, ok := k.PerRequestCap(now); ok {
		s := policy.FormatMinor(cur, c)
		v.PerRequest.Cap = &s
		if b, _ := k.Policy.PerRequestCapMinor(); b != c {
			bs := policy.FormatMinor(cur, b)
			v.PerRequest.BaseCap = &bs
		}
	}
	return v
}

// endOf is when w ends, nil when it never does.
func endOf(w policy.Window) *time.Time {
	if w.End.IsZero() {
		return nil
	}
	t := w.End.UTC()
	return &t
}

// newWindowsUsage is the usage of a key's or a budget's daily and period
// windows, their caps effective at now (with the raises active then); base
// are the windows with the caps of the policy alone, for base_cap.
func newWindowsUsage(cur string, windows []policy.Window, usage policy.Usage, base []policy.Window, raises []vault.Raise, now time.Time) *usageView {
	v := &usageView{Currency: cur, Raises: activeRaiseViews(raises, now)}
	for _, w := range windows {
		cnt := usage[w.ID]
		wv := &windowView{
			Start:     w.Start.UTC(),
			End:       endOf(w),
			Committed: policy.FormatMinor(cur, cnt.Committed),
			Held:      policy.FormatMinor(cur, cnt.Held),
			ResetAt:   endOf(w),
		}
		if w.HasCap {
			c := policy.FormatMinor(cur, w.Cap)
			r := policy.FormatMinor(cur, max(0, w.Cap-cnt.Committed-cnt.Held))
			wv.Cap, wv.Remaining = &c, &r
			for _, b := range base {
				if b.Kind == w.Kind && b.HasCap && b.Cap != w.Cap {
					bc := policy.FormatMinor(cur, b.Cap)
					wv.BaseCap = &bc
				}
			}
		}
		switch w.Kind {
		case policy.WindowDaily:
			v.Daily = wv
		case policy.WindowPeriod:
			v.Period = wv
		}
	}
	return v
}

// holdView is a hold on a key's windows.
type holdView struct {
	ID    string `json:"id"`
	KeyID string `json:"key_id"`
	// KeyName is the key's name (absent where the answer does not name keys).
	KeyName                string     `json:"key_name,omitempty"`
	IdempotencyKey         string     `json:"idempotency_key"`
	UpstreamIdempotencyKey string     `json:"upstream_idempotency_key"`
	Operation              string     `json:"operation"`
	Currency               string     `json:"currency"`
	Amount                 string     `json:"amount"`
	Windows                []string   `json:"windows"`
	State                  string     `json:"state"`
	CreatedAt              time.Time  `json:"created_at"`
	SettledAt              *time.Time `json:"settled_at,omitempty"`
}

func newHoldView(h vault.Hold) holdView {
	windows := policy.WindowIDStrings(h.WindowIDs)
	if windows == nil {
		windows = []string{}
	}
	return holdView{
		ID:                     h.ID,
		KeyID:                  h.KeyID,
		IdempotencyKey:         h.IdempotencyKey,
		UpstreamIdempotencyKey: vault.UpstreamKey(h.KeyID, h.IdempotencyKey),
		Operation:              h.Operation,
		Currency:               h.Currency,
		Amount:                 formatAmount(h.Currency, h.Amount),
		Windows:                windows,
		State:                  string(h.State),
		CreatedAt:              h.CreatedAt.UTC(),
		SettledAt:              optionalTime(h.SettledAt),
	}
}

// eventView is one entry of a key's ledger.
type eventView struct {
	ID              string    `json:"id"`
	Time            time.Time `json:"time"`
	KeyID           string    `json:"key_id"`
	Operation       string    `json:"operation"`
	Amount          string    `json:"amount"`
	Currency        string    `json:"currency,omitempty"`
	Decision        string    `json:"decision"`
	Reason          string    `json:"reason,omitempty"`
	HoldID          string    `json:"hold_id,omitempty"`
	HoldState       string    `json:"hold_state,omitempty"`
	UpstreamStatus  int       `json:"upstream_status,omitempty"`
	StripeRequestID string    `json:"stripe_request_id,omitempty"`
	ObjectID        string    `json:"object_id,omitempty"`
	IdempotencyKey  string    `json:"idempotency_key,omitempty"`
	Tool            string    `json:"tool,omitempty"`
	// Scope is the key or budget a refusal is about (absent on the others).
	Scope string `json:"scope,omitempty"`
	// HeldDelta and CommittedDelta are what the event changed on the key's
	// held and committed money (negative: released or moved out of held).
	HeldDelta      string `json:"held_delta"`
	CommittedDelta string `json:"committed_delta"`
}

func newEventView(e vault.Event) eventView {
	return eventView{
		ID:              e.ID,
		Time:            e.Time.UTC(),
		KeyID:           e.KeyID,
		Operation:       e.Operation,
		Amount:          formatAmount(e.Currency, e.Amount),
		Currency:        e.Currency,
		Decision:        string(e.Decision),
		Reason:          e.Reason,
		HoldID:          e.HoldID,
		HoldState:       string(e.HoldState),
		UpstreamStatus:  e.UpstreamStatus,
		StripeRequestID: e.StripeRequestID,
		ObjectID:        e.ObjectID,
		IdempotencyKey:  e.IdempotencyKey,
		Tool:            e.Tool,
		Scope:           e.Scope,
		HeldDelta:       formatAmount(e.Currency, e.HeldDelta),
		CommittedDelta:  formatAmount(e.Currency, e.CommittedDelta),
	}
}

// auditView is one admin change with its before and after documents.
type auditView struct {
	ID     string          `json:"id"`
	Time   time.Time       `json:"time"`
	Actor  string          `json:"actor"`
	Action string          `json:"action"`
	Target string          `json:"target"`
	Before json.RawMessage `json:"before"`
	After  json.RawMessage `json:"after"`
}

func newAuditView(e vault.AuditEntry) auditView {
	return auditView{
		ID:     e.ID,
		Time:   e.Time.UTC(),
		Actor:  e.Actor,
		Action: e.Action,
		Target: e.Target,
		Before: rawOrNull(e.Before),
		After:  rawOrNull(e.After),
	}
}

// rawOrNull returns b as raw JSON, or null when b is empty or not JSON.
func rawOrNull(b []byte) json.RawMessage {
	if len(b) == 0 || !json.Valid(b) {
		return json.RawMessage("null")
	}
	return json.RawMessage(b)
}

// formatAmount renders minor units in the currency's major unit; an amount without a
// (known) currency is rendered as the plain integer.
func formatAmount(currency string, minor int64) string {
	if _, ok := policy.Exponent(currency); !ok {
		return strconv.FormatInt(minor, 10)
	}
	return policy.FormatMinor(currency, minor)
}

// optionalTime returns t in UTC, or nil (the member is omitted) when t is zero.
func optionalTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// viewsOf maps items to their views. The result is never nil, so that an empty
// listing is [] in JSON, not null.
func viewsOf[T, V any](items []T, view func(T) V) []V {
	out := make([]V, 0, len(items))
	for _, it := range items {
		out = append(out, view(it))
	}
	return out
}

// fieldError is a shorthand for a policy.FieldError.
func fieldError(field, message string) policy.FieldError {
	return policy.FieldError{Field: field, Message: message}
}

// page is a list answer's cursor: next_cursor is absent on the last page.
type page struct {
	NextCursor string `json:"next_cursor,omitempty"`
}

// nameHolds sets each hold's key name, reading each key once. A key that is
// gone (it cannot be: holds keep their key) is named by its id.
func nameHolds(ctx context.Context, store vault.Store, holds []holdView) error {
	names := map[string]string{}
	for i := range holds {
		id := holds[i].KeyID
		name, ok := names[id]
		if !ok {
			k, err := store.GetKey(ctx, id)
			switch {
			case errors.Is(err, vault.ErrNotFound):
				name = id
			case err != nil:
				return fmt.Errorf("name the key of hold %s: %w", holds[i].ID, err)
			default:
				name = k.Name
			}
			names[id] = name
		}
		holds[i].KeyName = name
	}
	return nil
}
