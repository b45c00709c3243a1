package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/proxy/logfield"
)

// NewProxyListener returns the proxy listener's handler: /v1/*, /v2/* (Stripe),
// /keybrake/v1/* (agent endpoints, see agent.go), /mcp (the MCP endpoint, see
// mcp.go), /healthz, /readyz.
//
// The Stripe routes hand the request to cfg.Stripe exactly as it arrived: echo
// only routes on it (on the escaped path) and neither cleans nor unescapes the
// path, nor reads the body, so the proxy sees what the client sent, `//`, `%2F`
// and `..` included, and decides about it itself. Methods echo does not route
// (anything but CONNECT, DELETE, GET, HEAD, OPTIONS, PATCH, POST, PROPFIND, PUT,
// TRACE and REPORT) are answered 405 here and never reach the proxy.
//
// The agent endpoints are mounted when cfg.Store is set; their errors, 404 and 405
// under /keybrake/ included, are application/problem+json. Every other path is
// answered with a Stripe-shaped 404, so an SDK pointed at keybrake gets an error
// it understands.
func NewProxyListener(cfg ProxyConfig) http.Handler {
	base := cfg.Logger
	if base == nil {
		base = slog.Default()
	}
	logger := base.With(logfield.Component, "proxy-listener")

	e := newEcho()
	var ag *agent
	if cfg.Store != nil {
		ag = newAgent(cfg, base)
		ag.register(e)
		if rcv, ok := cfg.Stripe.(stripeEventReceiver); ok {
			registerStripeEvents(e, rcv, ag)
		}
	}
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		if ag != nil && isAgentPath(c.Request()) {
			ag.errorHandler(err, c)
			return
		}
		stripeRouteError(logger, err, c)
	}

	e.GET("/healthz", func(c echo.Context) error {
		c.Response().Header().Set("Cache-Control", "no-store")
		return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
	})
	e.GET("/readyz", func(c echo.Context) error { return serveReadyz(c, cfg.Store, logger, cfg.MaxClockOffset) })

	if cfg.Store != nil && cfg.Stripe != nil {
		newMCP(cfg, base).register(e)
	}
	if cfg.Stripe != nil {
		stripe := echo.WrapHandler(cfg.Stripe)
		e.Any("/v1/*", stripe)
		e.Any("/v2/*", stripe)
	}
	return e
}

// stripeError is the body of a Stripe API error.
type stripeError struct {
	Error stripeErrorBody `json:"error"`
}

type stripeErrorBody struct {
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

// stripeRouteError answers what echo's router could not route (404, 405) and any
// error a route returned, in Stripe's error shape. Route errors are the listener's
// own: the Stripe proxy writes its own errors and never returns one.
func stripeRouteError(logger *slog.Logger, err error, c echo.Context) {
	if c.Response().Committed {
		logger.Error("error after response was committed", slog.String(logfield.Error, err.Error()))
		return
	}
	r := c.Request()
	status := http.StatusInternalServerError
	var he *echo.HTTPError
	if errors.As(err, &he) {
		status = he.Code
	}
	body := stripeError{Error: stripeErrorBody{Type: "invalid_request_error"}}
	switch status {
	case http.StatusNotFound:
		body.Error.Code = "resource_missing"
		body.Error.Message = "Unrecognized request URL (" + r.Method + ": " + r.URL.EscapedPath() + ")."
	case http.StatusMethodNotAllowed:
		body.Error.Code = "method_not_allowed"
		body.Error.Message = "Method " + r.Method + " is not allowed for " + r.URL.EscapedPath() + "."
	default:
		if status < 500 {
			body.Error.Message = http.StatusText(status)
			break
		}
		logger.Error("proxy listener route failed", slog.String(logfield.Method, r.Method),
			slog.String(logfield.Path, r.URL.EscapedPath()), slog.String(logfield.Error, err.Error()))
		status = http.StatusInternalServerError
		body.Error.Type = "api_error"
		body.Error.Message = "An internal error occurred."
	}

	h := c.Response().Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Stripe-Should-Retry", "false")
	c.Response().WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	if werr := json.NewEncoder(c.Response()).Encode(body); werr != nil {
		logger.Debug("write error response", slog.String(logfield.Error, werr.Error()))
	}
}
