package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"flag"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/policy"
	"github.com/keybrake/keybrake/proxy/proxytest"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
)

// syncBuffer collects a program's output.
type syncBuffer = proxytest.Buffer

// env is a fake process environment.
type env map[string]string

func (e env) get(k string) string { return e[k] }

// testMain is a Main wired to buffers and a fake environment.
type testMain struct {
	*Main
	stdout *syncBuffer
	stderr *syncBuffer
}

// NewTestMain returns a Main whose streams are buffers and whose environment is e.
func NewTestMain(e env) testMain {
	m := NewMain()
	tm := testMain{Main: m, stdout: &syncBuffer{}, stderr: &syncBuffer{}}
	m.Stdout, m.Stderr = tm.stdout, tm.stderr
	if e == nil {
		e = env{}
	}
	m.Getenv = e.get
	return tm
}

// MustServe starts `keybrake serve` in-process on 127.0.0.1:0 with dataDir and
// upstream stripeURL, plus extra flags, and closes it in t.Cleanup.
func MustServe(tb testing.TB, dataDir, stripeURL string, e env, extra ...string) testMain {
	tb.Helper()
	tm := NewTestMain(e)
	args := append([]string{
		"serve",
		"--data-dir", dataDir,
		"--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0",
		"--stripe-url", stripeURL,
		"--log-level", "warn",
	}, extra...)
	ctx := context.Background()
	require.NoError(tb, tm.ParseFlags(ctx, args))
	tb.Cleanup(func() {
		if err := tm.Close(); err != nil {
			tb.Errorf("close: %v", err)
		}
	})
	require.NoError(tb, tm.Run(ctx), "stderr: %s", tm.stderr)
	return tm
}

// MustRunCommand runs a one-shot subcommand and returns its stdout.
func MustRunCommand(tb testing.TB, e env, args ...string) string {
	tb.Helper()
	tm := NewTestMain(e)
	ctx := context.Background()
	require.NoError(tb, tm.ParseFlags(ctx, args), "stderr: %s", tm.stderr)
	require.NoError(tb, tm.Run(ctx), "stderr: %s", tm.stderr)
	require.NoError(tb, tm.Close())
	return tm.stdout.String()
}

// runCommand runs a subcommand and returns its error (parse or run).
func runCommand(e env, args ...string) (string, error) {
	tm := NewTestMain(e)
	ctx := context.Background()
	if err := tm.ParseFlags(ctx, args); err != nil {
		return tm.stdout.String(), err
	}
	err := tm.Run(ctx)
	if cerr := tm.Close(); err == nil {
		err = cerr
	}
	return tm.stdout.String(), err
}

// MustGet GETs u and returns status and body.
func MustGet(tb testing.TB, u, bearer string) (int, []byte) {
	tb.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	require.NoError(tb, err)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(tb, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	return resp.StatusCode, body
}

// MustMasterKey reads the data directory's generated master key.
func MustMasterKey(tb testing.TB, dataDir string) []byte {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(dataDir, masterKeyFile))
	require.NoError(tb, err)
	key, err := decodeMasterKey(string(data))
	require.NoError(tb, err)
	return key
}

