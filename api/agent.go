package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
)

// The agent endpoints live on the proxy listener under /keybrake/v1 and are
// authenticated with the vault key itself, exactly like the proxy: "Authorization:
// Bearer vk_…" or HTTP Basic with the token as the user name. Every error is
// application/problem+json (RFC 9457); the claims API gives the IETF
// Idempotency-Key draft's meanings to 400 (no key), 409 (in progress, or not the
// owner) and 422 (the key was claimed with another fingerprint).

// AgentPathPrefix is the path prefix of the agent endpoints.
const AgentPathPrefix = "/keybrake/"

// Claim leases: lease_seconds defaults to DefaultClaimLease and may be at most
// MaxClaimLease.
const (
	DefaultClaimLease = 60 * time.Second
	MaxClaimLease     = time.Hour
)

// Problem types of the claims API, besides the general ones of problem.go.
const (
	// ProblemClaimInProgress: the key is claimed by someone else under a live lease
	// (409, with Retry-After).
	ProblemClaimInProgress = "urn:keybrake:problem:claim-in-progress"
	// ProblemClaimFingerprintMismatch: the key was claimed with another fingerprint
	// (422).
	ProblemClaimFingerprintMismatch = "urn:keybrake:problem:claim-fingerprint-mismatch"
	// ProblemClaimNotOwner: a complete or release with a fencing token that is not
	// the current owner's, or of a claim that is already completed (409).
	ProblemClaimNotOwner = "urn:keybrake:problem:claim-not-owner"
)

// Claim statuses of the claims API's answers.
const (
	claimStatusClaimed    = "claimed"
	claimStatusInProgress = "in_progress"
	claimStatusCompleted  = "completed"
	claimStatusReleased   = "released"
)

// ctxKeyVaultKey is the echo context key of the authenticated vault.Key.
const ctxKeyVaultKey = "keybrake.vault_key"

// agent serves the agent endpoints.
type agent struct {
	store   vault.Store
	log     *slog.Logger
	now     func() time.Time
	maxBody int64
}

// agentRoute is one agent endpoint. The OpenAPI document's operations tagged
// "agent" describe exactly these (a test holds the two together).
type agentRoute struct {
	method  string
	path    string
	handler func(*agent, echo.Context) error
}

// agentRoutes are the agent endpoints.
var agentRoutes = []agentRoute{
	{method: http.MethodGet, path: "/keybrake/v1/me", handler: (*agent).me},
	{method: http.MethodPost, path: "/keybrake/v1/claims", handler: (*agent).claim},
	{method: http.MethodGet, path: "/keybrake/v1/claims/:key", handler: (*agent).getClaim},
	{method: http.MethodPost, path: "/keybrake/v1/claims/:key/complete", handler: (*agent).completeClaim},
	{method: http.MethodPost, path: "/keybrake/v1/claims/:key/release", handler: (*agent).releaseClaim},
}

// newAgent returns the agent endpoints of cfg.
func newAgent(cfg ProxyConfig, logger *slog.Logger) *agent {
	// Every decision about the key (expiry, a claim's lease) is made at the
	// store's clock, never the process's.
	now := cfg.Store.Now
	maxBody := cfg.AgentMaxBodyBytes
	if maxBody <= 0 {
		maxBody = DefaultMaxBodyBytes
	}
	return &agent{store: cfg.Store, log: logger.With(logfield.Component, "agent"), now: now, maxBody: maxBody}
}

// register adds the agent routes to e.
func (a *agent) register(e *echo.Echo) {
	for _, r := range agentRoutes {
		h := r.handler
		e.Add(r.method, r.path, func(c echo.Context) error { return h(a, c) },
			accessLog(a.log, "agent request", agentLogAttrs), recoverPanic, securityHeaders, a.authenticate)
	}
}

// isAgentPath reports whether r is addressed to the agent endpoints, whose errors
// are problem+json rather than Stripe-shaped.
func isAgentPath(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, AgentPathPrefix) }

