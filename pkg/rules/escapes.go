package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// The operator's escapes from a rule (docs/escapes.md): bypass, overrides,
// a request-supplied limit from trusted peers, and a penalty. Validation
// lives here; compile.go and match.go use the results.

// Bounds of a penalty: Retry-After speaks in whole seconds, and a client
// locked out for more than a day is a ban, which is not this rule's job.
const (
	MinPenalty = time.Second
	MaxPenalty = 24 * time.Hour
)

// apiKeyHashLen is the length of a hex SHA-256 digest.
const apiKeyHashLen = 64

func (r *Rule) validateEscapes(p *problems) {
	r.validateBypass(p)
	r.validateResponse(p)
	r.validateOverrides(p)
	if r.LimitHeader != "" {
		if !isToken(r.LimitHeader) {
			p.addf(r.name(&r.LimitHeader), "%q: want a header name (an HTTP token)", r.LimitHeader)
		} else {
			r.LimitHeader = canonicalHeader(r.LimitHeader)
		}
	}
	switch d := r.Penalty.D(); {
	case d == 0:
	case d < MinPenalty || d > MaxPenalty:
		p.addf(r.name(&r.Penalty), "must be between %s and %s (got %s)", MinPenalty, MaxPenalty, d)
	case d%time.Second != 0:
		p.addf(r.name(&r.Penalty), "must be whole seconds, as Retry-After is (got %s)", d)
	case r.Shadow:
		p.addf(r.name(&r.Penalty), "a shadow rule never denies, so it cannot penalise")
	}
}

func (r *Rule) validateBypass(p *problems) {
	b := &r.Bypass
	normalizeList(p, &b.CIDRs, normalizeCIDR)
	normalizeList(p, &b.Hosts, normalizeHostPattern)
	normalizeList(p, &b.PathPrefix, normalizePrefix)
	normalizeList(p, &b.APIKeySHA256, normalizeKeyHash)
	// A message names the other field as the section spells it.
	switch {
	case b.APIKeyHeader != "" && !isToken(b.APIKeyHeader):
		p.addf(r.name(&b.APIKeyHeader), "%q: want a header name (an HTTP token)", b.APIKeyHeader)
	case b.APIKeyHeader != "":
		b.APIKeyHeader = canonicalHeader(b.APIKeyHeader)
		if len(b.APIKeySHA256) == 0 {
			p.addf(r.name(&b.APIKeyHeader), "needs %s: the hashes of the keys that bypass", nameIn(b, &b.APIKeySHA256))
		}
	case len(b.APIKeySHA256) > 0:
		p.addf(r.name(&b.APIKeySHA256), "needs %s: the header that carries the key", nameIn(b, &b.APIKeyHeader))
	}
	for _, l := range [][]string{b.CIDRs, b.Hosts, b.PathPrefix, b.APIKeySHA256} {
		slices.Sort(l)
	}
}

// normalizeCIDR takes "192.0.2.0/24" or a single address and returns the
// masked prefix ("192.0.2.7" is "192.0.2.7/32").
func normalizeCIDR(raw string) (string, error) {
	if !strings.Contains(raw, "/") {
		a, err := netip.ParseAddr(raw)
		if err != nil || a.Zone() != "" {
			return "", fmt.Errorf("%q: want an address or a CIDR such as 192.0.2.0/24", raw)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()).String(), nil
	}
	pr, err := netip.ParsePrefix(raw)
	if err != nil {
		return "", fmt.Errorf("%q: want an address or a CIDR such as 192.0.2.0/24", raw)
	}
	if pr.Addr().Is4In6() {
		if pr.Bits() < 96 {
			return "", fmt.Errorf("%q: an IPv4-mapped prefix must be /96 or longer", raw)
		}
		pr = netip.PrefixFrom(pr.Addr().Unmap(), pr.Bits()-96)
	}
	return pr.Masked().String(), nil
}

// normalizeKeyHash takes the SHA-256 of an API key as 64 hex digits and
// lower-cases it. Anything else is refused: a document must never hold a
// key itself (echo -n "$KEY" | sha256sum gives the hash).
func normalizeKeyHash(raw string) (string, error) {
	if len(raw) != apiKeyHashLen {
		return "", fmt.Errorf("want the key's SHA-256 as %d hex digits, never the key itself (got %d characters)", apiKeyHashLen, len(raw))
	}
	if _, err := hex.DecodeString(raw); err != nil {
		return "", fmt.Errorf("want the key's SHA-256 as %d hex digits, never the key itself (not hex)", apiKeyHashLen)
	}
	return strings.ToLower(raw), nil
}

