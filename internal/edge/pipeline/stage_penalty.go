package pipeline

import (
	"context"
	"time"

	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// penaltyStage denies a request whose key is serving a penalty (step 7,
// Penalty: escapes.go), or is blocked by a response-counted rule
// (response.go): 429 with Retry-After until its end, nothing counted, the
// behaviour layer not told. Both are looked up in one round trip.
func (e *Pipeline) penaltyStage(sc *scratch) string {
	if (len(sc.matches) > 0 || len(sc.after) > 0) && e.penalised(sc) {
		return outcomeDenied
	}
	return e.next(sc)
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
func (e *Pipeline) penalised(sc *scratch) bool {
	var keysBuf [maxPenaltyKeys]string
	var atBuf [maxPenaltyKeys]int
	keys, at := penaltyKeys(sc, keysBuf[:0], atBuf[:0])
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
	e.countPenalised(sc, at, left)
	appliedPenalties(sc, at, left)
	deny(sc.ctx, sc.applied, e.cfg.LegacyHeaders, &sc.policy)
	return true
}

// penaltyKeys appends the keys to ask the penalty box about, and the index
// (penaltyRule's) of the rule each belongs to.
func penaltyKeys(sc *scratch, keys []string, at []int) ([]string, []int) {
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
	return keys, at
}

// penaltyRule is the match and check at index i of sc.matches followed by
// sc.after.
func penaltyRule(sc *scratch, i int) (rules.Match, limiter.Check) {
	if i < len(sc.matches) {
		return sc.matches[i], sc.checks[i]
	}
	return sc.after[i-len(sc.matches)], sc.afterChecks[i-len(sc.matches)]
}

// countPenalised counts the denial of each rule whose key is penalised
// (left[j] > 0 for the rule at index at[j]).
func (e *Pipeline) countPenalised(sc *scratch, at []int, left []time.Duration) {
	for j, i := range at {
		if left[j] <= 0 {
			continue
		}
		sc.penalised = true
		m, _ := penaltyRule(sc, i)
		escape, reason := escapePenalised, "penalty"
		if i >= len(sc.matches) {
			escape, reason = escapeResponseBlocked, "response"
		}
		e.metrics.decision(ruleLabel(m.Rule), "denied", reason).Inc()
		e.metrics.escape(ruleLabel(m.Rule), escape).Inc()
	}
}

// appliedPenalties is what clients see: the penalised rules deny until
// their penalty ends; the others were not asked.
func appliedPenalties(sc *scratch, at []int, left []time.Duration) {
	j := 0
	for i := range len(sc.matches) + len(sc.after) {
		m, c := penaltyRule(sc, i)
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
}
