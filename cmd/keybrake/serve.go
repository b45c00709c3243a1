package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keybrake/keybrake/api"
	"github.com/keybrake/keybrake/api/webhooks"
	"github.com/keybrake/keybrake/cmd/internal/loopback"
	"github.com/keybrake/keybrake/proxy"
	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/bolt"
	"github.com/keybrake/keybrake/vault/postgres"
)

// actorSystem names the program itself in the audit log.
const actorSystem = "system"

// upstreamDefault is the upstream STRIPE_SECRET_KEY registers.
const upstreamDefault = "default"

// forcedCloseGrace bounds how long Close waits, after it closed the connections of
// requests that outlived ShutdownTimeout, for their handlers to return before it
// closes the store under them.
const forcedCloseGrace = 5 * time.Second

// runServe opens the store, builds the handlers, binds both listeners and starts
// serving. On error, Close releases whatever was set up.
func (m *Main) runServe(ctx context.Context) error {
	cfg := m.Config
	logger, err := newLogger(m.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	m.logger = logger
	log := logger.With(logfield.Component, "main")
	// The first words on the screen, before the store opens: a first run has
	// shown nothing while it compiled.
	fmt.Fprintf(m.Stderr, "keybrake %s: starting; the store is %s\n", Version(), m.storeName())

	masterKey, masterSrc, err := m.loadMasterKey(log)
	if err != nil {
		return err
	}

	upstreamURL, err := url.Parse(cfg.StripeURL)
	if err != nil {
		return fmt.Errorf("stripe url: %w", err)
	}
	if upstreamURL.Scheme == "http" && !loopback.Host(upstreamURL.Hostname()) {
		log.Warn("the upstream is plain HTTP on a non-loopback host: the Stripe secret travels unencrypted", "stripe_url", cfg.StripeURL)
	}

	// One registry for the whole program, handed to every component.
	registry := prometheus.NewRegistry()
	m.metrics, err = api.NewMetrics(registry, buildVersion())
	if err != nil {
		return err
	}

	store, err := m.openStore(ctx, masterKey, masterSrc, log)
	if err != nil {
		return err
	}
	m.store = store
	// The JWT secret is generated only once the store opened: a start that
	// fails (a restored database with the wrong master key) leaves nothing
	// behind in the data directory.
	jwtSecret, jwtSrc, err := loadOrGenerateSecret(jwtSecretSpec, m.Getenv, cfg.DataDir, log)
	if err != nil {
		return fmt.Errorf("jwt secret: %w", err)
	}
	log.Info("secrets loaded", "master_key", masterSrc, "jwt_secret", jwtSrc)
	if err := m.metrics.WatchStore(store, logger.With(logfield.Component, "metrics")); err != nil {
		return err
	}

	if cfg.Demo {
		if upstreamURL, err = m.startDemo(ctx, log); err != nil {
			return err
		}
	} else if secret := m.Getenv(envStripeKey); secret != "" {
		if err := m.registerDefaultUpstream(ctx, log, secret); err != nil {
			return err
		}
	}

	stripe, err := proxy.New(proxy.Config{
		Now:             m.processNow,
		Store:           store,
		Upstream:        upstreamURL,
		UpstreamTimeout: cfg.UpstreamTimeout,
		Logger:          logger,
		Registerer:      registry,
	})
	if err != nil {
		return fmt.Errorf("build proxy: %w", err)
	}
	m.stripe = stripe

	if cfg.TLSCert != "" {
		if m.proxyTLS, err = newCertReloader("proxy", cfg.TLSCert, cfg.TLSKey, cfg.TLSReloadCheck, log); err != nil {
			return err
		}
	}
	if cfg.AdminTLSCert != "" {
		if m.adminTLS, err = newCertReloader("admin", cfg.AdminTLSCert, cfg.AdminTLSKey, cfg.TLSReloadCheck, log); err != nil {
			return err
		}
	}

	var lc net.ListenConfig
	m.proxyLn, err = lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	m.adminLn, err = lc.Listen(ctx, "tcp", cfg.AdminListen)
	if err != nil {
		return fmt.Errorf("admin listen %s: %w", cfg.AdminListen, err)
	}
	if err := m.startPprof(ctx); err != nil {
		return err
	}
	m.publicURL = cfg.PublicURL
	if m.publicURL == "" {
		m.publicURL = derivePublicURL(m.proxyLn.Addr().String(), m.proxyTLS != nil)
	}
	if m.proxyTLS == nil && exposedWithoutTLS(m.proxyLn.Addr()) {
		log.Warn("the proxy listens beyond this machine without TLS: vault keys travel in clear; set --tls-cert and --tls-key, or terminate TLS in front of keybrake",
			"listen", m.proxyLn.Addr().String())
	}
	if m.adminTLS == nil && exposedWithoutTLS(m.adminLn.Addr()) {
		log.Warn("the admin API listens beyond this machine without TLS: admin tokens travel in clear; set --admin-tls-cert and --admin-tls-key, or keep it on 127.0.0.1",
			"admin_listen", m.adminLn.Addr().String())
	}

	proxyHandler := api.NewProxyListener(api.ProxyConfig{
		Now:            m.processNow,
		MaxClockOffset: cfg.MaxClockOffset,
		Store:          store,
		Logger:         logger,
		Stripe:         stripe,
		Version:        buildVersion(),
		IdempotencyTTL: cfg.IdempotencyTTL,
	})
	adminHandler := api.NewAdmin(api.AdminConfig{
		Now:            m.processNow,
		MaxClockOffset: cfg.MaxClockOffset,
		Store:          store,
		Logger:         logger,
		JWTSecret:      jwtSecret,
		PublicURL:      m.publicURL,
		Metrics:        registry,
		Stripe:         stripe,
		Demo:           cfg.Demo,

		WebhookAllowPrivate: cfg.WebhookAllowPrivate,
	})
	if cfg.Demo {
		proxyHandler, adminHandler = demoHeaders(proxyHandler), demoHeaders(adminHandler)
	}

	m.proxySrv = m.newServer(proxyHandler, cfg.ProxyWriteTimeout(), m.proxyTLS)
	m.adminSrv = m.newServer(adminHandler, cfg.AdminWriteTimeout, m.adminTLS)
	m.startServing(ctx)

	serving := []any{
		"version", Version(),
		"proxy", m.proxyLn.Addr().String(),
		"admin", m.adminLn.Addr().String(),
		"public_url", m.publicURL,
		"proxy_tls", m.proxyTLS != nil,
		"admin_tls", m.adminTLS != nil,
		"stripe_url", upstreamURL.String(),
		"demo", cfg.Demo,
		"data_dir", cfg.DataDir,
	}
	if m.pprofLn != nil {
		serving = append(serving, "pprof", m.pprofLn.Addr().String())
	}
	log.Info("keybrake serving", serving...)
	m.bootstrapBanner(ctx, log, jwtSecret)
	return nil
}

// loadMasterKey creates the data directory and returns the master key and where
// it came from: the environment, else the data directory, else freshly
// generated into it. A master key is generated only for a new database: a
// database without its key (a backup restored without master.key) is refused,
// and nothing is generated. The JWT secret is loaded the same way, once the
// store opened (runServe).
func (m *Main) loadMasterKey(log *slog.Logger) (masterKey []byte, masterSrc secretSource, err error) {
	dir := m.Config.DataDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", fmt.Errorf("create data directory: %w", err)
	}
	masterKey, masterSrc, err = loadSecret(masterKeySpec, m.Getenv, dir, log)
	if errors.Is(err, errNoSecret) {
		dbPath := filepath.Join(dir, databaseFile)
		if fi, serr := os.Stat(dbPath); serr == nil && fi.Size() > 0 {
			return nil, "", fmt.Errorf("%s exists, but there is no master key (%s is unset and %s is missing): "+
				"the database was sealed with a master key that is not here, and a new one would not open it. "+
				"A restored backup needs the master key of the server it was taken from: set %s to it, or write it to %s (mode 0600)",
				dbPath, envMasterKey, filepath.Join(dir, masterKeyFile), envMasterKey, filepath.Join(dir, masterKeyFile))
		}
		masterKey, masterSrc, err = loadOrGenerateSecret(masterKeySpec, m.Getenv, dir, log)
	}
	if err != nil {
		return nil, "", fmt.Errorf("master key: %w", err)
	}
	return masterKey, masterSrc, nil
}

