package api

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// healthz handles GET /healthz (no token): the process is up and serving.
func (a *admin) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// metrics handles GET /metrics (no token, like /healthz: the admin listener is
// loopback by default, and the answer holds only totals — no key, customer or
// token).
func (a *admin) metrics(c echo.Context) error {
	a.scrape.ServeHTTP(c.Response(), c.Request())
	return nil
}

// openAPI handles GET /api/v1/openapi.json (no token): the OpenAPI 3 document of
// this API.
func (a *admin) openAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, OpenAPIDocument())
}

// holdListView is the answer of GET /api/v1/holds.
type holdListView struct {
	Holds []holdView `json:"holds"`
	page
}

// listHolds handles GET /api/v1/holds?state=unknown: newest first.
func (a *admin) listHolds(c echo.Context) error {
	q, err := query(c, "state", "limit", "cursor")
	if err != nil {
		return err
	}
	state := vault.HoldState(q.Get("state"))
	switch state {
	case "", vault.HoldHeld, vault.HoldCommitted, vault.HoldReleased, vault.HoldUnknown:
	default:
		return validationProblem("the request is not valid",
			fieldError("state", `must be "held", "committed", "released" or "unknown"`))
	}
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	holds, next, err := a.store.ListHolds(c.Request().Context(), state, limit, cursor)
	if err != nil {
		return cursorError(fmt.Errorf("list holds: %w", err))
	}
	views := viewsOf(holds, newHoldView)
	if err := nameHolds(c.Request().Context(), a.store, views); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, holdListView{Holds: views, page: page{NextCursor: next}})
}

// resolveHoldRequest is the body of POST /api/v1/holds/{id}/resolve.
type resolveHoldRequest struct {
	Outcome string `json:"outcome"`
}

// resolveHold handles POST /api/v1/holds/{id}/resolve: an operator, having checked
// Stripe, says whether the money of an unknown hold moved (committed) or not
// (released).
func (a *admin) resolveHold(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	var req resolveHoldRequest
	if err := bindJSON(c, DefaultMaxBodyBytes, &req); err != nil {
		return err
	}
	outcome := vault.HoldState(req.Outcome)
	if outcome != vault.HoldCommitted && outcome != vault.HoldReleased {
		return validationProblem("the hold cannot be resolved",
			policy.FieldError{Field: "outcome", Message: `must be "committed" or "released"`})
	}
	h, err := a.store.ResolveHold(c.Request().Context(), actor(c), id, outcome)
	if err != nil {
		return fmt.Errorf("resolve hold %s: %w", id, err)
	}
	return c.JSON(http.StatusOK, newHoldView(h))
}

// askStripeView is the answer of POST /api/v1/holds/{id}/ask-stripe.
type askStripeView struct {
	HoldID string `json:"hold_id"`
	KeyID  string `json:"key_id"`
	// Stripe is "replayed" (Stripe answered with what it did the first time:
	// the request had executed) or "executed" (it executed it now).
	Stripe string `json:"stripe"`
	// Outcome is the hold's state after Stripe's answer: committed, released,
	// or unknown (the answer still left it unknown).
	Outcome         string `json:"outcome"`
	Status          int    `json:"status"`
	StripeRequestID string `json:"stripe_request_id,omitempty"`
}

// askStripe handles POST /api/v1/holds/{id}/ask-stripe: the request of an
// unknown hold is sent again under its upstream idempotency key, as the
// caller's retry would be, and the hold settled from Stripe's answer.
func (a *admin) askStripe(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	if a.stripe == nil {
		return newProblem(http.StatusServiceUnavailable, "this admin API has no Stripe upstream to ask")
	}
	res, err := a.stripe.AskStripe(c.Request().Context(), id)
	if err != nil {
		return fmt.Errorf("ask stripe about hold %s: %w", id, err)
	}
	v := askStripeView{HoldID: res.HoldID, KeyID: res.KeyID, Stripe: "executed", Status: res.Status, StripeRequestID: res.StripeRequestID}
	if res.Replayed {
		v.Stripe = "replayed"
	}
	switch res.Outcome {
	case vault.SettleCommit:
		v.Outcome = string(vault.HoldCommitted)
	case vault.SettleRelease:
		v.Outcome = string(vault.HoldReleased)
	default:
		v.Outcome = string(vault.HoldUnknown)
	}
	return c.JSON(http.StatusOK, v)
}

