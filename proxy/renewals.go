package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// Renewals (docs/renewals.md): the objects a key's request created
// indirectly are linked to the key — the subscription it created, the
// Checkout Session or Payment Link that starts one, the subscription such a
// session started, the invoices the subscription issues — and a renewal
// invoice is metered against the key once, in the transaction of the Stripe
// event's id (vault.IndirectEvent). A
// renewal over a cap is paused at Stripe by setting auto_advance=false on
// its draft: the pause is queued durably in the transaction that decided
// it, and SendPauses sends it, again until Stripe accepts.

// linkOperations are the requests whose answer starts a subscription, now
// or when a customer pays.
var linkOperations = map[string]bool{
	"subscriptions.create": true, "checkout.sessions.create": true, "payment_links.create": true,
}

// createdLink is the link of the object a 2xx answer to c created, when it
// is (or will start) a subscription, for the settle to write in its
// transaction (vault.SettleRequest.Link); nil for none.
func (c *call) createdLink(o stripeapi.Object) *vault.ObjectLink {
	if !linkOperations[c.cls.Operation] || c.cls.Target != "" || c.cls.ObjectID != "" {
		return nil
	}
	switch o.Get("object") {
	case "subscription", "checkout.session", "payment_link":
	default:
		return nil
	}
	if !stripeapi.IsID(o.Get("id")) {
		return nil
	}
	return &vault.ObjectLink{ObjectID: o.Get("id"), StripeAccount: c.account}
}

// linkSeen links the subscription a Checkout Session linked to a key
// started, as an answer about the session shows it (a read through
// keybrake, or Stripe's checkout.session.completed).
func (p *Proxy) linkSeen(ctx context.Context, upstream, account, eventID string, o stripeapi.Object) {
	cs, sub, plink, ok := stripeapi.StartedSubscription(o)
	if !ok {
		return
	}
	via := cs
	l, err := p.store.GetLink(ctx, upstream, cs)
	if errors.Is(err, vault.ErrNotFound) && plink != "" {
		via = plink
		l, err = p.store.GetLink(ctx, upstream, plink)
	}
	if errors.Is(err, vault.ErrNotFound) {
		return // a session no key started
	}
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelError, "reading the link of a Checkout Session failed; the subscription it started is not linked",
			slog.String(logfield.ObjectID, cs), slog.Any(logfield.Error, err))
		return
	}
	p.link(ctx, vault.ObjectLink{Upstream: upstream, ObjectID: sub, KeyID: l.KeyID, StripeAccount: account, Via: via, EventID: eventID})
}

func (p *Proxy) link(ctx context.Context, l vault.ObjectLink) {
	if _, _, err := p.store.LinkObject(ctx, l); err != nil {
		p.log.LogAttrs(ctx, slog.LevelError, "linking an object to its key failed; its renewals are not metered",
			slog.String(logfield.KeyID, l.KeyID), slog.String(logfield.ObjectID, l.ObjectID), slog.Any(logfield.Error, err))
	}
}

// indirectOf reads what an event's payload (verified) says about objects
// keys created indirectly, for the store to apply in the transaction of the
// event's id (vault.IndirectEvent); nil for nothing.
func indirectOf(typ string, payload []byte) *vault.IndirectEvent {
	var ev struct {
		Account string `json:"account"`
		Data    struct {
			Object json.RawMessage `json:"object"`
		} `json:"data"`
	}
	if json.Unmarshal(payload, &ev) != nil || len(ev.Data.Object) == 0 {
		return nil
	}
	obj := stripeapi.DecodeObject(ev.Data.Object)
	in := &vault.IndirectEvent{Account: ev.Account}
	switch obj.Get("object") {
	case "checkout.session":
		cs, sub, plink, ok := stripeapi.StartedSubscription(obj)
		if !ok {
			return nil
		}
		in.SessionID, in.Started, in.PaymentLinkID = cs, sub, plink
	case "subscription":
		if typ != "customer.subscription.deleted" || !stripeapi.IsID(obj.Get("id")) {
			return nil
		}
		in.Ended = obj.Get("id")
	case "invoice":
		inv, ok := stripeapi.ReadSubscriptionInvoice(obj)
		if !ok {
			return nil
		}
		if !inv.Renews() {
			in.InvoiceID, in.SubscriptionID = inv.ID, inv.Subscription
			break
		}
		in.Renewal = &vault.Renewal{InvoiceID: inv.ID, SubscriptionID: inv.Subscription, Customer: inv.Customer,
			AmountDue: inv.AmountDue, Currency: inv.Currency, Draft: inv.Status == "draft"}
	default:
		return nil
	}
	return in
}

