package pipeline

import (
	"context"

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
func (e *Pipeline) dropBypassed(ms []rules.Match, by []*rules.CompiledRule) ([]rules.Match, []*rules.CompiledRule) {
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

// limitOf is the limit a match is checked against (rules.LimitOf: the
// key's override, or a trusted peer's limit header, or the rule's own),
// counting the escapes it took.
func (e *Pipeline) limitOf(m rules.Match, key string, trusted bool, header func(string) (string, bool)) limiter.Limit {
	l, overridden, use := rules.LimitOf(m, key, trusted, header)
	if overridden {
		e.metrics.escape(ruleLabel(m.Rule), escapeOverride).Inc()
	}
	switch use {
	case rules.HeaderApplied:
		e.metrics.escape(ruleLabel(m.Rule), escapeLimitHeader).Inc()
	case rules.HeaderIgnored:
		e.metrics.escape(ruleLabel(m.Rule), escapeHeaderIgnored).Inc()
	}
	return l
}

// startPenalties penalises the keys whose penalty rule denied this request,
// region-wide, and makes the answer's retry and reset times say so.
func (e *Pipeline) startPenalties(ms []rules.Match, checks []limiter.Check, v *limiter.Verdict) {
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