// auditListView is the answer of GET /api/v1/audit.
type auditListView struct {
	Entries []auditView `json:"entries"`
	page
}

// listAudit handles GET /api/v1/audit: newest first.
func (a *admin) listAudit(c echo.Context) error {
	limit, cursor, err := pageQuery(c)
	if err != nil {
		return err
	}
	entries, next, err := a.store.ListAudit(c.Request().Context(), limit, cursor)
	if err != nil {
		return cursorError(fmt.Errorf("list audit: %w", err))
	}
	return c.JSON(http.StatusOK, auditListView{Entries: viewsOf(entries, newAuditView), page: page{NextCursor: next}})
}

// backup handles GET /api/v1/backup (admin role only): a hot, consistent copy of the
// database, streamed. A failure before the first byte is a problem+json 500; a
// failure midway aborts the connection, so a truncated copy never looks complete.
func (a *admin) backup(c echo.Context) error {
	if _, err := query(c); err != nil {
		return err
	}
	name := fmt.Sprintf("keybrake-%s.db", a.now().UTC().Format("20060102T150405Z"))
	w := &lazyHeaderWriter{c: c, filename: name}
	n, err := a.store.Backup(c.Request().Context(), w)
	switch {
	case err != nil && !w.started:
		return fmt.Errorf("backup: %w", err)
	case err != nil:
		a.log.Error("backup aborted midway", slog.Int64("bytes", n), slog.String(logfield.Error, err.Error()))
		panic(http.ErrAbortHandler)
	case !w.started:
		w.start()
	}
	return nil
}

// CheckView is the answer of GET /api/v1/check (`keybrake check --admin-url`
// reads it).
type CheckView struct {
	OK                bool     `json:"ok"`
	Pages             int      `json:"pages"`
	PageProblems      []string `json:"page_problems"`
	Records           int      `json:"records"`
	InvariantProblems []string `json:"invariant_problems"`
}

// check handles GET /api/v1/check (admin role only): the store's page check
// and invariant check in one read transaction, while the server serves
// (vault.Store.Check). Findings are the answer's, with 200: the request
// succeeded; ok says whether the store is whole.
func (a *admin) check(c echo.Context) error {
	if _, err := query(c); err != nil {
		return err
	}
	rep, err := a.store.Check(c.Request().Context())
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if !rep.OK() {
		a.log.Error("the store check found problems", slog.Int("page_problems", len(rep.PageProblems)),
			slog.Int("invariant_problems", len(rep.InvariantProblems)))
	}
	return c.JSON(http.StatusOK, CheckView{OK: rep.OK(), Pages: rep.Pages, PageProblems: nonNil(rep.PageProblems),
		Records: rep.Records, InvariantProblems: nonNil(rep.InvariantProblems)})
}

// nonNil is s, or an empty list for nil: JSON says [] rather than null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// compactView is the answer of POST /api/v1/compact.
type compactView struct {
	BytesBefore int64 `json:"bytes_before"`
	BytesAfter  int64 `json:"bytes_after"`
}

// compact handles POST /api/v1/compact (admin role only): the store gives the
// space the reaper freed back to the file system (vault.Store.Compact). On
// bbolt every request waits while the file is copied; a PostgreSQL store
// answers 501 (its autovacuum does this).
func (a *admin) compact(c echo.Context) error {
	if _, err := query(c); err != nil {
		return err
	}
	res, err := a.store.Compact(c.Request().Context())
	if err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	return c.JSON(http.StatusOK, compactView{BytesBefore: res.Before, BytesAfter: res.After})
}

// lazyHeaderWriter sends the backup's headers with its first byte, so an error before
// that can still be answered with a problem.
type lazyHeaderWriter struct {
	c        echo.Context
	filename string
	started  bool
}

func (w *lazyHeaderWriter) start() {
	h := w.c.Response().Header()
	h.Set(echo.HeaderContentType, echo.MIMEOctetStream)
	h.Set(echo.HeaderContentDisposition, fmt.Sprintf("attachment; filename=%q", w.filename))
	w.c.Response().WriteHeader(http.StatusOK)
	w.started = true
}

// Write implements io.Writer.
func (w *lazyHeaderWriter) Write(p []byte) (int, error) {
	if !w.started {
		w.start()
	}
	return w.c.Response().Write(p)
}

var _ io.Writer = (*lazyHeaderWriter)(nil)
