package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/vault"
)

const maxNameLen = 200

func validName(name string) bool {
	if name == "" || len(name) > maxNameLen {
		return false
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

func last4(secret string) string {
	if len(secret) <= 4 {
		return secret
	}
	return secret[len(secret)-4:]
}

// putUpstreamTx registers or replaces an upstream; created says no upstream
// of that name existed. The read locks an existing upstream's row
// (PostgreSQL), and a new one is inserted rather than put, so two
// transactions that both found the name free cannot both commit: the second
// runs again, finds the first's upstream and replaces it.
func (s *Engine) putUpstreamTx(tx Tx, now time.Time, actor, name, vendor, secret string) (vault.Upstream, bool, error) {
	if !validName(name) {
		return vault.Upstream{}, false, fmt.Errorf("upstream name %q: %w", name, vault.ErrInvalid)
	}
	if vendor != policy.VendorStripe {
		return vault.Upstream{}, false, fmt.Errorf("upstream vendor %q (only %q): %w", vendor, policy.VendorStripe, vault.ErrInvalid)
	}
	if strings.TrimSpace(secret) == "" {
		return vault.Upstream{}, false, fmt.Errorf("upstream %q: empty secret: %w", name, vault.ErrInvalid)
	}
	sealed, err := s.seal.seal([]byte(secret), upstreamAD(name))
	if err != nil {
		return vault.Upstream{}, false, err
	}
	var old upstreamRec
	existed, err := getJSON(tx, BucketUpstreams, []byte(name), &old)
	if err != nil {
		return vault.Upstream{}, false, err
	}
	rec := upstreamRec{Name: name, Vendor: vendor, SealedSecret: sealed, SecretLast4: last4(secret), CreatedAt: now, UpdatedAt: now}
	var before any
	write := insertJSON
	if existed {
		// A new API secret keeps the webhook secrets: Stripe still signs
		// with them.
		rec.CreatedAt, rec.WebhookSecrets, rec.WebhookLast4 = old.CreatedAt, old.WebhookSecrets, old.WebhookLast4
		before = old.view()
		write = putJSON
	}
	rec.Version = nextUpstreamVersion(&old, existed, now)
	if err := write(tx, BucketUpstreams, []byte(name), &rec); err != nil {
		return vault.Upstream{}, false, err
	}
	if err := putAudit(tx, now, actor, "upstream.put", name, before, rec.view()); err != nil {
		return vault.Upstream{}, false, err
	}
	return rec.public(), !existed, nil
}

// nextUpstreamVersion is the version of an upstream's next write: one up from
// the one it replaces, so a replica that cached the secret under the old
// version sees the change on its next request. A new upstream starts from the
// store's clock in nanoseconds, not from 1: a name deleted and registered again
// must not reuse a version a replica may still have cached the deleted
// upstream's secret under.
func nextUpstreamVersion(old *upstreamRec, existed bool, now time.Time) uint64 {
	if !existed {
		return uint64(max(now.UnixNano(), 1))
	}
	return old.version() + 1
}

func getUpstream(tx Tx, name string) (*upstreamRec, error) {
	var rec upstreamRec
	ok, err := getJSON(tx, BucketUpstreams, []byte(name), &rec)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("upstream %q: %w", name, vault.ErrNotFound)
	}
	return &rec, nil
}

func listUpstreamsTx(tx Tx) ([]vault.Upstream, error) {
	out := []vault.Upstream{}
	err := forEach(tx, BucketUpstreams, func(k, v []byte) error {
		var rec upstreamRec
		if err := decodeJSON(k, v, &rec); err != nil {
			return err
		}
		out = append(out, rec.public())
		return nil
	})
	return out, err
}

// deleteUpstreamTx refuses while any key that is not revoked names the upstream:
// an expired key can be given a new expiry by UpdateKey and would then need it.
func deleteUpstreamTx(tx Tx, now time.Time, actor, name string) error {
	rec, err := getUpstream(tx, name)
	if err != nil {
		return err
	}
	var user string
	err = forEach(tx, BucketKeys, func(k, v []byte) error {
		if user != "" {
			return nil
		}
		var kr keyRec
		if err := decodeJSON(k, v, &kr); err != nil {
			return err
		}
		if kr.Upstream == name && kr.Status != vault.KeyRevoked {
			user = kr.ID
		}
		return nil
	})
	if err != nil {
		return err
	}
	if user != "" {
		return fmt.Errorf("upstream %q is used by key %s: %w", name, user, vault.ErrConflict)
	}
	if err := tx.Delete(BucketUpstreams, []byte(name)); err != nil {
		return fmt.Errorf("delete upstream %q: %w", name, err)
	}
	return putAudit(tx, now, actor, "upstream.delete", name, rec.view(), nil)
}

// view is the upstream as its audit entries show it: no secret.
func (r *upstreamRec) view() upstreamView {
	return upstreamView{Name: r.Name, Vendor: r.Vendor, SecretLast4: r.SecretLast4, WebhookLast4: r.WebhookLast4}
}

// setWebhookSecretsTx replaces the upstream's webhook secrets, sealed.
func (s *Engine) setWebhookSecretsTx(tx Tx, now time.Time, actor, name string, secrets []string) (vault.Upstream, error) {
	if len(secrets) > vault.MaxWebhookSecrets {
		return vault.Upstream{}, fmt.Errorf("upstream %q: %d webhook secrets (at most %d): %w", name, len(secrets), vault.MaxWebhookSecrets, vault.ErrInvalid)
	}
	rec, err := getUpstream(tx, name)
	if err != nil {
		return vault.Upstream{}, err
	}
	before := rec.view()
	rec.WebhookSecrets, rec.WebhookLast4 = nil, nil
	for _, secret := range secrets {
		if strings.TrimSpace(secret) == "" {
			return vault.Upstream{}, fmt.Errorf("upstream %q: an empty webhook secret: %w", name, vault.ErrInvalid)
		}
		sealed, err := s.seal.seal([]byte(secret), webhookSecretAD(name))
		if err != nil {
			return vault.Upstream{}, err
		}
		rec.WebhookSecrets = append(rec.WebhookSecrets, sealed)
		rec.WebhookLast4 = append(rec.WebhookLast4, last4(secret))
	}
	rec.Version = nextUpstreamVersion(rec, true, now)
	rec.UpdatedAt = now
	if err := putJSON(tx, BucketUpstreams, []byte(name), rec); err != nil {
		return vault.Upstream{}, err
	}
	if err := putAudit(tx, now, actor, "upstream.webhook_secrets", name, before, rec.view()); err != nil {
		return vault.Upstream{}, err
	}
	return rec.public(), nil
}

// SetUpstreamWebhookSecrets replaces the secrets Stripe signs the upstream's
// events with (vault.Store).
func (s *Engine) SetUpstreamWebhookSecrets(ctx context.Context, actor, name string, secrets []string) (vault.Upstream, error) {
	var up vault.Upstream
	err := s.update(ctx, func(tx Tx, now time.Time) error {
		var err error
		up, err = s.setWebhookSecretsTx(tx, now, actor, name, secrets)
		return err
	})
	if err != nil {
		return vault.Upstream{}, fmt.Errorf("set webhook secrets: %w", err)
	}
	return up, nil
}

// UpstreamWebhookSecrets unseals the upstream's webhook secrets (vault.Store).
func (s *Engine) UpstreamWebhookSecrets(ctx context.Context, name string) ([]string, error) {
	var out []string
	err := s.view(ctx, func(tx Tx, now time.Time) error {
		out = nil // a re-run starts over
		rec, err := getUpstream(tx, name)
		if err != nil {
			return err
		}
		for _, sealed := range rec.WebhookSecrets {
			pt, err := s.seal.open(sealed, webhookSecretAD(name))
			if err != nil {
				return err
			}
			out = append(out, string(pt))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("upstream webhook secrets: %w", err)
	}
	return out, nil
}