// MustOpenStore opens a database file with masterKey and closes it in t.Cleanup.
func MustOpenStore(tb testing.TB, path string, masterKey []byte) vault.Store {
	tb.Helper()
	s, err := bolt.Open(path, bolt.Options{MasterKey: masterKey, OpenTimeout: 2 * time.Second})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// MustPolicy is a usd policy with period and daily cap (in dollars) valid for 30 days.
func MustPolicy(tb testing.TB, capDollars int64) policy.Policy {
	tb.Helper()
	now := time.Now()
	c := decimal.NewFromInt(capDollars)
	p := policy.Policy{
		Vendor:    policy.VendorStripe,
		Currency:  "usd",
		DailyCap:  &c,
		PeriodCap: &c,
		ExpiresAt: now.Add(30 * 24 * time.Hour).UTC().Truncate(time.Second),
	}
	p.Normalize(now)
	require.NoError(tb, p.ValidateNew(now))
	return p
}

// MustMintKey mints a vault key on upstream "default" directly in the store.
func MustMintKey(tb testing.TB, s vault.Store, name string, capDollars int64) (vault.Key, string) {
	tb.Helper()
	k, token, err := s.MintKey(context.Background(), "test", vault.MintRequest{
		Name: name, Upstream: upstreamDefault, Policy: MustPolicy(tb, capDollars),
	})
	require.NoError(tb, err)
	return k, token
}

func TestServeHealthzAndReadyzOnBothListeners(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_healthz")
	m := MustServe(t, t.TempDir(), fake.URL, nil) // no STRIPE_SECRET_KEY: no upstream

	for name, base := range map[string]string{"proxy": m.ProxyURL(), "admin": m.AdminURL()} {
		t.Run(name, func(t *testing.T) {
			require.True(t, strings.HasPrefix(base, "http://127.0.0.1:"), base)
			status, body := MustGet(t, base+"/healthz", "")
			assert.Equal(t, http.StatusOK, status, string(body))
			status, body = MustGet(t, base+"/readyz", "")
			assert.Equal(t, http.StatusServiceUnavailable, status, string(body))
			assert.Contains(t, string(body), "no upstream is registered")
		})
	}
	_, _, err := m.Store().PutUpstream(context.Background(), "test", upstreamDefault, "stripe", fake.Secret)
	require.NoError(t, err)
	for _, base := range []string{m.ProxyURL(), m.AdminURL()} {
		status, body := MustGet(t, base+"/readyz", "")
		assert.Equal(t, http.StatusOK, status, string(body))
	}
	assert.Equal(t, m.ProxyURL(), m.PublicURL(), "public URL derived from the bound proxy address")
	assert.Zero(t, fake.Count(), "health checks never reach Stripe")
}

func TestServePprofOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_pprof")
	off := MustServe(t, t.TempDir(), fake.URL, nil)
	assert.Empty(t, off.PprofURL(), "off by default")
	for _, base := range []string{off.ProxyURL(), off.AdminURL()} {
		status, _ := MustGet(t, base+"/debug/pprof/cmdline", "")
		assert.NotEqual(t, http.StatusOK, status, "%s: the API listeners never serve the profiler", base)
	}

	on := MustServe(t, t.TempDir(), fake.URL, env{"KEYBRAKE_PPROF_LISTEN": "127.0.0.1:0"})
	require.True(t, strings.HasPrefix(on.PprofURL(), "http://127.0.0.1:"), on.PprofURL())
	status, body := MustGet(t, on.PprofURL()+"/debug/pprof/cmdline", "")
	assert.Equal(t, http.StatusOK, status)
	assert.Contains(t, string(body), "keybrake.test", "the profiler of this very process")
	status, body = MustGet(t, on.PprofURL()+"/debug/pprof/profile?seconds=1", "")
	assert.Equal(t, http.StatusOK, status, string(body))
	assert.NotEmpty(t, body, "a CPU profile")
	status, _ = MustGet(t, on.AdminURL()+"/debug/pprof/cmdline", "")
	assert.NotEqual(t, http.StatusOK, status, "still not on the admin listener")
}

func TestServeGeneratesSecretsOnceAndReusesThem(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_secrets")
	dataDir := filepath.Join(t.TempDir(), "data")
	e := env{envStripeKey: fake.Secret}

	first := MustServe(t, dataDir, fake.URL, e)
	files := map[string][]byte{}
	for _, name := range []string{masterKeyFile, jwtSecretFile} {
		path := filepath.Join(dataDir, name)
		fi, err := os.Stat(path)
		require.NoError(t, err, name)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), name)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		files[name] = data
	}
	fi, err := os.Stat(dataDir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "data directory")
	assert.Contains(t, first.stderr.String(), "development secret", "a warning names the development default")
	assert.Contains(t, first.stderr.String(), "no vault keys yet", "first start prints the bootstrap banner")
	bootstrap := bootstrapToken(t, first.stderr.String())
	assertToken(t, files[jwtSecretFile], bootstrap, "bootstrap", api.RoleAdmin, first.Config.BootstrapTokenTTL)

	_, _ = MustMintKey(t, first.Store(), "reuse", 10)
	require.NoError(t, first.Close())

	second := MustServe(t, dataDir, fake.URL, e)
	for name, before := range files {
		after, err := os.ReadFile(filepath.Join(dataDir, name))
		require.NoError(t, err)
		assert.Equal(t, before, after, "%s is reused, not regenerated", name)
	}
	assert.NotContains(t, second.stderr.String(), "development secret", "nothing generated on the second start")
	assert.NotContains(t, second.stderr.String(), "no vault keys yet", "a key exists: no bootstrap banner")
	secret, err := second.Store().UpstreamSecret(context.Background(), upstreamDefault)
	require.NoError(t, err, "the upstream sealed under the first start's master key unseals")
	assert.Equal(t, fake.Secret, secret)
}

