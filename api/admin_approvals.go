package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// approvalView is one approval in the admin API's answers: money as decimal
// strings of its currency. The list leaves out the request's parameters.
type approvalView struct {
	ID             string        `json:"id"`
	KeyID          string        `json:"key_id"`
	KeyName        string        `json:"key_name"`
	HoldID         string        `json:"hold_id,omitempty"`
	IdempotencyKey string        `json:"idempotency_key"`
	Operation      string        `json:"operation"`
	Amount         string        `json:"amount"`
	Currency       string        `json:"currency"`
	Customer       string        `json:"customer,omitempty"`
	Account        string        `json:"account,omitempty"`
	State          string        `json:"state"`
	Reason         string        `json:"reason"`
	Parameters     []vault.Param `json:"parameters,omitempty"`
	Timeout        string        `json:"timeout"`
	CreatedAt      time.Time     `json:"created_at"`
	ExpiresAt      time.Time     `json:"expires_at"`
	DecidedAt      *time.Time    `json:"decided_at,omitempty"`
	DecidedBy      string        `json:"decided_by,omitempty"`
	Note           string        `json:"note,omitempty"`
	UsedAt         *time.Time    `json:"used_at,omitempty"`
}

// newApprovalView is the view of a, with its parameters when full.
func newApprovalView(a vault.Approval, full bool) approvalView {
	v := approvalView{
		ID: a.ID, KeyID: a.KeyID, KeyName: a.KeyName, HoldID: a.HoldID, IdempotencyKey: a.IdempotencyKey,
		Operation: a.Operation, Amount: policy.FormatMinor(a.Currency, a.Amount), Currency: a.Currency,
		Customer: a.Customer, Account: a.Account, State: string(a.State), Reason: a.Reason,
		Timeout: a.Timeout.String(), CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt,
		DecidedAt: optionalTime(a.DecidedAt), DecidedBy: a.DecidedBy, Note: a.Note, UsedAt: optionalTime(a.UsedAt),
	}
	if full {
		v.Parameters = a.Params
		if v.Parameters == nil {
			v.Parameters = []vault.Param{}
		}
	}
	return v
}

// approvalListView is the answer of GET /api/v1/approvals.
type approvalListView struct {
	Approvals []approvalView `json:"approvals"`
	page
}

// listApprovals handles GET /api/v1/approvals?state=pending: newest first.
func (a *admin) listApprovals(c echo.Context) error {
	q, err := query(c, "state", "key_id", "limit", "cursor")
	if err != nil {
		return err
	}
	state := vault.ApprovalState(q.Get("state"))
	if state != "" && !state.Valid() {
		return validationProblem("the request is not valid",
			fieldError("state", `must be "pending", "approved", "declined", "expired" or "used"`))
	}
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	list, next, err := a.store.ListApprovals(c.Request().Context(), vault.ApprovalFilter{
		State: state, KeyID: q.Get("key_id"), Limit: limit, Cursor: cursor,
	})
	if err != nil {
		return cursorError(fmt.Errorf("list approvals: %w", err))
	}
	views := viewsOf(list, func(ap vault.Approval) approvalView { return newApprovalView(ap, false) })
	return c.JSON(http.StatusOK, approvalListView{Approvals: views, page: page{NextCursor: next}})
}

// getApproval handles GET /api/v1/approvals/{id}: the approval with the
// request's parameters (card and bank fields masked) and who decided.
func (a *admin) getApproval(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	ap, err := a.store.GetApproval(c.Request().Context(), id)
	if err != nil {
		return fmt.Errorf("get approval %s: %w", id, err)
	}
	if ap.State.Open() && !a.now().Before(ap.ExpiresAt) {
		ap.State = vault.ApprovalExpired // the reaper writes it soon
	}
	return c.JSON(http.StatusOK, newApprovalView(ap, true))
}

// decideApprovalRequest is the body of POST /api/v1/approvals/{id}/approve
// and /decline.
type decideApprovalRequest struct {
	Note string `json:"note"`
}

// approveApproval handles POST /api/v1/approvals/{id}/approve (admin role).
func (a *admin) approveApproval(c echo.Context) error { return a.decideApproval(c, true) }

// declineApproval handles POST /api/v1/approvals/{id}/decline (admin role):
// the hold is released.
func (a *admin) declineApproval(c echo.Context) error { return a.decideApproval(c, false) }

// decideApproval approves or declines; a decision already made (by another
// admin at the same moment, say) is a 409 that names the state.
func (a *admin) decideApproval(c echo.Context, approve bool) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	var req decideApprovalRequest
	if c.Request().ContentLength != 0 {
		if err := bindJSON(c, DefaultMaxBodyBytes, &req); err != nil {
			return err
		}
	}
	if len(req.Note) > vault.MaxApprovalReason {
		return validationProblem("the approval cannot be decided",
			policy.FieldError{Field: "note", Message: fmt.Sprintf("must be at most %d bytes", vault.MaxApprovalReason)})
	}
	ap, err := a.store.DecideApproval(c.Request().Context(), actor(c), id, approve, req.Note)
	if errors.Is(err, vault.ErrConflict) {
		detail := fmt.Sprintf("approval %s is %s", ap.ID, ap.State)
		if ap.DecidedBy != "" {
			detail += " (decided by " + ap.DecidedBy + ")"
		}
		return newProblem(http.StatusConflict, detail)
	}
	if err != nil {
		return fmt.Errorf("decide approval %s: %w", id, err)
	}
	return c.JSON(http.StatusOK, newApprovalView(ap, true))
}
