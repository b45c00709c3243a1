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

// Why a server is not ready: the label values of keybrake_not_ready.
const (
	notReadyNoStore    = "no_store"
	notReadyClosed     = "closed"
	notReadyNoSpace    = "no_space"
	notReadyStorage    = "storage"
	notReadyNoUpstream = "no_upstream"
	notReadyClock      = "clock_offset"
)

// commitFailure is the keybrake_not_ready reason of a failed commit ("" for
// nil).
func commitFailure(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, vault.ErrClosed):
		return notReadyClosed
	case errors.Is(err, vault.ErrNoSpace):
		return notReadyNoSpace
	}
	return notReadyStorage
}

// notReadyReasons are every value of keybrake_not_ready's reason label.
var notReadyReasons = []string{notReadyNoStore, notReadyClosed, notReadyNoSpace, notReadyStorage, notReadyNoUpstream, notReadyClock}

// notReadyReason returns "" when store can serve traffic: it is open, it can
// commit now (Ping writes a probe as large as a settle's commit through the
// group committer: a full disk fails it) and at least one upstream is
// registered, and the process's clock is within maxOffset of the store's
// (when the store's is another: PostgreSQL's; 0 checks nothing). Otherwise it says why, without internal detail (the proxy
// listener is public), and code names the reason for keybrake_not_ready; the
// detail is logged at Error.
func notReadyReason(ctx context.Context, store vault.Store, log *slog.Logger, maxOffset time.Duration) (reason, code string) {
	if store == nil {
		return "no store is configured", notReadyNoStore
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := store.Ping(ctx); err != nil {
		code := commitFailure(err)
		switch code {
		case notReadyClosed:
			return "the store is closed", code
		case notReadyNoSpace:
			log.Error("readiness: the store cannot commit: no space left", slog.String(logfield.Error, err.Error()))
			return "the store cannot commit: no space left on its device", code
		}
		log.Error("readiness: the store cannot write", slog.String(logfield.Error, err.Error()))
		return "the store cannot write", notReadyStorage
	}
	// The Ping measured the offset again.
	if reason := clockOffsetReason(store, maxOffset); reason != "" {
		log.Error("readiness: "+reason, slog.Duration(logfield.ClockOffset, clockOffset(store)))
		return reason, notReadyClock
	}
	ups, err := store.ListUpstreams(ctx)
	if err != nil {
		log.Error("readiness: cannot list upstreams", slog.String(logfield.Error, err.Error()))
		return "the store cannot be read", notReadyStorage
	}
	if len(ups) == 0 {
		return "no upstream is registered: start with STRIPE_SECRET_KEY set, or POST /api/v1/upstreams", notReadyNoUpstream
	}
	return "", ""
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
	if reason, _ := notReadyReason(c.Request().Context(), store, log, maxOffset); reason != "" {
		return c.JSON(http.StatusServiceUnavailable, readiness{Status: statusNotReady, Reason: reason})
	}
	return c.JSON(http.StatusOK, readiness{Status: statusReady})
}

// readyz handles GET /readyz on the admin listener (no token).
func (a *admin) readyz(c echo.Context) error {
	return serveReadyz(c, a.store, a.log, a.maxClockOffset)
}