// bootstrapToken finds the JWT in the first-start banner.
func bootstrapToken(tb testing.TB, stderr string) string {
	tb.Helper()
	for _, line := range strings.Split(stderr, "\n") {
		line = strings.TrimSpace(line)
		if strings.Count(line, ".") == 2 && strings.HasPrefix(line, "eyJ") {
			return line
		}
	}
	require.FailNow(tb, "no token in the banner", stderr)
	return ""
}

// assertToken verifies token with secret like the admin API does and checks its claims.
func assertToken(tb testing.TB, secret []byte, token, sub, role string, ttl time.Duration) {
	tb.Helper()
	claims := struct {
		Role string `json:"role"`
		jwt.RegisteredClaims
	}{}
	parsed, err := jwt.ParseWithClaims(strings.TrimSpace(token), &claims,
		func(*jwt.Token) (any, error) { return bytes.TrimSpace(secret), nil },
		jwt.WithValidMethods([]string{"HS256"}), jwt.WithIssuer("keybrake"),
		jwt.WithAudience("keybrake-admin"), jwt.WithExpirationRequired())
	require.NoError(tb, err)
	require.True(tb, parsed.Valid)
	assert.Equal(tb, sub, claims.Subject)
	assert.Equal(tb, role, claims.Role)
	require.NotNil(tb, claims.IssuedAt)
	assert.Equal(tb, ttl, claims.ExpiresAt.Sub(claims.IssuedAt.Time), "exp - iat is the ttl")
}

func TestServeSecretsFromEnvironmentAreNotWritten(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_envsecrets")
	dataDir := t.TempDir()
	master, err := newMasterKeyText()
	require.NoError(t, err)
	e := env{
		envMasterKey: master,
		envJWTSecret: "a-jwt-secret-of-at-least-thirty-two-bytes",
		envStripeKey: fake.Secret,
	}
	m := MustServe(t, dataDir, fake.URL, e)
	for _, name := range []string{masterKeyFile, jwtSecretFile} {
		assert.NoFileExists(t, filepath.Join(dataDir, name))
	}
	assert.NotContains(t, m.stderr.String(), "development secret")
	require.NoError(t, m.Close())

	want, err := decodeMasterKey(master)
	require.NoError(t, err)
	s := MustOpenStore(t, filepath.Join(dataDir, databaseFile), want)
	secret, err := s.UpstreamSecret(context.Background(), upstreamDefault)
	require.NoError(t, err, "sealed under the environment's master key")
	assert.Equal(t, fake.Secret, secret)
}

