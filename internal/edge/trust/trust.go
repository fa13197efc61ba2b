// Package trust is the trust model, decided here and nowhere else.
//
// A peer is trusted when its socket address is in --trusted-proxies (for a
// connection from a --proxy-protocol-from balancer, the peer is the client
// its PROXY header names, trusted by the same rule). Only a
// trusted peer may tell the edge who the client is (X-Forwarded-For), what
// a request's limit is (a rule's limit_header, pipeline/escapes.go), which
// tier a request belongs to (the priority and test-mode headers, and path
// rules marked trusted_only), which request id it carries, and how the
// origin should see the request (Forwarded, X-Forwarded-*, X-Real-IP and the
// other fields listed in spoofable). From anyone else:
//
//   - every field in spoofable is removed before the rules, the shedder or
//     the origin see the request; the edge writes Forwarded,
//     X-Forwarded-For, -Proto and -Host itself from the connection;
//   - the client address is the socket peer's (an IPv6 client's prefix);
//   - the critical tier cannot be reached by any path, header or key
//     (shedder settings refuse a critical rule that untrusted requests
//     could match);
//   - behaviour identity is the address, never a key the client chose;
//   - the shedder's priority and test-mode headers (the names the live
//     settings give) are removed with the spoofable fields, so what the
//     origin or a further edge trusting this one receives is never the
//     client's own claim.
//
// From every peer, header names with an underscore are dropped unless
// --allow-underscores-in-headers (CGI, WSGI and Rack origins read
// X_Api_Key and X-Api-Key as the same HTTP_X_API_KEY, so one could pass a
// value the rules never looked at).
package trust

import (
	"bytes"
	"net"
	"net/netip"
	"strings"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// Set answers whether an address belongs to a trusted proxy.
type Set []netip.Prefix

// Contains reports whether a (IPv4-mapped or not) is in one of the prefixes.
func (t Set) Contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Peer is the socket peer's address.
func Peer(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// Client identifies the client. Only a trusted peer's X-Forwarded-For
// counts, read from the right: each trusted hop passes the question on, and
// the first untrusted hop is the client (hops further left were written by
// the client itself and prove nothing). A malformed hop ends the walk at the
// trusted hop to its right: garbage never becomes an identity.
func Client(peer netip.Addr, xff [][]byte, trusted Set) netip.Addr {
	if !trusted.Contains(peer) || len(xff) == 0 {
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
			if !trusted.Contains(client) {
				return client
			}
		}
	}
	return client
}

// spoofable are the request fields (lower case) an origin may take as the
// word of a proxy in front of it: the client's address, the scheme, host,
// port or path the request was first sent to, or a method to use instead
// of the request's own. Only a trusted peer's are passed on.
var spoofable = map[string]struct{}{
	"forwarded":                {},
	"x-forwarded-for":          {},
	"x-forwarded-host":         {},
	"x-forwarded-proto":        {},
	"x-forwarded-port":         {},
	"x-forwarded-prefix":       {},
	"x-forwarded-scheme":       {},
	"x-forwarded-server":       {},
	"x-forwarded-ssl":          {},
	"x-forwarded-uri":          {},
	"x-forwarded-path":         {},
	"x-forwarded-client-cert":  {},
	"x-original-forwarded-for": {},
	"front-end-https":          {},
	"x-url-scheme":             {},
	"x-real-ip":                {},
	"true-client-ip":           {},
	"x-client-ip":              {},
	"client-ip":                {},
	"cf-connecting-ip":         {},
	"cf-connecting-ipv6":       {},
	"fastly-client-ip":         {},
	"x-cluster-client-ip":      {},
	"x-proxyuser-ip":           {},
	"x-envoy-external-address": {},
	"x-original-url":           {},
	"x-original-uri":           {},
	"x-original-host":          {},
	"x-rewrite-url":            {},
	"x-host":                   {},
	"x-http-method-override":   {},
	"x-http-method":            {},
	"x-method-override":        {},
}

// maxSpoofable is the longest name in spoofable: longer names skip the
// lookup.
const maxSpoofable = len("x-original-forwarded-for")

// Screen drops the request fields a peer may not send (see the trust
// model above), in one pass over the header. Requests that carry none of
// them, the common case, allocate nothing.
type Screen struct {
	// AllowUnderscores passes header names with an underscore
	// (--allow-underscores-in-headers).
	AllowUnderscores bool
}

// Apply removes what the peer may not send and reports how many fields it
// removed.
//
// tier names the shedder's priority and test-mode headers (the live
// classifier's; empty names are off): this edge ignores an untrusted
// peer's, and passing them on would let a client promote itself at a
// further edge that trusts this one (a shield tier, say).
func (s Screen) Apply(h *fasthttp.RequestHeader, trusted bool, tier [2]string) int {
	var drop [8][]byte // names to delete, copied: deleting moves the header's own bytes
	var more [][]byte
	n := 0
	for k := range h.All() {
		if s.keep(k, trusted, tier) {
			continue
		}
		name := append([]byte(nil), k...)
		if n < len(drop) {
			drop[n] = name
		} else {
			more = append(more, name)
		}
		n++
	}
	for i := 0; i < n && i < len(drop); i++ {
		h.DelBytes(drop[i])
	}
	for _, k := range more {
		h.DelBytes(k)
	}
	return n
}

// keep reports whether the field named k may reach the rules and the origin.
func (s Screen) keep(k []byte, trusted bool, tier [2]string) bool {
	if !s.AllowUnderscores && bytes.IndexByte(k, '_') >= 0 {
		return false
	}
	if trusted {
		return true
	}
	for _, name := range tier {
		if name != "" && len(k) == len(name) && strings.EqualFold(unsafe.String(unsafe.SliceData(k), len(k)), name) {
			return false
		}
	}
	if len(k) > maxSpoofable {
		return true
	}
	var lower [maxSpoofable]byte
	for i, c := range k {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	_, bad := spoofable[string(lower[:len(k)])]
	return !bad
}
