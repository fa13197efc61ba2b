package edge

import (
	"context"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// The operator's escapes on the request path (docs/escapes.md). The rules
// say which requests a rule bypasses and which keys have their own limit
// (pkg/rules, no I/O); here the edge drops the bypassed rules before the
// limiter, applies a trusted peer's limit header, denies penalised keys
// before counting them and penalises the keys a penalty rule denied.

// The escape label of edgeguard_edge_escapes_total.
const (
	escapeBypass        = "bypass"               // the rule's bypass named the request
	escapeOverride      = "override"             // the key's own limit (overrides)
	escapeLimitHeader   = "limit_header"         // a trusted peer's limit header
	escapeHeaderIgnored = "limit_header_ignored" // sent by an untrusted peer, or not a valid limit
	escapePenalised     = "penalised"            // denied by a penalty, not counted
	escapePenaltyStart  = "penalty_start"        // a denial that started a penalty
)

// dropBypassed removes the bypassed matches from ms, counting each rule's
// bypass, and returns the rest and the bypassed rules.
func (e *Edge) dropBypassed(ms []rules.Match, by []*rules.CompiledRule) ([]rules.Match, []*rules.CompiledRule) {
	kept := ms[:0]
	for _, m := range ms {
		if !m.Bypass {
			kept = append(kept, m)
			continue
		}
		by = append(by, m.Rule)
		label := ruleLabel(m.Rule)
		e.metrics.decision(label, "bypass", "rules").Inc()
		e.metrics.escape(label, escapeBypass).Inc()
	}
	clear(ms[len(kept):])
	return kept, by
}

// limitOf is the limit a match is checked against: the key's override,
// or a trusted peer's limit header, or the rule's own. A limit header from
// an untrusted peer, or one that is not a limit the rule's algorithm can
// take, is ignored and counted.
func (e *Edge) limitOf(m rules.Match, key string, trusted bool, header func(string) (string, bool)) limiter.Limit {
	r := m.Rule
	l := ruleLimit(r, key)
	if m.Limit > 0 {
		l.Limit, l.Burst = m.Limit, m.Burst
		e.metrics.escape(ruleLabel(r), escapeOverride).Inc()
	}
	if r.LimitHeader == "" {
		return l
	}
	v, ok := header(r.LimitHeader)
	if !ok {
		return l
	}
	n, err := strconv.ParseInt(v, 10, 64)
	asked := l
	asked.Limit = n
	if r.Burst > 0 {
		asked.Burst = n // a bucket: the capacity follows the limit
	}
	if !trusted || err != nil || asked.Validate() != nil {
		e.metrics.escape(ruleLabel(r), escapeHeaderIgnored).Inc()
		return l
	}
	e.metrics.escape(ruleLabel(r), escapeLimitHeader).Inc()
	return asked
}

// maxPenaltyKeys bounds the penalty keys one request asks about on the
// stack; more rules with a penalty than that allocate.
const maxPenaltyKeys = 8

// penalised denies the request when a penalty rule's key is serving a
// penalty: 429 with Retry-After until its end, nothing counted. It reports
// whether it answered.
//
// The response-aware rules' blocks (response.go) are looked up in the same
// round trip: at indexes len(sc.matches) and on, in sc.after's order.
func (e *Edge) penalised(ctx *fasthttp.RequestCtx, sc *scratch) bool {
	var keysBuf [maxPenaltyKeys]string
	var atBuf [maxPenaltyKeys]int
	keys, at := keysBuf[:0], atBuf[:0]
	for i, m := range sc.matches {
		if m.Rule.Penalty > 0 && !sc.checks[i].Shadow {
			keys, at = append(keys, sc.checks[i].Limit.Key), append(at, i)
		}
	}
	for i := range sc.after {
		if !sc.afterChecks[i].Shadow {
			keys, at = append(keys, blockKey(sc.afterChecks[i].Limit.Key)), append(at, len(sc.matches)+i)
		}
	}
	if len(keys) == 0 {
		return false
	}
	var leftBuf [maxPenaltyKeys]time.Duration
	left := leftBuf[:0]
	for range keys {
		left = append(left, 0)
	}
	if err := e.penalties.Check(context.Background(), keys, left); err != nil {
		e.metrics.penaltyErrors.Inc()
	}
	longest := time.Duration(0)
	for _, d := range left {
		longest = max(longest, d)
	}
	if longest == 0 {
		return false
	}
	all := func(i int) (rules.Match, limiter.Check) {
		if i < len(sc.matches) {
			return sc.matches[i], sc.checks[i]
		}
		return sc.after[i-len(sc.matches)], sc.afterChecks[i-len(sc.matches)]
	}
	for j, i := range at {
		if left[j] > 0 {
			sc.penalised = true
			m, _ := all(i)
			escape, reason := escapePenalised, "penalty"
			if i >= len(sc.matches) {
				escape, reason = escapeResponseBlocked, "response"
			}
			e.metrics.decision(ruleLabel(m.Rule), "denied", reason).Inc()
			e.metrics.escape(ruleLabel(m.Rule), escape).Inc()
		}
	}
	// What clients see: the penalised rules deny until their penalty
	// ends; the others were not asked.
	j := 0
	for i := range len(sc.matches) + len(sc.after) {
		m, c := all(i)
		a := applied{rule: m.Rule, skipped: true, shadow: c.Shadow}
		if j < len(at) && at[j] == i {
			if d := left[j]; d > 0 {
				a.skipped = false
				a.out.Limit, a.out.RetryAfter, a.out.ResetAfter = c.Limit.Capacity(), d, d
			}
			j++
		}
		if !c.Shadow {
			sc.applied = append(sc.applied, a)
		}
		sc.all = append(sc.all, a)
	}
	deny(ctx, sc.applied, e.cfg.LegacyHeaders)
	return true
}

// startPenalties penalises the keys whose penalty rule denied this request,
// region-wide, and makes the answer's retry and reset times say so.
func (e *Edge) startPenalties(ms []rules.Match, checks []limiter.Check, v *limiter.Verdict) {
	for i, m := range ms {
		if i >= len(v.Checks) {
			return
		}
		o := &v.Checks[i]
		if m.Rule.Penalty == 0 || checks[i].Shadow || o.Allowed || o.Source == limiter.SourceSkipped || o.Source == limiter.SourceOpen {
			continue
		}
		if err := e.penalties.Trip(context.Background(), checks[i].Limit.Key, m.Rule.Penalty); err != nil {
			e.metrics.penaltyErrors.Inc()
		}
		e.metrics.escape(ruleLabel(m.Rule), escapePenaltyStart).Inc()
		o.RetryAfter = max(o.RetryAfter, m.Rule.Penalty)
		o.ResetAfter = max(o.ResetAfter, m.Rule.Penalty)
	}
}