// openStore opens the store the configuration names: PostgreSQL with
// --database-url, else bbolt in the data directory.
func (m *Main) openStore(ctx context.Context, masterKey []byte, masterSrc secretSource, log *slog.Logger) (vault.Store, error) {
	cfg := m.Config
	if cfg.DatabaseURL != "" {
		store, err := postgres.Open(ctx, cfg.DatabaseURL, postgres.Options{
			ProcessNow:      m.processNow,
			MasterKey:       masterKey,
			IdempotencyTTL:  cfg.IdempotencyTTL,
			LedgerRetention: cfg.LedgerRetention,
			Lease:           cfg.Lease(),
			Logger:          m.logger, // each package adds its own "component"
			CommitObserver:  m.metrics.ObserveCommit,
		})
		if err != nil {
			return nil, openPostgresError(redactedDatabaseURL(cfg.DatabaseURL), masterSrc, err)
		}
		log.Info("store opened", "store", "postgres", "database", redactedDatabaseURL(cfg.DatabaseURL))
		return store, nil
	}
	dbPath := filepath.Join(cfg.DataDir, databaseFile)
	if fi, err := os.Stat(dbPath); err == nil && fi.Size() == 0 && masterSrc == sourceFile {
		// bbolt would make a new, empty vault in it: every key, cap and
		// record of the one master.key was made for would be gone unseen.
		return nil, fmt.Errorf("%s is empty (0 bytes), but %s shows that a vault was created here: refusing to start a new, empty vault in its place. "+
			"Restore the database from a backup (keybrake check --file BACKUP first). Only if this data directory never served, delete the empty file: %w",
			dbPath, filepath.Join(cfg.DataDir, masterKeyFile), vault.ErrDamaged)
	}
	store, err := bolt.Open(dbPath, bolt.Options{
		CheckPages:      true,
		MasterKey:       masterKey,
		IdempotencyTTL:  cfg.IdempotencyTTL,
		LedgerRetention: cfg.LedgerRetention,
		Lease:           cfg.Lease(),
		Logger:          m.logger,
		OpenTimeout:     cfg.OpenTimeout,
		CommitObserver:  m.metrics.ObserveCommit,
	})
	if err != nil {
		return nil, openStoreError(dbPath, masterSrc, err)
	}
	return store, nil
}

