package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/api/webhooks"
	"github.com/keybrake/keybrake/vault"
)

// webhookRoutes are the endpoints of webhooks out (admin role for writes,
// as every write; audited by the store).
var webhookRoutes = []adminRoute{
	{method: http.MethodPost, path: "/api/v1/webhooks", handler: (*admin).createWebhook},
	{method: http.MethodGet, path: "/api/v1/webhooks", handler: (*admin).listWebhooks},
	{method: http.MethodGet, path: "/api/v1/webhooks/:id", handler: (*admin).getWebhook},
	{method: http.MethodPatch, path: "/api/v1/webhooks/:id", handler: (*admin).patchWebhook},
	{method: http.MethodDelete, path: "/api/v1/webhooks/:id", handler: (*admin).deleteWebhook},
	{method: http.MethodPost, path: "/api/v1/webhooks/:id/rotate-secret", handler: (*admin).rotateWebhookSecret},
	{method: http.MethodPost, path: "/api/v1/webhooks/:id/test", handler: (*admin).testWebhook},
	{method: http.MethodGet, path: "/api/v1/webhooks/:id/deliveries", handler: (*admin).listDeliveries},
	{method: http.MethodPost, path: "/api/v1/webhooks/:id/deliveries/:delivery_id/retry", handler: (*admin).retryDelivery},
}

func init() { adminRoutes = append(adminRoutes, webhookRoutes...) }

// createWebhookRequest is the body of POST /api/v1/webhooks.
type createWebhookRequest struct {
	URL         string   `json:"url"`
	Events      []string `json:"events"`
	Thresholds  []int    `json:"thresholds"`
	Description string   `json:"description"`
}

// patchWebhookRequest is the body of PATCH /api/v1/webhooks/{id}: the
// fields given change, the others stay.
type patchWebhookRequest struct {
	URL         *string              `json:"url"`
	Events      *[]string            `json:"events"`
	Thresholds  *[]int               `json:"thresholds"`
	Description *string              `json:"description"`
	Status      *vault.WebhookStatus `json:"status"`
}

// webhookCreatedView is a new endpoint with its secret, shown this once.
type webhookCreatedView struct {
	vault.Webhook
	Secret string `json:"secret"`
}

type webhookListView struct {
	Webhooks []vault.Webhook `json:"webhooks"`
}

type deliveryListView struct {
	Deliveries []vault.Delivery `json:"deliveries"`
	page
}

// checkDestination refuses an endpoint on an internal address (unless the
// server allows them) as a validation error of url.
func (a *admin) checkDestination(c echo.Context, raw string) error {
	if err := a.webhookGuard.CheckURL(c.Request().Context(), raw); err != nil {
		msg := "must not be a loopback, private, link-local or metadata address (serve --webhook-allow-private allows them)"
		if !errors.Is(err, webhooks.ErrForbiddenAddress) {
			msg = "the host does not resolve"
		}
		return validationProblem("the webhook cannot be saved", fieldError("url", msg))
	}
	return nil
}

func webhookETag(w vault.Webhook) string { return `"` + strconv.FormatUint(w.Version, 10) + `"` }

func (a *admin) webhookJSON(c echo.Context, status int, w vault.Webhook, v any) error {
	c.Response().Header().Set("ETag", webhookETag(w))
	return c.JSON(status, v)
}

// createWebhook handles POST /api/v1/webhooks: 201 with the secret.
func (a *admin) createWebhook(c echo.Context) error {
	var req createWebhookRequest
	if err := bindJSON(c, DefaultMaxBodyBytes, &req); err != nil {
		return err
	}
	if req.URL == "" {
		return validationProblem("the webhook cannot be saved", fieldError("url", "required"))
	}
	if err := a.checkDestination(c, req.URL); err != nil {
		return err
	}
	w, secret, err := a.store.CreateWebhook(c.Request().Context(), actor(c), vault.WebhookInput{
		URL: req.URL, Events: req.Events, Thresholds: req.Thresholds, Description: req.Description,
	})
	if err != nil {
		return fmt.Errorf("create webhook: %w", err)
	}
	c.Response().Header().Set("Location", "/api/v1/webhooks/"+w.ID)
	return a.webhookJSON(c, http.StatusCreated, w, webhookCreatedView{Webhook: w, Secret: secret})
}

