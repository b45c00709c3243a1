package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// A key's money objects and their exposure (see docs/metering.md): the list, an operator's refresh from Stripe's answer, and an
// operator's release without it.

// exposureView is a money object a key counts.
type exposureView struct {
	ObjectID string `json:"object_id"`
	// Kind is Stripe's name of the object's kind, told by its id: payment_intent,
	// charge, checkout.session, invoice, invoiceitem, or unknown.
	Kind     string `json:"kind"`
	Currency string `json:"currency"`
	// Exposure is the most the object can still move that the key answers for:
	// held on Windows until Stripe's answer shows it moved or cannot.
	Exposure  string               `json:"exposure"`
	Committed string               `json:"committed"`
	Windows   []exposureWindowView `json:"windows"`
	// Closed: an answer proved the object can move no more money.
	Closed        bool      `json:"closed"`
	StripeAccount string    `json:"stripe_account,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// exposureWindowView is the part of an exposure one cap window holds.
type exposureWindowView struct {
	ID       string `json:"id"`
	Exposure string `json:"exposure"`
}

func newExposureView(e vault.ExposedObject) exposureView {
	kind, _, ok := stripeapi.MoneyObjectOf(e.ObjectID)
	if !ok {
		kind = "unknown"
	}
	windows := make([]exposureWindowView, 0, len(e.Windows))
	for _, w := range e.Windows {
		windows = append(windows, exposureWindowView{ID: string(w.WindowID), Exposure: formatAmount(e.Currency, w.Amount)})
	}
	return exposureView{
		ObjectID:      e.ObjectID,
		Kind:          kind,
		Currency:      e.Currency,
		Exposure:      formatAmount(e.Currency, e.Held),
		Committed:     formatAmount(e.Currency, e.Committed),
		Windows:       windows,
		Closed:        e.Closed,
		StripeAccount: e.StripeAccount,
		CreatedAt:     e.CreatedAt.UTC(),
		UpdatedAt:     e.UpdatedAt.UTC(),
	}
}

// exposureListView is the answer of GET /api/v1/keys/{id}/exposures.
type exposureListView struct {
	Exposures []exposureView `json:"exposures"`
	page
}

// keyExposures handles GET /api/v1/keys/{id}/exposures: the key's money objects
// with live exposure, by object id.
func (a *admin) keyExposures(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	limit, cursor, err := pageQuery(c)
	if err != nil {
		return err
	}
	list, next, err := a.store.ListExposures(c.Request().Context(), id, limit, cursor)
	if err != nil {
		return cursorError(fmt.Errorf("key exposures %s: %w", id, err))
	}
	return c.JSON(http.StatusOK, exposureListView{Exposures: viewsOf(list, newExposureView), page: page{NextCursor: next}})
}

// exposureChangeView is the answer of a refresh or a release: what it
// committed and released, and the object before and after.
type exposureChangeView struct {
	Changed   bool         `json:"changed"`
	Committed string       `json:"committed"`
	Released  string       `json:"released"`
	Before    exposureView `json:"before"`
	After     exposureView `json:"after"`
}

func newExposureChangeView(ch vault.ExposureChange) exposureChangeView {
	cur := ch.After.Currency
	return exposureChangeView{
		Changed:   ch.Committed+ch.Released > 0,
		Committed: formatAmount(cur, ch.Committed),
		Released:  formatAmount(cur, ch.Released),
		Before:    newExposureView(ch.Before),
		After:     newExposureView(ch.After),
	}
}

// exposureParams reads the key id and object id of an exposure's path.
func exposureParams(c echo.Context) (keyID, objectID string, err error) {
	if keyID, err = pathParam(c, "id"); err != nil {
		return "", "", err
	}
	objectID, err = pathParam(c, "object_id")
	return keyID, objectID, err
}

// refreshExposure handles POST /api/v1/keys/{id}/exposures/{object_id}/refresh:
// keybrake asks Stripe about the object with the key's upstream secret and
// applies the answer as a read through the proxy would.
func (a *admin) refreshExposure(c echo.Context) error {
	keyID, objectID, err := exposureParams(c)
	if err != nil {
		return err
	}
	if a.stripe == nil {
		return newProblem(http.StatusServiceUnavailable, "this admin API has no Stripe upstream to ask")
	}
	ch, err := a.stripe.RefreshExposure(c.Request().Context(), actor(c), keyID, objectID)
	if err != nil {
		return fmt.Errorf("refresh exposure %s of %s: %w", objectID, keyID, err)
	}
	return c.JSON(http.StatusOK, newExposureChangeView(ch))
}

// releaseExposure handles POST /api/v1/keys/{id}/exposures/{object_id}/release:
// an operator who checked Stripe frees the exposure without Stripe's word.
func (a *admin) releaseExposure(c echo.Context) error {
	keyID, objectID, err := exposureParams(c)
	if err != nil {
		return err
	}
	ch, err := a.store.ReleaseExposure(c.Request().Context(), actor(c), keyID, objectID)
	if err != nil {
		return fmt.Errorf("release exposure %s of %s: %w", objectID, keyID, err)
	}
	return c.JSON(http.StatusOK, newExposureChangeView(ch))
}