// validateOverrides checks each override's key against the rule's
// descriptors and its limit as the limiter would, and refuses two entries
// for one key (after normalization). It runs in time linear in the list.
func (r *Rule) validateOverrides(p *problems) {
	if len(r.Overrides) == 0 {
		return
	}
	descs := make([]descriptor, len(r.Key))
	for i, k := range r.Key {
		d, err := parseDescriptor(k)
		if err != nil {
			return // reported as the key's problem
		}
		descs[i] = d
	}
	base := r.limit()
	seen := make(map[string]int, len(r.Overrides))
	var sb strings.Builder
	for i := range r.Overrides {
		o := &r.Overrides[i]
		field := fmt.Sprintf("%s[%d]", r.name(&r.Overrides), i)
		key := field + "." + nameIn(o, &o.Key)
		if len(o.Key) != len(descs) {
			p.addf(key, "want %d value(s), one per descriptor of %s %v (got %d)", len(descs), r.name(&r.Key), r.Key, len(o.Key))
		} else {
			ok := true
			for j, v := range o.Key {
				nv, err := normalizeKeyValue(descs[j], v)
				if err != nil {
					p.addf(fmt.Sprintf("%s[%d]", key, j), "%v", err)
					ok = false
					continue
				}
				o.Key[j] = nv
			}
			if ok {
				sb.Reset()
				for _, v := range o.Key {
					fmt.Fprintf(&sb, "%d:%s", len(v), v)
				}
				if j, dup := seen[sb.String()]; dup {
					p.addf(key, "duplicate (same as %s[%d] after normalization)", r.name(&r.Overrides), j)
				} else {
					seen[sb.String()] = i
				}
			}
		}
		l := base
		l.Limit, l.Burst = o.Limit, o.Burst
		for _, pr := range l.Problems() {
			switch r.limitField(pr.Field) {
			case &r.Limit:
				p.addf(field+"."+nameIn(o, &o.Limit), "%s", pr.Msg)
			case &r.Burst:
				p.addf(field+"."+nameIn(o, &o.Burst), "%s", pr.Msg)
			}
		}
	}
}

// normalizeKeyValue is a key value as the matcher reads it from a request.
func normalizeKeyValue(d descriptor, v string) (string, error) {
	if v == "" {
		return "", fmt.Errorf("empty: a request without a value is not counted, so it cannot be overridden")
	}
	switch d.kind {
	case descIP:
		a, err := netip.ParseAddr(v)
		if err != nil || a.Zone() != "" {
			return "", fmt.Errorf("%q: want an IP address", v)
		}
		return a.Unmap().String(), nil
	case descHost:
		h := strings.TrimSuffix(NormalizeHost(v), ".")
		if h == "" {
			return "", fmt.Errorf("%q: want a host name", v)
		}
		return h, nil
	case descMethod:
		return normalizeMethod(v)
	case descPath:
		if !strings.HasPrefix(v, "/") {
			return "", fmt.Errorf("%q: want a path starting with /", v)
		}
		return NormalizePath(v), nil
	}
	return v, nil
}

func (b Bypass) empty() bool {
	return len(b.CIDRs) == 0 && len(b.Hosts) == 0 && len(b.PathPrefix) == 0 && len(b.APIKeySHA256) == 0
}

// bypassSet is a rule's bypass section, ready for requests.
type bypassSet struct {
	nets       []netip.Prefix
	exactHosts []string
	hostSuffix []string // ".example.com" for "*.example.com"
	prefixes   []string
	anyPath    bool   // "/" is among the prefixes
	keyHeader  string // canonical
	keys       map[[sha256.Size]byte]struct{}
}

