package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// An operator's refresh of a money object: keybrake asks Stripe about it, as an
// amount lookup does, and applies the answer as a read through the proxy would
// (see observe). It frees the exposure of an object nobody will touch through
// keybrake again — cancelled in the Stripe Dashboard, abandoned, expired.

// refreshOperation names a refresh where a lookup names the request's
// operation (the log).
const refreshOperation = "exposure.refresh"

// RefreshFailure says why a refresh could not use Stripe's answer.
type RefreshFailure int

// Refresh failures.
const (
	// RefreshUnavailable: Stripe could not be reached, or answered 429 or 5xx.
	RefreshUnavailable RefreshFailure = iota + 1
	// RefreshTimeout: Stripe did not answer in time.
	RefreshTimeout
	// RefreshAuthFailed: Stripe rejected the upstream secret (401).
	RefreshAuthFailed
	// RefreshPermissionDenied: Stripe refused the upstream secret the read
	// (403: a restricted key, or no access to the connected account).
	RefreshPermissionDenied
	// RefreshNotFound: Stripe answered 404. The object may be gone — or the
	// secret or the account is not the one it lives under: keybrake cannot
	// tell, so its exposure is kept.
	RefreshNotFound
	// RefreshUnreadable: Stripe's answer is not the object keybrake counts
	// (another status, another kind or currency), or the id is of no kind
	// keybrake can look up.
	RefreshUnreadable
)

// RefreshError is why RefreshExposure could not apply Stripe's word about a
// money object. Nothing changed; Message says what happened and what to do,
// for the operator (never Stripe's body).
type RefreshError struct {
	Failure RefreshFailure
	Message string
	cause   error
}

// Error implements error.
func (e *RefreshError) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("%s: %v", e.Message, e.cause)
	}
	return e.Message
}

// Unwrap returns the cause.
func (e *RefreshError) Unwrap() error { return e.cause }

// RefreshExposure looks the money object objectID up at Stripe — with the
// secret of keyID's upstream and the Stripe-Account and Stripe-Context that
// Stripe last answered for it under — and applies the answer to the key's
// exposure on it exactly as a read through the proxy would, with the audit
// entry under actor (vault.Store.RefreshExposure): what moved is committed,
// an answer proving the object can move no more money releases the rest, a
// live object changes nothing. Errors: vault.ErrNotFound (no such key, or the
// key never counted the object), vault.ErrConflict (the key's upstream is not
// registered), *RefreshError (Stripe's answer could not be had or used:
// nothing changed), and the store's.
func (p *Proxy) RefreshExposure(ctx context.Context, actor, keyID, objectID string) (vault.ExposureChange, error) {
	key, err := p.store.GetKey(ctx, keyID)
	if err != nil {
		return vault.ExposureChange{}, fmt.Errorf("refresh exposure: %w", err)
	}
	exp, ok, err := p.store.ObjectExposure(ctx, keyID, objectID)
	if err != nil {
		return vault.ExposureChange{}, fmt.Errorf("refresh exposure: %w", err)
	}
	if !ok {
		return vault.ExposureChange{}, fmt.Errorf("refresh exposure: key %s has counted no money object %q: %w", keyID, objectID, vault.ErrNotFound)
	}
	read, err := p.lookUpMoneyObject(ctx, key, objectID, exp)
	if err != nil {
		return vault.ExposureChange{}, err
	}
	return p.store.RefreshExposure(ctx, actor, keyID, objectID, read.observation(""))
}

// moneyObjectRead is Stripe's answer about a money object, as a refresh reads
// it.
type moneyObjectRead struct {
	kind   string // "payment_intent", "checkout.session", …
	object stripeapi.Object
	money  stripeapi.MoneyObject
	c      *call // the lookup's call: the key, secret, account and context
}

// observation is what the answer shows, for the ledger under operation.
func (m moneyObjectRead) observation(operation string) vault.Observation {
	return vault.Observation{Operation: operation, Moved: m.money.Moved, MovedKnown: m.money.MovedKnown, Terminal: m.money.Terminal}
}

// lookUpMoneyObject looks the money object objectID up at Stripe with the
// secret of key's upstream and the Stripe-Account and Stripe-Context of its
// exposure exp, and reads the answer: the one code path of an operator's
// refresh and of the background refresher (stale.go). Errors as
// RefreshExposure's; nothing is written.
func (p *Proxy) lookUpMoneyObject(ctx context.Context, key vault.Key, objectID string, exp vault.Exposure) (moneyObjectRead, error) {
	kind, path, known := stripeapi.MoneyObjectOf(objectID)
	if !known {
		return moneyObjectRead{}, &RefreshError{Failure: RefreshUnreadable,
			Message: fmt.Sprintf("keybrake cannot tell what kind of Stripe object %s is, so it cannot look it up; nothing changed", objectID)}
	}
	c, err := p.objectCall(ctx, key, exp)
	if err != nil {
		return moneyObjectRead{}, err
	}
	body, err := p.fetch(ctx, c, path, nil)
	if err != nil {
		return moneyObjectRead{}, p.refreshFailed(ctx, c, objectID, err)
	}
	return p.readMoneyAnswer(ctx, c, kind, objectID, body)
}

