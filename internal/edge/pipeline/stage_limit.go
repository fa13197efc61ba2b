package pipeline

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/problem"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// limitStage has the limiter decide every check (step 9, Limit): over-limit
// cache, per-key coalescing, one round trip per Redis node (the behaviour
// layer's update riding in it), local fallback when Redis fails. A denial
// by a penalty rule starts its penalty (escapes.go); denied → 429 with
// Retry-After, RateLimit fields and a problem+json body. Concurrency slots
// are released when the rest of the pipeline returns.
func (e *Pipeline) limitStage(sc *scratch) string {
	if len(sc.matches) == 0 {
		return e.next(sc)
	}
	ctx := sc.ctx
	_, decide := e.tracing.child(sc.trace, "limiter.decide")
	verdict, err := e.limiter.DecideRiding(context.Background(), sc.checks, sc.rider, sc.decided) // bounded by --redis-timeout
	decide.End()
	if cap(verdict.Checks) > cap(sc.decided) {
		sc.decided = verdict.Checks[:0] // kept for the scratch's next request
	}
	sc.limitDenied, sc.denyRetry = limiterDenial(verdict)
	switch {
	case errors.Is(err, limiter.ErrUnavailable):
		problem.Unavailable(ctx, "rate limiting is unavailable; retry later", 1)
		return outcomeUnavailable
	case err != nil:
		// A check the limiter refuses is a bug (rules are validated);
		// never a wall of errors for clients.
		e.metrics.limiterError.Inc()
		e.log.Error("limiter refused checks", "err", err)
		verdict = limiter.Verdict{Allowed: true}
	}
	if !verdict.Allowed {
		e.startPenalties(sc.matches, sc.checks, &verdict)
	}
	sc.applied, sc.all = e.record(sc.matches, sc.checks, verdict, sc.applied, sc.all, e.access != nil || sc.span != nil, &sc.decisionSeen)
	if !verdict.Allowed {
		deny(ctx, sc.applied, e.cfg.LegacyHeaders, &sc.policy)
		return outcomeDenied
	}
	if !holdsSlot(verdict) {
		return e.next(sc)
	}
	// A concurrency slot is held for the whole exchange: to the end of a
	// streamed body (proxy stage, origin.Hop.AtEnd), else until the rest of
	// the pipeline returns. Released in the background either way: never
	// holds the response back.
	held := verdict
	held.Checks = slices.Clone(verdict.Checks) // the scratch's buffer is the next request's
	sc.atEnd = func() { e.limiter.ReleaseAsync(held) }
	outcome := e.next(sc)
	if !sc.endHandedOn {
		e.limiter.ReleaseAsync(held)
	}
	return outcome
}

// holdsSlot says whether v holds a unit until the request ends (a
// concurrency slot).
func holdsSlot(v limiter.Verdict) bool {
	for _, c := range v.Checks {
		// Units held in a store only: a decision without a lease (failing
		// open, say) holds nothing, and its lease's algorithm is unset.
		if c.Lease.Units > 0 && c.Lease.Limit.Algorithm.Spec().Held {
			return true
		}
	}
	return false
}

// limiterDenial says whether the limiter itself denied (not a failed
// decision, which has no checks), and the longest Retry-After of its
// denials, before penalties lengthen them.
func limiterDenial(v limiter.Verdict) (bool, time.Duration) {
	if v.Allowed || len(v.Checks) == 0 {
		return false, 0
	}
	var retry time.Duration
	for _, o := range v.Checks {
		if !o.Allowed && o.Source != limiter.SourceSkipped {
			retry = max(retry, o.RetryAfter)
		}
	}
	return true, retry
}

// record counts every rule's decision and returns the non-shadow checks
// (checks[i] is ms[i]'s) as clients see them, and, when all is wanted, every
// rule's outcome.
func (e *Pipeline) record(ms []rules.Match, checks []limiter.Check, v limiter.Verdict, dst, all []applied, wantAll bool, seen *decisionMemo) ([]applied, []applied) {
	for i, m := range ms {
		if i >= len(v.Checks) { // the limiter failed: admitted unchecked
			break
		}
		o, shadow := v.Checks[i], checks[i].Shadow
		decision := "allowed"
		switch {
		case o.Source == limiter.SourceSkipped:
		case !o.Allowed && shadow:
			decision = "shadow_denied"
			e.log.Info("shadow rule would deny", "rule", m.Rule.ID, "retry_after", o.RetryAfter)
		case !o.Allowed:
			decision = "denied"
		}
		if o.Source != limiter.SourceSkipped {
			e.decisionOf(seen, m.Rule, decision, o.Source).Inc()
		}
		a := applied{rule: m.Rule, out: o, skipped: o.Source == limiter.SourceSkipped, shadow: shadow}
		if !shadow {
			dst = append(dst, a)
		}
		if wantAll {
			all = append(all, a)
		}
	}
	return dst, all
}

// decisionMemo is a decisions counter and what it counts: the pipeline's
// metrics, the rule, the decision and where it was decided.
type decisionMemo struct {
	m        *metrics
	rule     *rules.CompiledRule
	decision string
	source   limiter.Source
	c        prometheus.Counter
}

// decisionOf is the decisions counter of rule r's decision, decided by s,
// through seen (the scratch's last): a flood by one rule finds it with
// four comparisons where the series' map hashes three label strings.
func (e *Pipeline) decisionOf(seen *decisionMemo, r *rules.CompiledRule, decision string, s limiter.Source) prometheus.Counter {
	if seen.rule == r && seen.m == e.metrics && seen.source == s && seen.decision == decision {
		return seen.c
	}
	c := e.metrics.decision(ruleLabel(r), decision, e.reason(s))
	*seen = decisionMemo{m: e.metrics, rule: r, decision: decision, source: s, c: c}
	return c
}

func (e *Pipeline) reason(s limiter.Source) string {
	if s == limiter.SourceStore {
		return e.storeName
	}
	return s.String()
}
