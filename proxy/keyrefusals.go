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
	err := p.store.RecordKeyRefusal(ctx, c.key.ID, vault.KeyRefusal{Code: string(kr.Code), RemoteAddr: addr, Path: path})
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelWarn, "cannot count the refusal of a revoked or expired vault key",
			slog.String(logfield.RequestID, c.requestID), slog.String(logfield.KeyID, c.key.ID), slog.Any(logfield.Error, err))
	}
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
