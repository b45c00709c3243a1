package api

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// IssueToken signs an admin-API JWT (HS256, iss keybrake, aud keybrake-admin) for sub
// with role, valid from now for ttl. The token carries sub, role, iss, aud, iat, nbf,
// exp and a random jti. It fails for an empty secret, an empty sub, a role other than
// RoleAdmin or RoleViewer, or a ttl that is not positive.
func IssueToken(secret []byte, sub, role string, ttl time.Duration, now time.Time) (string, error) {
	switch {
	case len(secret) == 0:
		return "", errors.New("issue token: empty jwt secret")
	case sub == "":
		return "", errors.New("issue token: empty sub")
	case !validRole(role):
		return "", fmt.Errorf("issue token: role %q is neither %q nor %q", role, RoleAdmin, RoleViewer)
	case ttl <= 0:
		return "", fmt.Errorf("issue token: ttl %s is not positive", ttl)
	}
	var jti [16]byte
	if _, err := rand.Read(jti[:]); err != nil {
		return "", fmt.Errorf("issue token: random id: %w", err)
	}
	now = now.Truncate(time.Second)
	claims := adminClaims{
		Role: role,
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    TokenIssuer,
			Subject:   sub,
			Audience:  jwt.ClaimStrings{TokenAudience},
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
			ID:        base64.RawURLEncoding.EncodeToString(jti[:]),
		},
	}
	signed, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
	if err != nil {
		return "", fmt.Errorf("issue token: sign: %w", err)
	}
	return signed, nil
}