// agentLogAttrs adds the key id to an agent log line; the path is never logged
// (it holds claim keys).
func agentLogAttrs(c echo.Context) []slog.Attr {
	if k, ok := c.Get(ctxKeyVaultKey).(vault.Key); ok {
		return []slog.Attr{slog.String(logfield.KeyID, k.ID)}
	}
	return nil
}

// errorHandler writes every error of an agent endpoint (and the router's 404 and
// 405 under AgentPathPrefix) as problem+json. A vault key that went bad between
// authentication and the store's transaction is a 401 like any other.
func (a *agent) errorHandler(err error, c echo.Context) {
	var p *Problem
	internal := false
	switch {
	case errors.Is(err, vault.ErrKeyRevoked):
		p = unauthorized("this vault key has been revoked")
	case errors.Is(err, vault.ErrKeyExpired):
		p = unauthorized("this vault key has expired")
	case errors.Is(err, vault.ErrKeyInvalid):
		p = unauthorized("invalid vault key")
	default:
		p, internal = problemFor(err)
	}
	answerProblem(c, a.log, err, p, internal, `Bearer realm="keybrake"`)
}

// authenticate admits a request only with an active vault key: none, unknown,
// revoked or expired is 401. The key is left in the echo context.
func (a *agent) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		key, refused, err := authenticateVaultKey(r.Context(), a.store, a.log, r.Header, r.RemoteAddr, a.now())
		switch {
		case err != nil:
			return err
		case refused != "":
			c.Set(ctxKeyAuthFailure, refused)
			return unauthorized(refused)
		}
		c.Set(ctxKeyVaultKey, key)
		return next(c)
	}
}

// authenticateVaultKey reads the vault key of h as the proxy does and looks it up:
// an active key (not-yet-valid included), or the reason it is refused (no,
// unknown, revoked or expired key), or the store's error.
func authenticateVaultKey(ctx context.Context, store vault.Store, log *slog.Logger, h http.Header, remoteAddr string, now time.Time) (key vault.Key, refused string, err error) {
	key, kr, err := proxy.AuthenticateVaultKey(ctx, store, h, now)
	switch {
	case err != nil:
		return vault.Key{}, "", err
	case kr == nil:
		return key, "", nil
	case errors.Is(kr.Cause, proxy.ErrStripeSecretKey):
		// An agent configured with the real Stripe key is an incident worth seeing.
		if log != nil {
			log.LogAttrs(ctx, slog.LevelWarn, "a Stripe secret key was sent instead of a vault key",
				slog.String(logfield.StripeKeyKind, proxy.StripeKeyKind(h)), slog.String(logfield.RemoteAddr, remoteAddr))
		}
		return vault.Key{}, proxy.StripeSecretKeyAdvice, nil
	case kr.Code == proxy.CodeVaultKeyRevoked:
		return vault.Key{}, "this vault key has been revoked", nil
	case kr.Code == proxy.CodeVaultKeyExpired:
		return vault.Key{}, "this vault key expired at " + kr.ExpiredAt.UTC().Format(time.RFC3339), nil
	case kr.Cause != nil:
		return vault.Key{}, kr.Cause.Error(), nil
	default:
		return vault.Key{}, "invalid vault key", nil
	}
}

// vaultKeyOf returns the authenticated key of the request.
func vaultKeyOf(c echo.Context) vault.Key {
	k, _ := c.Get(ctxKeyVaultKey).(vault.Key)
	return k
}

// ---- GET /keybrake/v1/me ----

// meView is the calling key as it may see itself: never its token, token hash or
// anything about the upstream secret.
type meView struct {
	ID       string            `json:"id"`
	Name     string            `json:"name"`
	Labels   map[string]string `json:"labels"`
	Status   string            `json:"status"`
	Policy   policy.Policy     `json:"policy"`
	Currency string            `json:"currency"`
	Windows  meWindows         `json:"windows"`
	// Budgets is the chain of budgets the key draws on, closest first: each
	// one's windows, what is left of them, and its velocity limits.
	Budgets []meBudget `json:"budgets"`
}

