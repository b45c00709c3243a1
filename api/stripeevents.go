package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// StripeEventsPath is the route of the endpoint an operator registers at
// Stripe for an upstream: POST /keybrake/v1/stripe/events/{upstream}.
const StripeEventsPath = "/keybrake/v1/stripe/events/:upstream"

// ProblemStripeEvent prefixes the problem type of a delivery turned down; the
// reason follows (urn:keybrake:problem:stripe-event:signature_invalid).
const ProblemStripeEvent = "urn:keybrake:problem:stripe-event:"

// stripeEventReceiver is what the events endpoint needs of the proxy.
type stripeEventReceiver interface {
	ReceiveStripeEvent(ctx context.Context, upstream, signature string, payload []byte) (vault.StripeEventResult, error)
	RejectStripeEvent(reason proxy.StripeEventRejection, message string) error
}

// stripeEventAnswer is the body of a 200: Stripe reads only the status.
type stripeEventAnswer struct {
	Received bool                     `json:"received"`
	Outcome  vault.StripeEventOutcome `json:"outcome"`
}

// registerStripeEvents mounts the events endpoint. It needs no vault key: the
// delivery proves itself with its signature.
func registerStripeEvents(e *echo.Echo, rcv stripeEventReceiver, a *agent) {
	e.POST(StripeEventsPath, func(c echo.Context) error { return receiveStripeEvent(c, rcv) },
		accessLog(a.log, "stripe event request", func(c echo.Context) []slog.Attr {
			return []slog.Attr{slog.String(logfield.Upstream, c.Param("upstream"))}
		}), recoverPanic, securityHeaders)
}

// receiveStripeEvent handles one delivery: 200 once the event is applied (or
// was before), 400 (413 for a body too large) with the reason as the problem
// type when it is turned down, which changes nothing.
func receiveStripeEvent(c echo.Context, rcv stripeEventReceiver) error {
	r := c.Request()
	upstream, err := pathParam(c, "upstream")
	if err != nil {
		return err
	}
	payload, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, proxy.MaxStripeEventBytes))
	var merr *http.MaxBytesError
	if errors.As(err, &merr) {
		err = rcv.RejectStripeEvent(proxy.EventTooLarge, fmt.Sprintf("the event is over %d bytes", proxy.MaxStripeEventBytes))
	} else if err != nil {
		return fmt.Errorf("read stripe event: %w", err)
	} else {
		var res vault.StripeEventResult
		res, err = rcv.ReceiveStripeEvent(r.Context(), upstream, r.Header.Get("Stripe-Signature"), payload)
		if err == nil {
			c.Response().Header().Set("Cache-Control", "no-store")
			return c.JSON(http.StatusOK, stripeEventAnswer{Received: true, Outcome: res.Outcome})
		}
	}
	var se *proxy.StripeEventError
	if errors.As(err, &se) {
		status := http.StatusBadRequest
		if se.Reason == proxy.EventTooLarge {
			status = http.StatusRequestEntityTooLarge
		}
		p := newProblem(status, se.Message)
		p.Type = ProblemStripeEvent + string(se.Reason)
		return p
	}
	return err
}
