package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v84"

	"github.com/keybrake/keybrake/proxy/proxytest"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

// MustTestCA makes a CA whose name carries name.
func MustTestCA(tb testing.TB, name string) *testCA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name + " test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(tb, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(tb, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// MustLeaf writes a certificate for 127.0.0.1 and localhost, signed by the CA, and
// its key to certPath and keyPath (replacing them atomically, as a renewal tool
// does), and returns the certificate's serial number.
func (ca *testCA) MustLeaf(tb testing.TB, certPath, keyPath string, serial int64) {
	tb.Helper()
	ca.MustLeafUntil(tb, certPath, keyPath, serial, time.Now().Add(24*time.Hour))
}

// MustLeafUntil is MustLeaf for a certificate valid until notAfter.
func (ca *testCA) MustLeafUntil(tb testing.TB, certPath, keyPath string, serial int64, notAfter time.Time) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "keybrake test"},
		NotBefore:    notAfter.Add(-48 * time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(tb, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(tb, err)
	mustReplaceFile(tb, keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	mustReplaceFile(tb, certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// MustTwoCAs makes two CAs, to renew a certificate from one to the other, and a
// pool that trusts both.
func MustTwoCAs(tb testing.TB) (a, b *testCA, both *x509.CertPool) {
	tb.Helper()
	a, b = MustTestCA(tb, "A"), MustTestCA(tb, "B")
	both = x509.NewCertPool()
	both.AddCert(a.cert)
	both.AddCert(b.cert)
	return a, b, both
}

// mustReplaceFile writes data beside path and renames it over path.
func mustReplaceFile(tb testing.TB, path string, data []byte) {
	tb.Helper()
	tmp := path + ".new"
	require.NoError(tb, os.WriteFile(tmp, data, 0o600))
	require.NoError(tb, os.Rename(tmp, path))
}

// tlsClient trusts only pool and opens a new connection for every request when
// fresh is set.
func tlsClient(pool *x509.CertPool, fresh bool) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: fresh}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// servedSerial GETs /healthz and returns the serial of the certificate the
// connection presented.
func servedSerial(tb testing.TB, client *http.Client, base string) int64 {
	tb.Helper()
	resp, err := client.Get(base + "/healthz")
	require.NoError(tb, err)
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body) // read to the end, so the connection is reused
	require.NoError(tb, err)
	require.Equal(tb, http.StatusOK, resp.StatusCode)
	require.NotNil(tb, resp.TLS)
	return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
}

func TestServeOverTLS(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_tls")
	dir := t.TempDir()
	ca := MustTestCA(t, "serve")
	proxyCert, proxyKey := filepath.Join(dir, "proxy.crt"), filepath.Join(dir, "proxy.key")
	adminCert, adminKey := filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")
	ca.MustLeaf(t, proxyCert, proxyKey, 10)
	ca.MustLeaf(t, adminCert, adminKey, 20)
	dataDir := filepath.Join(dir, "data")
	m := MustServe(t, dataDir, fake.URL, env{envStripeKey: fake.Secret},
		"--tls-cert", proxyCert, "--tls-key", proxyKey, "--admin-tls-cert", adminCert, "--admin-tls-key", adminKey,
		"--log-level", "info")

	require.True(t, strings.HasPrefix(m.ProxyURL(), "https://127.0.0.1:"), m.ProxyURL())
	require.True(t, strings.HasPrefix(m.AdminURL(), "https://127.0.0.1:"), m.AdminURL())
	assert.True(t, strings.HasPrefix(m.PublicURL(), "https://127.0.0.1:"), "public URL defaults to https: %s", m.PublicURL())
	client := tlsClient(ca.pool, true)
	assert.Equal(t, int64(10), servedSerial(t, client, m.ProxyURL()))
	assert.Equal(t, int64(20), servedSerial(t, client, m.AdminURL()), "each listener has its own pair")
	assert.NotContains(t, m.stderr.String(), "without TLS", "loopback listeners with TLS: no warning")

	// Mint over the admin listener's TLS, then charge with stripe-go pointed at
	// https://127.0.0.1:… trusting the test CA.
	token := strings.TrimSpace(MustRunCommand(t, env{}, "token", "--data-dir", dataDir))
	var minted struct {
		Token   string `json:"token"`
		BaseURL string `json:"base_url"`
	}
	mint := map[string]any{"name": "tls", "policy": map[string]any{"vendor": "stripe", "daily_cap": "50.00",
		"expires_at": time.Now().Add(48 * time.Hour).UTC().Format(time.RFC3339)}}
	require.Equal(t, http.StatusCreated, adminDoWith(t, client, http.MethodPost, m.AdminURL()+"/api/v1/keys", token, mint, &minted))
	assert.Equal(t, m.PublicURL(), minted.BaseURL)
	sc := stripe.NewClient(minted.Token, stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(minted.BaseURL),
		HTTPClient:        tlsClient(ca.pool, false),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
	ch, err := sc.V1Charges.Create(context.Background(), &stripe.ChargeCreateParams{
		Amount: stripe.Int64(1200), Currency: stripe.String("usd"),
		Source: &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
	})
	require.NoError(t, err)
	assert.Equal(t, int64(1200), ch.Amount)
	assert.Len(t, fake.Charges(), 1)

	// TLS 1.2 is the minimum; a client that offers only 1.1 is refused.
	addr := strings.TrimPrefix(m.ProxyURL(), "https://")
	_, err = tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.pool, MaxVersion: tls.VersionTLS11})
	assert.Error(t, err, "TLS 1.1 refused")
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.pool, MaxVersion: tls.VersionTLS12})
	require.NoError(t, err, "TLS 1.2 accepted")
	_ = conn.Close()

	// An untrusting client refuses the certificate: it really is the test CA's.
	_, err = tlsClient(x509.NewCertPool(), true).Get(m.ProxyURL() + "/healthz")
	assert.Error(t, err)
}