// openPostgresError is openStoreError for the PostgreSQL store at db (its URL
// without the password).
func openPostgresError(db string, masterSrc secretSource, err error) error {
	switch {
	case errors.Is(err, vault.ErrSealed):
		return fmt.Errorf("the PostgreSQL store %s was created with another master key than this replica's (from %s): "+
			"every replica of one store needs the same %s: %w", db, masterSrc, envMasterKey, err)
	case errors.Is(err, vault.ErrSchemaVersion):
		return fmt.Errorf("the PostgreSQL store %s was migrated by a newer keybrake: run that version on every replica: %w", db, err)
	}
	return fmt.Errorf("open the PostgreSQL store %s: %w", db, err)
}

// openStoreError turns the store's refusal to open into what the operator should
// do about it.
func openStoreError(dbPath string, masterSrc secretSource, err error) error {
	switch {
	case errors.Is(err, vault.ErrSealed):
		from := envMasterKey
		if masterSrc != sourceEnv {
			from = filepath.Join(filepath.Dir(dbPath), masterKeyFile)
		}
		return fmt.Errorf("%s was sealed with another master key than the one in %s: supply the key it was created with, in %s or %s "+
			"(a restored backup needs the master key of the server it came from; after an interrupted keybrake rekey, the new key): %w",
			dbPath, from, envMasterKey, filepath.Join(filepath.Dir(dbPath), masterKeyFile), err)
	case errors.Is(err, vault.ErrLocked):
		return fmt.Errorf("another keybrake process holds %s (its file lock): stop it, or give this one another --data-dir: %w", dbPath, err)
	case errors.Is(err, vault.ErrSchemaVersion):
		return fmt.Errorf("%s was written by a newer keybrake: run that version, or restore a backup taken before the upgrade: %w", dbPath, err)
	case errors.Is(err, vault.ErrDamaged), errors.Is(err, vault.ErrMigrated):
		return err // the message names the file and what to do
	}
	return fmt.Errorf("open store %s: %w", dbPath, err)
}

