package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// peekProblem reports why c cannot be a peek, nil when it can (or is not
// one).
func (c Check) peekProblem() error {
	switch {
	case !c.Peek:
		return nil
	case c.Tolerance > 0 || c.Global:
		return fmt.Errorf("%w: a leased or global check cannot peek", ErrInvalidRequest)
	case c.Limit.Algorithm.Spec().Members:
		return fmt.Errorf("%w: %s cannot peek (its script trims expired members before it reads)", ErrInvalidRequest, c.Limit.Algorithm)
	}
	return nil
}

// decideWithPeeks decides a request with peeks among its checks: each
// peek alone (peek), the others as Decide decides them, then the request
// all-or-nothing as Decide does. v holds the checks' initial decisions.
func (l *Limiter) decideWithPeeks(ctx context.Context, checks []Check, keys []string, rd *Rider, v Verdict, now time.Time) (Verdict, error) {
	var rest []Check
	var at []int
	for i, c := range checks {
		if !c.Peek {
			rest, at = append(rest, c), append(at, i)
			continue
		}
		d, err := l.peek(ctx, c, keys[i], now)
		if err != nil {
			return Verdict{}, err
		}
		v.Checks[i] = d
	}
	if len(rest) > 0 {
		rv, err := l.DecideRiding(ctx, rest, rd, nil)
		if err != nil {
			return Verdict{}, err
		}
		for j, i := range at {
			v.Checks[i] = rv.Checks[j]
		}
	}
	for i, c := range checks {
		if !c.Shadow && !v.Checks[i].Allowed {
			v.Allowed = false
		}
	}
	if !v.Allowed {
		l.refund(v.Checks, func(Decision) bool { return true })
	}
	return v, nil
}

// peek answers a peek without counting anything: from the over-limit cache
// when it knows the key over (no call), else from the store (a cost of 0,
// which the scripts answer without writing), else, when the store cannot
// answer, per the fail mode: the fallback's local view, read without
// taking or seeding, open or closed. A peek is never cached, never owed to
// the store and never coalesced with takes.
func (l *Limiter) peek(ctx context.Context, c Check, key string, now time.Time) (Decision, error) {
	if !c.Limit.Algorithm.Spec().Held {
		if d, ok := l.cache.get(c.Limit, c.Cost, now); ok {
			l.metrics.prefilterHits.Inc()
			l.metrics.record(SourcePrefilter, 1)
			return d.from(SourcePrefilter, nil), nil
		}
	}
	req := []Request{{Limit: c.Limit, Cost: c.Cost, Peek: true}}
	b := l.breakers.get(l.store.Shard(c.Limit))
	err := errBreakerOpen
	if l.admitToShard(b, c.Limit, now) {
		cctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
		var ds []Decision
		ds, err = l.store.Take(cctx, req)
		cancel()
		var te *TakeError
		if errors.As(err, &te) && len(te.Errs) == 1 {
			err = te.Errs[0]
		}
		switch {
		case err == nil:
			b.answered.Store(l.now().UnixNano())
			b.success()
			l.metrics.record(SourceStore, 1)
			return ds[0].from(SourceStore, nil), nil
		case callerError(err):
			return Decision{}, err
		case ctx.Err() != nil:
			// The caller gave up: nothing said about the store.
			return Decision{}, ctx.Err()
		}
		b.failure(l.now())
	}
	reason := "error"
	if errors.Is(err, errBreakerOpen) {
		reason = "breaker_open"
	}
	l.metrics.fallbacks.WithLabelValues(reason).Inc()
	switch l.cfg.FailMode {
	case FailOpen:
		l.metrics.record(SourceOpen, 1)
		return Decision{Allowed: true, Limit: c.Limit.Limit, Remaining: c.Limit.Limit, Source: SourceOpen}, nil
	case FailClosed:
		return Decision{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return l.peekLocally(c), nil
}

// peekLocally is the fallback's answer to a peek: what this node's share
// (decideLocally) has left, read from the fallback's count when this
// outage has one for the key, else from the store's last answer. Nothing
// is taken, seeded or owed.
func (l *Limiter) peekLocally(c Check) Decision {
	l.metrics.record(SourceFallback, 1)
	local := c.Limit
	nodes := int64(max(c.Nodes, 1))
	local.Limit = c.Limit.Limit / nodes
	local.Burst = c.Limit.Burst / nodes
	key := memKey(c.Limit)
	now := l.now()
	if local.Limit < 1 || (c.Limit.Burst > 0 && local.Burst < 1) || l.unknownInWindow(c, key, now) {
		retry := max(l.cfg.BreakerCooldown, time.Second)
		return Decision{Limit: c.Limit.Limit, ResetAfter: retry, Lease: Lease{Limit: local}, Source: SourceFallback}
	}
	ds, err := l.fallback.Take(context.Background(), []Request{{Limit: local, Cost: c.Cost, Peek: true}})
	if err != nil {
		return Decision{Limit: c.Limit.Limit, Source: SourceFallback}
	}
	d := ds[0]
	if used, seeded := l.ledger.peekSeed(key, local.Capacity(), nodes, now); !seeded {
		// No local count this outage yet (what the fallback holds is an
		// earlier outage's): the share the store's last answer leaves.
		d.Remaining = max(0, local.Capacity()-used)
		d.Allowed = d.Remaining >= c.Cost
	}
	return d.from(SourceFallback, nil)
}