func TestTLSCertificateReloadKeepsConnections(t *testing.T) {
	t.Parallel()
	fake := proxytest.NewFakeStripe(t, "sk_test_tlsreload")
	dir := t.TempDir()
	caA, caB, both := MustTwoCAs(t)
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	caA.MustLeaf(t, certPath, keyPath, 1)

	tm := NewTestMain(env{envStripeKey: fake.Secret})
	ctx := context.Background()
	require.NoError(t, tm.ParseFlags(ctx, []string{"serve", "--data-dir", filepath.Join(dir, "data"),
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--stripe-url", fake.URL,
		"--tls-cert", certPath, "--tls-key", keyPath, "--log-level", "info"}))
	tm.Config.TLSReloadCheck = time.Hour // only ReloadTLS (SIGHUP) reloads at first
	t.Cleanup(func() { assert.NoError(t, tm.Close()) })
	require.NoError(t, tm.Run(ctx), "stderr: %s", tm.stderr)
	base := tm.ProxyURL()

	kept := tlsClient(both, false) // one keep-alive connection, opened before the renewal
	require.Equal(t, int64(1), servedSerial(t, kept, base))

	// Renewed files are not picked up before the next check or SIGHUP.
	caB.MustLeaf(t, certPath, keyPath, 2)
	assert.Equal(t, int64(1), servedSerial(t, tlsClient(both, true), base))
	require.NoError(t, tm.ReloadTLS())
	assert.Equal(t, int64(2), servedSerial(t, tlsClient(both, true), base), "new connections get the new certificate")
	assert.Equal(t, int64(1), servedSerial(t, kept, base), "the open connection was not dropped: it still speaks under the old one")
	assert.Contains(t, tm.stderr.String(), `"trigger":"SIGHUP"`)

	// Files that do not load keep the current certificate.
	require.NoError(t, os.WriteFile(keyPath, []byte("not a key"), 0o600))
	assert.Error(t, tm.ReloadTLS())
	assert.Equal(t, int64(2), servedSerial(t, tlsClient(both, true), base))
	assert.Contains(t, tm.stderr.String(), "TLS certificate not reloaded; keeping the current one")

	// An expired certificate does not replace a valid one, on SIGHUP or
	// when the files change, and the log says why.
	caA.MustLeafUntil(t, certPath, keyPath, 9, time.Now().Add(-time.Hour))
	require.ErrorContains(t, tm.ReloadTLS(), "expired")
	assert.Equal(t, int64(2), servedSerial(t, tlsClient(both, true), base), "the valid certificate is kept")
	assert.Contains(t, tm.stderr.String(), "has expired")

	// When the files change, a handshake after the check interval picks them up.
	tm.proxyTLS.mu.Lock()
	tm.proxyTLS.every = time.Millisecond
	tm.proxyTLS.mu.Unlock()
	caA.MustLeaf(t, certPath, keyPath, 3)
	assert.Eventually(t, func() bool { return servedSerial(t, tlsClient(both, true), base) == 3 },
		10*time.Second, 5*time.Millisecond, "reloaded when the files changed")
	assert.Contains(t, tm.stderr.String(), `"trigger":"files changed"`)
	assert.Equal(t, int64(1), servedSerial(t, kept, base), "still the first connection")
}