// compileBypass assumes b is validated and normalized.
func compileBypass(b *Bypass) *bypassSet {
	if b.empty() {
		return nil
	}
	s := &bypassSet{prefixes: b.PathPrefix, anyPath: slices.Contains(b.PathPrefix, "/"), keyHeader: b.APIKeyHeader}
	for _, c := range b.CIDRs {
		s.nets = append(s.nets, netip.MustParsePrefix(c))
	}
	for _, h := range b.Hosts {
		if suffix, ok := strings.CutPrefix(h, "*"); ok {
			s.hostSuffix = append(s.hostSuffix, suffix)
		} else {
			s.exactHosts = append(s.exactHosts, h)
		}
	}
	if len(b.APIKeySHA256) > 0 {
		s.keys = make(map[[sha256.Size]byte]struct{}, len(b.APIKeySHA256))
		for _, h := range b.APIKeySHA256 {
			var sum [sha256.Size]byte
			_, _ = hex.Decode(sum[:], []byte(h))
			s.keys[sum] = struct{}{}
		}
	}
	return s
}

// matches reports whether req is one the rule leaves alone. An API key is
// hashed and the hash looked up: the key itself is never compared, kept or
// logged.
func (b *bypassSet) matches(req *Request, host string) bool {
	if req.ClientIP.IsValid() {
		ip := req.ClientIP.Unmap()
		for _, n := range b.nets {
			if n.Contains(ip) {
				return true
			}
		}
	}
	if slices.Contains(b.exactHosts, host) {
		return true
	}
	for _, suf := range b.hostSuffix {
		if len(host) > len(suf) && strings.HasSuffix(host, suf) {
			return true
		}
	}
	if b.anyPath {
		return true
	}
	for _, x := range b.prefixes {
		if strings.HasPrefix(req.Path, x) && (len(req.Path) == len(x) || req.Path[len(x)] == '/') {
			return true
		}
	}
	if b.keys != nil && req.Header != nil {
		if v, ok := req.Header(b.keyHeader); ok && v != "" {
			if _, ok := b.keys[sha256.Sum256([]byte(v))]; ok {
				return true
			}
		}
	}
	return false
}

// override is one key's own quota.
type override struct{ limit, burst int64 }

// compileOverrides keys each override by the counter key a request with
// those values gets (Match.Key), so a request finds its override with one
// map lookup on the key it has already made: no cost per entry.
func (s *Snapshot) compileOverrides(c *CompiledRule, list Overrides) map[string]override {
	out := make(map[string]override, len(list))
	base := c.limitFor(0, 0)
	for _, o := range list {
		req := requestOf(c.descriptors, o.Key)
		key, ok := s.key(c, &req)
		if !ok {
			continue // validated: every value is usable
		}
		l := base
		l.Limit, l.Burst = o.Limit, o.Burst
		burst := int64(0)
		if l.Algorithm.Spec().Burst {
			burst = l.Capacity()
		}
		out[key] = override{limit: o.Limit, burst: burst}
	}
	return out
}

// requestOf is a request carrying the key values vals (one per descriptor).
func requestOf(descs []descriptor, vals []string) Request {
	var req Request
	var named map[string]string
	for i, d := range descs {
		v := vals[i]
		switch d.kind {
		case descIP:
			req.ClientIP, _ = netip.ParseAddr(v)
		case descHost:
			req.Host = v
		case descMethod:
			req.Method = v
		case descPath:
			req.Path = v
		case descJA4:
			req.JA4 = v
		case descHeader, descQuery:
			if named == nil {
				named = map[string]string{}
			}
			named[d.String()] = v
		}
	}
	req.Header = func(name string) (string, bool) { v, ok := named["header:"+name]; return v, ok }
	req.Query = func(name string) (string, bool) { v, ok := named["query:"+name]; return v, ok }
	return req
}

// limitFor is the rule's limit with limit and burst replaced (0: kept).
func (r *CompiledRule) limitFor(lim, burst int64) limit.Limit {
	l := limit.Limit{Algorithm: r.Algorithm, Limit: r.Limit, Window: r.Window, Burst: r.Burst, MinInterval: r.MinInterval}
	if lim > 0 {
		l.Limit, l.Burst = lim, burst
	}
	return l
}

// AfterResponse reports whether the rule counts after the response
// (count_if or cost_header): it is never asked before the request, and a
// key over its limit is denied from the next request on.
func (r *Rule) AfterResponse() bool {
	return len(r.CountIf.Status) > 0 || r.CountIf.Header != "" || r.CostHeader != ""
}