func TestServeRefusesBadSecrets(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		env  env
		want string
	}{
		"master key not base64":  {env{envMasterKey: "not base64 !!"}, "must be base64 of 32 bytes"},
		"master key too short":   {env{envMasterKey: "c2hvcnQ="}, "is base64 of 5 bytes; it must be base64 of 32 bytes"},
		"master key of 33 bytes": {env{envMasterKey: strings.Repeat("QUFB", 11)}, "must be base64 of 32 bytes"},
		"master key in hex":      {env{envMasterKey: strings.Repeat("0f", 32)}, "looks like hex"},
		"jwt secret too short":   {env{envJWTSecret: "short"}, "at least 32"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dataDir := t.TempDir()
			tm := NewTestMain(tc.env)
			ctx := context.Background()
			require.NoError(t, tm.ParseFlags(ctx, []string{"serve", "--data-dir", dataDir,
				"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}))
			err := tm.Run(ctx)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			if strings.Contains(name, "master key") {
				assert.Contains(t, err.Error(), "openssl rand -base64 32", "says how to make one")
			}
			assert.NoError(t, tm.Close())
		})
	}
}

func TestServeRefusesADatabaseWithoutItsMasterKey(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_restore")
	oldDir := t.TempDir()
	m := MustServe(t, oldDir, fake.URL, env{envStripeKey: fake.Secret})
	require.NoError(t, m.Close())
	masterText := strings.TrimSpace(readFile(t, filepath.Join(oldDir, masterKeyFile)))

	// A backup restored into a new data directory, without its master.key.
	newDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(newDir, databaseFile), []byte(readFile(t, filepath.Join(oldDir, databaseFile))), 0o600))
	serve := func(e env) error {
		_, err := runCommand(e, "serve", "--data-dir", newDir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
			"--stripe-url", fake.URL)
		return err
	}
	err := serve(env{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "there is no master key")
	assert.Contains(t, err.Error(), "A restored backup needs the master key of the server it was taken from")
	assert.NoFileExists(t, filepath.Join(newDir, masterKeyFile), "no key generated that could never open it")
	assert.NoFileExists(t, filepath.Join(newDir, jwtSecretFile))

	err = serve(env{envMasterKey: MustNewMasterKeyText(t)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "was sealed with another master key than the one in KEYBRAKE_MASTER_KEY")
	assert.NoFileExists(t, filepath.Join(newDir, jwtSecretFile), "a start that failed leaves no secret behind")
	require.NoError(t, os.WriteFile(filepath.Join(newDir, masterKeyFile), []byte(MustNewMasterKeyText(t)), 0o600))
	err = serve(env{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "was sealed with another master key than the one in "+filepath.Join(newDir, masterKeyFile))

	require.NoError(t, os.Remove(filepath.Join(newDir, masterKeyFile)))
	assertServesWith(t, newDir, fake.URL, env{envMasterKey: masterText}, fake.Secret)
}

func TestSecondServeOnADataDirectoryInUse(t *testing.T) {
	t.Parallel()
	assert.LessOrEqual(t, DefaultConfig().OpenTimeout, time.Second, "the second serve says so within a second")
	fake := proxytest.NewFakeStripe(t, "sk_test_twice")
	dataDir := t.TempDir()
	MustServe(t, dataDir, fake.URL, nil)
	_, err := runCommand(nil, "serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--stripe-url", fake.URL)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "another keybrake process holds "+filepath.Join(dataDir, databaseFile))
}

func TestServeFlagsAndEnvironment(t *testing.T) {
	t.Parallel()
	full := env{
		"KEYBRAKE_DATA_DIR":         "/env/data",
		"KEYBRAKE_LISTEN":           "127.0.0.1:9000",
		"KEYBRAKE_ADMIN_LISTEN":     "127.0.0.1:9001",
		"KEYBRAKE_STRIPE_URL":       "http://127.0.0.1:12111",
		"KEYBRAKE_UPSTREAM_TIMEOUT": "15s",
		"KEYBRAKE_IDEMPOTENCY_TTL":  "2h",
		"KEYBRAKE_LEDGER_RETENTION": "720h",
		"KEYBRAKE_PUBLIC_URL":       "https://env.example",
		"KEYBRAKE_LOG_LEVEL":        "debug",
		"KEYBRAKE_LOG_FORMAT":       "text",
		"KEYBRAKE_SHUTDOWN_TIMEOUT": "7s",
		"KEYBRAKE_REAP_INTERVAL":    "1m",
		"KEYBRAKE_LEASE_MARGIN":     "5s",
	}
	fromEnv := DefaultConfig()
	fromEnv.DataDir = "/env/data"
	fromEnv.Listen = "127.0.0.1:9000"
	fromEnv.AdminListen = "127.0.0.1:9001"
	fromEnv.StripeURL = "http://127.0.0.1:12111"
	fromEnv.UpstreamTimeout = 15 * time.Second
	fromEnv.IdempotencyTTL = 2 * time.Hour
	fromEnv.LedgerRetention = 30 * 24 * time.Hour
	fromEnv.PublicURL = "https://env.example"
	fromEnv.LogLevel = "debug"
	fromEnv.LogFormat = "text"
	fromEnv.ShutdownTimeout = 7 * time.Second
	fromEnv.ReapInterval = time.Minute
	fromEnv.LeaseMargin = 5 * time.Second

	flagsWin := fromEnv
	flagsWin.DataDir = "/flag/data"
	flagsWin.UpstreamTimeout = 30 * time.Second
	flagsWin.PublicURL = "https://flag.example"
	flagsWin.LogFormat = "json"

	tests := map[string]struct {
		env  env
		args []string
		want Config
	}{
		"defaults":                     {env: env{}, want: DefaultConfig()},
		"environment fills every flag": {env: full, want: fromEnv},
		"a flag wins over its variable": {
			env: full,
			args: []string{"--data-dir", "/flag/data", "--upstream-timeout", "30s",
				"--public-url", "https://flag.example", "--log-format=json"},
			want: flagsWin,
		},
		"an empty variable counts as unset": {
			env:  env{"KEYBRAKE_LISTEN": "", "KEYBRAKE_UPSTREAM_TIMEOUT": ""},
			want: DefaultConfig(),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tm := NewTestMain(tc.env)
			require.NoError(t, tm.ParseFlags(context.Background(), append([]string{"serve"}, tc.args...)))
			assert.Equal(t, tc.want, tm.Config)
		})
	}
}

