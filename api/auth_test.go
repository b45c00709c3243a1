package api_test

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
)

// jwtClaims builds a claim set like IssueToken's, at now, valid for an hour.
func jwtClaims(now time.Time) jwt.MapClaims {
	return jwt.MapClaims{
		"iss":  "keybrake",
		"aud":  []string{"keybrake-admin"},
		"sub":  "mallory",
		"role": "admin",
		"iat":  now.Unix(),
		"exp":  now.Add(time.Hour).Unix(),
	}
}

// MustSignHS signs claims with an HMAC method and key.
func MustSignHS(tb testing.TB, m jwt.SigningMethod, key []byte, claims jwt.MapClaims) string {
	tb.Helper()
	s, err := jwt.NewWithClaims(m, claims).SignedString(key)
	require.NoError(tb, err)
	return s
}

// rawJWT assembles a token from a header, claims and an HMAC-SHA256 signature under
// key (nil key: empty signature), bypassing any library checks.
func rawJWT(tb testing.TB, header map[string]any, claims jwt.MapClaims, key []byte) string {
	tb.Helper()
	h, err := json.Marshal(header)
	require.NoError(tb, err)
	c, err := json.Marshal(claims)
	require.NoError(tb, err)
	signing := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c)
	if key == nil {
		return signing + "."
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signing))
	return signing + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func TestAdminJWTAttacksAre401(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	now := env.clock.Now()
	secret := env.secret

	without := func(claim string) jwt.MapClaims {
		c := jwtClaims(now)
		delete(c, claim)
		return c
	}
	with := func(claim string, v any) jwt.MapClaims {
		c := jwtClaims(now)
		c[claim] = v
		return c
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	rs256, err := jwt.NewWithClaims(jwt.SigningMethodRS256, jwtClaims(now)).SignedString(rsaKey)
	require.NoError(t, err)
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwtClaims(now)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)

	// A viewer token whose payload was rewritten to admin, signature kept.
	viewer := env.viewerToken
	parts := strings.Split(viewer, ".")
	require.Len(t, parts, 3)
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	forgedPayload := strings.Replace(string(payload), `"role":"viewer"`, `"role":"admin"`, 1)
	require.NotEqual(t, string(payload), forgedPayload)
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(forgedPayload)) + "." + parts[2]

	cases := map[string]struct{ authz, reason string }{ // Authorization header ("" = none) and the reason given
		"missing header":             {"", "missing Authorization header"},
		"Basic scheme":               {"Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+string(secret))), "scheme must be Bearer"},
		"Basic scheme with a JWT":    {"Basic " + env.adminToken, "scheme must be Bearer"},
		"bearer without token":       {"Bearer ", "empty bearer token"},
		"garbage":                    {"Bearer not-a-jwt", "malformed"},
		"three garbage segments":     {"Bearer aaa.bbb.ccc", "malformed"},
		"alg none":                   {"Bearer " + none, "signing method not accepted"},
		"alg none, hand made":        {"Bearer " + rawJWT(t, map[string]any{"alg": "none", "typ": "JWT"}, jwtClaims(now), nil), "signing method not accepted"},
		"alg NONE with HMAC":         {"Bearer " + rawJWT(t, map[string]any{"alg": "NONE", "typ": "JWT"}, jwtClaims(now), secret), "signing method not accepted"},
		"HS384 with the secret":      {"Bearer " + MustSignHS(t, jwt.SigningMethodHS384, secret, jwtClaims(now)), "signing method not accepted"},
		"HS512 with the secret":      {"Bearer " + MustSignHS(t, jwt.SigningMethodHS512, secret, jwtClaims(now)), "signing method not accepted"},
		"RS256 signed with RSA":      {"Bearer " + rs256, "signing method not accepted"},
		"RS256 header, HMAC signed":  {"Bearer " + rawJWT(t, map[string]any{"alg": "RS256", "typ": "JWT"}, jwtClaims(now), secret), "signing method not accepted"},
		"no alg header, HMAC signed": {"Bearer " + rawJWT(t, map[string]any{"typ": "JWT"}, jwtClaims(now), secret), "signing method not accepted"},
		"expired":                    {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, with("exp", now.Add(-time.Minute).Unix())), "expired"},
		"missing exp":                {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, without("exp")), "required claim is missing"},
		"wrong iss":                  {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, with("iss", "someone-else")), "wrong issuer"},
		"missing iss":                {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, without("iss")), "required claim is missing"},
		"wrong aud":                  {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, with("aud", "keybrake-agent")), "wrong audience"},
		"missing aud":                {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, without("aud")), "required claim is missing"},
		"issued in the future":       {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, with("iat", now.Add(time.Hour).Unix())), "issued in the future"},
		"not valid yet":              {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, with("nbf", now.Add(time.Hour).Unix())), "not valid yet"},
		"bad signature (other key)":  {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, []byte("another-secret-another-secret-00"), jwtClaims(now)), "bad signature"},
		"payload tampered":           {"Bearer " + tampered, "bad signature"},
		"signature stripped":         {"Bearer " + parts[0] + "." + parts[1] + ".", "bad signature"},
		"missing sub":                {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, without("sub")), "sub is missing"},
		"missing role":               {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, without("role")), "role must be"},
		"unknown role":               {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, with("role", "root")), "role must be"},
		"role in upper case":         {"Bearer " + MustSignHS(t, jwt.SigningMethodHS256, secret, with("role", "ADMIN")), "role must be"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			authz := tc.authz
			for _, req := range []struct{ method, path string }{
				{http.MethodGet, "/api/v1/keys"},
				{http.MethodPost, "/api/v1/keys/key_x/revoke"},
				{http.MethodGet, "/api/v1/backup"},
			} {
				hdr := http.Header{}
				if authz != "" {
					hdr.Set("Authorization", authz)
				}
				r := env.DoRaw(req.method, req.path, hdr, nil)
				require.Equal(t, http.StatusUnauthorized, r.Status, "%s %s: %s", req.method, req.path, r.Body)
				assert.Equal(t, "Bearer", r.Header.Get("WWW-Authenticate"))
				p := r.Problem(t)
				assert.Equal(t, api.ProblemUnauthorized, p.Type)
				assert.Contains(t, p.Detail, tc.reason, "refused for the right reason")
				if cred := strings.TrimSpace(strings.TrimPrefix(authz, "Bearer ")); len(cred) > 8 {
					assert.NotContains(t, string(r.Body), cred, "a problem never echoes the token")
				}
			}
		})
	}

	// Control: the same requests with a valid admin token are not 401, and 30 s of
	// clock skew is tolerated.
	skewed := MustSignHS(t, jwt.SigningMethodHS256, secret, with("iat", now.Add(20*time.Second).Unix()))
	for _, tok := range []string{env.adminToken, skewed} {
		r := env.Do(http.MethodGet, "/api/v1/keys", tok, nil)
		assert.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	}
	r := env.DoRaw(http.MethodGet, "/api/v1/keys", http.Header{"Authorization": {"bearer " + env.adminToken}}, nil)
	assert.Equal(t, http.StatusOK, r.Status, "the scheme is case-insensitive: %s", r.Body)
	r = env.DoRaw(http.MethodGet, "/api/v1/keys", http.Header{"Authorization": {"Bearer " + env.adminToken, "Bearer " + env.viewerToken}}, nil)
	assert.Equal(t, http.StatusUnauthorized, r.Status, "two Authorization headers: %s", r.Body)

	// A token is refused once it expires (past the leeway).
	env.clock.Set(now.Add(time.Hour + time.Minute))
	r = env.Do(http.MethodGet, "/api/v1/keys", env.adminToken, nil)
	assert.Equal(t, http.StatusUnauthorized, r.Status)
}

