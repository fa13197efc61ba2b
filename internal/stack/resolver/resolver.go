// Package resolver resolves edges the way a user's resolver would: a
// net.Resolver whose every query goes to one Consul agent's DNS interface,
// asking for a prepared query (<query>.query.consul), so drills and load
// tests follow DNS routing instead of hard-coded addresses.
package resolver

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"
)

// Resolver asks one Consul DNS server.
type Resolver struct {
	server string
	net    *net.Resolver
}

// New returns a resolver sending every query to the Consul DNS server at
// addr ("127.0.0.1:8600").
func New(addr string) (*Resolver, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("consul dns address %q: %w", addr, err)
	}
	d := net.Dialer{Timeout: time.Second}
	return &Resolver{server: addr, net: &net.Resolver{
		PreferGo: true,
		// Whatever server the system's resolv.conf names, this one is asked.
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}}, nil
}

// Name is the DNS name of a prepared query, fully qualified so no search
// domain is tried.
func Name(query string) string { return query + ".query.consul." }

// Lookup returns the IPv4 addresses DNS answers for the prepared query,
// sorted. No healthy edge anywhere along the failover list is an error
// (NXDOMAIN or no answer).
func (r *Resolver) Lookup(ctx context.Context, query string) ([]netip.Addr, error) {
	addrs, err := r.net.LookupNetIP(ctx, "ip4", Name(query))
	if err != nil {
		return nil, fmt.Errorf("resolving %s at %s: %w", Name(query), r.server, err)
	}
	for i, a := range addrs {
		addrs[i] = a.Unmap()
	}
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(addrs), nil
}