func TestServeFlagWinsAtRuntime(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_runtime")
	envDir, flagDir := t.TempDir(), t.TempDir()
	e := env{
		"KEYBRAKE_DATA_DIR":   envDir,
		"KEYBRAKE_PUBLIC_URL": "https://env.example",
		"KEYBRAKE_STRIPE_URL": fake.URL,
	}
	m := MustServe(t, flagDir, fake.URL, e, "--public-url", "https://flag.example")
	assert.Equal(t, "https://flag.example", m.PublicURL())
	assert.FileExists(t, filepath.Join(flagDir, databaseFile))
	assert.NoFileExists(t, filepath.Join(envDir, databaseFile))
}

func TestParseFlagsRefuses(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		env     env
		args    []string
		wantMsg string
	}{
		"no command":                {args: nil, wantMsg: "no command"},
		"unknown command":           {args: []string{"launch"}, wantMsg: "unknown command"},
		"unknown flag":              {args: []string{"serve", "--bogus"}, wantMsg: "bogus"},
		"stray argument":            {args: []string{"serve", "extra"}, wantMsg: "serve: unexpected arguments"},
		"bad listen":                {args: []string{"serve", "--listen", "8080"}, wantMsg: "listen"},
		"bad stripe url":            {args: []string{"serve", "--stripe-url", "ftp://x"}, wantMsg: "stripe-url"},
		"stripe url with query":     {args: []string{"serve", "--stripe-url", "https://api.stripe.com?x=1"}, wantMsg: "stripe-url"},
		"bad public url":            {args: []string{"serve", "--public-url", "localhost:8080"}, wantMsg: "public-url"},
		"zero upstream timeout":     {args: []string{"serve", "--upstream-timeout", "0s"}, wantMsg: "upstream-timeout"},
		"bad log level":             {args: []string{"serve", "--log-level", "loud"}, wantMsg: "log-level"},
		"bad log format":            {args: []string{"serve", "--log-format", "xml"}, wantMsg: "log-format"},
		"pprof on every interface":  {args: []string{"serve", "--pprof-listen", ":6060"}, wantMsg: "pprof-listen"},
		"pprof on a public address": {env: env{"KEYBRAKE_PPROF_LISTEN": "192.0.2.1:6060"}, args: []string{"serve"}, wantMsg: "pprof-listen"},
		"bad duration in the env":   {env: env{"KEYBRAKE_UPSTREAM_TIMEOUT": "soon"}, args: []string{"serve"}, wantMsg: "KEYBRAKE_UPSTREAM_TIMEOUT"},
		"negative refresh after":    {env: env{"KEYBRAKE_EXPOSURE_REFRESH_AFTER": "-1h"}, args: []string{"serve"}, wantMsg: "exposure-refresh-after"},
		"token with a bad role":     {args: []string{"token", "--role", "root"}, wantMsg: "role"},
		"token with a negative ttl": {args: []string{"token", "--ttl", "-1h"}, wantMsg: "ttl"},
		"token over 30 days":        {args: []string{"token", "--ttl", "721h"}, wantMsg: "pass --allow-long-ttl"},
		"backup without out":        {args: []string{"backup"}, wantMsg: "out"},
		"version with an argument":  {args: []string{"version", "now"}, wantMsg: "version: unexpected arguments"},
		"token with an argument":    {args: []string{"token", "admin"}, wantMsg: "token: unexpected arguments"},
		"backup with an argument":   {args: []string{"backup", "--out", "x", "now"}, wantMsg: "backup: unexpected arguments"},
		"backup with a bad url":     {args: []string{"backup", "--out", "x", "--admin-url", "127.0.0.1:8081"}, wantMsg: "admin-url"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tm := NewTestMain(tc.env)
			err := tm.ParseFlags(context.Background(), tc.args)
			require.Error(t, err)
			assert.Contains(t, err.Error()+tm.stderr.String(), tc.wantMsg)
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{
		"help":          {"help"},
		"--help":        {"--help"},
		"help serve":    {"help", "serve"},
		"serve -h":      {"serve", "-h"},
		"backup --help": {"backup", "--help"},
	} {
		t.Run(name, func(t *testing.T) {
			tm := NewTestMain(nil)
			err := tm.ParseFlags(context.Background(), args)
			require.ErrorIs(t, err, flag.ErrHelp)
			assert.NotEmpty(t, tm.stdout.String()+tm.stderr.String())
		})
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	out := MustRunCommand(t, nil, "version")
	assert.Regexp(t, `^keybrake \S+ \(go1\.\S+ \w+/\w+\)\n$`, out)
}

func TestTokenCommand(t *testing.T) {
	t.Parallel()
	const (
		flagSecret = "flag-secret-flag-secret-flag-secret!"
		envSecret  = "env-secret-env-secret-env-secret-env!"
	)
	fileDir := t.TempDir()
	created, err := writeFileExclusive(filepath.Join(fileDir, jwtSecretFile), []byte("file-secret-file-secret-file-secret!\n"))
	require.NoError(t, err)
	require.True(t, created)
	emptyDir := t.TempDir()

	tests := map[string]struct {
		env        env
		args       []string
		wantSecret string
		wantSub    string
		wantRole   string
		wantTTL    time.Duration
	}{
		"flag wins over env and file": {
			env:        env{envJWTSecret: envSecret},
			args:       []string{"--jwt-secret", flagSecret, "--data-dir", fileDir},
			wantSecret: flagSecret, wantSub: "admin", wantRole: api.RoleAdmin, wantTTL: time.Hour,
		},
		"env wins over file": {
			env:        env{envJWTSecret: envSecret},
			args:       []string{"--data-dir", fileDir, "--role", "viewer", "--sub", "alice", "--ttl", "15m"},
			wantSecret: envSecret, wantSub: "alice", wantRole: api.RoleViewer, wantTTL: 15 * time.Minute,
		},
		"data directory file": {
			args:       []string{"--data-dir", fileDir, "--ttl", "24h"},
			wantSecret: "file-secret-file-secret-file-secret!", wantSub: "admin", wantRole: api.RoleAdmin, wantTTL: 24 * time.Hour,
		},
		"data directory from env": {
			env:        env{"KEYBRAKE_DATA_DIR": fileDir},
			wantSecret: "file-secret-file-secret-file-secret!", wantSub: "admin", wantRole: api.RoleAdmin, wantTTL: time.Hour,
		},
		"30 days": {
			args:       []string{"--data-dir", fileDir, "--ttl", "720h"},
			wantSecret: "file-secret-file-secret-file-secret!", wantSub: "admin", wantRole: api.RoleAdmin, wantTTL: MaxTokenTTL,
		},
		"a year, on purpose": {
			args:       []string{"--data-dir", fileDir, "--ttl", "8760h", "--allow-long-ttl"},
			wantSecret: "file-secret-file-secret-file-secret!", wantSub: "admin", wantRole: api.RoleAdmin, wantTTL: 8760 * time.Hour,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out := MustRunCommand(t, tc.env, append([]string{"token"}, tc.args...)...)
			assertToken(t, []byte(tc.wantSecret), out, tc.wantSub, tc.wantRole, tc.wantTTL)
		})
	}

	refusals := map[string]struct {
		env  env
		args []string
	}{
		"no secret anywhere": {args: []string{"--data-dir", emptyDir}},
		"short secret":       {args: []string{"--jwt-secret", "short", "--data-dir", emptyDir}},
	}
	for name, tc := range refusals {
		t.Run(name, func(t *testing.T) {
			out, err := runCommand(tc.env, append([]string{"token"}, tc.args...)...)
			assert.Error(t, err)
			assert.Empty(t, out, "no token printed")
		})
	}
}

// token --link prints a sign-in link for a running server's dashboard: the token
// in the fragment, and a token the server accepts.
func TestTokenCommandPrintsASignInLink(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_link")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{})
	out := MustRunCommand(t, env{"KEYBRAKE_ADMIN_URL": m.AdminURL() + "/"}, "token", "--data-dir", dataDir, "--link", "--role", "viewer")
	link := strings.TrimSpace(out)
	prefix := m.AdminURL() + api.UIPath + "#token="
	require.True(t, strings.HasPrefix(link, prefix), link)
	token := strings.TrimPrefix(link, prefix)
	secret, err := os.ReadFile(filepath.Join(dataDir, jwtSecretFile))
	require.NoError(t, err)
	assertToken(t, secret, token, "admin", api.RoleViewer, time.Hour)
	status, _ := MustGet(t, m.AdminURL()+"/api/v1/overview", token)
	assert.Equal(t, http.StatusOK, status, "the server accepts the link's token")

	def := MustRunCommand(t, nil, "token", "--data-dir", dataDir, "--link")
	assert.True(t, strings.HasPrefix(def, "http://127.0.0.1:8081/ui/#token="), "the default admin listener: %s", def)
	_, err = runCommand(nil, "token", "--data-dir", dataDir, "--link", "--admin-url", "ftp://x")
	assert.ErrorContains(t, err, "admin-url")
}

func TestBackupOffline(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_backup")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	var want []string
	for _, name := range []string{"alpha", "beta", "gamma"} {
		k, _ := MustMintKey(t, m.Store(), name, 25)
		want = append(want, k.ID)
	}

	out := filepath.Join(t.TempDir(), "copy.db")
	_, err := runCommand(env{}, "backup", "--out", out, "--data-dir", dataDir, "--open-timeout", "200ms")
	require.Error(t, err, "the running server holds the database lock")
	assert.Contains(t, err.Error(), "--admin-url", "the error points at the online backup")
	assert.NoFileExists(t, out, "a failed backup leaves nothing behind")

	require.NoError(t, m.Close())
	stdout := MustRunCommand(t, env{}, "backup", "--out", out, "--data-dir", dataDir)
	assert.Contains(t, stdout, out)
	fi, err := os.Stat(out)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	leftovers, err := filepath.Glob(filepath.Join(filepath.Dir(out), ".copy.db.tmp-*"))
	require.NoError(t, err)
	assert.Empty(t, leftovers, "no temporary file left")

	s := MustOpenStore(t, out, MustMasterKey(t, dataDir))
	keys, next, err := s.ListKeys(context.Background(), vault.KeyFilter{})
	require.NoError(t, err)
	assert.Empty(t, next)
	var got []string
	for _, k := range keys {
		got = append(got, k.ID)
	}
	assert.ElementsMatch(t, want, got, "the copy holds the same keys")
	secret, err := s.UpstreamSecret(context.Background(), upstreamDefault)
	require.NoError(t, err)
	assert.Equal(t, fake.Secret, secret)

	_, err = runCommand(env{}, "backup", "--out", filepath.Join(dataDir, databaseFile), "--data-dir", dataDir)
	assert.ErrorContains(t, err, "database itself", "never overwrite the database with its own copy")
}

// An offline backup that cannot open the database says why: only a lock points
// at the online copy; a wrong master key is named as such.
func TestBackupWithAnotherMasterKeySaysSo(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_backup")
	dataDir := t.TempDir()
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret})
	require.NoError(t, m.Close())

	other := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	out := filepath.Join(t.TempDir(), "copy.db")
	_, err := runCommand(env{envMasterKey: other}, "backup", "--out", out, "--data-dir", dataDir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "sealed with another master key")
	assert.NotContains(t, err.Error(), "--admin-url", "no server runs: the online copy is no way out")
	assert.NoFileExists(t, out)
}

