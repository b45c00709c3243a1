package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// readyTimeout bounds the store checks of one readiness probe.
const readyTimeout = 5 * time.Second

// Readiness answers of GET /readyz.
const (
	statusReady    = "ready"
	statusNotReady = "not_ready"
)

// readiness is the body of GET /readyz.
type readiness struct {
	Status string `json:"status"`
	// Reason says why the server is not ready; empty when it is.
	Reason string `json:"reason,omitempty"`
}

// notReadyReason returns "" when store can serve traffic: it is open and
// writable (an empty write transaction through its group committer commits),
// at least one upstream is registered, and the process's clock is within
// maxOffset of the store's (when the store's is another: PostgreSQL's; 0
// checks nothing). Otherwise it says why, without internal detail (the proxy
// listener is public); the detail is logged at Error.
func notReadyReason(ctx context.Context, store vault.Store, log *slog.Logger, maxOffset time.Duration) string {
	if store == nil {
		return "no store is configured"
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := store.Ping(ctx); err != nil {
		if errors.Is(err, vault.ErrClosed) {
			return "the store is closed"
		}
		log.Error("readiness: the store cannot write", slog.String(logfield.Error, err.Error()))
		return "the store cannot write"
	}
	// The Ping measured the offset again.
	if reason := clockOffsetReason(store, maxOffset); reason != "" {
		log.Error("readiness: "+reason, slog.Duration(logfield.ClockOffset, clockOffset(store)))
		return reason
	}
	ups, err := store.ListUpstreams(ctx)
	if err != nil {
		log.Error("readiness: cannot list upstreams", slog.String(logfield.Error, err.Error()))
		return "the store cannot be read"
	}
	if len(ups) == 0 {
		return "no upstream is registered: start with STRIPE_SECRET_KEY set, or POST /api/v1/upstreams"
	}
	return ""
}

// clockOffset is how far the store's clock is ahead of the process's, 0 when
// it is the process's or not measured yet.
func clockOffset(store vault.Store) time.Duration {
	if cr, ok := store.(vault.ClockReader); ok {
		if off, ok := cr.ClockOffset(); ok {
			return off
		}
	}
	return 0
}

// clockOffsetReason says why a replica whose clock is off by more than
// maxOffset from the store's is not ready ("" when it is within it, or
// maxOffset is 0). keybrake decides nothing about money or keys by the
// process's clock, but such a clock is broken, and what the process does
// stamp by it (its log lines, the admin tokens it issues and checks) is off.
func clockOffsetReason(store vault.Store, maxOffset time.Duration) string {
	off := clockOffset(store)
	if maxOffset <= 0 || off.Abs() <= maxOffset {
		return ""
	}
	return fmt.Sprintf("this replica's clock is %s off the database's, more than the %s allowed (--max-clock-offset): fix its time synchronisation",
		off.Abs().Round(time.Millisecond), maxOffset)
}

// serveReadyz answers GET /readyz on either listener: 200 when ready, else 503
// with the reason. Load balancers and orchestrators poll it without a token.
func serveReadyz(c echo.Context, store vault.Store, log *slog.Logger, maxOffset time.Duration) error {
	c.Response().Header().Set("Cache-Control", "no-store")
	if reason := notReadyReason(c.Request().Context(), store, log, maxOffset); reason != "" {
		return c.JSON(http.StatusServiceUnavailable, readiness{Status: statusNotReady, Reason: reason})
	}
	return c.JSON(http.StatusOK, readiness{Status: statusReady})
}

// readyz handles GET /readyz on the admin listener (no token).
func (a *admin) readyz(c echo.Context) error {
	return serveReadyz(c, a.store, a.log, a.maxClockOffset)
}
