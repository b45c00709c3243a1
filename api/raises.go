package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keybrake/keybrake/proxy/logfield"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// raiseView is a raise of a key's or a budget's cap; money as a decimal string
// in the scope's currency.
type raiseView struct {
	ID        string     `json:"id"`
	Window    string     `json:"window"`
	Amount    string     `json:"amount"`
	Currency  string     `json:"currency"`
	Until     time.Time  `json:"until"`
	Reason    string     `json:"reason"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`
	Active    bool       `json:"active"`
	RequestID string     `json:"request_id,omitempty"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	EndedBy   string     `json:"ended_by,omitempty"`
}

func newRaiseView(r vault.Raise, now time.Time) raiseView {
	return raiseView{
		ID: r.ID, Window: string(r.Window), Amount: policy.FormatMinor(r.Currency, r.Amount), Currency: r.Currency,
		Until: r.Until.UTC(), Reason: r.Reason, CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt.UTC(),
		Active: r.Active(now), RequestID: r.RequestID, EndedAt: optionalTime(r.EndedAt), EndedBy: r.EndedBy,
	}
}

// activeRaiseViews are the raises of rs active at now, as usage shows them
// (never null).
func activeRaiseViews(rs []vault.Raise, now time.Time) []raiseView {
	out := []raiseView{}
	for _, r := range rs {
		if r.Active(now) {
			out = append(out, newRaiseView(r, now))
		}
	}
	return out
}

// raiseListView is the answer of GET …/raises.
type raiseListView struct {
	Raises []raiseView `json:"raises"`
}

// raiseRequestView is a raise request as operators and the key see it.
type raiseRequestView struct {
	ID        string     `json:"id"`
	KeyID     string     `json:"key_id"`
	KeyName   string     `json:"key_name"`
	Window    string     `json:"window"`
	Amount    string     `json:"amount"`
	Currency  string     `json:"currency"`
	Until     time.Time  `json:"until"`
	Reason    string     `json:"reason"`
	State     string     `json:"state"`
	CreatedAt time.Time  `json:"created_at"`
	DecidedAt *time.Time `json:"decided_at,omitempty"`
	DecidedBy string     `json:"decided_by,omitempty"`
	Note      string     `json:"note,omitempty"`
	RaiseID   string     `json:"raise_id,omitempty"`
}

func newRaiseRequestView(r vault.RaiseRequest) raiseRequestView {
	return raiseRequestView{
		ID: r.ID, KeyID: r.KeyID, KeyName: r.KeyName, Window: string(r.Window),
		Amount: policy.FormatMinor(r.Currency, r.Amount), Currency: r.Currency, Until: r.Until.UTC(), Reason: r.Reason,
		State: string(r.State), CreatedAt: r.CreatedAt.UTC(), DecidedAt: optionalTime(r.DecidedAt),
		DecidedBy: r.DecidedBy, Note: r.Note, RaiseID: r.RaiseID,
	}
}

// raiseBody is the body of POST …/raises and POST /keybrake/v1/raise-requests.
// The amount is a decimal string in the scope's currency (a JSON number is
// taken as its decimal text, without float rounding).
type raiseBody struct {
	Window *string     `json:"window"`
	Amount json.Number `json:"amount"`
	Until  *time.Time  `json:"until"`
	Reason string      `json:"reason"`
}

// raiseBodyOf reads and checks a raise's body for a scope in currency; the
// store checks the rest (until's bounds, a cap to raise) against its clock.
func raiseBodyOf(c echo.Context, limit int64, currency string) (vault.NewRaise, error) {
	body, err := readJSONBody(c, limit)
	if err != nil {
		return vault.NewRaise{}, err
	}
	return parseRaise(body, currency)
}

// parseRaise decodes a raise's JSON body strictly.
func parseRaise(body []byte, currency string) (vault.NewRaise, error) {
	var b raiseBody
	if err := decodeStrict(body, &b); err != nil {
		return vault.NewRaise{}, err
	}
	var errs []policy.FieldError
	var nr vault.NewRaise
	switch {
	case b.Window == nil:
		errs = append(errs, fieldError("window", `is required: "daily", "period" or "per_request"`))
	default:
		nr.Window = policy.WindowKind(*b.Window)
	}
	if b.Amount == "" {
		errs = append(errs, fieldError("amount", "is required: a decimal string like \"50.00\""))
	} else if d, err := policy.ParseAmount(strings.Trim(string(b.Amount), `"`)); err != nil {
		errs = append(errs, fieldError("amount", "must be a decimal amount like \"50.00\""))
	} else if nr.Amount, err = policy.ToMinor(currency, d); err != nil {
		errs = append(errs, fieldError("amount", fmt.Sprintf("is not an amount of %s: %v", currency, err)))
	}
	if b.Until == nil {
		errs = append(errs, fieldError("until", "is required: an RFC 3339 time at most 31 days ahead"))
	} else {
		nr.Until = *b.Until
	}
	nr.Reason = b.Reason
	if len(errs) > 0 {
		return vault.NewRaise{}, validationProblem("the raise is not valid", errs...)
	}
	return nr, nil
}

