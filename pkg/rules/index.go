package rules

import "slices"

// ruleIndex finds the rules that may apply to a request without looking at
// the others, so matching costs what the matching rules cost, not what the
// rule set holds. Each rule is filed under the most selective condition it
// has, in this order:
//
//   - its hosts: exact names in a map; wildcards "*.example.com" in a map
//     of suffixes ".example.com", probed at each label boundary of the
//     request host from the right (its reversed labels);
//   - else its path prefixes, in a map probed with the request path cut at
//     each segment boundary (a prefix tree laid flat: one probe per level);
//   - else its methods, in a map by method;
//   - else it applies to every request and is always a candidate.
//
// The candidates are then checked with the same matchMethod, matchHost and
// matchPath as the plain scan (matchScan), in rule order, so the index only
// decides which rules are looked at, never whether one matches: every
// matching rule is a candidate, since it matches the condition it is filed
// under.
type ruleIndex struct {
	exact    map[string][]int32 // host -> rules listing it
	wildcard map[string][]int32 // ".example.com" -> rules listing "*.example.com"
	prefix   map[string][]int32 // "/api" -> rules without hosts listing it
	method   map[string][]int32 // "POST" -> rules with only methods
	always   []int32            // rules with no match condition
}

// newRuleIndex indexes rules; indexes are int32 positions in rules.
func newRuleIndex(rules []CompiledRule) *ruleIndex {
	ix := &ruleIndex{
		exact:    map[string][]int32{},
		wildcard: map[string][]int32{},
		prefix:   map[string][]int32{},
		method:   map[string][]int32{},
	}
	// add files rule i under key once, however often the rule lists it.
	add := func(m map[string][]int32, key string, i int32) {
		if l := m[key]; len(l) == 0 || l[len(l)-1] != i {
			m[key] = append(l, i)
		}
	}
	for n := range rules {
		r, i := &rules[n], int32(n)
		switch {
		case len(r.exactHosts) > 0 || len(r.hostSuffix) > 0:
			for _, h := range r.exactHosts {
				add(ix.exact, h, i)
			}
			for _, suf := range r.hostSuffix {
				add(ix.wildcard, suf, i)
			}
		case r.prefixes != nil:
			for _, p := range r.prefixes {
				add(ix.prefix, p, i)
			}
		case len(r.methods) > 0:
			for _, m := range r.methods {
				add(ix.method, m, i)
			}
		default:
			ix.always = append(ix.always, i)
		}
	}
	return ix
}

// candidates appends to dst, in rule order and once each, every rule that
// may apply to a request for host (trailing dot already trimmed), path and
// method.
func (ix *ruleIndex) candidates(host, path, method string, dst []int32) []int32 {
	dst = append(dst, ix.always...)
	if len(ix.exact) > 0 {
		dst = append(dst, ix.exact[host]...)
	}
	if len(ix.wildcard) > 0 {
		// matchHost: len(host) > len(suffix) and host ends with it; every
		// suffix starts with '.', so it starts at a '.' other than host[0].
		for i := len(host) - 1; i > 0; i-- {
			if host[i] == '.' {
				dst = append(dst, ix.wildcard[host[i:]]...)
			}
		}
	}
	if len(ix.prefix) > 0 {
		// matchPath: path starts with the prefix and ends there or at a '/'.
		for k := 0; k <= len(path); k++ {
			if k == len(path) || path[k] == '/' {
				dst = append(dst, ix.prefix[path[:k]]...)
			}
		}
	}
	if len(ix.method) > 0 {
		dst = append(dst, ix.method[method]...)
	}
	if len(dst) > 1 {
		slices.Sort(dst)
		dst = slices.Compact(dst)
	}
	return dst
}

// matchIndexed is Match through the index.
func (s *Snapshot) matchIndexed(req *Request, dst []Match) []Match {
	host := trimDot(req.Host)
	var stack [32]int32
	for _, i := range s.index.candidates(host, req.Path, req.Method, stack[:0]) {
		r := &s.rules[i]
		if !r.matchMethod(req.Method) || !r.matchHost(host) || !r.matchPath(req.Path) {
			continue
		}
		dst = s.appendMatch(dst, r, req, host)
	}
	return dst
}

func trimDot(h string) string {
	if n := len(h); n > 0 && h[n-1] == '.' {
		return h[:n-1]
	}
	return h
}
