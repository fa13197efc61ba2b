package shedder

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// PoolLimitConfig bounds the requests one origin pool has in flight, so a
// slow origin is held where it is slow: requests past the limit wait in a
// short queue of the pool's own, or are refused at once, before they take
// one of the edge's workers.
type PoolLimitConfig struct {
	// Limit is the most requests in flight to the pool; 0: no limit. With
	// Adaptive, the most the learned limit may reach.
	Limit int
	// Adaptive learns the limit from the pool's latency (the gradient of
	// the edge's adaptive origin limit, AdaptiveConfig), between MinLimit
	// and Limit, starting at InitialLimit.
	Adaptive     bool
	MinLimit     int
	InitialLimit int
	// Queue is how many requests may wait for the pool past its limit
	// (0: refused at once); each waits at most QueueTimeout.
	Queue        int
	QueueTimeout time.Duration
}

// Pool limit defaults.
const (
	DefaultPoolQueueTimeout = 100 * time.Millisecond
	DefaultPoolMinLimit     = 4
	DefaultPoolInitialLimit = 20
)

// Validate reports every problem at once, each naming its field.
func (c PoolLimitConfig) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.Limit < 0 {
		bad("limit", "must be >= 0 (0: no limit), got %d", c.Limit)
	}
	if c.Adaptive && c.Limit <= 0 {
		bad("limit", "adaptive needs a limit, the most the learned limit may reach")
	}
	if c.MinLimit < 0 || (c.Limit > 0 && c.MinLimit > c.Limit) {
		bad("min_limit", "must be in [0, limit %d], got %d", c.Limit, c.MinLimit)
	}
	if c.InitialLimit < 0 || (c.Limit > 0 && c.InitialLimit > c.Limit) {
		bad("initial_limit", "must be in [0, limit %d], got %d", c.Limit, c.InitialLimit)
	}
	if c.Queue < 0 {
		bad("queue", "must be >= 0, got %d", c.Queue)
	}
	if c.QueueTimeout < 0 {
		bad("queue_timeout", "must be >= 0, got %v", c.QueueTimeout)
	}
	return errors.Join(errs...)
}

// PoolLimit is one pool's concurrency limit: a cap with a short queue
// ordered by tier (Workers), its cap learned from latency when adaptive.
// Critical requests are never refused by it and take none of its slots
// (the worker cap bounds them), as the adaptive origin limit never refuses
// them.
type PoolLimit struct {
	slots    *Workers
	adaptive *Adaptive // nil: a fixed limit

	mu       sync.Mutex
	critical int // critical requests in flight, outside the slots
	limit    int // the cap in force, as last set
}

// NewPoolLimit returns cfg's limit, nil when it sets none. cfg must be
// valid (Validate).
func NewPoolLimit(cfg PoolLimitConfig) *PoolLimit {
	if cfg.Limit <= 0 {
		return nil
	}
	timeout := cfg.QueueTimeout
	if timeout == 0 {
		timeout = DefaultPoolQueueTimeout
	}
	p := &PoolLimit{slots: NewWorkers(cfg.Limit, cfg.Queue, timeout), limit: cfg.Limit}
	if cfg.Adaptive {
		ac := DefaultAdaptiveConfig()
		ac.MaxLimit = cfg.Limit
		ac.MinLimit = cmpOr(cfg.MinLimit, min(DefaultPoolMinLimit, cfg.Limit))
		ac.InitialLimit = cmpOr(cfg.InitialLimit, min(DefaultPoolInitialLimit, cfg.Limit))
		ac.InitialLimit = max(ac.InitialLimit, ac.MinLimit)
		// It learns and sets the cap; the slots enforce it (tier shares
		// are the queue's order there).
		ac.Enabled = false
		p.adaptive = NewAdaptive(ac)
		p.limit = ac.InitialLimit
		p.slots.SetCapacity(p.limit)
	}
	return p
}

func cmpOr(v, def int) int {
	if v != 0 {
		return v
	}
	return def
}

// Acquire takes a place in the pool's limit for a request of tier at now,
// waiting in the pool's queue while gone (nil: never) says the client is
// still there. The error is ErrQueueFull, ErrQueueTimeout or ErrGone. An
// admitted request must call release once when its origin exchange ends,
// with the origin's latency and whether it measured the origin (see
// Adaptive.Release).
func (p *PoolLimit) Acquire(ctx context.Context, now time.Time, tier Tier, gone func() bool) (release func(now time.Time, rtt time.Duration, sample bool), err error) {
	if tier == TierCritical {
		p.mu.Lock()
		p.critical++
		p.mu.Unlock()
		return p.releaser(now, tier, nil), nil
	}
	free, err := p.slots.AcquireUnless(ctx, tier, gone)
	if err != nil {
		return nil, err
	}
	return p.releaser(now, tier, free), nil
}

func (p *PoolLimit) releaser(now time.Time, tier Tier, free func()) func(time.Time, time.Duration, bool) {
	if p.adaptive != nil {
		p.adaptive.Acquire(now, tier)
	}
	return func(now time.Time, rtt time.Duration, sample bool) {
		if free != nil {
			free()
		} else {
			p.mu.Lock()
			p.critical--
			p.mu.Unlock()
		}
		if p.adaptive == nil {
			return
		}
		p.adaptive.Release(now, tier, rtt, sample)
		if l := p.adaptive.Limit(); l != p.Limit() {
			p.mu.Lock()
			p.limit = l
			p.mu.Unlock()
			p.slots.SetCapacity(l)
		}
	}
}

// Limit is the cap in force: the fixed limit, or the learned one.
func (p *PoolLimit) Limit() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.limit
}

// InFlight is the pool's requests in flight, critical ones included.
func (p *PoolLimit) InFlight() int {
	p.mu.Lock()
	c := p.critical
	p.mu.Unlock()
	return p.slots.Busy() + c
}

// Queued is how many requests wait for the pool.
func (p *PoolLimit) Queued() int { return p.slots.Queued() }
