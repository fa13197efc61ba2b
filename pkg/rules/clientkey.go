package rules

import "net/netip"

// DefaultIPv6Prefix is how many leading bits of an IPv6 client address
// identify one client: a single subscriber usually gets a whole /64 and could
// otherwise rotate through 2^64 addresses to dodge a per-IP limit.
const DefaultIPv6Prefix = 64

// ClientKey is the value of the "ip" key descriptor: an IPv4 address (IPv4-
// mapped IPv6 is unmapped first) as "203.0.113.7", an IPv6 address as its
// masked prefix, e.g. "2001:db8:1:2::/64". v6Prefix outside 1..128 means
// DefaultIPv6Prefix. An invalid address yields "".
func ClientKey(ip netip.Addr, v6Prefix int) string {
	var buf [64]byte
	b, ok := appendClientKey(buf[:0], ip, v6Prefix)
	if !ok {
		return ""
	}
	return string(b)
}

// appendClientKey is ClientKey without allocating, for the matcher.
func appendClientKey(dst []byte, ip netip.Addr, v6Prefix int) ([]byte, bool) {
	if !ip.IsValid() {
		return dst, false
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is4() {
		return ip.AppendTo(dst), true
	}
	if v6Prefix < 1 || v6Prefix > 128 {
		v6Prefix = DefaultIPv6Prefix
	}
	p, err := ip.Prefix(v6Prefix)
	if err != nil {
		return dst, false
	}
	return p.AppendTo(dst), true
}
