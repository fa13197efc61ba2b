package edge

import (
	"bytes"
	"net"
	"net/netip"
)

// trustedSet answers whether an address belongs to a trusted proxy.
type trustedSet []netip.Prefix

func (t trustedSet) contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peerAddr is the socket peer's address.
func peerAddr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// clientAddr identifies the client. Only a trusted peer's X-Forwarded-For
// counts, read from the right: each trusted hop passes the question on, and
// the first untrusted hop is the client (hops further left were written by
// the client itself and prove nothing). A malformed hop ends the walk at the
// trusted hop to its right: garbage never becomes an identity.
func clientAddr(peer netip.Addr, xff [][]byte, trusted trustedSet) netip.Addr {
	if !trusted.contains(peer) || len(xff) == 0 {
		return peer
	}
	client := peer
	for i := len(xff) - 1; i >= 0; i-- {
		hops := bytes.Split(xff[i], []byte{','})
		for j := len(hops) - 1; j >= 0; j-- {
			a, err := netip.ParseAddr(string(bytes.TrimSpace(hops[j])))
			if err != nil {
				return client
			}
			client = a.Unmap()
			if !trusted.contains(client) {
				return client
			}
		}
	}
	return client
}