// startServing starts both servers on their bound listeners and the reaper. A
// server that stops with an error reports it to Wait.
func (m *Main) startServing(ctx context.Context) {
	m.serveErr = make(chan error, 2)
	for _, s := range []struct {
		name string
		srv  *http.Server
		ln   net.Listener
	}{{"proxy", m.proxySrv, m.proxyLn}, {"admin", m.adminSrv, m.adminLn}} {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			serve := s.srv.Serve
			if s.srv.TLSConfig != nil {
				// The certificate comes from TLSConfig.GetCertificate.
				serve = func(ln net.Listener) error { return s.srv.ServeTLS(ln, "", "") }
			}
			if err := serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				m.serveErr <- fmt.Errorf("%s server: %w", s.name, err)
			}
		}()
	}

	reapCtx, stopReap := context.WithCancel(context.WithoutCancel(ctx))
	m.stopReap = stopReap
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.reap(reapCtx, m.logger.With(logfield.Component, "reaper"))
	}()
	// The deliverer of webhooks out stops with the reaper: an attempt under
	// way finishes (15 s at most) and records its outcome.
	deliverer := &webhooks.Deliverer{
		Store:     m.store,
		Log:       m.logger.With(logfield.Component, "webhooks"),
		Client:    webhooks.NewClient(webhooks.Guard{AllowPrivate: m.Config.WebhookAllowPrivate}),
		UserAgent: "keybrake-webhooks/" + buildVersion(),
		Observe:   m.metrics.ObserveDelivery,
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		deliverer.Run(reapCtx)
	}()
}

// newServer returns the server of one listener: h, tracked for Close, with the
// configured timeouts, over TLS when certs is set. Requests do not inherit Run's
// ctx: cancelling it starts a graceful shutdown in which in-flight requests
// finish, so their contexts must outlive it.
func (m *Main) newServer(h http.Handler, writeTimeout time.Duration, certs *certReloader) *http.Server {
	srv := &http.Server{
		Handler:           m.inflight.track(h),
		ReadHeaderTimeout: m.Config.ReadHeaderTimeout,
		ReadTimeout:       m.Config.ReadTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       m.Config.IdleTimeout,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(m.logger.With(logfield.Component, "http").Handler(), slog.LevelWarn),
	}
	if certs != nil {
		srv.TLSConfig = certs.tlsConfig()
	}
	return srv
}

// registerDefaultUpstream registers STRIPE_SECRET_KEY as the upstream "default"
// when there is none or when the value changed since the last start (the store
// keeps a salted fingerprint of it, never the value). An unchanged environment
// leaves the upstream as it is, so a secret an admin changed through the API
// survives a restart; a changed one replaces it, with a warning.
func (m *Main) registerDefaultUpstream(ctx context.Context, log *slog.Logger, secret string) error {
	up, action, err := m.store.SyncEnvUpstream(ctx, actorSystem, upstreamDefault, "stripe", secret)
	if err != nil {
		return fmt.Errorf("register upstream %s from %s: %w", upstreamDefault, envStripeKey, err)
	}
	attrs := []any{logfield.Upstream, up.Name, logfield.SecretLast4, up.SecretLast4, "variable", envStripeKey}
	switch action {
	case vault.EnvUpstreamRegistered:
		log.Info("upstream registered from the environment", attrs...)
	case vault.EnvUpstreamReplaced:
		log.Warn("the environment's value changed since the last start: it replaced the registered upstream secret", attrs...)
	case vault.EnvUpstreamKept:
		log.Info("the environment's value is unchanged since the last start: the registered upstream is kept as it is", attrs...)
	}
	return nil
}

