package fakestripe

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v84/webhook"
)

// Stripe's events, sent the way Stripe sends them: an event carries a copy of
// its object as it was when the event was made, and each delivery is signed
// with the endpoint's whsec_ secret at the time it is sent. A test makes an
// event (Event), then delivers it as often, as late and in whatever order it
// likes (Deliver, DeliverAt).

// Event is one Stripe event.
type Event struct {
	ID      string
	Type    string
	Created time.Time
	// Object is data.object: the object as it was when the event was made.
	Object json.RawMessage
	// IdempotencyKey is request.idempotency_key: the key of the API request
	// that caused the event ("" for one no request caused: a payment in a
	// browser, an expiry).
	IdempotencyKey string
}

// JSON is the event's body as Stripe sends it.
func (e Event) JSON() []byte {
	var request any
	if e.IdempotencyKey != "" {
		request = map[string]any{"id": "req_fakeevent", "idempotency_key": e.IdempotencyKey}
	}
	b, err := json.Marshal(map[string]any{
		"id": e.ID, "object": "event", "api_version": "2026-08-26.dahlia", "type": e.Type,
		"created": e.Created.Unix(), "livemode": false, "pending_webhooks": 1,
		"data": map[string]any{"object": e.Object}, "request": request,
	})
	if err != nil {
		panic(err) // only maps of JSON values
	}
	return b
}

// Event makes an event of type typ about the object objectID (a
// PaymentIntent, Charge, Checkout Session or invoice of the fake) as it is now.
// It panics for an object the fake does not have: a test's mistake.
func (f *FakeStripe) Event(typ, objectID string) Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var path string
	for prefix, p := range map[string]string{"pi_": "/v1/payment_intents/", "ch_": "/v1/charges/",
		"cs_": "/v1/checkout/sessions/", "in_": "/v1/invoices/"} {
		if strings.HasPrefix(objectID, prefix) {
			path = p + objectID
		}
	}
	a := f.route(http.MethodGet, path, nil, "")
	if path == "" || a.status != http.StatusOK {
		panic(fmt.Sprintf("fakestripe: no object %q to make an event of", objectID))
	}
	return f.newEventLocked(typ, a.body)
}

// EventOf makes an event of type typ with object as its data.object (an
// object the fake does not keep: a refund, an object of another account).
func (f *FakeStripe) EventOf(typ string, object any) Event {
	b, err := json.Marshal(object)
	if err != nil {
		panic(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.newEventLocked(typ, b)
}

func (f *FakeStripe) newEventLocked(typ string, object []byte) Event {
	f.seq++
	return Event{ID: fmt.Sprintf("evt_fake%08d", f.seq), Type: typ, Created: time.Now(), Object: bytes.Clone(object)}
}

// Deliver sends ev to url signed with secret now, as Stripe does, and returns
// the status and body of the answer.
func (f *FakeStripe) Deliver(url, secret string, ev Event) (int, []byte, error) {
	return DeliverAt(url, ev.JSON(), time.Now(), secret)
}

// DeliverAt posts payload to url with a Stripe-Signature of its timestamp at
// signed, one v1 signature for each of secrets (Stripe signs with the old
// secret too while one is being rolled).
func DeliverAt(url string, payload []byte, signed time.Time, secrets ...string) (int, []byte, error) {
	var parts []string
	for i, s := range secrets {
		sp := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: s, Timestamp: signed})
		if i == 0 {
			parts = append(parts, strings.SplitN(sp.Header, ",", 2)[0]) // t=…
		}
		parts = append(parts, "v1="+fmt.Sprintf("%x", sp.Signature))
	}
	return Post(url, payload, strings.Join(parts, ","))
}

// Post sends payload to url with the Stripe-Signature header sig as is ("":
// none), the way Stripe's deliveries come.
func Post(url string, payload []byte, sig string) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	if sig != "" {
		req.Header.Set("Stripe-Signature", sig)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// ConfirmClientSide confirms the PaymentIntent id as a browser does with its
// client_secret: at Stripe, without any request through keybrake.
func (f *FakeStripe) ConfirmClientSide(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	pi := f.pi(id)
	if pi == nil {
		panic("fakestripe: no PaymentIntent " + id)
	}
	f.confirmLocked(pi, nil)
}

// ExpireCheckoutSession expires the open Checkout Session id, as Stripe does
// once its expires_at passes.
func (f *FakeStripe) ExpireCheckoutSession(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.sessions, func(cs *CheckoutSession) bool { return cs.ID == id })
	if i < 0 || f.sessions[i].Status != "open" {
		panic("fakestripe: no open Checkout Session " + id)
	}
	cs := f.sessions[i]
	cs.Status = "expired"
	if !cs.Recovery {
		f.moved[cs.Currency] -= cs.Amount
	}
}

// PayCheckoutSession completes the open Checkout Session id as a customer
// paying it in a browser does: status complete, payment_status paid.
func (f *FakeStripe) PayCheckoutSession(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.sessions, func(cs *CheckoutSession) bool { return cs.ID == id })
	if i < 0 || f.sessions[i].Status != "open" {
		panic("fakestripe: no open Checkout Session " + id)
	}
	f.sessions[i].Status, f.sessions[i].Paid = "complete", true
}
