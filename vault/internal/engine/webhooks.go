package engine

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"time"

	"github.com/keybrake/keybrake/vault"
)

// RetrySchedule is how long after each failed attempt of a delivery the next
// one is made (with jitter); after the last, the delivery is failed.
var RetrySchedule = []time.Duration{
	5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour,
	10 * time.Hour, 14 * time.Hour, 20 * time.Hour, 24 * time.Hour,
}

// SecretOverlap is how long a rotated-out secret keeps signing beside the new one.
const SecretOverlap = 24 * time.Hour

// DefaultThresholds are an endpoint's thresholds when it names none.
var DefaultThresholds = []int{80, 100}

const (
	maxWebhookURLLen  = 2048
	maxDescriptionLen = 500
	maxThresholds     = 10
	webhookSecretLen  = 32
	// WebhookSecretPrefix starts every signing secret (Standard Webhooks).
	WebhookSecretPrefix = "whsec_"
)

// retryDelay is the wait after failed attempt n (from 1), with ±10% jitter;
// ok is false after the last.
func retryDelay(n int) (time.Duration, bool) {
	if n < 1 || n > len(RetrySchedule) {
		return 0, false
	}
	d := RetrySchedule[n-1]
	jitter := time.Duration(rand.Int64N(int64(d)/5+1)) - d/10
	return d + jitter, true
}

func newWebhookSecret() (string, error) {
	var b [webhookSecretLen]byte
	if _, err := cryptoRead(b[:]); err != nil {
		return "", fmt.Errorf("read random secret: %w", err)
	}
	return WebhookSecretPrefix + base64.StdEncoding.EncodeToString(b[:]), nil
}

var cryptoRead = crand.Read

// checkWebhookURL checks the form of an endpoint's URL: absolute http or
// https with a host and no credentials. Which addresses it may reach is the
// deliverer's to judge (it resolves the name).
func checkWebhookURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case len(raw) > maxWebhookURLLen:
		return fmt.Errorf("url is longer than %d characters: %w", maxWebhookURLLen, vault.ErrInvalid)
	case err != nil:
		return fmt.Errorf("url: %w", vault.ErrInvalid)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("url must be http or https: %w", vault.ErrInvalid)
	case u.Hostname() == "":
		return fmt.Errorf("url has no host: %w", vault.ErrInvalid)
	case u.User != nil:
		return fmt.Errorf("url must not carry credentials: %w", vault.ErrInvalid)
	case u.Fragment != "":
		return fmt.Errorf("url must not have a fragment: %w", vault.ErrInvalid)
	}
	return nil
}