// pauseRetry is how long after a failed pause the next attempt is made:
// doubling from 10 s, at most 5 min (Stripe waits about an hour after
// invoice.created before it finalises the draft).
func pauseRetry(attempts int) time.Duration {
	d := 10 * time.Second << min(attempts, 5)
	return min(d, 5*time.Minute)
}

// SendPauses sends every pause that is due: auto_advance=false on the draft
// renewal invoice, with the secret of the key's upstream and the invoice's
// connected account. Stripe's 2xx removes the pause; an answer that says the
// invoice can no longer be changed (a 4xx: already finalised) removes it and
// counts the renewal over the cap (vault.RenewalStore.PauseSent); no answer, a 429 or 5xx, or a
// secret refused keeps it for a later attempt. It returns how many pauses
// Stripe accepted.
func (p *Proxy) SendPauses(ctx context.Context) (int, error) {
	due, err := p.store.DuePauses(ctx, 50)
	if err != nil {
		return 0, err
	}
	sent := 0
	for _, pz := range due {
		status, err := p.sendPause(ctx, pz)
		var serr error
		switch {
		case err == nil && status/100 == 2:
			sent++
			serr = p.store.PauseSent(ctx, pz.Upstream, pz.InvoiceID, "")
		case err == nil && status >= 400 && status < 500 && status != http.StatusTooManyRequests &&
			status != http.StatusUnauthorized && status != http.StatusForbidden:
			p.log.LogAttrs(ctx, slog.LevelWarn, "Stripe refused to pause a renewal invoice over a cap; it is counted, over the cap",
				slog.String(logfield.KeyID, pz.KeyID), slog.String(logfield.ObjectID, pz.InvoiceID), slog.Int("status", status))
			serr = p.store.PauseSent(ctx, pz.Upstream, pz.InvoiceID, fmt.Sprintf("Stripe answered %d", status))
		default:
			why := fmt.Sprintf("Stripe answered %d", status)
			if err != nil {
				why = err.Error()
			}
			p.log.LogAttrs(ctx, slog.LevelWarn, "pausing a renewal invoice over a cap failed; trying again",
				slog.String(logfield.KeyID, pz.KeyID), slog.String(logfield.ObjectID, pz.InvoiceID), slog.String("why", why))
			serr = p.store.PauseFailed(ctx, pz.Upstream, pz.InvoiceID, p.now().Add(pauseRetry(pz.Attempts)), why)
		}
		if serr != nil {
			return sent, serr
		}
	}
	return sent, nil
}

// sendPause makes the one call of a pause; the idempotency key makes a
// resent pause one change at Stripe.
func (p *Proxy) sendPause(ctx context.Context, pz vault.RenewalPause) (int, error) {
	key, err := p.store.GetKey(ctx, pz.KeyID)
	if err != nil {
		return 0, err
	}
	up, err := p.store.UpstreamSecret(ctx, key.Upstream)
	if err != nil {
		return 0, err
	}
	if !stripeapi.IsID(pz.InvoiceID) {
		return 0, fmt.Errorf("invoice id %q refused", pz.InvoiceID)
	}
	u := *p.upstream
	u.Path = strings.TrimSuffix(p.upstream.Path, "/") + "/v1/invoices/" + pz.InvoiceID
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	body := url.Values{"auto_advance": {"false"}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+up)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "keybrake-renewal-pause-"+pz.InvoiceID)
	if pz.StripeAccount != "" {
		req.Header.Set(headerStripeAccount, pz.StripeAccount)
	}
	resp, err := p.lookups.Do(req)
	if err != nil {
		return 0, fmt.Errorf("pause %s: %w", pz.InvoiceID, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, nil
}

// RunPauses sends the due pauses every interval until ctx ends.
func (p *Proxy) RunPauses(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := p.SendPauses(ctx); err != nil && ctx.Err() == nil {
			p.log.LogAttrs(ctx, slog.LevelError, "sending renewal pauses failed", slog.Any(logfield.Error, err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
