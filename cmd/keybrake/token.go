package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keybrake/keybrake/api"
)

// TokenConfig is the configuration of `keybrake token`.
type TokenConfig struct {
	// Role is api.RoleAdmin or api.RoleViewer.
	Role string
	// TTL is how long the token is valid.
	TTL time.Duration
	// Sub is the token's subject: who the audit log names for its changes.
	Sub string
	// DataDir is where serve generated jwt.secret, the last place the secret is looked for.
	DataDir string
	// JWTSecret is the signing secret (--jwt-secret, else KEYBRAKE_JWT_SECRET).
	JWTSecret string
	// AllowLongTTL lets TTL exceed MaxTokenTTL.
	AllowLongTTL bool
	// Link prints a dashboard sign-in link that carries the token instead of
	// the bare token.
	Link bool
	// AdminURL is the dashboard's server for Link (--admin-url, else
	// KEYBRAKE_ADMIN_URL, else the default admin listener's URL).
	AdminURL string
}

// MaxTokenTTL is the longest token `keybrake token` mints without --allow-long-ttl:
// a token cannot be revoked before it expires (only rotating KEYBRAKE_JWT_SECRET
// invalidates it, and every other token with it).
const MaxTokenTTL = 30 * 24 * time.Hour

// DefaultTokenConfig returns token's defaults.
func DefaultTokenConfig() TokenConfig {
	return TokenConfig{
		Role:     api.RoleAdmin,
		TTL:      time.Hour,
		Sub:      "admin",
		DataDir:  DefaultConfig().DataDir,
		AdminURL: listenerURL(DefaultConfig().AdminListen, "127.0.0.1", false),
	}
}

// Validate returns every problem with the configuration at once.
func (c TokenConfig) Validate() error {
	var errs []error
	if c.Role != api.RoleAdmin && c.Role != api.RoleViewer {
		errs = append(errs, fmt.Errorf("role: %q is not %s or %s", c.Role, api.RoleAdmin, api.RoleViewer))
	}
	if c.TTL <= 0 {
		errs = append(errs, fmt.Errorf("ttl: must be positive, got %s", c.TTL))
	}
	if c.TTL > MaxTokenTTL && !c.AllowLongTTL {
		errs = append(errs, fmt.Errorf("ttl: %s is longer than 30 days (%s): a token cannot be revoked before it expires, "+
			"only by rotating the JWT secret (which ends every token); pass --allow-long-ttl to mint it anyway", c.TTL, MaxTokenTTL))
	}
	if c.Sub == "" {
		errs = append(errs, errors.New("sub: must not be empty"))
	}
	if c.Link {
		if err := validateBaseURL(c.AdminURL); err != nil {
			errs = append(errs, fmt.Errorf("admin-url: %w", err))
		}
	}
	return errors.Join(errs...)
}

// parseToken reads token's flags; --jwt-secret falls back to KEYBRAKE_JWT_SECRET
// and --data-dir to KEYBRAKE_DATA_DIR.
func (m *Main) parseToken(args []string) error {
	fs := m.flagSet(cmdToken, "keybrake token [--role admin|viewer] [--ttl 1h] [--sub NAME] [--data-dir DIR] [--jwt-secret SECRET] [--link [--admin-url URL]]\n\nPrints an admin API token signed with --jwt-secret, else KEYBRAKE_JWT_SECRET,\nelse the jwt.secret that serve generated in the data directory. A token cannot be\nrevoked, so --ttl is capped at 30 days unless --allow-long-ttl. With --link it\nprints a dashboard sign-in link that carries the token instead.")
	c := &m.Token
	fs.StringVar(&c.Role, "role", c.Role, "role: admin or viewer")
	fs.DurationVar(&c.TTL, "ttl", c.TTL, "how long the token is valid (at most 720h = 30 days without --allow-long-ttl)")
	fs.BoolVar(&c.AllowLongTTL, "allow-long-ttl", c.AllowLongTTL, "allow a --ttl over 30 days")
	fs.StringVar(&c.Sub, "sub", c.Sub, "subject (who the audit log names)")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "data directory holding the generated jwt.secret")
	fs.StringVar(&c.JWTSecret, "jwt-secret", c.JWTSecret, "signing secret (visible to other local users in the process list: prefer KEYBRAKE_JWT_SECRET)")
	fs.BoolVar(&c.Link, "link", c.Link, "print a dashboard sign-in link carrying the token (in the URL fragment, which browsers never send to a server)")
	fs.StringVar(&c.AdminURL, "admin-url", c.AdminURL, "the admin listener's URL, for --link")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if err := applyEnv(fs, m.Getenv, map[string]string{"data-dir": envName("data-dir"), "jwt-secret": envJWTSecret, "admin-url": envName("admin-url")}); err != nil {
		return fmt.Errorf("token: %w", err)
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("token: %w", err)
	}
	return nil
}

// runToken prints the token on Stdout.
func (m *Main) runToken(ctx context.Context) error {
	secret, err := m.localJWTSecret(m.Token.JWTSecret, m.Token.DataDir)
	if err != nil {
		return err
	}
	token, err := api.IssueToken(secret, m.Token.Sub, m.Token.Role, m.Token.TTL, time.Now())
	if err != nil {
		return fmt.Errorf("issue token: %w", err)
	}
	if m.Token.Link {
		_, err = fmt.Fprintln(m.Stdout, signInLink(m.Token.AdminURL, token))
		return err
	}
	_, err = fmt.Fprintln(m.Stdout, token)
	return err
}

// localJWTSecret returns explicit when set (a flag, already defaulted from the
// environment), else the data directory's jwt.secret.
func (m *Main) localJWTSecret(explicit, dataDir string) ([]byte, error) {
	if explicit != "" {
		b, err := checkJWTSecret([]byte(explicit))
		if err != nil {
			return nil, fmt.Errorf("jwt secret: %w", err)
		}
		return b, nil
	}
	b, _, err := loadSecret(jwtSecretSpec, noEnv, dataDir, nil)
	if errors.Is(err, errNoSecret) {
		return nil, fmt.Errorf("no jwt secret: pass --jwt-secret, set %s, or run serve once with --data-dir %s to generate one: %w", envJWTSecret, dataDir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("jwt secret: %w", err)
	}
	return b, nil
}

// signInLink is the dashboard's sign-in link for token on the admin listener at
// adminURL. The token travels in the URL fragment, which browsers never send to
// a server (nor in a Referer): only the dashboard's script reads it.
func signInLink(adminURL, token string) string {
	return strings.TrimRight(adminURL, "/") + api.UIPath + "#token=" + token
}