func TestAdminViewerMayOnlyRead(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	env.MustUpstream("default")
	k := env.MustMint("k", "", nil, seedLegacyPolicy)
	env.MustHold(k.ID, "idem-u", 100, "unknown")
	holdID := ""
	{
		r := env.Do(http.MethodGet, "/api/v1/holds?state=unknown", env.adminToken, nil)
		var hl struct {
			Holds []struct {
				ID string `json:"id"`
			} `json:"holds"`
		}
		r.Decode(t, &hl)
		require.Len(t, hl.Holds, 1)
		holdID = hl.Holds[0].ID
	}

	reads := []string{
		"/api/v1/upstreams", "/api/v1/keys", "/api/v1/keys/" + k.ID, "/api/v1/keys/" + k.ID + "/usage",
		"/api/v1/keys/" + k.ID + "/events", "/api/v1/holds?state=unknown", "/api/v1/audit",
	}
	for _, path := range reads {
		r := env.Do(http.MethodGet, path, env.viewerToken, nil)
		assert.Equal(t, http.StatusOK, r.Status, "viewer GET %s: %s", path, r.Body)
	}

	writes := map[string]struct {
		method, path, body string
	}{
		"register upstream": {http.MethodPost, "/api/v1/upstreams", `{"name":"x","secret":"sk_test_x"}`},
		"delete upstream":   {http.MethodDelete, "/api/v1/upstreams/default", ""},
		"mint":              {http.MethodPost, "/api/v1/keys", `{"name":"v","policy":` + seedLegacyPolicy + `}`},
		"patch":             {http.MethodPatch, "/api/v1/keys/" + k.ID, `{"policy":{"daily_cap":"1"}}`},
		"revoke":            {http.MethodPost, "/api/v1/keys/" + k.ID + "/revoke", ""},
		"rotate":            {http.MethodPost, "/api/v1/keys/" + k.ID + "/rotate", ""},
		"resolve hold":      {http.MethodPost, "/api/v1/holds/" + holdID + "/resolve", `{"outcome":"released"}`},
		"backup":            {http.MethodGet, "/api/v1/backup", ""},
		"compact":           {http.MethodPost, "/api/v1/compact", ""},
	}
	for name, w := range writes {
		t.Run(name, func(t *testing.T) {
			var body any
			if w.body != "" {
				body = w.body
			}
			r := env.Do(w.method, w.path, env.viewerToken, body)
			require.Equal(t, http.StatusForbidden, r.Status, "body: %s", r.Body)
			assert.Equal(t, api.ProblemForbidden, r.Problem(t).Type)
		})
	}

	// Nothing changed.
	got := env.Do(http.MethodGet, "/api/v1/keys/"+k.ID, env.adminToken, nil)
	require.Equal(t, http.StatusOK, got.Status)
	m := got.JSON(t)
	assert.Equal(t, "active", m["status"])
	assert.Equal(t, "99.00", m["policy"].(map[string]any)["daily_cap"])
	r := env.Do(http.MethodGet, "/api/v1/keys", env.adminToken, nil)
	assert.NotContains(t, string(r.Body), `"name":"v"`)
	r = env.Do(http.MethodGet, "/api/v1/audit", env.adminToken, nil)
	assert.NotContains(t, string(r.Body), "victor@example.com", "no audit entry from the viewer")
}

