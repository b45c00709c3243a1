package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// ContentTypeProblem is the media type of every admin API error body (RFC 9457).
const ContentTypeProblem = "application/problem+json"

// Problem type URIs. They identify the kind of problem; clients match on them, not on
// title or detail. They are URNs: nothing needs to be fetched to understand them.
const (
	ProblemMalformed        = "urn:keybrake:problem:malformed-request"
	ProblemUnauthorized     = "urn:keybrake:problem:unauthorized"
	ProblemForbidden        = "urn:keybrake:problem:forbidden"
	ProblemNotFound         = "urn:keybrake:problem:not-found"
	ProblemMethodNotAllowed = "urn:keybrake:problem:method-not-allowed"
	ProblemConflict         = "urn:keybrake:problem:conflict"
	ProblemPrecondition     = "urn:keybrake:problem:precondition-failed"
	ProblemTooLarge         = "urn:keybrake:problem:request-too-large"
	ProblemUnsupportedMedia = "urn:keybrake:problem:unsupported-media-type"
	ProblemValidation       = "urn:keybrake:problem:validation-failed"
	ProblemInternal         = "urn:keybrake:problem:internal"
	ProblemUnavailable      = "urn:keybrake:problem:unavailable"
	// ProblemNoSpace: the store's device is full (507); the operator frees space.
	ProblemNoSpace = "urn:keybrake:problem:no-space"

	// Stripe's answer to a lookup keybrake made for an operator (a refresh of
	// a money object) could not be had or used; nothing changed.
	ProblemUpstreamUnavailable  = "urn:keybrake:problem:upstream-unavailable"
	ProblemUpstreamAuthFailed   = "urn:keybrake:problem:upstream-authentication-failed"
	ProblemUpstreamPermission   = "urn:keybrake:problem:upstream-permission-denied"
	ProblemStripeObjectNotFound = "urn:keybrake:problem:stripe-object-not-found"
	ProblemStripeAnswerUnusable = "urn:keybrake:problem:stripe-answer-unusable"
)

// refreshProblems maps each way a refresh fails to its status and problem type.
var refreshProblems = map[proxy.RefreshFailure]struct {
	status int
	typ    string
}{
	proxy.RefreshUnavailable:      {http.StatusBadGateway, ProblemUpstreamUnavailable},
	proxy.RefreshTimeout:          {http.StatusGatewayTimeout, ProblemUpstreamUnavailable},
	proxy.RefreshAuthFailed:       {http.StatusBadGateway, ProblemUpstreamAuthFailed},
	proxy.RefreshPermissionDenied: {http.StatusBadGateway, ProblemUpstreamPermission},
	// Not a gateway failure: Stripe answered, and its answer keeps the exposure.
	proxy.RefreshNotFound:   {http.StatusConflict, ProblemStripeObjectNotFound},
	proxy.RefreshUnreadable: {http.StatusBadGateway, ProblemStripeAnswerUnusable},
}

// problemTypes maps a status code to the problem type used when a handler gives none.
var problemTypes = map[int]string{
	http.StatusBadRequest:            ProblemMalformed,
	http.StatusUnauthorized:          ProblemUnauthorized,
	http.StatusForbidden:             ProblemForbidden,
	http.StatusNotFound:              ProblemNotFound,
	http.StatusMethodNotAllowed:      ProblemMethodNotAllowed,
	http.StatusConflict:              ProblemConflict,
	http.StatusPreconditionFailed:    ProblemPrecondition,
	http.StatusRequestEntityTooLarge: ProblemTooLarge,
	http.StatusUnsupportedMediaType:  ProblemUnsupportedMedia,
	http.StatusUnprocessableEntity:   ProblemValidation,
	http.StatusInternalServerError:   ProblemInternal,
	http.StatusServiceUnavailable:    ProblemUnavailable,
	http.StatusInsufficientStorage:   ProblemNoSpace,
}

// Problem is an RFC 9457 problem detail. Handlers return it as an error when they
// know the exact answer; the admin HTTPErrorHandler writes it as
// application/problem+json. Errors lists every field problem of a 422.
type Problem struct {
	Type   string              `json:"type"`
	Title  string              `json:"title"`
	Status int                 `json:"status"`
	Detail string              `json:"detail,omitempty"`
	Errors []policy.FieldError `json:"errors,omitempty"`
}

// Error returns the problem's status and detail, so a Problem can travel as an error.
func (p *Problem) Error() string {
	if p.Detail == "" {
		return fmt.Sprintf("%d %s", p.Status, p.Title)
	}
	return fmt.Sprintf("%d %s: %s", p.Status, p.Title, p.Detail)
}

// newProblem returns a Problem for status with the default type and title.
func newProblem(status int, detail string) *Problem {
	typ, ok := problemTypes[status]
	if !ok {
		typ = "about:blank"
	}
	return &Problem{Type: typ, Title: http.StatusText(status), Status: status, Detail: detail}
}

// validationProblem returns a 422 listing every field error.
func validationProblem(detail string, errs ...policy.FieldError) *Problem {
	p := newProblem(http.StatusUnprocessableEntity, detail)
	p.Errors = errs
	return p
}

// prefixFields returns errs with every field name put under prefix ("policy" →
// "policy.daily_cap").
func prefixFields(prefix string, errs []policy.FieldError) []policy.FieldError {
	out := make([]policy.FieldError, len(errs))
	for i, fe := range errs {
		out[i] = fe
		switch {
		case fe.Field == "":
			out[i].Field = prefix
		case fe.Field[0] == '[':
			out[i].Field = prefix + fe.Field
		default:
			out[i].Field = prefix + "." + fe.Field
		}
	}
	return out
}

