package config

import (
	"bytes"
	"net/netip"

	"github.com/valyala/fasthttp"
)

// refusedMethods are answered 405 unless --allow-methods names them:
// CONNECT asks the edge to open a tunnel, TRACE echoes the request
// (credentials included) back; neither belongs on a CDN origin by default.
var refusedMethods = [...]string{fasthttp.MethodConnect, fasthttp.MethodTrace}

// RefusedMethod returns the refused method m names (case-insensitively,
// as origins may read it), or "".
func RefusedMethod(m []byte) string {
	for _, r := range refusedMethods {
		if bytes.EqualFold(m, []byte(r)) {
			return r
		}
	}
	return ""
}

// UsableHost reports whether h can name a site: a DNS name or an IP
// literal, with an optional port, at most 255 bytes. Anything else would
// match no host rule (an empty host skips them all) while an origin might
// still route it.
func UsableHost(h []byte) bool {
	if len(h) == 0 || len(h) > 255 {
		return false
	}
	name, port, ok := splitHost(h)
	if !ok || !usablePort(port) {
		return false
	}
	return name == nil || usableName(name)
}

// splitHost splits a Host into its name (nil for a bracketed IP literal,
// which it checks) and its ":port" part (empty without one).
func splitHost(h []byte) (name, port []byte, ok bool) {
	if h[0] != '[' {
		if i := bytes.IndexByte(h, ':'); i >= 0 {
			return h[:i], h[i:], true
		}
		return h, nil, true
	}
	end := bytes.IndexByte(h, ']')
	if end < 0 {
		return nil, nil, false
	}
	if _, err := netip.ParseAddr(string(h[1:end])); err != nil {
		return nil, nil, false
	}
	port = h[end+1:]
	if len(port) > 0 && port[0] != ':' {
		return nil, nil, false
	}
	return nil, port, true
}

// usablePort reports whether p is empty or ":" and one to five digits.
func usablePort(p []byte) bool {
	if len(p) == 0 {
		return true
	}
	if len(p) < 2 || len(p) > 6 {
		return false
	}
	for _, c := range p[1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// usableName reports whether name is a DNS name: letters, digits, '-',
// '.', '_', and not only dots.
func usableName(name []byte) bool {
	if len(name) == 0 || len(bytes.Trim(name, ".")) == 0 {
		return false
	}
	for _, c := range name {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.', c == '_':
		default:
			return false
		}
	}
	return true
}
