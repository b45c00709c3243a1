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

// errKeyChanged says that a key this replica remembered changed since (see
// prepare): the request is decided again with the key as it is now.
var errKeyChanged = errors.New("the vault key changed since this replica authenticated it")

// authenticate is step 1: the request's vault key, active and valid at the
// store's clock (never the process's: a replica whose clock is off decides no
// key differently), or a 401 (403 for a key not valid yet).
//
// On a store shared by replicas the key may come from what this replica
// remembers of the token (vault.KeyRememberer), without a round trip:
// c.remembered is then set until the Reserve that checks it in its
// transaction, or confirmKey, has read the key as it is now. A remembered key
// is never refused: a refusal rests on the key read again.
func (p *Proxy) authenticate(ctx context.Context, r *http.Request, c *call) error {
	return p.authenticateKey(ctx, r, c, true)
}

// confirmKey reads c's key again where it came from this replica's memory and
// no Reserve has checked it: before the request reaches Stripe (send), is
// refused, or goes on without a Reserve (decide). Its answer, kept in
// c.keyCheck, is the refusal of the key as it is now, or errKeyChanged when
// the key or its upstream is at another version than the remembered one.
func (p *Proxy) confirmKey(ctx context.Context, c *call) error {
	r := c.remembered
	if r == nil {
		return c.keyCheck
	}
	was := c.key
	err := p.authenticateKey(ctx, r, c, false)
	if err == nil && (c.key.Version != was.Version || c.key.UpstreamVersion != was.UpstreamVersion) {
		err = errKeyChanged
	}
	c.keyCheck = err
	return err
}

// authenticateKey is authenticate, from the replica's memory when remember is
// set and the store remembers keys.
func (p *Proxy) authenticateKey(ctx context.Context, r *http.Request, c *call, remember bool) error {
	now := p.store.Now()
	key, remembered, kr, err := authenticateVaultKey(ctx, p.store, r.Header, now, remember)
	if remembered && (err != nil || kr != nil || now.Before(key.Policy.PeriodStart)) {
		key, remembered, kr, err = authenticateVaultKey(ctx, p.store, r.Header, now, false)
	}
	c.key = key // the log line names even a revoked or expired key
	c.remembered = nil
	if remembered {
		c.remembered = r
	}
	if kr != nil {
		p.noteKeyRefusal(ctx, r, c, kr)
	}
	switch {
	case err != nil:
		return internalError(err)
	case kr == nil:
	case errors.Is(kr.Cause, ErrStripeSecretKey):
		p.log.LogAttrs(ctx, slog.LevelWarn, "a Stripe secret key was sent to the proxy instead of a vault key",
			slog.String(logfield.RequestID, c.requestID), slog.String(logfield.StripeKeyKind, StripeKeyKind(r.Header)),
			slog.String(logfield.RemoteAddr, r.RemoteAddr))
		return refuse(CodeVaultKeyInvalid, "%s", StripeSecretKeyAdvice)
	case kr.Code == CodeVaultKeyRevoked:
		return refuse(CodeVaultKeyRevoked, "This vault key has been revoked.")
	case kr.Code == CodeVaultKeyExpired:
		return refuse(CodeVaultKeyExpired, "This vault key expired at %s.", kr.ExpiredAt.UTC().Format(time.RFC3339))
	case kr.Cause != nil:
		return refuse(CodeVaultKeyInvalid, "Invalid vault key: %s. Use it as the API key of your Stripe client.", kr.Cause)
	default:
		return refuse(CodeVaultKeyInvalid, "Invalid vault key provided.")
	}
	if now.Before(key.Policy.PeriodStart) {
		return refuse(CodeVaultKeyNotYetValid, "This vault key is valid from %s.", key.Policy.PeriodStart.UTC().Format(time.RFC3339))
	}
	return nil
}

// KeyRefusal is why a request's vault key is refused. Each surface words it
// its own way: the proxy as a Stripe error, the agent and MCP endpoints as a 401.
type KeyRefusal struct {
	// Code is CodeVaultKeyInvalid, CodeVaultKeyRevoked or CodeVaultKeyExpired.
	Code ErrorCode
	// Cause says what is wrong with the credential itself (for
	// CodeVaultKeyInvalid: no or several Authorization headers, another scheme,
	// ErrStripeSecretKey); nil for a token that is no vault key's.
	Cause error
	// ExpiredAt is when an expired key expired.
	ExpiredAt time.Time
}

// AuthenticateVaultKey finds the vault key a request carries (see VaultToken)
// and checks it at now: it returns the key — also one that is not valid yet,
// which only the proxy refuses — or why it is refused, or the store's failure.
// A revoked or expired key is returned with its refusal, so that the refusal
// can name it.
func AuthenticateVaultKey(ctx context.Context, store vault.Store, h http.Header, now time.Time) (vault.Key, *KeyRefusal, error) {
	key, _, kr, err := authenticateVaultKey(ctx, store, h, now, false)
	return key, kr, err
}

// authenticateVaultKey is AuthenticateVaultKey, answered from what the store
// remembers when remember is set and it does (remembered says so).
func authenticateVaultKey(ctx context.Context, store vault.Store, h http.Header, now time.Time, remember bool) (key vault.Key, remembered bool, kr *KeyRefusal, err error) {
	token, kr := readVaultToken(h)
	if kr != nil {
		return vault.Key{}, false, kr, nil
	}
	if err := vault.CheckTokenShape(token); err != nil {
		return vault.Key{}, false, &KeyRefusal{Code: CodeVaultKeyInvalid, Cause: err}, nil
	}
	if kr, ok := store.(vault.KeyRememberer); ok && remember {
		key, remembered, err = kr.AuthenticateRemembered(ctx, token)
	} else {
		key, err = store.Authenticate(ctx, token)
	}
	switch {
	case errors.Is(err, vault.ErrKeyRevoked):
		return key, remembered, &KeyRefusal{Code: CodeVaultKeyRevoked}, nil
	case errors.Is(err, vault.ErrKeyInvalid), errors.Is(err, vault.ErrNotFound):
		return vault.Key{}, remembered, &KeyRefusal{Code: CodeVaultKeyInvalid}, nil
	case err != nil:
		return vault.Key{}, remembered, nil, fmt.Errorf("authenticate vault key: %w", err)
	}
	if key.StatusAt(now) == vault.KeyExpired {
		return key, remembered, &KeyRefusal{Code: CodeVaultKeyExpired, ExpiredAt: key.Policy.ExpiresAt}, nil
	}
	return key, remembered, nil, nil
}

// readVaultToken reads the vault key as VaultToken does, or the refusal of a
// credential that is none.
func readVaultToken(h http.Header) (string, *KeyRefusal) {
	token, err := VaultToken(h)
	if err != nil {
		return "", &KeyRefusal{Code: CodeVaultKeyInvalid, Cause: err}
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
		return "", errors.New("the vault key is empty: Authorization: Bearer has nothing after it (is the variable that should hold the key empty?)")
	case "basic":
		if raw, err := base64.StdEncoding.DecodeString(cred); err == nil {
			user, _, _ := strings.Cut(string(raw), ":")
			if user != "" {
				return user, nil
			}
			return "", errors.New("the vault key is empty: the HTTP Basic user name is empty (is the variable that should hold the key empty?)")
		}
	}
	return "", errors.New("invalid Authorization header: use Bearer with the vault key, or Basic with the vault key as the user name")
}