// meBudget is a budget of the key's chain as the key may see it: its scope,
// windows and limits, not its labels nor the other keys under it.
type meBudget struct {
	Scope    policy.Scope      `json:"scope"`
	Currency string            `json:"currency"`
	Daily    *windowView       `json:"daily"`
	Period   *windowView       `json:"period"`
	Velocity []policy.Velocity `json:"velocity"`
}

// meWindows is the admin API's usage view per window, without its currency (which
// meView carries).
type meWindows struct {
	Daily      *windowView    `json:"daily"`
	Period     *windowView    `json:"period"`
	PerRequest perRequestView `json:"per_request"`
}

// me handles GET /keybrake/v1/me: the key's policy and, per window, cap,
// committed, held, remaining and reset_at, read in one transaction.
func (a *agent) me(c echo.Context) error {
	v, err := loadMeView(c.Request().Context(), a.store, vaultKeyOf(c).ID, a.now())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}

// loadMeView reads the key with this id and its usage in one transaction and shows them as
// the key may see itself (GET /keybrake/v1/me, the MCP tool get_budget).
func loadMeView(ctx context.Context, store vault.Store, id string, now time.Time) (meView, error) {
	key, windows, usage, err := store.KeyUsage(ctx, id)
	if err != nil {
		return meView{}, fmt.Errorf("usage of %s: %w", id, err)
	}
	u := newUsageView(key, windows, usage)
	v := meView{
		ID:       key.ID,
		Name:     key.Name,
		Labels:   labelsOf(key),
		Status:   string(key.StatusAt(now)),
		Policy:   key.Policy,
		Currency: u.Currency,
		Windows:  meWindows{Daily: u.Daily, Period: u.Period, PerRequest: u.PerRequest},
		Budgets:  []meBudget{},
	}
	if key.Policy.Budget == "" {
		return v, nil
	}
	chain, err := store.BudgetChain(ctx, key.Policy.Budget)
	if err != nil {
		return meView{}, fmt.Errorf("budgets of %s: %w", id, err)
	}
	for _, st := range chain {
		bu := newWindowsUsage(st.Budget.Currency, st.Windows, st.Usage)
		vel := st.Budget.Velocity
		if vel == nil {
			vel = []policy.Velocity{}
		}
		v.Budgets = append(v.Budgets, meBudget{Scope: st.Budget.Scope(), Currency: bu.Currency, Daily: bu.Daily, Period: bu.Period, Velocity: vel})
	}
	return v, nil
}

// ---- the claims API ----

// claimView is a claim as the claims API shows it. The fencing token is shown only
// to the caller that just became the owner.
type claimView struct {
	Status         string          `json:"status"`
	Key            string          `json:"key"`
	Fingerprint    *string         `json:"fingerprint,omitempty"`
	LeaseExpiresAt *time.Time      `json:"lease_expires_at,omitempty"`
	FencingToken   *uint64         `json:"fencing_token,omitempty"`
	Result         json.RawMessage `json:"result,omitempty"`
	CreatedAt      *time.Time      `json:"created_at,omitempty"`
	CompletedAt    *time.Time      `json:"completed_at,omitempty"`
}

// newClaimView shows a stored claim (without its fencing token).
func newClaimView(cl vault.Claim) claimView {
	fp, created := cl.Fingerprint, cl.CreatedAt.UTC()
	v := claimView{Status: claimStatusInProgress, Key: cl.Key, Fingerprint: &fp, CreatedAt: &created}
	if cl.State == vault.ClaimCompleted {
		done := cl.CompletedAt.UTC()
		v.Status, v.Result, v.CompletedAt = claimStatusCompleted, json.RawMessage(cl.Result), &done
	} else {
		until := cl.LeaseExpiresAt.UTC()
		v.LeaseExpiresAt = &until
	}
	return v
}

// claimRequest is the body of POST /keybrake/v1/claims.
type claimRequest struct {
	Key          *string `json:"key"`
	Fingerprint  *string `json:"fingerprint"`
	LeaseSeconds *int64  `json:"lease_seconds"`
}

