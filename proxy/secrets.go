package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// Step 4 of the pipeline (see prepare): the upstream's real secret, unsealed
// from the store and cached for a few seconds; and Stripe's refusal of it,
// whether to a lookup or to the forwarded request.

// upstreamSecret returns the real secret of key's upstream. It is cached for
// a few seconds under the upstream's version as Authenticate read it, after
// the key: a secret replaced through another replica has
// a new version, so the first request authenticated after the change commits
// misses the cache and reads the new secret. A key read without a version
// (an operator's refresh: GetKey) always asks the store.
func (p *Proxy) upstreamSecret(ctx context.Context, key vault.Key) (string, error) {
	sc := &p.secrets
	name, version := key.Upstream, key.UpstreamVersion
	now := p.now()
	if sc.ttl > 0 && version != 0 {
		sc.mu.Lock()
		e, ok := sc.entries[name]
		sc.mu.Unlock()
		if ok && e.version == version && now.Sub(e.fetched) < sc.ttl && !now.Before(e.fetched) {
			return e.secret, nil
		}
	}
	// Read after the key, so the secret is at least as new as version.
	secret, err := p.store.UpstreamSecret(ctx, name)
	if err != nil {
		return "", err
	}
	if sc.ttl > 0 && version != 0 {
		sc.mu.Lock()
		sc.entries[name] = cachedSecret{secret: secret, version: version, fetched: now}
		sc.mu.Unlock()
	}
	return secret, nil
}

// forget drops the cached secret of upstream name.
func (sc *secretCache) forget(name string) {
	sc.mu.Lock()
	delete(sc.entries, name)
	sc.mu.Unlock()
}

// isCredentialRefusal reports whether Stripe's status judges keybrake's own
// credential rather than the request: 401 (the secret is wrong or was rolled)
// or 403 (a restricted key without the permission, or no access to the
// connected account). Either way Stripe executed nothing and, as it does for
// authentication failures, saves nothing under the idempotency key.
func isCredentialRefusal(status int) bool {
	return status == http.StatusUnauthorized || status == http.StatusForbidden
}

// upstreamAuthError is Stripe's 401 or 403 to keybrake's own credential.
type upstreamAuthError struct{ status int }

// Error implements error. It never holds Stripe's body, which may echo the key.
func (e *upstreamAuthError) Error() string {
	return fmt.Sprintf("Stripe answered %d to the upstream secret", e.status)
}

// refusal is the caller's answer: 502 api_error, never 401, so that neither the
// caller nor its SDK takes it for a wrong vault key, and none of Stripe's body.
// pending says that an earlier attempt with the same idempotency key has an
// unknown outcome that this one did not settle.
func (e *upstreamAuthError) refusal(pending bool) *refusal {
	code, what := CodeUpstreamAuthFailed, "Stripe rejected the secret keybrake holds for this vault key's upstream (your vault key is fine)"
	if e.status == http.StatusForbidden {
		code, what = CodeUpstreamPermission, "Stripe did not permit this request with the secret keybrake holds for this vault key's upstream (your vault key is fine)"
	}
	next := "Nothing was executed. An operator must fix the upstream secret; then retry."
	if pending {
		next = "This attempt executed nothing, but the outcome of the first request with this idempotency key is still unknown. An operator must fix the upstream secret; then retry with the same idempotency key."
	}
	rf := refuse(code, "%s. %s", what, next)
	rf.cause = e
	return rf
}

// upstreamAuthFailed records Stripe's refusal of the upstream secret: counted
// for /metrics, logged at Error for the operator (never the secret, only its
// last four characters), and the cached secret dropped so that a fixed one is
// used at once.
func (p *Proxy) upstreamAuthFailed(c *call, kind string, status int, stripeRequestID string) *upstreamAuthError {
	p.metrics.observeUpstreamAuthFailure()
	p.secrets.forget(c.key.Upstream)
	last4 := c.secret[max(0, len(c.secret)-4):]
	p.log.LogAttrs(context.Background(), slog.LevelError,
		"Stripe rejected keybrake's upstream secret: register the right one (POST /api/v1/upstreams)",
		slog.String(logfield.Upstream, c.key.Upstream), slog.String(logfield.SecretLast4, last4), slog.String(logfield.Kind, kind),
		slog.Int(logfield.UpstreamStatus, status), slog.String(logfield.StripeRequestID, stripeRequestID),
		slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.String(logfield.Operation, c.cls.Operation))
	// Operators hear of it through webhooks too (upstream.auth_failed, at
	// most once an hour per upstream).
	if err := p.store.NoticeUpstreamAuthFailed(context.Background(), c.key.Upstream, status, c.key.ID, c.cls.Operation); err != nil {
		p.log.Warn("record the upstream auth failure for webhooks", slog.String(logfield.Error, err.Error()))
	}
	return &upstreamAuthError{status: status}
}

// secretCache keeps unsealed upstream secrets for a short time so that the hot
// path does not unseal on every request. An entry serves only requests whose
// key was authenticated with the same upstream version, so a rotated secret is
// picked up from the next request on, on every replica; ttl only bounds how
// long an unsealed secret stays in memory.
type secretCache struct {
	ttl     time.Duration
	mu      sync.Mutex
	entries map[string]cachedSecret
}

type cachedSecret struct {
	secret  string
	version uint64 // the upstream's version the key was authenticated with
	fetched time.Time
}
