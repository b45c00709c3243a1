package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"syscall"
)

// ErrForbiddenAddress is a destination on a loopback, private, link-local,
// metadata or otherwise internal address: an endpoint there would let
// whoever configures webhooks make keybrake call into its own network.
var ErrForbiddenAddress = errors.New("the destination is an internal address")

// forbidden are the ranges beyond what netip classifies that no webhook may
// reach: "this network", carrier-grade NAT, benchmarking, IETF protocol
// assignments, multicast and reserved space, and the IPv6 ranges that embed
// IPv4 or are documentation.
var forbidden = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("2002::/16"),
	netip.MustParsePrefix("fd00:ec2::254/128"), // AWS metadata over IPv6
}

// CheckAddr returns ErrForbiddenAddress for an address no webhook may reach:
// loopback, private (RFC 1918, unique local), link-local (169.254.0.0/16,
// where cloud metadata services answer, and fe80::/10), unspecified,
// multicast, and the reserved ranges above. IPv4 mapped into IPv6 is judged
// as IPv4.
func CheckAddr(a netip.Addr) error {
	a = a.Unmap()
	switch {
	case !a.IsValid(), a.IsLoopback(), a.IsPrivate(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast(),
		a.IsInterfaceLocalMulticast(), a.IsMulticast(), a.IsUnspecified():
		return fmt.Errorf("%s: %w", a, ErrForbiddenAddress)
	}
	for _, p := range forbidden {
		if p.Contains(a) {
			return fmt.Errorf("%s: %w", a, ErrForbiddenAddress)
		}
	}
	return nil
}

// Guard judges destinations: everything when AllowPrivate (tests, and an
// operator whose receivers are on the private network, with
// --webhook-allow-private), else only public addresses.
type Guard struct {
	AllowPrivate bool
	// Resolver looks names up for CheckURL; net.DefaultResolver when nil.
	Resolver *net.Resolver
}

// CheckURL refuses an endpoint URL whose host is, or resolves to, an
// internal address. A name that does not resolve is refused too: there is
// nothing to judge. The dialer checks again at every connection (Control),
// since a name may resolve elsewhere later.
func (g Guard) CheckURL(ctx context.Context, raw string) error {
	if g.AllowPrivate {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		return CheckAddr(a)
	}
	r := g.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("%s does not resolve: %w", host, err)
	}
	for _, a := range addrs {
		if err := CheckAddr(a); err != nil {
			return fmt.Errorf("%s resolves to %w", host, err)
		}
	}
	return nil
}

// Control is a net.Dialer Control hook that refuses a connection to an
// internal address: the address actually dialled, after resolution, so a
// name that resolves to one is caught too.
func (g Guard) Control(network, address string, _ syscall.RawConn) error {
	if g.AllowPrivate {
		return nil
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dial %s: %w", address, ErrForbiddenAddress)
	}
	return CheckAddr(ap.Addr())
}