// raiseScopeOf reads the scope of a …/raises path and its currency.
func (a *admin) raiseScopeOf(c echo.Context, kind policy.ScopeKind) (vault.RaiseScope, string, error) {
	id, err := pathParam(c, "id")
	if err != nil {
		return vault.RaiseScope{}, "", err
	}
	scope := vault.RaiseScope{Kind: kind, ID: id}
	cur, err := scopeCurrency(c.Request().Context(), a.store, scope)
	return scope, cur, err
}

// scopeCurrency is the currency a scope's amounts are in.
func scopeCurrency(ctx context.Context, store vault.Store, scope vault.RaiseScope) (string, error) {
	if scope.Kind == policy.ScopeBudget {
		b, err := store.GetBudget(ctx, scope.ID)
		if err != nil {
			return "", fmt.Errorf("budget %s: %w", scope.ID, err)
		}
		return b.Currency, nil
	}
	k, err := store.GetKey(ctx, scope.ID)
	if err != nil {
		return "", fmt.Errorf("key %s: %w", scope.ID, err)
	}
	return k.Policy.EffectiveCurrency(), nil
}

func (a *admin) addRaise(c echo.Context, kind policy.ScopeKind) error {
	scope, cur, err := a.raiseScopeOf(c, kind)
	if err != nil {
		return err
	}
	nr, err := raiseBodyOf(c, DefaultMaxBodyBytes, cur)
	if err != nil {
		return err
	}
	r, err := a.store.AddRaise(c.Request().Context(), actor(c), scope, nr)
	if err != nil {
		return fmt.Errorf("raise %s %s: %w", kind, scope.ID, err)
	}
	return c.JSON(http.StatusCreated, newRaiseView(r, a.now()))
}

func (a *admin) listRaises(c echo.Context, kind policy.ScopeKind) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	rs, err := a.store.ListRaises(c.Request().Context(), vault.RaiseScope{Kind: kind, ID: id})
	if err != nil {
		return fmt.Errorf("raises of %s %s: %w", kind, id, err)
	}
	now := a.now()
	return c.JSON(http.StatusOK, raiseListView{Raises: viewsOf(rs, func(r vault.Raise) raiseView { return newRaiseView(r, now) })})
}

func (a *admin) endRaise(c echo.Context, kind policy.ScopeKind) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	raiseID, err := pathParam(c, "raise_id")
	if err != nil {
		return err
	}
	r, err := a.store.EndRaise(c.Request().Context(), actor(c), vault.RaiseScope{Kind: kind, ID: id}, raiseID)
	if err != nil {
		return fmt.Errorf("end raise %s of %s %s: %w", raiseID, kind, id, err)
	}
	return c.JSON(http.StatusOK, newRaiseView(r, a.now()))
}