// objectCall is the call of a request keybrake makes by itself about a money
// object of key's: its upstream's secret, the exposure's account and context.
func (p *Proxy) objectCall(ctx context.Context, key vault.Key, exp vault.Exposure) (*call, error) {
	secret, err := p.upstreamSecret(ctx, key)
	if errors.Is(err, vault.ErrNotFound) {
		return nil, fmt.Errorf("refresh exposure: the key's upstream %q is not registered: %w", key.Upstream, vault.ErrConflict)
	}
	if err != nil {
		return nil, fmt.Errorf("refresh exposure: %w", err)
	}
	return &call{requestID: newRequestID(), key: key, decided: decided{secret: secret}, account: exp.StripeAccount, stripeContext: exp.StripeContext,
		cls: stripeapi.Classification{Operation: refreshOperation}}, nil
}

// readMoneyAnswer reads Stripe's answer body about objectID, which must be a
// kind in the key's currency.
func (p *Proxy) readMoneyAnswer(ctx context.Context, c *call, kind, objectID string, body []byte) (moneyObjectRead, error) {
	o := stripeapi.DecodeObject(body)
	m, read := stripeapi.ReadMoneyObject(o, c.key.Policy.EffectiveCurrency())
	if !read || m.ID != objectID || o.Get("object") != kind {
		return moneyObjectRead{}, p.refreshFailed(ctx, c, objectID, &RefreshError{Failure: RefreshUnreadable,
			Message: fmt.Sprintf("Stripe's answer about %s is not a %s in %s that keybrake can read; nothing changed",
				objectID, kind, c.key.Policy.EffectiveCurrency())})
	}
	return moneyObjectRead{kind: kind, object: o, money: m, c: c}, nil
}

// refreshFailed turns a failed lookup into the RefreshError the operator gets,
// and logs it at Warn (a refused secret is logged at Error by fetch already).
func (p *Proxy) refreshFailed(ctx context.Context, c *call, objectID string, err error) error {
	re := &RefreshError{Failure: RefreshUnreadable, cause: err}
	account := ""
	if c.account != "" {
		account = " and the connected account " + c.account
	}
	var (
		rf     *refusal
		status *lookupStatusError
	)
	switch {
	case errors.As(err, &re):
	case errors.As(err, &rf) && rf.Code == CodeUpstreamAuthFailed:
		re.Failure = RefreshAuthFailed
		re.Message = fmt.Sprintf("Stripe rejected the secret keybrake holds for upstream %q; nothing changed. Register the right secret, then refresh again", c.key.Upstream)
	case errors.As(err, &rf) && rf.Code == CodeUpstreamPermission:
		re.Failure = RefreshPermissionDenied
		re.Message = fmt.Sprintf("Stripe did not permit reading %s with the secret of upstream %q%s; nothing changed", objectID, c.key.Upstream, account)
	case errors.As(err, &rf) && rf.Status == http.StatusGatewayTimeout:
		re.Failure = RefreshTimeout
		re.Message = fmt.Sprintf("Stripe did not answer in time about %s; nothing changed. Try again", objectID)
	case errors.As(err, &rf):
		re.Failure = RefreshUnavailable
		re.Message = fmt.Sprintf("keybrake could not get Stripe's answer about %s (Stripe unreachable, busy or failing); nothing changed. Try again", objectID)
	case errors.As(err, &status) && status.status == http.StatusNotFound:
		re.Failure = RefreshNotFound
		re.Message = fmt.Sprintf("Stripe answered that there is no %s with the secret of upstream %q%s. keybrake keeps its exposure: "+
			"a wrong secret or account gets the same answer as an object that is gone. Check it in the Stripe Dashboard; "+
			"if it can no longer move money, release its exposure (POST /api/v1/keys/%s/exposures/%s/release)",
			objectID, c.key.Upstream, account, c.key.ID, objectID)
	case errors.As(err, &status):
		re.Message = fmt.Sprintf("Stripe answered %d about %s; nothing changed", status.status, objectID)
	default:
		re.Message = fmt.Sprintf("keybrake could not read Stripe's answer about %s; nothing changed", objectID)
	}
	p.log.LogAttrs(ctx, slog.LevelWarn, "refreshing a money object at Stripe failed; its exposure stays counted",
		slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID),
		slog.String(logfield.ObjectID, objectID), slog.Any(logfield.Error, err))
	return re
}