// claim handles POST /keybrake/v1/claims.
func (a *agent) claim(c echo.Context) error {
	var req claimRequest
	if err := bindJSON(c, a.maxBody, &req); err != nil {
		return err
	}
	if req.Key == nil || *req.Key == "" {
		return newProblem(http.StatusBadRequest, "key is required: the claim key names the unit of work")
	}
	if !vault.ValidClaimKey(*req.Key) {
		return newProblem(http.StatusBadRequest, claimKeyRule)
	}
	var errs []policy.FieldError
	switch {
	case req.Fingerprint == nil || *req.Fingerprint == "":
		errs = append(errs, fieldError("fingerprint", "is required: a digest of the work's inputs, so a different job under the same key is refused"))
	case len(*req.Fingerprint) > vault.MaxClaimFingerprintLen:
		errs = append(errs, fieldError("fingerprint", fmt.Sprintf("must be at most %d bytes", vault.MaxClaimFingerprintLen)))
	}
	lease := DefaultClaimLease
	if req.LeaseSeconds != nil {
		maxSec := int64(MaxClaimLease / time.Second)
		if *req.LeaseSeconds < 1 || *req.LeaseSeconds > maxSec {
			errs = append(errs, fieldError("lease_seconds", fmt.Sprintf("must be an integer from 1 to %d", maxSec)))
		} else {
			lease = time.Duration(*req.LeaseSeconds) * time.Second
		}
	}
	if len(errs) > 0 {
		return validationProblem("the request is not valid", errs...)
	}

	keyID := vaultKeyOf(c).ID
	res, err := a.store.Claim(c.Request().Context(), keyID, *req.Key, *req.Fingerprint, lease)
	if err != nil {
		return fmt.Errorf("claim under %s: %w", keyID, err)
	}
	switch res.Outcome {
	case vault.ClaimOutcomeClaimed:
		v := newClaimView(res.Claim)
		token := res.Claim.FencingToken
		v.Status, v.FencingToken = claimStatusClaimed, &token
		c.Response().Header().Set(echo.HeaderLocation, claimPath(*req.Key))
		return c.JSON(http.StatusCreated, v)
	case vault.ClaimOutcomeCompleted:
		return c.JSON(http.StatusOK, newClaimView(res.Claim))
	case vault.ClaimOutcomeInProgress:
		until := res.Claim.LeaseExpiresAt
		c.Response().Header().Set("Retry-After", strconv.FormatInt(retryAfter(until, a.now()), 10))
		p := newProblem(http.StatusConflict, "this key is claimed by another caller whose lease expires at "+
			until.UTC().Format(time.RFC3339)+"; retry after it, or read the claim to see its outcome")
		p.Type = ProblemClaimInProgress
		return p
	case vault.ClaimOutcomeFingerprintMismatch:
		p := newProblem(http.StatusUnprocessableEntity,
			"this key was claimed with a different fingerprint: the same key may only name the same work")
		p.Type = ProblemClaimFingerprintMismatch
		return p
	default:
		return fmt.Errorf("claim under %s: unexpected outcome %d", keyID, res.Outcome)
	}
}

// claimKeyRule says what a claim key must be.
var claimKeyRule = fmt.Sprintf("key must be 1-%d characters without control characters", vault.MaxClaimKeyLen)

// retryAfter is the Retry-After of a live lease: whole seconds until it lapses, at
// least 1.
func retryAfter(until, now time.Time) int64 {
	secs := math.Ceil(until.Sub(now).Seconds())
	return max(1, int64(secs))
}

// claimPath is the URL path of the claim key, escaped.
func claimPath(key string) string { return "/keybrake/v1/claims/" + url.PathEscape(key) }