// bootstrapBanner prints where keybrake serves to Stderr and, while the store
// holds no vault key yet, a short-lived admin token and a dashboard sign-in
// link that carries it, so a new user can log in at once. It goes to Stderr
// directly, not through the logger, so it does not land in log pipelines as a
// structured record.
func (m *Main) bootstrapBanner(ctx context.Context, log *slog.Logger, jwtSecret []byte) {
	keys, _, err := m.store.ListKeys(ctx, vault.KeyFilter{Limit: 1})
	if err != nil {
		log.Warn("cannot tell whether this is a first start", logfield.Error, err)
		return
	}
	if len(keys) > 0 {
		fmt.Fprintf(m.Stderr, `%s
keybrake is serving.
  Dashboard:             %s
  Proxy for Stripe SDKs: %s
  Sign in with the link: %s

`, m.demoBanner(), m.AdminURL()+api.UIPath, m.publicURL, m.linkHint())
		return
	}
	if pg, ok := m.store.(*postgres.Store); ok && !pg.CreatedSchema() {
		// Replicas starting together on an empty database: the one that
		// created the schema prints the token, the others do not repeat it.
		log.Info("no vault keys yet; the replica that created the schema printed the first-start admin token (keybrake token issues another)")
		return
	}
	ttl := m.Config.BootstrapTokenTTL
	token, err := api.IssueToken(jwtSecret, "bootstrap", api.RoleAdmin, ttl, time.Now())
	if err != nil {
		log.Warn("cannot issue the first-start admin token", logfield.Error, err)
		return
	}
	dashboard := m.AdminURL() + api.UIPath
	fmt.Fprintf(m.Stderr, `%s
keybrake: no vault keys yet. An admin token, valid for %s:

    %s

  Dashboard:             %s
  Sign-in link:          %s
  Admin API:             %s/api/v1
  Proxy for Stripe SDKs: %s

Mint more tokens with: %s
A sign-in link later:  %s

`, m.demoBanner(), ttl, token, dashboard, signInLink(m.AdminURL(), token), m.AdminURL(), m.publicURL, m.tokenHint(), m.linkHint())
}

// linkHint is the command that prints a sign-in link for this server's dashboard.
func (m *Main) linkHint() string {
	h := strings.Replace(m.tokenHint(), "keybrake token --role admin", "keybrake token --link", 1)
	if def := listenerURL(DefaultConfig().AdminListen, "127.0.0.1", false); m.AdminURL() != def {
		h = strings.Replace(h, "keybrake token --link", "keybrake token --link --admin-url "+m.AdminURL(), 1)
	}
	return h
}

// storeName says which store serve opens, for the first line it prints.
func (m *Main) storeName() string {
	if m.Config.DatabaseURL != "" {
		return "PostgreSQL at " + redactedDatabaseURL(m.Config.DatabaseURL)
	}
	return filepath.Join(m.Config.DataDir, databaseFile)
}

// tokenHint is the command that mints more admin tokens for this server: token
// reads the JWT secret where serve did — the environment first, else the data
// directory.
func (m *Main) tokenHint() string {
	if m.Getenv(envJWTSecret) != "" {
		return "keybrake token --role admin, with this server's " + envJWTSecret + " in its environment"
	}
	return "keybrake token --role admin --data-dir " + m.Config.DataDir
}

