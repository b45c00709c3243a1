package api

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/keybrake/keybrake/api/webhooks"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// Keys of values handlers and middleware leave in the echo context for the access log.
const (
	ctxKeyInternalError = "keybrake.internal_error"
	ctxKeyAuthFailure   = "keybrake.auth_failure"
)

// admin serves the admin REST API.
type admin struct {
	store     vault.Store
	log       *slog.Logger
	secret    []byte
	publicURL string
	now       func() time.Time
	parser    *jwt.Parser
	scrape    http.Handler
	stripe    *proxy.Proxy
	demo      bool

	// maxClockOffset is AdminConfig.MaxClockOffset.
	maxClockOffset time.Duration
	// webhookGuard judges webhook destinations (AdminConfig.WebhookAllowPrivate).
	webhookGuard webhooks.Guard
}

// adminRoute is one route of the admin API. The OpenAPI document describes exactly
// these (a test holds the two together).
type adminRoute struct {
	method  string
	path    string // echo syntax: /api/v1/keys/:id
	handler func(*admin, echo.Context) error
	public  bool // no token needed
	admin   bool // the admin role even for a read
}

// adminRoutes is the admin API.
var adminRoutes = []adminRoute{
	{method: http.MethodGet, path: "/healthz", handler: (*admin).healthz, public: true},
	{method: http.MethodGet, path: "/readyz", handler: (*admin).readyz, public: true},
	{method: http.MethodGet, path: "/api/v1/openapi.json", handler: (*admin).openAPI, public: true},
	{method: http.MethodGet, path: "/metrics", handler: (*admin).metrics, public: true},

	{method: http.MethodPost, path: "/api/v1/upstreams", handler: (*admin).putUpstream},
	{method: http.MethodGet, path: "/api/v1/upstreams", handler: (*admin).listUpstreams},
	{method: http.MethodPatch, path: "/api/v1/upstreams/:name", handler: (*admin).patchUpstream},
	{method: http.MethodDelete, path: "/api/v1/upstreams/:name", handler: (*admin).deleteUpstream},

	{method: http.MethodPost, path: "/api/v1/keys", handler: (*admin).mintKey},
	{method: http.MethodGet, path: "/api/v1/keys", handler: (*admin).listKeys},
	{method: http.MethodGet, path: "/api/v1/keys/:id", handler: (*admin).getKey},
	{method: http.MethodPatch, path: "/api/v1/keys/:id", handler: (*admin).patchKey},
	{method: http.MethodPost, path: "/api/v1/keys/:id/revoke", handler: (*admin).revokeKey},
	{method: http.MethodPost, path: "/api/v1/keys/:id/rotate", handler: (*admin).rotateKey},
	{method: http.MethodGet, path: "/api/v1/keys/:id/usage", handler: (*admin).keyUsage},
	{method: http.MethodGet, path: "/api/v1/keys/:id/events", handler: (*admin).keyEvents},
	{method: http.MethodGet, path: "/api/v1/keys/:id/spend", handler: (*admin).keySpend},
	{method: http.MethodGet, path: "/api/v1/keys/:id/exposures", handler: (*admin).keyExposures},
	{method: http.MethodPost, path: "/api/v1/keys/:id/exposures/:object_id/refresh", handler: (*admin).refreshExposure},
	{method: http.MethodPost, path: "/api/v1/keys/:id/exposures/:object_id/release", handler: (*admin).releaseExposure},
	{method: http.MethodGet, path: "/api/v1/usage", handler: (*admin).listUsage},
	{method: http.MethodGet, path: "/api/v1/overview", handler: (*admin).overview},

	{method: http.MethodPost, path: "/api/v1/budgets", handler: (*admin).createBudget},
	{method: http.MethodGet, path: "/api/v1/budgets", handler: (*admin).listBudgets},
	{method: http.MethodGet, path: "/api/v1/budgets/:id", handler: (*admin).getBudget},
	{method: http.MethodPatch, path: "/api/v1/budgets/:id", handler: (*admin).patchBudget},
	{method: http.MethodDelete, path: "/api/v1/budgets/:id", handler: (*admin).deleteBudget},
	{method: http.MethodGet, path: "/api/v1/budgets/:id/usage", handler: (*admin).budgetUsage},

	{method: http.MethodGet, path: "/api/v1/holds", handler: (*admin).listHolds},
	{method: http.MethodPost, path: "/api/v1/holds/:id/resolve", handler: (*admin).resolveHold},

	{method: http.MethodPost, path: "/api/v1/keys/:id/raises", handler: (*admin).addKeyRaise},
	{method: http.MethodGet, path: "/api/v1/keys/:id/raises", handler: (*admin).listKeyRaises},
	{method: http.MethodDelete, path: "/api/v1/keys/:id/raises/:raise_id", handler: (*admin).endKeyRaise},
	{method: http.MethodPost, path: "/api/v1/budgets/:id/raises", handler: (*admin).addBudgetRaise},
	{method: http.MethodGet, path: "/api/v1/budgets/:id/raises", handler: (*admin).listBudgetRaises},
	{method: http.MethodDelete, path: "/api/v1/budgets/:id/raises/:raise_id", handler: (*admin).endBudgetRaise},
	{method: http.MethodGet, path: "/api/v1/raise-requests", handler: (*admin).listRaiseRequests},
	{method: http.MethodGet, path: "/api/v1/raise-requests/:id", handler: (*admin).getRaiseRequest},
	{method: http.MethodPost, path: "/api/v1/raise-requests/:id/approve", handler: (*admin).approveRaiseRequest, admin: true},
	{method: http.MethodPost, path: "/api/v1/raise-requests/:id/decline", handler: (*admin).declineRaiseRequest, admin: true},
	{method: http.MethodGet, path: "/api/v1/approvals", handler: (*admin).listApprovals},
	{method: http.MethodGet, path: "/api/v1/approvals/:id", handler: (*admin).getApproval},
	{method: http.MethodPost, path: "/api/v1/approvals/:id/approve", handler: (*admin).approveApproval},
	{method: http.MethodPost, path: "/api/v1/approvals/:id/decline", handler: (*admin).declineApproval},

	{method: http.MethodGet, path: "/api/v1/audit", handler: (*admin).listAudit},
	{method: http.MethodGet, path: "/api/v1/backup", handler: (*admin).backup, admin: true},
	{method: http.MethodPost, path: "/api/v1/compact", handler: (*admin).compact, admin: true},
	{method: http.MethodGet, path: "/api/v1/check", handler: (*admin).check, admin: true},
}