func TestServeRefusesBadTLSConfiguration(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	MustTestCA(t, "x").MustLeaf(t, certPath, keyPath, 1)

	_, err := runCommand(env{}, "serve", "--tls-cert", certPath)
	assert.ErrorContains(t, err, "--tls-cert and --tls-key: give both or neither")
	_, err = runCommand(env{}, "serve", "--admin-tls-key", keyPath)
	assert.ErrorContains(t, err, "--admin-tls-cert and --admin-tls-key")

	_, err = runCommand(env{}, "serve", "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--tls-cert", certPath, "--tls-key", certPath)
	assert.ErrorContains(t, err, "proxy TLS", "a certificate is not a key")
	_, err = runCommand(env{}, "serve", "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--admin-tls-cert", filepath.Join(dir, "missing.crt"), "--admin-tls-key", keyPath)
	assert.ErrorContains(t, err, "admin TLS")
}

func TestExposedWithoutTLS(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:8080":  false,
		"[::1]:8080":      false,
		"0.0.0.0:8080":    true,
		"[::]:8080":       true,
		"192.0.2.10:8080": true,
	} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		require.NoError(t, err)
		assert.Equal(t, want, exposedWithoutTLS(a), addr)
	}
}

// TestSIGHUPReloadsCertificates runs the real binary: main turns SIGHUP into a
// reload of the certificate files, and the process keeps serving.
func TestSIGHUPReloadsCertificates(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	bin := MustBuildBinary(t)
	dir := t.TempDir()
	caA, caB, both := MustTwoCAs(t)
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	caA.MustLeaf(t, certPath, keyPath, 1)

	c := startChild(t, bin, []string{"serve", "--data-dir", filepath.Join(dir, "data"),
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--stripe-url", "http://127.0.0.1:1",
		"--tls-cert", certPath, "--tls-key", keyPath, "--log-format", "json"}, childEnviron())
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.exited
	})
	base := "https://" + c.waitReady(t)
	// reloads waits until the child has logged n reloads on SIGHUP.
	reloads := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { return strings.Count(c.logs(), `"trigger":"SIGHUP"`) >= n },
			10*time.Second, 10*time.Millisecond, "reload %d is logged; logs:\n%s", n, c.logs())
	}
	// The moment serve says it is ready, a SIGHUP reloads: it no longer meets
	// the default action, which ends the process.
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGHUP))
	reloads(1)
	require.Equal(t, int64(1), servedSerial(t, tlsClient(both, true), base))

	caB.MustLeaf(t, certPath, keyPath, 2)
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGHUP))
	reloads(2)
	assert.Equal(t, int64(2), servedSerial(t, tlsClient(both, true), base), "serving the new certificate")

	require.NoError(t, c.signalAndWait(t, syscall.SIGTERM, 30*time.Second), "SIGHUP did not stop it; SIGTERM does, cleanly; logs:\n%s", c.logs())
	assert.False(t, c.raceSeen.Load(), "data race in the child:\n%s", c.logs())
}
