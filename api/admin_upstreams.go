package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

// putUpstreamRequest is the body of POST /api/v1/upstreams.
type putUpstreamRequest struct {
	Name   string `json:"name"`
	Vendor string `json:"vendor"`
	Secret string `json:"secret"`
	// WebhookSecrets, when given, replace the upstream's webhook secrets.
	WebhookSecrets *[]string `json:"webhook_secrets"`
}

// patchUpstreamRequest is the body of PATCH /api/v1/upstreams/{name}.
type patchUpstreamRequest struct {
	WebhookSecrets *[]string `json:"webhook_secrets"`
}

// checkWebhookSecrets validates webhook_secrets: at most two (the current one
// and, during a rotation, the one before), each a whsec_ secret.
func checkWebhookSecrets(secrets []string) []policy.FieldError {
	if len(secrets) > vault.MaxWebhookSecrets {
		return []policy.FieldError{fieldError("webhook_secrets", fmt.Sprintf("at most %d (the current secret and, while rotating, the one before)", vault.MaxWebhookSecrets))}
	}
	var errs []policy.FieldError
	for i, s := range secrets {
		field := fmt.Sprintf("webhook_secrets[%d]", i)
		switch {
		case !strings.HasPrefix(s, "whsec_") || len(s) <= len("whsec_"):
			errs = append(errs, fieldError(field, "must be a Stripe webhook signing secret (whsec_…)"))
		case len(s) > 255 || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r > '~' }):
			errs = append(errs, fieldError(field, "must be at most 255 printable characters without spaces"))
		}
	}
	return errs
}

// patchUpstream handles PATCH /api/v1/upstreams/{name}: replace the upstream's
// webhook secrets (sealed, never returned; [] removes them).
func (a *admin) patchUpstream(c echo.Context) error {
	name, err := pathParam(c, "name")
	if err != nil {
		return err
	}
	var req patchUpstreamRequest
	if err := bindJSON(c, DefaultMaxBodyBytes, &req); err != nil {
		return err
	}
	if req.WebhookSecrets == nil {
		return validationProblem("nothing to change", fieldError("webhook_secrets", "required"))
	}
	if errs := checkWebhookSecrets(*req.WebhookSecrets); len(errs) > 0 {
		return validationProblem("the webhook secrets cannot be set", errs...)
	}
	ctx := c.Request().Context()
	u, err := a.store.SetUpstreamWebhookSecrets(ctx, actor(c), name, *req.WebhookSecrets)
	if err != nil {
		return fmt.Errorf("patch upstream %q: %w", name, err)
	}
	secret, err := a.store.UpstreamSecret(ctx, u.Name)
	if err != nil {
		return fmt.Errorf("patch upstream %q: %w", name, err)
	}
	return c.JSON(http.StatusOK, newUpstreamView(u, a.upstreamMode(secret), a.upstreamURL()))
}

// upstreamListView is the answer of GET /api/v1/upstreams.
type upstreamListView struct {
	Upstreams []upstreamView `json:"upstreams"`
}

// putUpstream handles POST /api/v1/upstreams: register (201) or replace (200) the
// upstream's secret. The secret is sealed by the store and never returned.
func (a *admin) putUpstream(c echo.Context) error {
	var req putUpstreamRequest
	if err := bindJSON(c, DefaultMaxBodyBytes, &req); err != nil {
		return err
	}
	if req.Vendor == "" {
		req.Vendor = policy.VendorStripe
	}
	var errs []policy.FieldError
	errs = append(errs, checkName("name", req.Name)...)
	if req.Vendor != policy.VendorStripe {
		errs = append(errs, fieldError("vendor", `must be "stripe"`))
	}
	switch {
	case req.Secret == "":
		errs = append(errs, fieldError("secret", "required"))
	case !strings.HasPrefix(req.Secret, "sk_") && !strings.HasPrefix(req.Secret, "rk_"):
		// A publishable key (pk_) or a vault key (vk_) here is a mistake that would
		// only show up as failing upstream requests later.
		errs = append(errs, fieldError("secret", "must be a Stripe secret key (sk_…) or restricted key (rk_…)"))
	case strings.ContainsFunc(req.Secret, func(r rune) bool { return r <= ' ' || r > '~' }):
		errs = append(errs, fieldError("secret", "must not contain spaces or control characters"))
	}
	if req.WebhookSecrets != nil {
		errs = append(errs, checkWebhookSecrets(*req.WebhookSecrets)...)
	}
	if len(errs) > 0 {
		return validationProblem("the upstream cannot be registered", errs...)
	}
	ctx := c.Request().Context()
	// Created or replaced is decided by the store's transaction that writes
	// the upstream, so of two replicas registering one new name at once only
	// one answers 201.
	u, created, err := a.store.PutUpstream(ctx, actor(c), req.Name, req.Vendor, req.Secret)
	if err != nil {
		return fmt.Errorf("put upstream %q: %w", req.Name, err)
	}
	if req.WebhookSecrets != nil {
		if u, err = a.store.SetUpstreamWebhookSecrets(ctx, actor(c), req.Name, *req.WebhookSecrets); err != nil {
			return fmt.Errorf("put upstream %q: %w", req.Name, err)
		}
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, newUpstreamView(u, a.upstreamMode(req.Secret), a.upstreamURL()))
}

// listUpstreams handles GET /api/v1/upstreams.
func (a *admin) listUpstreams(c echo.Context) error {
	if _, err := query(c); err != nil {
		return err
	}
	ctx := c.Request().Context()
	ups, err := a.store.ListUpstreams(ctx)
	if err != nil {
		return fmt.Errorf("list upstreams: %w", err)
	}
	views := make([]upstreamView, 0, len(ups))
	for _, u := range ups {
		// The mode is read from the secret itself: only its last 4 are stored
		// beside it.
		secret, err := a.store.UpstreamSecret(ctx, u.Name)
		if err != nil {
			return fmt.Errorf("list upstreams: %s: %w", u.Name, err)
		}
		views = append(views, newUpstreamView(u, a.upstreamMode(secret), a.upstreamURL()))
	}
	return c.JSON(http.StatusOK, upstreamListView{Upstreams: views})
}

// deleteUpstream handles DELETE /api/v1/upstreams/{name}: 409 while an active key
// uses it.
func (a *admin) deleteUpstream(c echo.Context) error {
	name, err := pathParam(c, "name")
	if err != nil {
		return err
	}
	err = a.store.DeleteUpstream(c.Request().Context(), actor(c), name)
	switch {
	case errors.Is(err, vault.ErrConflict):
		return newProblem(http.StatusConflict,
			fmt.Sprintf("upstream %q is used by active keys; revoke them or let them expire first", name))
	case err != nil:
		return fmt.Errorf("delete upstream %q: %w", name, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// upstreamURL is the base URL the proxy sends upstream requests to ("" without a proxy).
func (a *admin) upstreamURL() string {
	if a.stripe == nil {
		return ""
	}
	return a.stripe.UpstreamURL()
}

// upstreamMode is "demo" in a demonstration (the upstream is no Stripe, whatever
// its secret says), else the secret's mode.
func (a *admin) upstreamMode(secret string) string {
	if a.demo {
		return "demo"
	}
	return secretMode(secret)
}