// NewAdmin returns the admin listener's handler: /api/v1/*, /healthz, /readyz,
// /metrics (Prometheus), and the web dashboard under /ui/ (see UIPath). The
// handler is an *echo.Echo. Every /api/v1 route but
// /api/v1/openapi.json needs an admin token
// (Authorization: Bearer <JWT>, see IssueToken); every error is
// application/problem+json (RFC 9457).
func NewAdmin(cfg AdminConfig) http.Handler {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	a := &admin{
		store:     cfg.Store,
		log:       logger.With(logfield.Component, "admin"),
		secret:    append([]byte(nil), cfg.JWTSecret...),
		publicURL: strings.TrimRight(cfg.PublicURL, "/"),
		now:       cfg.Store.Now,
		parser:    newTokenParser(now),
		stripe:    cfg.Stripe,
		demo:      cfg.Demo,

		maxClockOffset: cfg.MaxClockOffset,
		webhookGuard:   webhooks.Guard{AllowPrivate: cfg.WebhookAllowPrivate},
	}
	gatherer := cfg.Metrics
	if gatherer == nil {
		gatherer = prometheus.NewRegistry()
	}
	a.scrape = metricsHandler(gatherer, a.log)
	if len(a.secret) == 0 {
		a.log.Error("no JWT secret configured: every admin API request will be refused")
	}

	e := newEcho()
	e.HTTPErrorHandler = a.errorHandler
	e.Use(accessLog(a.log, "admin request", adminLogAttrs), recoverPanic, securityHeaders)

	for _, r := range adminRoutes {
		h := r.handler
		handler := func(c echo.Context) error { return h(a, c) }
		var mw []echo.MiddlewareFunc
		if !r.public {
			mw = append(mw, a.authenticate)
		}
		if r.admin {
			mw = append(mw, requireAdmin)
		}
		e.Add(r.method, r.path, handler, mw...)
	}
	if ui, err := loadUI(); err != nil {
		a.log.Error("the web dashboard cannot be served", slog.String(logfield.Error, err.Error()))
	} else {
		mountUI(e, ui)
	}
	return e
}

// newEcho returns an echo instance that prints nothing itself: echo's own logger
// and banner write to stdout, and everything worth saying goes through slog.
func newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.Logger.SetOutput(io.Discard)
	return e
}