func (r *Rule) validateResponse(p *problems) {
	if !r.AfterResponse() {
		if r.MaxCost != 0 {
			p.addf(r.name(&r.MaxCost), "only with %s", r.name(&r.CostHeader))
		}
		return
	}
	normalizeList(p, &r.CountIf.Status, normalizeStatus)
	slices.Sort(r.CountIf.Status)
	for _, h := range []*string{&r.CountIf.Header, &r.CostHeader} {
		if *h == "" {
			continue
		}
		if !isToken(*h) {
			p.addf(r.name(h), "%q: want a header name (an HTTP token)", *h)
			continue
		}
		*h = canonicalHeader(*h)
	}
	l := r.limit()
	if l.Algorithm.Valid() && l.Algorithm.Spec().Held {
		p.addf(r.name(&r.CountIf), "a %s rule holds a slot for the request's life; it cannot count after the response", r.Algorithm)
	}
	switch capacity := l.Capacity(); {
	case r.MaxCost < 0:
		p.addf(r.name(&r.MaxCost), "must be > 0 (got %d)", r.MaxCost)
	case r.MaxCost > 0 && r.CostHeader == "":
		p.addf(r.name(&r.MaxCost), "only with %s", r.name(&r.CostHeader))
	case r.MaxCost > 0 && capacity > 0 && r.MaxCost > capacity:
		p.addf(r.name(&r.MaxCost), "must be <= the rule's capacity %d (got %d): a larger cost could never be admitted", capacity, r.MaxCost)
	}
}

// normalizeStatus takes a status code (100-599) or class ("5xx").
func normalizeStatus(raw string) (string, error) {
	s := strings.ToLower(raw)
	if len(s) == 3 && s[0] >= '1' && s[0] <= '5' {
		if s[1:] == "xx" {
			return s, nil
		}
		if s[1] >= '0' && s[1] <= '9' && s[2] >= '0' && s[2] <= '9' {
			return s, nil
		}
	}
	return "", fmt.Errorf("%q: want a status code (401) or class (5xx) from 1xx to 5xx", raw)
}

// responseMatch is a rule's count_if and cost_header, ready for responses.
type responseMatch struct {
	classes    [6]bool // by status / 100
	codes      []int
	header     string
	costHeader string
	maxCost    int64
	cost       int64
}

func compileResponse(r *Rule, capacity int64) *responseMatch {
	if !r.AfterResponse() {
		return nil
	}
	m := &responseMatch{header: r.CountIf.Header, costHeader: r.CostHeader, maxCost: r.MaxCost, cost: r.Cost}
	if m.maxCost == 0 {
		m.maxCost = capacity
	}
	for _, s := range r.CountIf.Status {
		if s[1:] == "xx" {
			m.classes[s[0]-'0'] = true
			continue
		}
		n, _ := strconv.Atoi(s)
		m.codes = append(m.codes, n)
	}
	return m
}

// AfterResponse reports whether the rule counts after the response (see
// Rule.AfterResponse).
func (r *CompiledRule) AfterResponse() bool { return r.response != nil }

// CostProblem says why a cost header's value was not taken as it was.
type CostProblem uint8

// The cost header's problems.
const (
	CostOK       CostProblem = iota
	CostInvalid              // not a non-negative integer: the rule's cost was charged
	CostTooLarge             // above max_cost: max_cost was charged
)

// ResponseCost is what the response costs the rule's key: 0 when the rule
// does not count it. status is the response's code, header looks up a
// response header. A cost header that is not a non-negative decimal
// integer charges the rule's cost; one above max_cost charges max_cost;
// both are reported.
func (r *CompiledRule) ResponseCost(status int, header func(string) (string, bool)) (int64, CostProblem) {
	m := r.response
	if m == nil {
		return 0, CostOK
	}
	counted := len(r.CountIf.Status) == 0 && m.header == "" // cost_header alone: every response
	if !counted && status >= 100 && status < 600 && m.classes[status/100] {
		counted = true
	}
	if !counted && slices.Contains(m.codes, status) {
		counted = true
	}
	if !counted && m.header != "" {
		_, counted = header(m.header)
	}
	if !counted {
		return 0, CostOK
	}
	if m.costHeader == "" {
		return m.cost, CostOK
	}
	v, ok := header(m.costHeader)
	if !ok {
		return m.cost, CostOK
	}
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
	switch {
	case err != nil && errors.Is(err, strconv.ErrRange), err == nil && n > uint64(m.maxCost):
		return m.maxCost, CostTooLarge
	case err != nil:
		return m.cost, CostInvalid
	}
	return int64(n), CostOK
}