func TestBackupWithoutMasterKeyFails(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, databaseFile), nil, 0o600))
	_, err := runCommand(env{}, "backup", "--out", filepath.Join(t.TempDir(), "x.db"), "--data-dir", dataDir)
	assert.ErrorContains(t, err, "master key")
}

func TestDerivePublicURL(t *testing.T) {
	t.Parallel()
	tests := map[string]struct{ addr, want string }{
		"all interfaces, no host": {":8080", "http://localhost:8080"},
		"ipv4 unspecified":        {"0.0.0.0:8080", "http://localhost:8080"},
		"ipv6 unspecified":        {"[::]:8080", "http://localhost:8080"},
		"loopback":                {"127.0.0.1:8080", "http://127.0.0.1:8080"},
		"host name":               {"keybrake.internal:8080", "http://keybrake.internal:8080"},
		"ipv6 address":            {"[fd00::1]:8080", "http://[fd00::1]:8080"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, derivePublicURL(tc.addr, false))
			assert.Equal(t, "https"+strings.TrimPrefix(tc.want, "http"), derivePublicURL(tc.addr, true), "with TLS")
		})
	}
}

func TestCloseWithoutRunAndTwice(t *testing.T) {
	t.Parallel()
	tm := NewTestMain(nil)
	require.NoError(t, tm.ParseFlags(context.Background(), []string{"serve"}))
	assert.NoError(t, tm.Close())
	assert.NoError(t, tm.Close())
}