// accessLog returns the middleware that writes one log line per request, after the
// error handler has answered: 2xx/3xx at Info, 4xx at Warn, 5xx at Error with the
// internal cause. It never logs headers or bodies (tokens, secrets); extra adds the
// attributes of one surface.
func accessLog(log *slog.Logger, msg string, extra func(echo.Context) []slog.Attr) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			if err := next(c); err != nil {
				c.Error(err)
			}
			status := c.Response().Status
			attrs := []slog.Attr{
				slog.String(logfield.Method, c.Request().Method),
				slog.String(logfield.Route, c.Path()),
				slog.Int(logfield.Status, status),
				logfield.Duration(time.Since(start)),
			}
			attrs = append(attrs, extra(c)...)
			if reason, ok := c.Get(ctxKeyAuthFailure).(string); ok {
				attrs = append(attrs, slog.String(logfield.AuthFailure, reason))
			}
			level := slog.LevelInfo
			switch {
			case status >= http.StatusInternalServerError:
				level = slog.LevelError
				if err, ok := c.Get(ctxKeyInternalError).(error); ok {
					attrs = append(attrs, slog.String(logfield.Error, err.Error()))
				}
			case status >= http.StatusBadRequest:
				level = slog.LevelWarn
			}
			log.LogAttrs(c.Request().Context(), level, msg, attrs...)
			return nil
		}
	}
}

// adminLogAttrs adds the path and the JWT's subject and role to an admin log line.
func adminLogAttrs(c echo.Context) []slog.Attr {
	attrs := []slog.Attr{slog.String(logfield.Path, c.Request().URL.Path)}
	if p, ok := PrincipalFromContext(c.Request().Context()); ok {
		attrs = append(attrs, slog.String(logfield.Actor, p.Subject), slog.String(logfield.Role, p.Role))
	}
	return attrs
}

// recoverPanic turns a handler panic into a 500 (logged once by accessLog). An
// http.ErrAbortHandler panic is re-raised: it aborts a response on purpose.
func recoverPanic(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler { //nolint:errorlint // sentinel panic value
					panic(r)
				}
				err = fmt.Errorf("panic in handler: %v", r)
			}
		}()
		return next(c)
	}
}

// securityHeaders marks every answer uncacheable (mint and rotate carry tokens) and
// not to be sniffed.
func securityHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		return next(c)
	}
}

// actor returns the sub of the request's token, written into the audit log.
func actor(c echo.Context) string {
	p, _ := PrincipalFromContext(c.Request().Context())
	return p.Subject
}

// pathParam returns the unescaped path parameter name (echo routes on the escaped
// path and leaves parameters escaped).
func pathParam(c echo.Context, name string) (string, error) {
	v, err := url.PathUnescape(c.Param(name))
	if err != nil {
		return "", newProblem(http.StatusBadRequest, fmt.Sprintf("path parameter %s is not validly escaped", name))
	}
	return v, nil
}

// query checks the request's query parameters against allowed (a misspelt filter
// must not silently widen a listing) and returns them.
func query(c echo.Context, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return nil, newProblem(http.StatusBadRequest, "the query string is not validly encoded")
	}
	var unknown []string
	for name := range q {
		if !slices.Contains(allowed, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		p := validationProblem("unknown query parameter")
		for _, name := range unknown {
			p.Errors = append(p.Errors, fieldError(name, "unknown query parameter; allowed: "+strings.Join(allowed, ", ")))
		}
		return nil, p
	}
	for name, vs := range q {
		if len(vs) > 1 && name != "label" {
			return nil, validationProblem("the request is not valid", fieldError(name, "may be given only once"))
		}
	}
	return q, nil
}

// cursorError reports a listing's ErrInvalid as a bad cursor (the only argument a
// listing passes that the API has not checked itself).
func cursorError(err error) error {
	if errors.Is(err, vault.ErrInvalid) {
		return validationProblem("the request is not valid",
			fieldError("cursor", "is not a next_cursor of this listing"))
	}
	return err
}

// MaxPageSize is the largest page a list endpoint returns.
const MaxPageSize = 500

// pageParams reads limit (1–500; the store's default of 50 when absent) and cursor.
func pageParams(q url.Values) (limit int, cursor string, err error) {
	if s := q.Get("limit"); s != "" {
		n, perr := strconv.Atoi(s)
		if perr != nil || n < 1 || n > MaxPageSize {
			return 0, "", validationProblem("the request is not valid",
				fieldError("limit", fmt.Sprintf("must be an integer from 1 to %d", MaxPageSize)))
		}
		limit = n
	}
	return limit, q.Get("cursor"), nil
}

// pageQuery reads a list's query when it takes only limit and cursor.
func pageQuery(c echo.Context) (limit int, cursor string, err error) {
	q, err := query(c, "limit", "cursor")
	if err != nil {
		return 0, "", err
	}
	return pageParams(q)
}
