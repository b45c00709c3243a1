package proxy

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/keybrake/keybrake/proxy/logfield"
	"github.com/keybrake/keybrake/proxy/stripeapi"
	"github.com/keybrake/keybrake/vault"
)

// Who still sends a vault key that no longer works: step 1's refusals are
// kept where an operator looks during an incident. A revoked or expired key's
// are counted on the key in the store (Store.RecordKeyRefusal), so they
// survive a restart and every replica sees them; a token that is no key's is
// counted in this process only, since writing for every such request would let
// anyone with network access make the store write.
//
// A revoked token's holder must not make the store write at will either: a
// key's refusals are added up in memory and written at most once per key per
// refusalFlushInterval in each process (one RecordKeyRefusal carrying the
// count and the last request), and whatever is pending is written by Shutdown.

// refusalFlushInterval is how often at most a key's refusals are written.
const refusalFlushInterval = time.Second

// pendingRefusals adds up revoked or expired keys' refusals between writes.
type pendingRefusals struct {
	mu       sync.Mutex
	interval time.Duration
	byKey    map[string]vault.KeyRefusal
	timer    *time.Timer // armed while byKey is not empty
	armed    uint64      // counts the timers, so that a stopped one that fired anyway does nothing
	flushMu  sync.Mutex  // one flush at a time, so a key's writes keep their order
}

// UnknownKeyRefusals counts this process's refusals of a credential that is no
// vault key's (unknown, malformed, missing, a Stripe secret key), with the last one.
type UnknownKeyRefusals struct {
	Count      int64
	Since      time.Time // when this process started counting
	Last       time.Time
	RemoteAddr string
	Path       string
}

// unknownRefusals is the counter behind UnknownKeyRefusals.
type unknownRefusals struct {
	mu sync.Mutex
	UnknownKeyRefusals
}

// UnknownKeyRefusals returns this process's count of refused credentials that
// are no vault key's.
func (p *Proxy) UnknownKeyRefusals() UnknownKeyRefusals {
	p.unknown.mu.Lock()
	defer p.unknown.mu.Unlock()
	return p.unknown.UnknownKeyRefusals
}

// noteKeyRefusal records a refusal of step 1: the path for the log line (the
// request is not read any further), the key's name for it when the token is a
// known key's, and the count. A store that fails to count is logged, never
// the request's failure: the refusal stands either way.
func (p *Proxy) noteKeyRefusal(ctx context.Context, r *http.Request, c *call, kr *KeyRefusal) {
	if c.path == "" {
		c.path = r.URL.EscapedPath()
	}
	addr := remoteHost(r.RemoteAddr)
	c.keyRefused, c.remoteAddr = true, addr
	path := stripeapi.Clip(c.path)
	if c.key.ID == "" {
		p.unknown.mu.Lock()
		u := &p.unknown.UnknownKeyRefusals
		u.Count++
		u.Last, u.RemoteAddr, u.Path = p.store.Now(), addr, path // the store's clock, like every decision about a key
		p.unknown.mu.Unlock()
		return
	}
	pr := &p.refusals
	pr.mu.Lock()
	defer pr.mu.Unlock()
	n := pr.byKey[c.key.ID].Count
	pr.byKey[c.key.ID] = vault.KeyRefusal{Code: string(kr.Code), RemoteAddr: addr, Path: path, Count: n + 1}
	if pr.timer == nil {
		pr.armed++
		armed := pr.armed
		pr.timer = time.AfterFunc(pr.interval, func() {
			pr.mu.Lock()
			current := pr.armed == armed && pr.timer != nil
			pr.mu.Unlock()
			if current {
				p.FlushKeyRefusals(context.Background())
			}
		})
	}
}

// FlushKeyRefusals writes the refusals of revoked or expired keys counted
// since the last write, one RecordKeyRefusal per key. It runs on its own a
// second after a refusal, and Shutdown runs it. A store that fails to count is
// logged, never retried: the refusals stood either way.
func (p *Proxy) FlushKeyRefusals(ctx context.Context) {
	pr := &p.refusals
	pr.flushMu.Lock()
	defer pr.flushMu.Unlock()
	pr.mu.Lock()
	batch := pr.byKey
	pr.byKey = map[string]vault.KeyRefusal{}
	if pr.timer != nil {
		pr.timer.Stop()
		pr.timer = nil
	}
	pr.mu.Unlock()
	for id, r := range batch {
		if err := p.store.RecordKeyRefusal(ctx, id, r); err != nil {
			p.log.LogAttrs(ctx, slog.LevelWarn, "cannot count the refusals of a revoked or expired vault key",
				slog.String(logfield.KeyID, id), slog.Int64("refusals", r.Count), slog.Any(logfield.Error, err))
		}
	}
}

// Shutdown writes the pending refusals of revoked or expired keys
// (FlushKeyRefusals). Call it after the server stopped serving the proxy and
// before the store is closed; the Proxy keeps working after it.
func (p *Proxy) Shutdown(ctx context.Context) {
	p.FlushKeyRefusals(ctx)
}

// remoteHost is the host of a request's RemoteAddr, without its port.
func remoteHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// UpstreamURL is the base URL the proxy forwards to.
func (p *Proxy) UpstreamURL() string { return p.upstream.String() }