// addKeyRaise handles POST /api/v1/keys/{id}/raises.
func (a *admin) addKeyRaise(c echo.Context) error { return a.addRaise(c, policy.ScopeKey) }

// listKeyRaises handles GET /api/v1/keys/{id}/raises.
func (a *admin) listKeyRaises(c echo.Context) error { return a.listRaises(c, policy.ScopeKey) }

// endKeyRaise handles DELETE /api/v1/keys/{id}/raises/{raise_id}.
func (a *admin) endKeyRaise(c echo.Context) error { return a.endRaise(c, policy.ScopeKey) }

// addBudgetRaise handles POST /api/v1/budgets/{id}/raises.
func (a *admin) addBudgetRaise(c echo.Context) error { return a.addRaise(c, policy.ScopeBudget) }

// listBudgetRaises handles GET /api/v1/budgets/{id}/raises.
func (a *admin) listBudgetRaises(c echo.Context) error { return a.listRaises(c, policy.ScopeBudget) }

// endBudgetRaise handles DELETE /api/v1/budgets/{id}/raises/{raise_id}.
func (a *admin) endBudgetRaise(c echo.Context) error { return a.endRaise(c, policy.ScopeBudget) }

// raiseRequestListView is the answer of GET /api/v1/raise-requests.
type raiseRequestListView struct {
	RaiseRequests []raiseRequestView `json:"raise_requests"`
	page
}

// listRaiseRequests handles GET /api/v1/raise-requests?state=pending: newest
// first.
func (a *admin) listRaiseRequests(c echo.Context) error {
	q, err := query(c, "state", "limit", "cursor")
	if err != nil {
		return err
	}
	state := vault.RaiseRequestState(q.Get("state"))
	switch state {
	case "", vault.RaiseRequestPending, vault.RaiseRequestApproved, vault.RaiseRequestDeclined:
	default:
		return validationProblem("the request is not valid", fieldError("state", `must be "pending", "approved" or "declined"`))
	}
	limit, cursor, err := pageParams(q)
	if err != nil {
		return err
	}
	rs, next, err := a.store.ListRaiseRequests(c.Request().Context(), state, limit, cursor)
	if err != nil {
		return cursorError(fmt.Errorf("list raise requests: %w", err))
	}
	return c.JSON(http.StatusOK, raiseRequestListView{RaiseRequests: viewsOf(rs, newRaiseRequestView), page: page{NextCursor: next}})
}

// getRaiseRequest handles GET /api/v1/raise-requests/{id}.
func (a *admin) getRaiseRequest(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	r, err := a.store.GetRaiseRequest(c.Request().Context(), id)
	if err != nil {
		return fmt.Errorf("raise request %s: %w", id, err)
	}
	return c.JSON(http.StatusOK, newRaiseRequestView(r))
}

// decisionBody is the body of POST /api/v1/raise-requests/{id}/approve and
// /decline (optional).
type decisionBody struct {
	Note string `json:"note"`
}

func (a *admin) decideRaiseRequest(c echo.Context, approve bool) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	var b decisionBody
	if c.Request().ContentLength != 0 {
		if err := bindJSON(c, DefaultMaxBodyBytes, &b); err != nil {
			return err
		}
	}
	r, err := a.store.DecideRaiseRequest(c.Request().Context(), actor(c), id, approve, b.Note)
	if err != nil {
		return fmt.Errorf("decide raise request %s: %w", id, err)
	}
	return c.JSON(http.StatusOK, newRaiseRequestView(r))
}

// approveRaiseRequest handles POST /api/v1/raise-requests/{id}/approve: the
// raise is created on the key, in the same transaction.
func (a *admin) approveRaiseRequest(c echo.Context) error { return a.decideRaiseRequest(c, true) }

// declineRaiseRequest handles POST /api/v1/raise-requests/{id}/decline.
func (a *admin) declineRaiseRequest(c echo.Context) error { return a.decideRaiseRequest(c, false) }

// ---- the agent's side ----

