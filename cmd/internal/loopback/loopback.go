// Package loopback says whether a host name stays on this machine. keybrake
// serve warns about listeners and upstreams beyond it, and keybrake-load loads
// nothing beyond it without --unsafe-allow-remote: both ask the same question.
package loopback

import "net"

// Host reports whether host — a URL's Hostname() or a listen address's host —
// is "localhost" or a loopback IP literal (127.0.0.0/8, ::1). Other names are
// not resolved: a name can point anywhere, so it counts as remote.
func Host(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
