package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/labstack/echo/v4"
)

// JWT claim values of admin tokens.
const (
	// TokenIssuer is the iss of every admin token.
	TokenIssuer = "keybrake"
	// TokenAudience is the aud of every admin token.
	TokenAudience = "keybrake-admin"
	// TokenLeeway is the clock skew tolerated on exp, nbf and iat.
	TokenLeeway = 30 * time.Second
)

// adminClaims are the claims of an admin token: the registered ones plus role.
type adminClaims struct {
	Role string `json:"role"`
	jwt.RegisteredClaims
}

// Principal is the authenticated caller of an admin request: the token's sub (the
// actor written into the audit log) and its role.
type Principal struct {
	Subject string
	Role    string
}

// principalKey is the context key of the request's Principal.
type principalKey struct{}

// NewContextWithPrincipal returns ctx carrying p.
func NewContextWithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFromContext returns the Principal of an authenticated admin request.
func PrincipalFromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// validRole reports whether role is one an admin token may carry.
func validRole(role string) bool { return role == RoleAdmin || role == RoleViewer }

// newTokenParser returns the parser every admin token goes through: HS256 only, exp
// required, iss and aud pinned, iat checked, 30 s of leeway, the admin clock.
func newTokenParser(now func() time.Time) *jwt.Parser {
	return jwt.NewParser(
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuer(TokenIssuer),
		jwt.WithAudience(TokenAudience),
		jwt.WithLeeway(TokenLeeway),
		jwt.WithIssuedAt(),
		jwt.WithTimeFunc(now),
	)
}

// unauthorized is the 401 every authentication failure gets. The error handler adds
// WWW-Authenticate: Bearer.
func unauthorized(detail string) *Problem { return newProblem(http.StatusUnauthorized, detail) }

// authenticate is the middleware that admits a request only with a valid admin token.
//
// Roles: "admin" may do everything; "viewer" may only read (GET and HEAD), any other
// method is 403. A token with no sub, or with a role that is neither admin nor
// viewer, is not an admin credential at all: 401, like any other bad token, so a
// 403 always means "valid token, insufficient role".
func (a *admin) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		claims, err := a.parseBearer(c.Request())
		if err != nil {
			c.Set(ctxKeyAuthFailure, err.Detail)
			return err
		}
		p := Principal{Subject: claims.Subject, Role: claims.Role}
		c.SetRequest(c.Request().WithContext(NewContextWithPrincipal(c.Request().Context(), p)))
		if p.Role != RoleAdmin && !isRead(c.Request().Method) {
			return newProblem(http.StatusForbidden, "the viewer role may only read; this needs the admin role")
		}
		return next(c)
	}
}

// requireAdmin refuses every role but admin, also on reads (the backup is a copy of
// every secret, sealed or not).
func requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		p, ok := PrincipalFromContext(c.Request().Context())
		if !ok || p.Role != RoleAdmin {
			return newProblem(http.StatusForbidden, "this needs the admin role")
		}
		return next(c)
	}
}

// isRead reports whether method only reads.
func isRead(method string) bool { return method == http.MethodGet || method == http.MethodHead }

// parseBearer extracts and verifies the request's bearer token. It never returns or
// logs the token itself.
func (a *admin) parseBearer(r *http.Request) (*adminClaims, *Problem) {
	values := r.Header.Values(echo.HeaderAuthorization)
	switch {
	case len(values) == 0:
		return nil, unauthorized("missing Authorization header; send Authorization: Bearer <JWT>")
	case len(values) > 1:
		return nil, unauthorized("more than one Authorization header")
	}
	scheme, raw, _ := strings.Cut(values[0], " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return nil, unauthorized("the Authorization scheme must be Bearer")
	}
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, unauthorized("empty bearer token")
	}
	if len(a.secret) == 0 {
		// Fail closed: an empty HMAC key would make every token forgeable.
		return nil, unauthorized("admin tokens cannot be verified: no JWT secret is configured")
	}
	claims := &adminClaims{}
	tok, err := a.parser.ParseWithClaims(raw, claims, func(*jwt.Token) (any, error) {
		return a.secret, nil
	})
	if err != nil {
		reason := tokenErrorReason(err)
		if tok != nil && !errors.Is(err, jwt.ErrTokenMalformed) && tok.Header["alg"] != jwt.SigningMethodHS256.Alg() {
			reason = "signing method not accepted (HS256 only)"
		}
		return nil, unauthorized("invalid token: " + reason)
	}
	if claims.Subject == "" {
		return nil, unauthorized("invalid token: sub is missing")
	}
	if !validRole(claims.Role) {
		return nil, unauthorized(`invalid token: role must be "admin" or "viewer"`)
	}
	return claims, nil
}

// tokenErrorReason says in a few words why a token was refused, without echoing any
// part of it.
func tokenErrorReason(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "malformed"
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return "signing method not accepted"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "bad signature"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "a required claim is missing"
	case errors.Is(err, jwt.ErrTokenExpired):
		return "expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return "not valid yet"
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return "issued in the future"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "wrong issuer"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "wrong audience"
	case errors.Is(err, jwt.ErrTokenInvalidClaims):
		return "invalid claims"
	default:
		return "rejected"
	}
}
