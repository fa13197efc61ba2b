package rules

import (
	"crypto/sha256"
	"encoding/base64"
	"net/netip"
	"strings"
	"sync/atomic"
)

// Request is what the edge knows about one request: plain values and
// getters, no I/O. Match never retains the request or the strings the getters
// return, so getters may return views of the edge's own buffers.
type Request struct {
	Host     string // lower case, without port (see NormalizeHost)
	Method   string // upper case
	Path     string // already normalized: NormalizePath, or pathsem.Normalize under the host's path semantics
	ClientIP netip.Addr
	// Header looks up a request header. It is called with canonical names
	// ("X-Api-Key") and must match case-insensitively. nil means no headers.
	Header func(name string) (string, bool)
	// Query looks up a decoded query parameter by exact name. nil means none.
	Query func(name string) (string, bool)
	// JA4 is the TLS client's JA4 fingerprint; "" over plain HTTP (a rule
	// keyed by ja4 then does not apply).
	JA4 string
}

// Match is one rule that applies to a request, with the counter key the
// limiter should use for it.
type Match struct {
	Rule *CompiledRule
	// Key is "<rule id>:<hash>", where hash is 22 base64url characters
	// (128 bits of SHA-256) over the descriptor values. Raw client IPs and
	// API keys never appear in it, and it contains no '{', '}' or ':' beyond
	// the separator, so the limiter can add its own prefix or hash tag.
	Key string
	// Bypass: the request is one the rule's bypass section names. Key is
	// empty: the rule neither counts nor denies it.
	Bypass bool
	// Limit and Burst are the key's override (overrides): its own limit
	// and, for a bucket, capacity. 0: the rule's own.
	Limit, Burst int64
}

// appendMatch appends what rule r, which applies to req, makes of it.
func (s *Snapshot) appendMatch(dst []Match, r *CompiledRule, req *Request, host string) []Match {
	if r.bypass != nil && r.bypass.matches(req, host) {
		return append(dst, Match{Rule: r, Bypass: true})
	}
	key, ok := s.key(r, req)
	if !ok {
		return dst
	}
	m := Match{Rule: r, Key: key}
	if o, ok := r.overrides[key]; ok {
		m.Limit, m.Burst = o.limit, o.burst
	}
	return append(dst, m)
}

// keyHashBytes is how much of the SHA-256 digest goes into a key: 128 bits
// keeps collisions out of reach while keeping Redis keys short.
const keyHashBytes = 16

// Match appends every rule that applies to req to dst and returns it. Rules
// whose key needs a value the request lacks (missing or empty header or query
// parameter, invalid client IP, empty host) are skipped: they cannot be
// counted. A rule whose bypass names the request is returned with Bypass
// set and no key. Reusing dst across requests avoids allocating the slice; a
// key the snapshot made lately comes from its cache (keycache.go) without
// an allocation, any other allocates its string.
func (s *Snapshot) Match(req *Request, dst []Match) []Match {
	if s == nil || req == nil {
		return dst
	}
	if s.index != nil {
		return s.matchIndexed(req, dst)
	}
	return s.matchScan(req, dst)
}

// matchScan is Match by looking at every rule: the reference the index
// (index.go) must agree with, rule for rule.
func (s *Snapshot) matchScan(req *Request, dst []Match) []Match {
	host := strings.TrimSuffix(req.Host, ".")
	for i := range s.rules {
		r := &s.rules[i]
		if !r.matchMethod(req.Method) || !r.matchHost(host) || !r.matchPath(req.Path) {
			continue
		}
		dst = s.appendMatch(dst, r, req, host)
	}
	return dst
}

func (r *CompiledRule) matchMethod(m string) bool {
	if len(r.methods) == 0 {
		return true
	}
	for _, x := range r.methods {
		if x == m {
			return true
		}
	}
	return false
}

func (r *CompiledRule) matchHost(h string) bool {
	if len(r.exactHosts) == 0 && len(r.hostSuffix) == 0 {
		return true
	}
	for _, x := range r.exactHosts {
		if x == h {
			return true
		}
	}
	for _, suf := range r.hostSuffix {
		// Strictly longer: "*.example.com" covers subdomains, not the apex.
		if len(h) > len(suf) && strings.HasSuffix(h, suf) {
			return true
		}
	}
	return false
}

func (r *CompiledRule) matchPath(p string) bool {
	if r.prefixes == nil {
		return true
	}
	for _, x := range r.prefixes {
		// Segment boundary: "/api" covers "/api" and "/api/x", not "/apix".
		if strings.HasPrefix(p, x) && (len(p) == len(x) || p[len(x)] == '/') {
			return true
		}
	}
	return false
}

// key builds "<id>:<hash>". Each descriptor value is written as a 4-byte
// length followed by the bytes, so ("a","bc") and ("ab","c") differ. The
// buffers live on the stack unless values are unusually long.
func (s *Snapshot) key(r *CompiledRule, req *Request) (string, bool) {
	var stack [512]byte
	b := append(stack[:0], s.salt...)
	for _, d := range r.descriptors {
		at := len(b)
		b = append(b, 0, 0, 0, 0)
		switch d.kind {
		case descIP:
			var ok bool
			if b, ok = appendClientKey(b, req.ClientIP, s.v6Prefix); !ok {
				return "", false
			}
		case descHost:
			b = append(b, strings.TrimSuffix(req.Host, ".")...)
		case descMethod:
			b = append(b, req.Method...)
		case descPath:
			b = append(b, req.Path...)
		case descJA4:
			b = append(b, req.JA4...)
		case descHeader, descQuery:
			get := req.Header
			if d.kind == descQuery {
				get = req.Query
			}
			if get == nil {
				return "", false
			}
			v, ok := get(d.name)
			if !ok {
				return "", false
			}
			b = append(b, v...)
		}
		n := len(b) - at - 4
		if n == 0 {
			return "", false // an empty value is as good as absent
		}
		b[at], b[at+1], b[at+2], b[at+3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	}
	var slot *atomic.Pointer[cachedKey]
	if s.keys != nil {
		slot = s.keys.slot(r, b)
		if k, ok := s.keys.get(slot, r, b); ok {
			return k, true
		}
	}
	sum := sha256.Sum256(b)

	var out [maxKeyLen]byte
	k := append(out[:0], r.keyPrefix...)
	k = base64.RawURLEncoding.AppendEncode(k, sum[:keyHashBytes])
	if slot == nil {
		return string(k), true
	}
	return s.keys.put(slot, r, b, k), true
}
