package proxy

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// Step 1 of the pipeline (see prepare): the vault key, from Authorization:
// Bearer or the user name of HTTP Basic.

func (p *Proxy) authenticate(ctx context.Context, r *http.Request, c *call) error {
	token, err := vaultToken(r.Header)
	if err != nil {
		if kind := StripeKeyKind(r.Header); kind != "" {
			p.log.LogAttrs(ctx, slog.LevelWarn, "a Stripe secret key was sent to the proxy instead of a vault key",
				slog.String(logfield.RequestID, c.requestID), slog.String(logfield.StripeKeyKind, kind),
				slog.String(logfield.RemoteAddr, r.RemoteAddr))
		}
		return err
	}
	key, err := p.store.Authenticate(ctx, token)
	switch {
	case errors.Is(err, vault.ErrKeyRevoked):
		return refuse(CodeVaultKeyRevoked, "This vault key has been revoked.")
	case errors.Is(err, vault.ErrKeyInvalid), errors.Is(err, vault.ErrNotFound):
		return refuse(CodeVaultKeyInvalid, "Invalid vault key provided.")
	case err != nil:
		return internalError(fmt.Errorf("authenticate: %w", err))
	}
	c.key = key
	now := p.now()
	if key.StatusAt(now) == vault.KeyExpired {
		return refuse(CodeVaultKeyExpired, "This vault key expired at %s.", key.Policy.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if now.Before(key.Policy.PeriodStart) {
		return refuse(CodeVaultKeyNotYetValid, "This vault key is valid from %s.", key.Policy.PeriodStart.UTC().Format(time.RFC3339))
	}
	return nil
}

// vaultToken reads the vault key as VaultToken does, refusing with
// vault_key_invalid when there is none.
func vaultToken(h http.Header) (string, error) {
	token, err := VaultToken(h)
	switch {
	case errors.Is(err, ErrStripeSecretKey):
		return "", refuse(CodeVaultKeyInvalid, "%s", StripeSecretKeyAdvice)
	case err != nil:
		return "", refuse(CodeVaultKeyInvalid, "Invalid vault key: %s. Use it as the API key of your Stripe client.", err)
	}
	return token, nil
}

// VaultToken reads the vault key from "Authorization: Bearer <token>" or from the
// user name of HTTP Basic (the password is ignored), as Stripe SDKs and curl -u
// send it. The error says what is wrong; it never repeats the header. A Stripe
// secret or restricted key is refused with ErrStripeSecretKey.
func VaultToken(h http.Header) (string, error) {
	token, err := readCredential(h)
	if err != nil {
		return "", err
	}
	if isStripeSecretKey(token) {
		return "", ErrStripeSecretKey
	}
	return token, nil
}

// readCredential reads the bearer token or the Basic user name.
func readCredential(h http.Header) (string, error) {
	vals := h.Values("Authorization")
	switch {
	case len(vals) == 0 || strings.TrimSpace(vals[0]) == "":
		return "", errors.New("missing Authorization header (send the vault key as Authorization: Bearer vk_...)")
	case len(vals) > 1:
		return "", errors.New("more than one Authorization header")
	}
	scheme, cred, _ := strings.Cut(strings.TrimSpace(vals[0]), " ")
	cred = strings.TrimSpace(cred)
	switch strings.ToLower(scheme) {
	case "bearer":
		if cred != "" {
			return cred, nil
		}
	case "basic":
		if raw, err := base64.StdEncoding.DecodeString(cred); err == nil {
			if user, _, _ := strings.Cut(string(raw), ":"); user != "" {
				return user, nil
			}
		}
	}
	return "", errors.New("invalid Authorization header: use Bearer with the vault key, or Basic with the vault key as the user name")
}
