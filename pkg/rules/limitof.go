package rules

import (
	"strconv"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// HeaderUse is what became of a rule's limit header on one request.
type HeaderUse uint8

// The uses of a limit header.
const (
	HeaderAbsent  HeaderUse = iota // no limit header: the rule has none or the request sent none
	HeaderApplied                  // a trusted peer's valid limit replaced the limit
	HeaderIgnored                  // sent by an untrusted peer, or not a limit the rule's algorithm takes
)

// LimitOf is the limit match m is checked against, on key: the key's own
// limit (overrides: overridden is true), or a trusted peer's limit header
// (limit_header), or the rule's own. A limit header from an untrusted peer,
// or one that is not a limit the rule's algorithm can take, is ignored.
// header reads the request's headers as Request.Header does. No I/O: the
// caller counts the escapes.
func LimitOf(m Match, key string, trusted bool, header func(string) (string, bool)) (l limit.Limit, overridden bool, use HeaderUse) {
	r := m.Rule
	l = r.LimitOn(key)
	if m.Limit > 0 {
		l.Limit, l.Burst = m.Limit, m.Burst
		overridden = true
	}
	if r.LimitHeader == "" || header == nil {
		return l, overridden, HeaderAbsent
	}
	v, ok := header(r.LimitHeader)
	if !ok {
		return l, overridden, HeaderAbsent
	}
	n, err := strconv.ParseInt(v, 10, 64)
	asked := l
	asked.Limit = n
	if r.Burst > 0 {
		asked.Burst = n // a bucket: the capacity follows the limit
	}
	if !trusted || err != nil || asked.Validate() != nil {
		return l, overridden, HeaderIgnored
	}
	return asked, overridden, HeaderApplied
}

// LimitOn is the rule's own limit on key: rules compile to the limiter's
// own algorithms, so nothing is parsed per request.
func (r *CompiledRule) LimitOn(key string) limit.Limit {
	return limit.Limit{Key: key, Algorithm: r.Algorithm, Limit: r.Limit, Window: r.Window, Burst: r.Burst, MinInterval: r.MinInterval}
}