func TestServeRefusesATakenPort(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })

	dataDir := t.TempDir()
	tm := NewTestMain(nil)
	ctx := context.Background()
	require.NoError(t, tm.ParseFlags(ctx, []string{"serve", "--data-dir", dataDir,
		"--listen", "127.0.0.1:0", "--admin-listen", ln.Addr().String()}))
	err = tm.Run(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "admin listen")
	require.NoError(t, tm.Close(), "a failed start releases what it opened")

	// The store was closed: it opens again at once.
	s := MustOpenStore(t, filepath.Join(dataDir, databaseFile), MustMasterKey(t, dataDir))
	_, _, err = s.ListKeys(ctx, vault.KeyFilter{})
	assert.NoError(t, err)
}

// postForm POSTs a form to the proxy with a vault key and an idempotency key.
func postForm(ctx context.Context, client *http.Client, u, vaultKey, idemKey string, form url.Values) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+vaultKey)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func TestStripeSecretKeyOnlyReplacesWhenItChanged(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_envfirst")
	dataDir := t.TempDir()
	ctx := context.Background()
	start := func(secret string) testMain {
		t.Helper()
		m := MustServe(t, dataDir, fake.URL, env{envStripeKey: secret}, "--log-level", "info")
		return m
	}
	secretOf := func(m testMain) string {
		t.Helper()
		s, err := m.Store().UpstreamSecret(ctx, upstreamDefault)
		require.NoError(t, err)
		return s
	}

	m := start("sk_test_envfirst")
	assert.Contains(t, m.stderr.String(), "upstream registered from the environment")
	// An admin replaces the secret through the API.
	_, _, err := m.Store().PutUpstream(ctx, "alice", upstreamDefault, "stripe", "sk_test_adminset")
	require.NoError(t, err)
	require.NoError(t, m.Close())

	m = start("sk_test_envfirst") // the same environment: the admin's secret stays
	assert.Equal(t, "sk_test_adminset", secretOf(m))
	assert.Contains(t, m.stderr.String(), "is unchanged since the last start")
	require.NoError(t, m.Close())

	m = start("sk_test_envsecond") // a new value: it replaces, with a warning
	assert.Equal(t, "sk_test_envsecond", secretOf(m))
	logs := m.stderr.String()
	assert.Contains(t, logs, `"level":"WARN","msg":"the environment's value changed since the last start`)
	for _, secret := range []string{"sk_test_envfirst", "sk_test_adminset", "sk_test_envsecond"} {
		assert.NotContains(t, logs, secret, "no secret in the logs")
	}
}