// reap removes expired idempotency records and counters now and then every
// ReapInterval, until ctx ends.
func (m *Main) reap(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(m.Config.ReapInterval)
	defer t.Stop()
	for {
		n, err := m.store.Reap(ctx)
		if ctx.Err() == nil {
			m.metrics.ObserveReap(n, err)
		}
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("reap failed", logfield.Error, err)
		case n > 0:
			log.Info("reaped expired entries", "removed", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// close is Close's body.
func (m *Main) close() error {
	var errs []error
	log := slog.New(slog.DiscardHandler)
	if m.logger != nil {
		log = m.logger.With(logfield.Component, "main")
	}
	if m.proxySrv != nil || m.adminSrv != nil {
		log.Info("shutting down", "timeout", m.Config.ShutdownTimeout.String())
	}

	// Stop accepting and let in-flight requests finish, both servers at once.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), m.Config.ShutdownTimeout)
	var swg sync.WaitGroup
	var mu sync.Mutex
	for _, s := range []struct {
		name string
		srv  *http.Server
	}{{"proxy", m.proxySrv}, {"admin", m.adminSrv}} {
		if s.srv == nil {
			continue
		}
		swg.Add(1)
		go func() {
			defer swg.Done()
			err := s.srv.Shutdown(shutdownCtx)
			if err == nil {
				return
			}
			log.Warn("requests outlived the shutdown timeout; closing their connections", "server", s.name)
			if cerr := s.srv.Close(); cerr != nil {
				err = errors.Join(err, cerr)
			}
			mu.Lock()
			errs = append(errs, fmt.Errorf("shut down %s server: %w", s.name, err))
			mu.Unlock()
		}()
	}
	swg.Wait()
	cancel()
	// Listeners bound but never served (Run failed half way) are closed here.
	for _, ln := range []net.Listener{m.proxyLn, m.adminLn} {
		if ln != nil {
			_ = ln.Close()
		}
	}
	// Handlers whose connections were closed may still be settling with the store.
	if !m.inflight.wait(forcedCloseGrace) {
		errs = append(errs, errors.New("handlers still running after shutdown"))
	}

	if m.stripe != nil {
		// The refusals of revoked keys counted since the last write.
		flushCtx, cancel := context.WithTimeout(context.Background(), forcedCloseGrace)
		m.stripe.Shutdown(flushCtx)
		cancel()
	}
	if m.pprofSrv != nil {
		_ = m.pprofSrv.Close() // a profile being taken is cut short
	}
	if m.demoStripe != nil {
		m.demoStripe.Close()
	}
	if m.stopReap != nil {
		m.stopReap()
	}
	m.wg.Wait()

	if m.store != nil {
		if err := m.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		} else {
			log.Info("store closed")
		}
	}
	return errors.Join(errs...)
}

// ProxyURL is the bound proxy listener's URL, dialable from this machine ("" before
// Run).
func (m *Main) ProxyURL() string {
	if m.proxyLn == nil {
		return ""
	}
	return dialableURL(m.proxyLn.Addr(), m.proxyTLS != nil)
}

// AdminURL is the bound admin listener's URL, dialable from this machine ("" before
// Run).
func (m *Main) AdminURL() string {
	if m.adminLn == nil {
		return ""
	}
	return dialableURL(m.adminLn.Addr(), m.adminTLS != nil)
}

// PublicURL is the proxy base URL handed out with minted keys (--public-url, or
// derived from the bound proxy address).
func (m *Main) PublicURL() string { return m.publicURL }

// Store is the open store while serving (nil otherwise); for tests and embedders.
func (m *Main) Store() vault.Store { return m.store }

// inflight counts handlers that are running, so Close can wait for the ones whose
// connections it had to close before it closes the store under them.
type inflight struct {
	mu sync.Mutex
	n  int
}

// track wraps h so that its running calls are counted.
func (f *inflight) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.n++
		f.mu.Unlock()
		defer func() {
			f.mu.Lock()
			f.n--
			f.mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
}

// wait polls until no handler runs (true) or d has passed (false).
func (f *inflight) wait(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		f.mu.Lock()
		n := f.n
		f.mu.Unlock()
		if n == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processNow is this process's own clock: the wall clock, shifted by
// --unsafe-clock-skew under test. It times requests, stamps the admin tokens
// and is what the PostgreSQL store measures the database's clock against;
// no decision about a key or money is made by it.
func (m *Main) processNow() time.Time { return time.Now().Add(m.Config.UnsafeClockSkew) }
