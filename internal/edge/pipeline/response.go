package pipeline

import (
	"context"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// Counting by the response (count_if, cost_header): such a rule is never
// asked before the request. Its key is denied while it is over its limit
// (a block held in the penalty box, region-wide, until the limiter says a
// unit fits again); the response, when it matches, is counted afterwards on
// a goroutine of its own, so the request is never held back waiting for
// Redis. Concurrent counts for one key travel as one script call (the
// limiter's per-key coalescing), counts for different keys share
// pipelines. Worst-case overshoot: the requests of a key already in flight
// when its count crosses the limit, plus those that arrive before that
// count's reply (one Redis round trip) sets the block.

// Response escapes (the escape label).
const (
	escapeResponseCounted = "response_counted" // a response counted by a count_if/cost_header rule
	escapeResponseBlocked = "response_blocked" // denied: the key is over its response-counted limit
	escapeCostHeaderError = "cost_header_error"
)

// maxCounting bounds the response counts in flight; past it a count is
// dropped (and counted as dropped) rather than pile up goroutines while
// Redis is slow.
const maxCounting = 4096

// responseCounter sends the counts of response-aware rules.
type responseCounter struct {
	slots chan struct{}
	wg    sync.WaitGroup
}

func newResponseCounter() *responseCounter {
	return &responseCounter{slots: make(chan struct{}, maxCounting)}
}

// wait waits for the counts in flight (each bounded by the store deadline).
func (c *responseCounter) wait() { c.wg.Wait() }

// blockKey is where a response-aware rule's block for key lives.
func blockKey(key string) string { return key + ":over" }

// splitAfter moves the response-aware matches of ms into after.
func splitAfter(ms, after []rules.Match) ([]rules.Match, []rules.Match) {
	kept := ms[:0]
	for _, m := range ms {
		if m.Rule.AfterResponse() {
			after = append(after, m)
		} else {
			kept = append(kept, m)
		}
	}
	clear(ms[len(kept):])
	return kept, after
}

// countResponse counts the response for each response-aware rule it
// matches, after the fact.
func (e *Pipeline) countResponse(ctx *fasthttp.RequestCtx, sc *scratch) {
	status := ctx.Response.StatusCode()
	header := func(name string) (string, bool) {
		v := ctx.Response.Header.Peek(name)
		return b2s(v), v != nil
	}
	var batch []afterCount
	for i, m := range sc.after {
		cost, problem := m.Rule.ResponseCost(status, header)
		if problem != rules.CostOK {
			e.metrics.escape(ruleLabel(m.Rule), escapeCostHeaderError).Inc()
		}
		if cost <= 0 {
			continue
		}
		c := sc.afterChecks[i]
		c.Cost = cost
		batch = append(batch, afterCount{rule: m.Rule, check: c})
	}
	if len(batch) == 0 {
		return
	}
	select {
	case e.counter.slots <- struct{}{}:
	default:
		e.metrics.countsDropped.Inc()
		return
	}
	e.counter.wg.Go(func() {
		defer func() { <-e.counter.slots }()
		for _, a := range batch {
			e.countOne(a)
		}
	})
}

type afterCount struct {
	rule  *rules.CompiledRule
	check limiter.Check
}

// countOne takes one response's cost; when the key is over its limit, it
// is blocked until a unit fits again (or for the rule's penalty, if longer).
func (e *Pipeline) countOne(a afterCount) {
	v, err := e.limiter.Decide(context.Background(), []limiter.Check{a.check})
	if err != nil || len(v.Checks) == 0 {
		e.metrics.limiterError.Inc()
		return
	}
	o := v.Checks[0]
	label := ruleLabel(a.rule)
	decision := "allowed"
	switch {
	case !o.Allowed && a.check.Shadow:
		decision = "shadow_denied"
	case !o.Allowed:
		decision = "denied"
	}
	e.metrics.decision(label, decision, e.reason(o.Source)).Inc()
	// Counted once the count, and the block it may set, are done.
	defer e.metrics.escape(label, escapeResponseCounted).Inc()
	if o.Allowed || a.check.Shadow || o.Source == limiter.SourceOpen {
		return
	}
	d := max(o.RetryAfter, a.rule.Penalty)
	if a.rule.Penalty > 0 {
		e.metrics.escape(label, escapePenaltyStart).Inc()
	}
	if d <= 0 {
		return
	}
	if err := e.penalties.Trip(context.Background(), blockKey(a.check.Limit.Key), d); err != nil {
		e.metrics.penaltyErrors.Inc()
	}
}
