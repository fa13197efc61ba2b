package limiter

import (
	"sync"
	"sync/atomic"
	"time"
)

type breakerState int32

const (
	breakerClosed breakerState = iota
	breakerOpen
	breakerHalfOpen
)

// breaker stops a failing store from costing every request its deadline:
// after `threshold` consecutive failures it opens, checks go straight to the
// fallback, and every `cooldown` one call is let through to probe recovery.
type breaker struct {
	state     atomic.Int32 // read lock-free on every call
	failures  atomic.Int32
	mu        sync.Mutex
	threshold int32
	cooldown  time.Duration
	openedAt  time.Time
	onChange  func(breakerState)
}

func newBreaker(threshold int, cooldown time.Duration, onChange func(breakerState)) *breaker {
	return &breaker{threshold: int32(threshold), cooldown: cooldown, onChange: onChange}
}

func (b *breaker) allow(now time.Time) bool {
	if breakerState(b.state.Load()) == breakerClosed {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch breakerState(b.state.Load()) {
	case breakerClosed:
		return true
	case breakerOpen:
		if now.Sub(b.openedAt) >= b.cooldown {
			b.set(breakerHalfOpen) // exactly one probe
			return true
		}
	}
	return false
}

func (b *breaker) success() {
	if b.failures.Load() == 0 && breakerState(b.state.Load()) == breakerClosed {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures.Store(0)
	if breakerState(b.state.Load()) != breakerClosed {
		b.set(breakerClosed)
	}
}

func (b *breaker) failure(now time.Time) {
	n := b.failures.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	s := breakerState(b.state.Load())
	if s == breakerHalfOpen || (s == breakerClosed && n >= b.threshold) {
		b.openedAt = now
		b.set(breakerOpen)
	}
}

// set changes state; called locked.
func (b *breaker) set(s breakerState) {
	b.state.Store(int32(s))
	if b.onChange != nil {
		b.onChange(s)
	}
}