func checkEvents(events []string) ([]string, error) {
	if len(events) == 0 {
		return nil, fmt.Errorf("events: name at least one event type (or \"*\"): %w", vault.ErrInvalid)
	}
	out := slices.Clone(events)
	for _, e := range out {
		if !vault.KnownEventType(e) {
			return nil, fmt.Errorf("events: unknown event type %q: %w", e, vault.ErrInvalid)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func checkThresholds(ts []int) ([]int, error) {
	if ts == nil {
		return slices.Clone(DefaultThresholds), nil
	}
	if len(ts) > maxThresholds {
		return nil, fmt.Errorf("thresholds: at most %d: %w", maxThresholds, vault.ErrInvalid)
	}
	out := slices.Clone(ts)
	for _, t := range out {
		if t < 1 || t > 100 {
			return nil, fmt.Errorf("thresholds: %d is not a percentage from 1 to 100: %w", t, vault.ErrInvalid)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func checkDescription(d string) error {
	if len(d) > maxDescriptionLen {
		return fmt.Errorf("description is longer than %d characters: %w", maxDescriptionLen, vault.ErrInvalid)
	}
	return nil
}

// updateWebhooks is update for a change of the endpoints: the hot path's
// view of them is forgotten once it commits.
func (s *Engine) updateWebhooks(ctx context.Context, fn TxFunc) error {
	defer s.webhooks.forget()
	return s.b.Update(ctx, fn)
}

// CreateWebhook adds an endpoint with a new secret, returned only here.
func (s *Engine) CreateWebhook(ctx context.Context, actor string, in vault.WebhookInput) (vault.Webhook, string, error) {
	if err := checkWebhookURL(in.URL); err != nil {
		return vault.Webhook{}, "", err
	}
	events, err := checkEvents(in.Events)
	if err != nil {
		return vault.Webhook{}, "", err
	}
	thresholds, err := checkThresholds(in.Thresholds)
	if err != nil {
		return vault.Webhook{}, "", err
	}
	if err := checkDescription(in.Description); err != nil {
		return vault.Webhook{}, "", err
	}
	secret, err := newWebhookSecret()
	if err != nil {
		return vault.Webhook{}, "", err
	}
	var out vault.Webhook
	err = s.updateWebhooks(ctx, func(tx Tx, now time.Time) error {
		seq, err := tx.NextSequence(BucketWebhooks)
		if err != nil {
			return err
		}
		id := seqID(webhookIDPrefix, seq)
		sealed, err := s.seal.seal([]byte(secret), webhookAD(id))
		if err != nil {
			return err
		}
		r := &webhookRec{Webhook: vault.Webhook{
			ID: id, URL: in.URL, Events: events, Thresholds: thresholds, Description: in.Description,
			Status: vault.WebhookEnabled, SecretLast4: last4(secret), Version: 1, CreatedAt: now, UpdatedAt: now,
		}, Secrets: []webhookSecret{{Sealed: sealed}}}
		if err := insertJSON(tx, BucketWebhooks, []byte(id), r); err != nil {
			return err
		}
		out = r.public(now)
		return putAudit(tx, now, actor, "webhook.create", id, nil, out)
	})
	if err != nil {
		return vault.Webhook{}, "", fmt.Errorf("create webhook: %w", err)
	}
	return out, secret, nil
}

// ListWebhooks lists every endpoint, oldest first.
func (s *Engine) ListWebhooks(ctx context.Context) ([]vault.Webhook, error) {
	var out []vault.Webhook
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		hooks, err := readWebhooks(tx)
		out = out[:0]
		for _, h := range hooks {
			out = append(out, h.public(now))
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	return out, nil
}

// GetWebhook returns one endpoint; ErrNotFound when there is none.
func (s *Engine) GetWebhook(ctx context.Context, id string) (vault.Webhook, error) {
	var out vault.Webhook
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		r, err := getWebhook(tx, id)
		if err == nil {
			out = r.public(now)
		}
		return err
	})
	return out, err
}

// PatchWebhook changes an endpoint in one transaction, its row locked (on
// PostgreSQL a read of an endpoint in a write transaction locks it).
func (s *Engine) PatchWebhook(ctx context.Context, actor, id string, ch vault.WebhookChange) (vault.Webhook, error) {
	var out vault.Webhook
	err := s.updateWebhooks(ctx, func(tx Tx, now time.Time) error {
		r, err := getWebhook(tx, id)
		if err != nil {
			return err
		}
		if ch.IfVersion != 0 && ch.IfVersion != r.Version {
			return fmt.Errorf("webhook %s is at version %d, not %d: %w", id, r.Version, ch.IfVersion, vault.ErrPrecondition)
		}
		before := r.public(now)
		if ch.URL != nil {
			if err := checkWebhookURL(*ch.URL); err != nil {
				return err
			}
			r.URL = *ch.URL
		}
		if ch.Events != nil {
			if r.Events, err = checkEvents(*ch.Events); err != nil {
				return err
			}
		}
		if ch.Thresholds != nil {
			if r.Thresholds, err = checkThresholds(*ch.Thresholds); err != nil {
				return err
			}
		}
		if ch.Description != nil {
			if err := checkDescription(*ch.Description); err != nil {
				return err
			}
			r.Description = *ch.Description
		}
		if ch.Status != nil {
			switch *ch.Status {
			case vault.WebhookEnabled:
				r.DisabledReason = ""
			case vault.WebhookDisabled:
				if r.Status != vault.WebhookDisabled {
					r.DisabledReason = "disabled by " + actor
				}
			default:
				return fmt.Errorf("status must be enabled or disabled: %w", vault.ErrInvalid)
			}
			r.Status = *ch.Status
		}
		r.Version++
		r.UpdatedAt = now
		if err := putJSON(tx, BucketWebhooks, []byte(id), r); err != nil {
			return err
		}
		out = r.public(now)
		return putAudit(tx, now, actor, "webhook.update", id, before, out)
	})
	if err != nil {
		return vault.Webhook{}, fmt.Errorf("patch webhook: %w", err)
	}
	return out, nil
}

// DeleteWebhook removes an endpoint. Its pending deliveries fail when they
// come due; its delivery log goes with the retention.
func (s *Engine) DeleteWebhook(ctx context.Context, actor, id string) error {
	err := s.updateWebhooks(ctx, func(tx Tx, now time.Time) error {
		r, err := getWebhook(tx, id)
		if err != nil {
			return err
		}
		if err := tx.Delete(BucketWebhooks, []byte(id)); err != nil {
			return err
		}
		return putAudit(tx, now, actor, "webhook.delete", id, r.public(now), nil)
	})
	if err != nil {
		return fmt.Errorf("delete webhook: %w", err)
	}
	return nil
}

// RotateWebhookSecret gives the endpoint a new secret; the current one keeps
// signing beside it for SecretOverlap.
func (s *Engine) RotateWebhookSecret(ctx context.Context, actor, id string) (vault.Webhook, string, error) {
	secret, err := newWebhookSecret()
	if err != nil {
		return vault.Webhook{}, "", err
	}
	var out vault.Webhook
	err = s.updateWebhooks(ctx, func(tx Tx, now time.Time) error {
		r, err := getWebhook(tx, id)
		if err != nil {
			return err
		}
		sealed, err := s.seal.seal([]byte(secret), webhookAD(id))
		if err != nil {
			return err
		}
		until := now.Add(SecretOverlap)
		kept := []webhookSecret{{Sealed: sealed}}
		for _, old := range r.Secrets {
			if old.Until.IsZero() {
				old.Until = until
			}
			if old.Until.After(now) {
				kept = append(kept, old)
			}
		}
		r.Secrets, r.SecretLast4, r.PreviousSecretUntil = kept, last4(secret), until
		r.Version++
		r.UpdatedAt = now
		if err := putJSON(tx, BucketWebhooks, []byte(id), r); err != nil {
			return err
		}
		out = r.public(now)
		return putAudit(tx, now, actor, "webhook.rotate_secret", id, nil, map[string]any{
			"secret_last4": out.SecretLast4, "previous_secret_until": until})
	})
	if err != nil {
		return vault.Webhook{}, "", fmt.Errorf("rotate webhook secret: %w", err)
	}
	return out, secret, nil
}

// TestWebhook queues a webhook.test event to the endpoint alone.
func (s *Engine) TestWebhook(ctx context.Context, actor, id string) (vault.Delivery, error) {
	var out vault.Delivery
	err := s.b.Update(ctx, func(tx Tx, now time.Time) error {
		r, err := getWebhook(tx, id)
		if err != nil {
			return err
		}
		if r.Status != vault.WebhookEnabled {
			return fmt.Errorf("webhook %s is disabled: %w", id, vault.ErrConflict)
		}
		body, err := jsonBody(vault.EventWebhookTest, now, map[string]any{
			"webhook_id": id, "message": "A test event sent by " + actor + ".",
		})
		if err != nil {
			return err
		}
		seq, err := tx.NextSequence(BucketDeliveries)
		if err != nil {
			return err
		}
		d, err := newDelivery(tx, now, id, seqID(eventIDPrefix, seq), vault.EventWebhookTest, body)
		if err != nil {
			return err
		}
		out = d.public()
		return putAudit(tx, now, actor, "webhook.test", id, nil, map[string]string{"delivery_id": d.ID})
	})
	if err != nil {
		return vault.Delivery{}, fmt.Errorf("test webhook: %w", err)
	}
	return out, nil
}

// ListDeliveries lists an endpoint's deliveries, newest first; cursor is the
// previous page's next.
func (s *Engine) ListDeliveries(ctx context.Context, webhookID string, limit int, cursor string) ([]vault.Delivery, string, error) {
	limit = clampLimit(limit)
	var (
		out  []vault.Delivery
		next string
	)
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		out, next = out[:0], ""
		if _, err := getWebhook(tx, webhookID); err != nil {
			return err
		}
		prefix := append([]byte(webhookID), 0)
		seek := append(bytes.Clone(prefix), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
		if cursor != "" {
			k, ok := deliveryKeyOf(webhookID, cursor)
			if !ok {
				return fmt.Errorf("cursor: %w", vault.ErrInvalid)
			}
			seek = k
		}
		c := tx.Cursor(BucketDeliveries)
		k, v := c.Seek(seek)
		if k == nil {
			k, v = c.Last()
		}
		for ; k != nil && !bytes.Equal(k, seek) && !bytes.HasPrefix(k, prefix); k, v = c.Prev() {
		}
		if k != nil && bytes.Equal(k, seek) {
			k, v = c.Prev()
		}
		for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Prev() {
			if len(out) == limit {
				next = out[len(out)-1].ID
				break
			}
			var r deliveryRec
			if err := decodeJSON(k, v, &r); err != nil {
				return err
			}
			out = append(out, r.public())
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("list deliveries: %w", err)
	}
	return out, next, nil
}

// RetryDelivery makes a delivered or failed delivery pending again, due now,
// for one more attempt. A pending one is ErrConflict.
func (s *Engine) RetryDelivery(ctx context.Context, actor, webhookID, deliveryID string) (vault.Delivery, error) {
	k, ok := deliveryKeyOf(webhookID, deliveryID)
	if !ok {
		return vault.Delivery{}, fmt.Errorf("delivery %s: %w", deliveryID, vault.ErrNotFound)
	}
	var out vault.Delivery
	err := s.b.Update(ctx, func(tx Tx, now time.Time) error {
		h, err := getWebhook(tx, webhookID)
		if err != nil {
			return err
		}
		if h.Status != vault.WebhookEnabled {
			return fmt.Errorf("webhook %s is disabled: %w", webhookID, vault.ErrConflict)
		}
		r, err := getDelivery(tx, k)
		if err != nil {
			return err
		}
		if r == nil {
			return fmt.Errorf("delivery %s: %w", deliveryID, vault.ErrNotFound)
		}
		if r.State == vault.DeliveryPending {
			return fmt.Errorf("delivery %s is pending: %w", deliveryID, vault.ErrConflict)
		}
		prev := *r
		r.State, r.NextAt, r.Leased, r.DoneAt, r.LastTry = vault.DeliveryPending, now, false, time.Time{}, true
		if err := putDelivery(tx, k, &prev, r); err != nil {
			return err
		}
		out = r.public()
		return putAudit(tx, now, actor, "webhook.delivery_retry", webhookID, nil, map[string]string{"delivery_id": deliveryID})
	})
	if err != nil {
		return vault.Delivery{}, fmt.Errorf("retry delivery: %w", err)
	}
	return out, nil
}

// ClaimDeliveries claims up to limit due deliveries for an attempt each: a
// claimed delivery is due again only when lease ends (a deliverer that died),
// and its attempt count is the fencing token FinishDelivery checks. On
// PostgreSQL the read of each delivery locks its row, so two replicas never
// claim one delivery at once; the one that waited finds it leased.
func (s *Engine) ClaimDeliveries(ctx context.Context, limit int, lease time.Duration) ([]vault.DeliveryJob, error) {
	var jobs []vault.DeliveryJob
	err := s.b.Update(ctx, func(tx Tx, now time.Time) error {
		jobs = jobs[:0]
		var due [][]byte
		c := tx.Cursor(BucketDeliveryDue)
		for k, _ := c.First(); k != nil && len(due) < limit; k, _ = c.Next() {
			if len(k) < 8 || int64(binary.BigEndian.Uint64(k)) > now.UnixNano() {
				break
			}
			due = append(due, bytes.Clone(k[8:]))
		}
		hooks := map[string]*webhookRec{}
		for _, k := range due {
			r, err := getDelivery(tx, k)
			if err != nil {
				return err
			}
			if r == nil || r.State != vault.DeliveryPending || r.NextAt.After(now) {
				continue // another claimer took it first
			}
			h, ok := hooks[r.WebhookID]
			if !ok {
				var err error
				if h, err = getWebhook(tx, r.WebhookID); err != nil && !isNotFound(err) {
					return err
				}
				hooks[r.WebhookID] = h
			}
			prev := *r
			if h == nil || h.Status != vault.WebhookEnabled {
				r.State, r.DoneAt, r.Leased = vault.DeliveryFailed, now, false
				r.LastError = "the endpoint is disabled or deleted"
				if h == nil {
					r.LastError = "the endpoint was deleted"
				}
				if err := putDelivery(tx, k, &prev, r); err != nil {
					return err
				}
				continue
			}
			secrets, err := s.signingSecrets(h, now)
			if err != nil {
				return err
			}
			r.Attempts++
			r.Leased, r.NextAt, r.LastAttemptAt = true, now.Add(lease), now
			if err := putDelivery(tx, k, &prev, r); err != nil {
				return err
			}
			jobs = append(jobs, vault.DeliveryJob{
				Delivery: r.public(), URL: h.URL, Secrets: secrets, Body: bytes.Clone(r.Body), Attempt: r.Attempts,
			})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return jobs, nil
}

func isNotFound(err error) bool { return errors.Is(err, vault.ErrNotFound) }

// signingSecrets opens the secrets that sign at now: the current one first.
func (s *Engine) signingSecrets(h *webhookRec, now time.Time) ([]string, error) {
	var out []string
	for _, sec := range h.Secrets {
		if !sec.Until.IsZero() && !sec.Until.After(now) {
			continue
		}
		pt, err := s.seal.open(sec.Sealed, webhookAD(h.ID))
		if err != nil {
			return nil, fmt.Errorf("webhook %s secret: %w", h.ID, err)
		}
		out = append(out, string(pt))
	}
	return out, nil
}

// FinishDelivery records the outcome of attempt job.Attempt: delivered on a
// 2xx; on 410 the delivery fails and the endpoint is disabled; otherwise the
// next attempt is scheduled, or the delivery fails after the last. An attempt
// whose lease another deliverer took over (the count moved on) changes
// nothing.
func (s *Engine) FinishDelivery(ctx context.Context, job vault.DeliveryJob, res vault.DeliveryResult) error {
	k, ok := deliveryKeyOf(job.WebhookID, job.ID)
	if !ok {
		return fmt.Errorf("delivery %s: %w", job.ID, vault.ErrNotFound)
	}
	disabled := false
	err := s.b.Update(ctx, func(tx Tx, now time.Time) error {
		disabled = false
		r, err := getDelivery(tx, k)
		if err != nil || r == nil {
			return err
		}
		if r.State != vault.DeliveryPending || !r.Leased || r.Attempts != job.Attempt {
			return nil
		}
		prev := *r
		r.Leased, r.LastStatus, r.LastError = false, res.Status, res.Err
		switch {
		case res.Status >= 200 && res.Status < 300:
			r.State, r.DoneAt, r.LastError = vault.DeliveryDelivered, now, ""
		case res.Status == 410:
			r.State, r.DoneAt = vault.DeliveryFailed, now
			if r.LastError == "" {
				r.LastError = "410 Gone: the endpoint is disabled"
			}
			if disabled, err = disableGone(tx, now, job.WebhookID); err != nil {
				return err
			}
		default:
			wait, again := retryDelay(r.Attempts)
			if r.LastTry {
				again = false
			}
			if again {
				r.NextAt = now.Add(wait)
			} else {
				r.State, r.DoneAt = vault.DeliveryFailed, now
			}
		}
		if r.State != vault.DeliveryPending {
			r.LastTry = false
		}
		return putDelivery(tx, k, &prev, r)
	})
	if disabled {
		s.webhooks.forget()
	}
	if err != nil {
		return fmt.Errorf("finish delivery: %w", err)
	}
	return nil
}

// disableGone disables an endpoint that answered 410 Gone.
func disableGone(tx Tx, now time.Time, id string) (bool, error) {
	h, err := getWebhook(tx, id)
	if isNotFound(err) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if h.Status == vault.WebhookDisabled {
		return false, nil
	}
	before := h.public(now)
	h.Status, h.DisabledReason = vault.WebhookDisabled, "the endpoint answered 410 Gone at "+now.UTC().Format(time.RFC3339)
	h.Version++
	h.UpdatedAt = now
	if err := putJSON(tx, BucketWebhooks, []byte(id), h); err != nil {
		return false, err
	}
	return true, putAudit(tx, now, "keybrake", "webhook.disable", id, before, h.public(now))
}

// NextDeliveryAt is when the earliest pending delivery is due, zero when none is.
func (s *Engine) NextDeliveryAt(ctx context.Context) (time.Time, error) {
	var at time.Time
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		k, _ := tx.Cursor(BucketDeliveryDue).First()
		at = time.Time{}
		if len(k) >= 8 {
			at = time.Unix(0, int64(binary.BigEndian.Uint64(k))).UTC()
		}
		return nil
	})
	return at, err
}

func jsonBody(typ string, now time.Time, data any) ([]byte, error) {
	return json.Marshal(eventBody{Type: typ, Timestamp: now.UTC(), Data: data})
}