// domainDetail is the detail of a domain error without the operation context the
// layers above the store wrapped around it: the innermost message that still
// names the thing ("hold \"hold_x\": not found" rather than "resolve hold
// hold_x: resolve hold: hold \"hold_x\": not found").
func domainDetail(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil || errors.Unwrap(next) == nil {
			return err.Error()
		}
		err = next
	}
}

// problemFor maps an error to the problem the client gets. internal is true when the
// error is not a domain error: the client then gets a generic 500 and the cause is
// logged once, at Error.
func problemFor(err error) (p *Problem, internal bool) {
	var (
		prob *Problem
		verr *policy.ValidationError
		herr *echo.HTTPError
		merr *http.MaxBytesError
		rerr *proxy.RefreshError
		aerr *proxy.AskError
	)
	switch {
	case errors.As(err, &prob):
		return prob, false
	case errors.As(err, &rerr):
		m, ok := refreshProblems[rerr.Failure]
		if !ok {
			m = refreshProblems[proxy.RefreshUnreadable]
		}
		return &Problem{Type: m.typ, Title: http.StatusText(m.status), Status: m.status, Detail: rerr.Message}, false
	case errors.As(err, &aerr):
		p := newProblem(aerr.Status, aerr.Message)
		if aerr.Status == http.StatusBadGateway {
			p.Type = ProblemUpstreamUnavailable
		}
		return p, false
	case errors.As(err, &verr):
		return validationProblem("the request is not valid", verr.Errors...), false
	case errors.As(err, &merr):
		return newProblem(http.StatusRequestEntityTooLarge,
			fmt.Sprintf("request body is larger than %d bytes", merr.Limit)), false
	case errors.Is(err, vault.ErrInvalid):
		return validationProblem(err.Error()), false
	case errors.Is(err, vault.ErrNotFound):
		return newProblem(http.StatusNotFound, domainDetail(err)), false
	case errors.Is(err, vault.ErrConflict):
		return newProblem(http.StatusConflict, domainDetail(err)), false
	case errors.Is(err, vault.ErrPrecondition):
		return newProblem(http.StatusPreconditionFailed,
			"the key changed since the ETag given in If-Match was read; read it again and send the change against its new ETag"), false
	case errors.Is(err, vault.ErrKeyRevoked), errors.Is(err, vault.ErrKeyExpired):
		return newProblem(http.StatusConflict, err.Error()), false
	case errors.Is(err, vault.ErrKeyInvalid):
		return newProblem(http.StatusNotFound, err.Error()), false
	case errors.Is(err, errors.ErrUnsupported):
		// What this store does not do (a PostgreSQL store's backup): the
		// message says what to use instead.
		return newProblem(http.StatusNotImplemented, err.Error()), false
	case errors.Is(err, vault.ErrClosed):
		return newProblem(http.StatusServiceUnavailable, "the store is closed; the server is shutting down"), false
	case errors.Is(err, vault.ErrNoSpace):
		// A full disk is the operator's to fix, not a bug: say so.
		return newProblem(http.StatusInsufficientStorage, "no space left on the store's device: free some and try again"), false
	case errors.Is(err, vault.ErrStorage), errors.Is(err, context.DeadlineExceeded):
		// The store failed or did not answer in time (a PostgreSQL server that
		// is down, a lock another replica holds past lock_timeout): nothing
		// changed, and the same request may be sent again.
		return newProblem(http.StatusServiceUnavailable, "the store is unavailable; nothing was changed, retry the request"), true
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads this answer.
		return newProblem(http.StatusServiceUnavailable, "request canceled"), false
	case errors.As(err, &herr):
		if herr.Code >= http.StatusInternalServerError {
			return newProblem(http.StatusInternalServerError, "internal server error"), true
		}
		detail := ""
		if m, ok := herr.Message.(string); ok && m != http.StatusText(herr.Code) {
			detail = m
		}
		return newProblem(herr.Code, detail), false
	default:
		return newProblem(http.StatusInternalServerError, "internal server error"), true
	}
}

// errorHandler is the admin API's one echo HTTPErrorHandler: every error any handler,
// middleware or the router returns becomes problem+json here.
func (a *admin) errorHandler(err error, c echo.Context) {
	p, internal := problemFor(err)
	answerProblem(c, a.log, err, p, internal, "Bearer")
}

// answerProblem writes p as the answer to the request that failed with err. When
// internal, the cause is left for accessLog, the outermost middleware, which writes
// the request's one log line with it at Error; the client gets nothing of it. A 401
// carries challenge in WWW-Authenticate.
func answerProblem(c echo.Context, log *slog.Logger, err error, p *Problem, internal bool, challenge string) {
	if internal {
		c.Set(ctxKeyInternalError, err)
	}
	if c.Response().Committed {
		return
	}
	if p.Status == http.StatusUnauthorized {
		c.Response().Header().Set("WWW-Authenticate", challenge)
	}
	if werr := writeProblem(c, p); werr != nil {
		log.Warn("write problem response", slog.String(logfield.Error, werr.Error()))
	}
}

// writeProblem writes p as application/problem+json.
func writeProblem(c echo.Context, p *Problem) error {
	body, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("marshal problem: %w", err)
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	if c.Request().Method == http.MethodHead {
		return c.NoContent(p.Status)
	}
	return c.Blob(p.Status, ContentTypeProblem, body)
}
