package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keybrake/keybrake/cmd/internal/loopback"
	"github.com/keybrake/keybrake/proxy/logfield"
)

// certReloader serves a certificate and key read from files, and reads them again
// when they change (checked at most every `every`, during handshakes) or when
// Reload is called (SIGHUP). A new certificate applies to new connections;
// connections already open keep theirs, so nothing is dropped. Files that do not
// load (a renewal half written, a key that does not match) leave the current
// certificate in place and are tried again at the next check.
type certReloader struct {
	name              string // the listener, for logs
	certFile, keyFile string
	every             time.Duration
	log               *slog.Logger

	cert atomic.Pointer[tls.Certificate]

	mu        sync.Mutex // serializes checks and loads
	stamp     fileStamp  // of the files the current certificate came from
	lastCheck time.Time
}

// fileStamp identifies a version of the certificate and key files.
type fileStamp struct {
	certMod, keyMod   time.Time
	certSize, keySize int64
}

// newCertReloader loads the pair once; an error here stops the start.
func newCertReloader(name, certFile, keyFile string, every time.Duration, log *slog.Logger) (*certReloader, error) {
	r := &certReloader{name: name, certFile: certFile, keyFile: keyFile, every: every, log: log, lastCheck: time.Now()}
	if err := r.load(); err != nil {
		return nil, fmt.Errorf("%s TLS: %w", name, err)
	}
	return r, nil
}

// stampFiles stats both files.
func (r *certReloader) stampFiles() (fileStamp, error) {
	c, err := os.Stat(r.certFile)
	if err != nil {
		return fileStamp{}, err
	}
	k, err := os.Stat(r.keyFile)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{certMod: c.ModTime(), keyMod: k.ModTime(), certSize: c.Size(), keySize: k.Size()}, nil
}

// load reads the pair and makes it current. The caller holds mu (or is the
// constructor).
func (r *certReloader) load() error {
	st, err := r.stampFiles()
	if err != nil {
		return fmt.Errorf("certificate files: %w", err)
	}
	pair, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("load certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	if pair.Leaf == nil {
		return errors.New("certificate has no leaf")
	}
	now := time.Now()
	if now.After(pair.Leaf.NotAfter) {
		// Clients refuse an expired certificate: it never replaces one they
		// still accept. At start there is none to keep, and serving says so
		// in every failing handshake.
		if cur := r.cert.Load(); cur != nil && !now.After(cur.Leaf.NotAfter) {
			return fmt.Errorf("the certificate %s has expired (not after %s): the current one, valid until %s, is kept",
				r.certFile, pair.Leaf.NotAfter.UTC().Format(time.RFC3339), cur.Leaf.NotAfter.UTC().Format(time.RFC3339))
		}
		r.log.Warn("the TLS certificate has expired", "listener", r.name, "not_after", pair.Leaf.NotAfter)
	}
	r.cert.Store(&pair)
	r.stamp = st
	return nil
}

// Reload reads the files now, whether or not they changed.
func (r *certReloader) Reload(trigger string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastCheck = time.Now()
	if err := r.load(); err != nil {
		r.log.Warn("TLS certificate not reloaded; keeping the current one", "listener", r.name, "trigger", trigger, logfield.Error, err)
		return fmt.Errorf("%s TLS: %w", r.name, err)
	}
	r.logLoaded(trigger)
	return nil
}

func (r *certReloader) logLoaded(trigger string) {
	leaf := r.cert.Load().Leaf
	r.log.Info("TLS certificate reloaded", "listener", r.name, "trigger", trigger,
		"subject", leaf.Subject.String(), "not_after", leaf.NotAfter)
}

// GetCertificate implements tls.Config.GetCertificate.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.maybeReload()
	return r.cert.Load(), nil
}

// maybeReload reloads when the files changed since the last load, checking at
// most every r.every. A handshake never waits for another one's check.
func (r *certReloader) maybeReload() {
	if !r.mu.TryLock() {
		return
	}
	defer r.mu.Unlock()
	now := time.Now()
	if now.Sub(r.lastCheck) < r.every {
		return
	}
	r.lastCheck = now
	st, err := r.stampFiles()
	if err != nil || st == r.stamp {
		return // a file missing for a moment (replaced by rename) is checked again later
	}
	if err := r.load(); err != nil {
		r.log.Warn("TLS certificate files changed but do not load; keeping the current certificate",
			"listener", r.name, logfield.Error, err)
		return
	}
	r.logLoaded("files changed")
}

// tlsConfig is the server configuration of a listener: TLS 1.2 or later, the
// certificate from r. Go's default cipher suites and curves apply.
func (r *certReloader) tlsConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
}

// ReloadTLS reads the certificate files of both listeners again (SIGHUP). It
// returns the errors of the pairs that did not load; they keep their current
// certificate.
func (m *Main) ReloadTLS() error {
	var errs []error
	for _, r := range []*certReloader{m.proxyTLS, m.adminTLS} {
		if r != nil {
			errs = append(errs, r.Reload("SIGHUP"))
		}
	}
	return errors.Join(errs...)
}

// exposedWithoutTLS reports whether a plain-HTTP listener bound to addr can be
// reached from other machines: any address that is not loopback, the unspecified
// one (":8080", "0.0.0.0") included.
func exposedWithoutTLS(addr net.Addr) bool {
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return true
	}
	return !loopback.Host(host)
}
