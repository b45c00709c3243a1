package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/shopspring/decimal"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// Fields of a budget's JSON. The caps, currency, zone, period and velocity
// are read exactly as a policy's (the same strict decoder), the rest here.
var (
	budgetPolicyFields = []string{"currency", "daily_cap", "period_cap", "period_start", "expires_at", "timezone", "velocity"}
	budgetOwnFields    = []string{"name", "parent", "labels"}
)

// budgetView is a budget as the admin API shows it.
type budgetView struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Parent      *string           `json:"parent"`
	Currency    string            `json:"currency"`
	DailyCap    *string           `json:"daily_cap"`
	PeriodCap   *string           `json:"period_cap"`
	PeriodStart time.Time         `json:"period_start"`
	ExpiresAt   *time.Time        `json:"expires_at"`
	Timezone    string            `json:"timezone"`
	Velocity    []policy.Velocity `json:"velocity"`
	Labels      map[string]string `json:"labels"`
	Children    int               `json:"children"`
	Keys        int               `json:"keys"`
	Version     uint64            `json:"version"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
	Usage       *usageView        `json:"usage,omitempty"`
}

func newBudgetView(b vault.Budget) budgetView {
	v := budgetView{
		ID: b.ID, Name: b.Name, Currency: b.Currency, PeriodStart: b.PeriodStart.UTC(), Timezone: b.Timezone,
		Velocity: b.Velocity, Labels: b.Labels, Children: b.Children, Keys: b.Keys, Version: b.Version,
		CreatedAt: b.CreatedAt.UTC(), UpdatedAt: b.UpdatedAt.UTC(),
	}
	if v.Velocity == nil {
		v.Velocity = []policy.Velocity{}
	}
	if v.Labels == nil {
		v.Labels = map[string]string{}
	}
	if b.Parent != "" {
		v.Parent = &b.Parent
	}
	if !b.ExpiresAt.IsZero() {
		t := b.ExpiresAt.UTC()
		v.ExpiresAt = &t
	}
	v.DailyCap, v.PeriodCap = capString(b.Currency, b.DailyCap), capString(b.Currency, b.PeriodCap)
	return v
}

// capString writes a cap with its currency's decimals; nil for no cap.
func capString(cur string, d *decimal.Decimal) *string {
	if d == nil {
		return nil
	}
	s := d.String()
	if c, err := policy.ToMinor(cur, *d); err == nil {
		s = policy.FormatMinor(cur, c)
	}
	return &s
}

// decodeNumbersJSON decodes one JSON object keeping numbers as their text.
func decodeNumbersJSON(body []byte, dst *map[string]any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(dst); err != nil {
		return err
	}
	if *dst == nil {
		return errors.New("not an object")
	}
	return nil
}

// budgetWithUsage is a budget with the usage of its windows now.
func budgetWithUsage(st vault.BudgetState, now time.Time) budgetView {
	v := newBudgetView(st.Budget)
	v.Usage = newBudgetUsage(st, now)
	return v
}

// decodeBudget reads a budget's JSON fields (all of them optional here) into
// spec, starting from spec as it is: a create starts empty, a merge patch from
// the budget as it is, merged already.
func decodeBudget(raw map[string]json.RawMessage) (vault.BudgetSpec, []policy.FieldError) {
	var spec vault.BudgetSpec
	var errs []policy.FieldError
	for k := range raw {
		if !slices.Contains(budgetPolicyFields, k) && !slices.Contains(budgetOwnFields, k) {
			errs = append(errs, fieldError(k, "unknown field"))
		}
	}
	if r, ok := raw["name"]; ok && !isNull(r) {
		if err := json.Unmarshal(r, &spec.Name); err != nil {
			errs = append(errs, fieldError("name", "must be a string"))
		}
	}
	if r, ok := raw["parent"]; ok && !isNull(r) {
		if err := json.Unmarshal(r, &spec.Parent); err != nil {
			errs = append(errs, fieldError("parent", "must be a budget id or null"))
		}
	}
	if r, ok := raw["labels"]; ok {
		labels, lerrs := decodeLabels(r)
		errs = append(errs, lerrs...)
		errs = append(errs, checkLabels(labels)...)
		spec.Labels = labels
	}
	pol := map[string]json.RawMessage{"vendor": json.RawMessage(`"stripe"`)}
	for _, k := range budgetPolicyFields {
		if r, ok := raw[k]; ok {
			pol[k] = r
		}
	}
	doc, err := json.Marshal(pol)
	if err != nil {
		return spec, append(errs, fieldError("", err.Error()))
	}
	var p policy.Policy
	if err := json.Unmarshal(doc, &p); err != nil {
		var verr *policy.ValidationError
		if errors.As(err, &verr) {
			return spec, append(errs, verr.Errors...)
		}
		return spec, append(errs, decodeProblem(err, "").Errors...)
	}
	spec.Currency, spec.DailyCap, spec.PeriodCap = p.Currency, p.DailyCap, p.PeriodCap
	spec.PeriodStart, spec.ExpiresAt, spec.Timezone, spec.Velocity = p.PeriodStart, p.ExpiresAt, p.Timezone, p.Velocity
	var verr *policy.ValidationError
	if errors.As(policy.ValidateVelocities("velocity", spec.Velocity), &verr) {
		errs = append(errs, verr.Errors...)
	}
	return spec, append(errs, checkVelocityOperations("velocity", spec.Velocity, errs)...)
}

// budgetDoc is the JSON of a budget's changeable fields, what a merge patch
// applies to.
func budgetDoc(b vault.Budget) (map[string]any, error) {
	v := newBudgetView(b)
	out := map[string]any{"name": v.Name, "currency": v.Currency, "timezone": v.Timezone,
		"period_start": v.PeriodStart.Format(time.RFC3339Nano), "labels": map[string]any{}}
	if v.Parent != nil {
		out["parent"] = *v.Parent
	}
	if v.DailyCap != nil {
		out["daily_cap"] = *v.DailyCap
	}
	if v.PeriodCap != nil {
		out["period_cap"] = *v.PeriodCap
	}
	if v.ExpiresAt != nil {
		out["expires_at"] = v.ExpiresAt.Format(time.RFC3339Nano)
	}
	if len(b.Velocity) > 0 {
		raw, err := json.Marshal(b.Velocity)
		if err != nil {
			return nil, err
		}
		var vs any
		if err := json.Unmarshal(raw, &vs); err != nil {
			return nil, err
		}
		out["velocity"] = vs
	}
	for k, lv := range b.Labels {
		out["labels"].(map[string]any)[k] = lv
	}
	return out, nil
}

// budgetProblem maps a store's validation error of a budget to a 422 naming
// its fields.
func budgetProblem(detail string, err error) error {
	var verr *policy.ValidationError
	if errors.As(err, &verr) {
		return validationProblem(detail, verr.Errors...)
	}
	return err
}

// createBudget handles POST /api/v1/budgets.
func (a *admin) createBudget(c echo.Context) error {
	var raw map[string]json.RawMessage
	if err := bindJSON(c, DefaultMaxBodyBytes, &raw); err != nil {
		return err
	}
	spec, errs := decodeBudget(raw)
	if _, ok := raw["name"]; !ok {
		errs = append(errs, fieldError("name", "required"))
	}
	if _, ok := raw["currency"]; !ok {
		errs = append(errs, fieldError("currency", "required"))
	}
	if len(errs) > 0 {
		return validationProblem("the budget cannot be created", errs...)
	}
	if spec.PeriodStart.IsZero() {
		spec.PeriodStart = a.now().Truncate(time.Second)
	}
	b, err := a.store.CreateBudget(c.Request().Context(), actor(c), spec)
	switch {
	case errors.Is(err, vault.ErrNotFound):
		return validationProblem("the budget cannot be created", fieldError("parent", fmt.Sprintf("no budget %q", spec.Parent)))
	case err != nil:
		return budgetProblem("the budget cannot be created", fmt.Errorf("create budget: %w", err))
	}
	c.Response().Header().Set(echo.HeaderLocation, "/api/v1/budgets/"+b.ID)
	return a.budgetAnswer(c, http.StatusCreated, b.ID)
}

// budgetAnswer answers with the budget id and its usage now.
func (a *admin) budgetAnswer(c echo.Context, status int, id string) error {
	chain, err := a.store.BudgetChain(c.Request().Context(), id)
	if err != nil {
		return fmt.Errorf("budget %s: %w", id, err)
	}
	c.Response().Header().Set("ETag", `"`+strconv.FormatUint(chain[0].Budget.Version, 10)+`"`)
	return c.JSON(status, budgetWithUsage(chain[0], a.now()))
}

// getBudget handles GET /api/v1/budgets/{id}.
func (a *admin) getBudget(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	return a.budgetAnswer(c, http.StatusOK, id)
}

// budgetUsage handles GET /api/v1/budgets/{id}/usage.
func (a *admin) budgetUsage(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	chain, err := a.store.BudgetChain(c.Request().Context(), id)
	if err != nil {
		return fmt.Errorf("budget usage %s: %w", id, err)
	}
	return c.JSON(http.StatusOK, newBudgetUsage(chain[0], a.now()))
}

// budgetListView is the answer of GET /api/v1/budgets.
type budgetListView struct {
	Budgets []budgetView `json:"budgets"`
	page
}

// listBudgets handles GET /api/v1/budgets.
func (a *admin) listBudgets(c echo.Context) error {
	q, err := query(c, "parent", "label", "q", "limit", "cursor")
	if err != nil {
		return err
	}
	f := vault.BudgetFilter{Parent: q.Get("parent"), NamePrefix: q.Get("q"), Cursor: q.Get("cursor")}
	var errs []policy.FieldError
	if f.Parent == "null" || f.Parent == "none" {
		f.Parent = vault.RootParent
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, ":")
		if !ok || k == "" {
			errs = append(errs, fieldError("label", "must be key:value"))
			continue
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 500 {
			errs = append(errs, fieldError("limit", "must be a whole number from 1 to 500"))
		}
		f.Limit = n
	}
	if len(errs) > 0 {
		return validationProblem("the listing cannot be made", errs...)
	}
	ctx := c.Request().Context()
	budgets, next, err := a.store.ListBudgets(ctx, f)
	if err != nil {
		return cursorError(fmt.Errorf("list budgets: %w", err))
	}
	out := budgetListView{Budgets: make([]budgetView, 0, len(budgets)), page: page{NextCursor: next}}
	for _, b := range budgets {
		chain, err := a.store.BudgetChain(ctx, b.ID)
		if errors.Is(err, vault.ErrNotFound) {
			continue // deleted since the listing
		} else if err != nil {
			return fmt.Errorf("list budgets: %w", err)
		}
		out.Budgets = append(out.Budgets, budgetWithUsage(chain[0], a.now()))
	}
	return c.JSON(http.StatusOK, out)
}

// patchBudget handles PATCH /api/v1/budgets/{id}: a JSON merge patch (RFC
// 7386) of the budget's fields, applied inside the store's transaction to the
// budget as it is under its lock.
func (a *admin) patchBudget(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	body, err := readJSONBody(c, DefaultMaxBodyBytes)
	if err != nil {
		return err
	}
	var patch map[string]any
	if err := decodeNumbersJSON(body, &patch); err != nil {
		return validationProblem("the budget cannot be changed", fieldError("", "the body must be a JSON object (a merge patch)"))
	}
	ifVersion, err := ifMatchVersion(c)
	if err != nil {
		return err
	}
	_, err = a.store.PatchBudget(c.Request().Context(), actor(c), id, vault.BudgetChange{
		IfVersion: ifVersion,
		Apply: func(b vault.Budget, _ time.Time) (vault.BudgetSpec, error) {
			doc, err := budgetDoc(b)
			if err != nil {
				return vault.BudgetSpec{}, err
			}
			merged, err := json.Marshal(policy.MergeValue(doc, patch))
			if err != nil {
				return vault.BudgetSpec{}, err
			}
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(merged, &raw); err != nil {
				return vault.BudgetSpec{}, err
			}
			spec, errs := decodeBudget(raw)
			if _, ok := raw["currency"]; !ok {
				errs = append(errs, fieldError("currency", "cannot be removed"))
			}
			if len(errs) > 0 {
				return vault.BudgetSpec{}, validationProblem("the budget cannot be changed", errs...)
			}
			return spec, nil
		},
	})
	if err != nil {
		return budgetProblem("the budget cannot be changed", fmt.Errorf("patch budget %s: %w", id, err))
	}
	return a.budgetAnswer(c, http.StatusOK, id)
}

// deleteBudget handles DELETE /api/v1/budgets/{id}: 409 while keys or
// budgets name it.
func (a *admin) deleteBudget(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	if err := a.store.DeleteBudget(c.Request().Context(), actor(c), id); err != nil {
		return fmt.Errorf("delete budget %s: %w", id, err)
	}
	return c.NoContent(http.StatusNoContent)
}