// claimKeyParam returns the claim key of the path. echo routes on the escaped path
// when the request's escaping differs from Go's default (a key with %2F) and on the
// decoded one otherwise, and leaves the parameter as it routed on it.
func claimKeyParam(c echo.Context) (string, error) {
	key := c.Param("key")
	if c.Request().URL.RawPath != "" {
		var err error
		if key, err = url.PathUnescape(key); err != nil {
			return "", newProblem(http.StatusBadRequest, "the claim key in the path is not validly escaped")
		}
	}
	if !vault.ValidClaimKey(key) {
		return "", newProblem(http.StatusBadRequest, claimKeyRule)
	}
	return key, nil
}

// getClaim handles GET /keybrake/v1/claims/{key}.
func (a *agent) getClaim(c echo.Context) error {
	key, err := claimKeyParam(c)
	if err != nil {
		return err
	}
	keyID := vaultKeyOf(c).ID
	cl, err := a.store.GetClaim(c.Request().Context(), keyID, key)
	if errors.Is(err, vault.ErrNotFound) {
		return newProblem(http.StatusNotFound, "this vault key has no claim with this key")
	}
	if err != nil {
		return fmt.Errorf("get claim under %s: %w", keyID, err)
	}
	return c.JSON(http.StatusOK, newClaimView(cl))
}

// completeRequest is the body of POST /keybrake/v1/claims/{key}/complete.
type completeRequest struct {
	Result       json.RawMessage `json:"result"`
	FencingToken *uint64         `json:"fencing_token"`
}

// releaseRequest is the body of POST /keybrake/v1/claims/{key}/release.
type releaseRequest struct {
	FencingToken *uint64 `json:"fencing_token"`
}

// fencingRequired is the field error of a missing fencing token.
var fencingRequired = fieldError("fencing_token", "is required: the token the claim answered with")

// ownerError maps the store's answer to a complete or release.
func ownerError(err error, keyID, action string) error {
	switch {
	case errors.Is(err, vault.ErrNotFound):
		return newProblem(http.StatusNotFound, "this vault key has no claim with this key")
	case errors.Is(err, vault.ErrConflict):
		p := newProblem(http.StatusConflict, "this fencing token does not own the claim: it changed owner, or the claim is already completed")
		p.Type = ProblemClaimNotOwner
		return p
	}
	return fmt.Errorf("%s claim under %s: %w", action, keyID, err)
}

// completeClaim handles POST /keybrake/v1/claims/{key}/complete.
func (a *agent) completeClaim(c echo.Context) error {
	key, err := claimKeyParam(c)
	if err != nil {
		return err
	}
	var req completeRequest
	if err := bindJSON(c, a.maxBody, &req); err != nil {
		return err
	}
	var errs []policy.FieldError
	if req.Result == nil {
		errs = append(errs, fieldError("result", "is required: any JSON value (null too) that a re-run gets back"))
	}
	if req.FencingToken == nil {
		errs = append(errs, fencingRequired)
	}
	if len(errs) > 0 {
		return validationProblem("the request is not valid", errs...)
	}
	ctx := c.Request().Context()
	keyID := vaultKeyOf(c).ID
	if err := a.store.CompleteClaim(ctx, keyID, key, *req.FencingToken, req.Result); err != nil {
		return ownerError(err, keyID, "complete")
	}
	cl, err := a.store.GetClaim(ctx, keyID, key)
	if err != nil {
		return fmt.Errorf("read completed claim under %s: %w", keyID, err)
	}
	return c.JSON(http.StatusOK, newClaimView(cl))
}

// releaseClaim handles POST /keybrake/v1/claims/{key}/release.
func (a *agent) releaseClaim(c echo.Context) error {
	key, err := claimKeyParam(c)
	if err != nil {
		return err
	}
	var req releaseRequest
	if err := bindJSON(c, a.maxBody, &req); err != nil {
		return err
	}
	if req.FencingToken == nil {
		return validationProblem("the request is not valid", fencingRequired)
	}
	keyID := vaultKeyOf(c).ID
	if err := a.store.ReleaseClaim(c.Request().Context(), keyID, key, *req.FencingToken); err != nil {
		return ownerError(err, keyID, "release")
	}
	return c.JSON(http.StatusOK, claimView{Status: claimStatusReleased, Key: key})
}