func TestIssueToken(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef")
	now := time.Date(2026, 9, 14, 12, 0, 0, 0, time.UTC)

	tok, err := api.IssueToken(secret, "ops@example.com", api.RoleViewer, 90*time.Minute, now)
	require.NoError(t, err)
	parts := strings.Split(tok, ".")
	require.Len(t, parts, 3)
	hdr, err := base64.RawURLEncoding.DecodeString(parts[0])
	require.NoError(t, err)
	assert.JSONEq(t, `{"alg":"HS256","typ":"JWT"}`, string(hdr))

	claims := jwt.MapClaims{}
	_, err = jwt.NewParser(jwt.WithTimeFunc(func() time.Time { return now })).ParseWithClaims(tok, claims,
		func(*jwt.Token) (any, error) { return secret, nil })
	require.NoError(t, err)
	assert.Equal(t, "keybrake", claims["iss"])
	assert.Equal(t, []any{"keybrake-admin"}, claims["aud"])
	assert.Equal(t, "ops@example.com", claims["sub"])
	assert.Equal(t, "viewer", claims["role"])
	assert.EqualValues(t, now.Unix(), claims["iat"])
	assert.EqualValues(t, now.Add(90*time.Minute).Unix(), claims["exp"])
	assert.NotEmpty(t, claims["jti"])

	other, err := api.IssueToken(secret, "ops@example.com", api.RoleViewer, 90*time.Minute, now)
	require.NoError(t, err)
	assert.NotEqual(t, tok, other, "a random jti makes every token distinct")

	bad := map[string]struct {
		secret []byte
		sub    string
		role   string
		ttl    time.Duration
	}{
		"empty secret":      {nil, "a", api.RoleAdmin, time.Hour},
		"empty sub":         {secret, "", api.RoleAdmin, time.Hour},
		"unknown role":      {secret, "a", "root", time.Hour},
		"zero ttl":          {secret, "a", api.RoleAdmin, 0},
		"negative ttl":      {secret, "a", api.RoleAdmin, -time.Hour},
		"empty role":        {secret, "a", "", time.Hour},
		"role in caps":      {secret, "a", "Admin", time.Hour},
		"empty sub, viewer": {secret, "", api.RoleViewer, time.Hour},
	}
	for name, tc := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := api.IssueToken(tc.secret, tc.sub, tc.role, tc.ttl, now)
			assert.Error(t, err)
		})
	}
}

func TestAdminWithoutJWTSecretRefusesEveryone(t *testing.T) {
	t.Parallel()
	env := MustAdminEnv(t)
	srv := httptest.NewServer(api.NewAdmin(api.AdminConfig{Store: env.store, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: env.clock.Now}))
	t.Cleanup(srv.Close)
	// A token signed with an empty key must not pass either.
	forged := MustSignHS(t, jwt.SigningMethodHS256, []byte{}, jwtClaims(env.clock.Now()))
	for _, tok := range []string{forged, env.adminToken} {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/keys", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	}
}
