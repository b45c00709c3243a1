package proxy

import "time"

// SetRefusalFlushInterval sets how often at most p writes a key's refusals
// (refusalFlushInterval): a test that must see only Shutdown's write sets it long.
func SetRefusalFlushInterval(p *Proxy, d time.Duration) {
	p.refusals.mu.Lock()
	defer p.refusals.mu.Unlock()
	p.refusals.interval = d
}