// listWebhooks handles GET /api/v1/webhooks.
func (a *admin) listWebhooks(c echo.Context) error {
	if _, err := query(c); err != nil {
		return err
	}
	ws, err := a.store.ListWebhooks(c.Request().Context())
	if err != nil {
		return fmt.Errorf("list webhooks: %w", err)
	}
	if ws == nil {
		ws = []vault.Webhook{}
	}
	return c.JSON(http.StatusOK, webhookListView{Webhooks: ws})
}

// getWebhook handles GET /api/v1/webhooks/{id}.
func (a *admin) getWebhook(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	w, err := a.store.GetWebhook(c.Request().Context(), id)
	if err != nil {
		return fmt.Errorf("get webhook: %w", err)
	}
	return a.webhookJSON(c, http.StatusOK, w, w)
}

// patchWebhook handles PATCH /api/v1/webhooks/{id}, in one transaction of
// the store; If-Match makes it conditional on the version.
func (a *admin) patchWebhook(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	var req patchWebhookRequest
	if err := bindJSON(c, DefaultMaxBodyBytes, &req); err != nil {
		return err
	}
	if req.URL != nil {
		if err := a.checkDestination(c, *req.URL); err != nil {
			return err
		}
	}
	ifVersion, err := ifMatchVersion(c)
	if err != nil {
		return err
	}
	w, err := a.store.PatchWebhook(c.Request().Context(), actor(c), id, vault.WebhookChange{
		URL: req.URL, Events: req.Events, Thresholds: req.Thresholds, Description: req.Description,
		Status: req.Status, IfVersion: ifVersion,
	})
	if err != nil {
		return fmt.Errorf("patch webhook: %w", err)
	}
	return a.webhookJSON(c, http.StatusOK, w, w)
}

// deleteWebhook handles DELETE /api/v1/webhooks/{id}: 204.
func (a *admin) deleteWebhook(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	if err := a.store.DeleteWebhook(c.Request().Context(), actor(c), id); err != nil {
		return fmt.Errorf("delete webhook: %w", err)
	}
	return c.NoContent(http.StatusNoContent)
}

// rotateWebhookSecret handles POST /api/v1/webhooks/{id}/rotate-secret: the
// new secret, shown this once; the old one signs beside it for 24 hours.
func (a *admin) rotateWebhookSecret(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	w, secret, err := a.store.RotateWebhookSecret(c.Request().Context(), actor(c), id)
	if err != nil {
		return fmt.Errorf("rotate webhook secret: %w", err)
	}
	return a.webhookJSON(c, http.StatusOK, w, webhookCreatedView{Webhook: w, Secret: secret})
}

// testWebhook handles POST /api/v1/webhooks/{id}/test: 202 with the
// delivery of a webhook.test event.
func (a *admin) testWebhook(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	d, err := a.store.TestWebhook(c.Request().Context(), actor(c), id)
	if err != nil {
		return fmt.Errorf("test webhook: %w", err)
	}
	return c.JSON(http.StatusAccepted, d)
}

// listDeliveries handles GET /api/v1/webhooks/{id}/deliveries: newest first.
func (a *admin) listDeliveries(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	limit, cursor, err := pageQuery(c)
	if err != nil {
		return err
	}
	ds, next, err := a.store.ListDeliveries(c.Request().Context(), id, limit, cursor)
	if err != nil {
		return cursorError(fmt.Errorf("list deliveries: %w", err))
	}
	if ds == nil {
		ds = []vault.Delivery{}
	}
	return c.JSON(http.StatusOK, deliveryListView{Deliveries: ds, page: page{NextCursor: next}})
}

// retryDelivery handles POST /api/v1/webhooks/{id}/deliveries/{delivery_id}/retry:
// 202, the delivery pending again for one attempt.
func (a *admin) retryDelivery(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	did, err := pathParam(c, "delivery_id")
	if err != nil {
		return err
	}
	d, err := a.store.RetryDelivery(c.Request().Context(), actor(c), id, did)
	if err != nil {
		return fmt.Errorf("retry delivery: %w", err)
	}
	return c.JSON(http.StatusAccepted, d)
}