// createRaiseRequest handles POST /keybrake/v1/raise-requests: the key asks an
// admin for a raise of one of its caps.
func (a *agent) createRaiseRequest(c echo.Context) error {
	key := vaultKeyOf(c)
	nr, err := raiseBodyOf(c, a.maxBody, key.Policy.EffectiveCurrency())
	if err != nil {
		return err
	}
	r, err := a.store.RequestRaise(c.Request().Context(), key.ID, nr)
	if err != nil {
		return fmt.Errorf("raise request of %s: %w", key.ID, err)
	}
	c.Response().Header().Set(echo.HeaderLocation, "/keybrake/v1/raise-requests/"+r.ID)
	return c.JSON(http.StatusCreated, newRaiseRequestView(r))
}

// getRaiseRequest handles GET /keybrake/v1/raise-requests/{id}: only the key's
// own requests (another key's is 404, as if it did not exist).
func (a *agent) getRaiseRequest(c echo.Context) error {
	key := vaultKeyOf(c)
	id := c.Param("id")
	r, err := a.store.GetRaiseRequest(c.Request().Context(), id)
	if err == nil && r.KeyID != key.ID {
		err = fmt.Errorf("raise request %s: %w", id, vault.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("raise request of %s: %w", key.ID, err)
	}
	return c.JSON(http.StatusOK, newRaiseRequestView(r))
}

// requestRaise answers request_budget_raise: what POST
// /keybrake/v1/raise-requests does, its refusals as the tool's errors.
func (m *mcpEndpoint) requestRaise(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key, err := m.keyOf(ctx, req.Extra)
	if err != nil {
		return nil, err
	}
	args, err := decodeArgs(req.Params.Arguments)
	if err != nil {
		return refusalResult(http.StatusBadRequest, sourceKeybrake, codeInvalidArguments, err.Error()+".", nil), nil
	}
	str := func(name string) string { s, _ := args[name].(string); return s }
	var body bytes.Buffer
	if err := json.NewEncoder(&body).Encode(map[string]any{
		"window": str("window"), "amount": str("amount"), "until": str("until"), "reason": str("reason"),
	}); err != nil {
		return nil, fmt.Errorf("encode raise request: %w", err)
	}
	nr, err := parseRaise(body.Bytes(), key.Policy.EffectiveCurrency())
	if err == nil {
		var r vault.RaiseRequest
		if r, err = m.store.RequestRaise(ctx, key.ID, nr); err == nil {
			v := newRaiseRequestView(r)
			out, err := json.Marshal(v)
			if err != nil {
				return nil, fmt.Errorf("encode raise request: %w", err)
			}
			return &mcp.CallToolResult{
				Content: []mcp.Content{
					&mcp.TextContent{Text: fmt.Sprintf("Raise request %s is pending: %s %s more on the %s cap until %s, once an admin approves.",
						v.ID, v.Amount, v.Currency, v.Window, v.Until.Format(time.RFC3339))},
					&mcp.TextContent{Text: string(out)},
				},
				StructuredContent: json.RawMessage(out),
			}, nil
		}
	}
	p, internal := problemFor(err)
	if internal {
		m.log.LogAttrs(ctx, slog.LevelError, "request_budget_raise failed", slog.String(logfield.KeyID, key.ID),
			slog.String(logfield.Error, err.Error()))
		return nil, errors.New("internal error")
	}
	msg := p.Detail
	for _, fe := range p.Errors {
		msg += "; " + fe.Field + " " + fe.Message
	}
	return refusalResult(p.Status, sourceKeybrake, codeInvalidArguments, msg+".", nil), nil
}

// newBudgetUsage is a budget's usage: its windows' caps effective at now,
// with the raises active then.
func newBudgetUsage(st vault.BudgetState, now time.Time) *usageView {
	lim := st.Budget.Limits()
	base, _ := lim.Windows(now)
	return newWindowsUsage(st.Budget.Currency, st.Windows, st.Usage, base, st.Budget.Raises, now)
}
