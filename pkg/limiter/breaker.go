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
	used      atomic.Int64 // unix ns of the last get: shards that stop being used are forgotten
	// probeLimit is a limit of the shard that failed: readiness checks
	// probe with it when no request comes to do so.
	probeLimit atomic.Pointer[Limit]
	// answered is when the shard last answered (unix ns on the limiter's
	// clock; 0: never): the fallback gives an exact check's key no share
	// when it knows nothing of it and the shard answered within its
	// window (Limiter.unknownInWindow).
	answered atomic.Int64
	// failedAt is when a call to the shard last failed, and downSince when
	// the first failure after its last answer came (unix ns on the
	// limiter's clock; downSince 0 or before answered: none since): what
	// says the shard is down now, and has been for how long
	// (Limiter.downThroughWindow).
	failedAt, downSince atomic.Int64
	// ident is the shard's identity as last read (identity.go), and
	// identing is set while a read is under way.
	ident    atomic.Pointer[storeIdent]
	identing atomic.Bool
}

func newBreaker(threshold int, cooldown time.Duration, onChange func(breakerState)) *breaker {
	return &breaker{threshold: int32(threshold), cooldown: cooldown, onChange: onChange}
}

// breakers holds one breaker per shard, made on first use. Shards are store
// nodes, so the set stays small.
type breakers struct {
	mu        sync.RWMutex
	m         map[string]*breaker
	threshold int
	cooldown  time.Duration
	// onChange reports a shard's new state, how many are open, and the worst.
	onChange func(shard string, s breakerState, open int, worst breakerState)
	// onNew reports a shard seen for the first time (its breaker closed);
	// onGone one forgotten because no key has mapped to it for a while (a
	// failed Cluster master whose slots moved to the promoted replica).
	onNew, onGone func(shard string)
	swept         atomic.Int64 // unix ns of the last sweep
}

// forgetAfter is how long a shard no key maps to keeps its breaker.
const forgetAfter = 10 * time.Second

func newBreakers(threshold int, cooldown time.Duration, onChange func(string, breakerState, int, breakerState)) *breakers {
	return &breakers{m: map[string]*breaker{}, threshold: threshold, cooldown: cooldown, onChange: onChange}
}

func (bs *breakers) get(shard string) *breaker {
	now := time.Now().UnixNano()
	if last := bs.swept.Load(); now-last > int64(forgetAfter) && bs.swept.CompareAndSwap(last, now) {
		bs.mu.Lock()
		bs.sweep(now)
		bs.mu.Unlock()
	}
	bs.mu.RLock()
	b, ok := bs.m[shard]
	bs.mu.RUnlock()
	if !ok {
		bs.mu.Lock()
		if b, ok = bs.m[shard]; !ok {
			b = newBreaker(bs.threshold, bs.cooldown, func(s breakerState) { bs.changed(shard, s) })
			bs.m[shard] = b
			if bs.onNew != nil {
				bs.onNew(shard)
			}
		}
		bs.mu.Unlock()
	}
	if b.used.Load() < now {
		b.used.Store(now)
	}
	return b
}

// sweep forgets shards no key has mapped to for forgetAfter, so a failed
// master's open breaker does not linger in the metrics. Called locked.
func (bs *breakers) sweep(now int64) {
	for name, b := range bs.m {
		if now-b.used.Load() > int64(forgetAfter) {
			delete(bs.m, name)
			if bs.onGone != nil {
				bs.onGone(name)
			}
		}
	}
}

// changed runs under the shard's breaker lock; it reads the others' states
// atomically and never takes their locks.
func (bs *breakers) changed(shard string, s breakerState) {
	bs.mu.Lock()
	open, worst := 0, breakerClosed
	for name, b := range bs.m {
		st := breakerState(b.state.Load())
		if name == shard {
			st = s
		}
		if st != breakerClosed {
			open++
		}
		worst = max(worst, st)
	}
	bs.mu.Unlock()
	if bs.onChange != nil {
		bs.onChange(shard, s, open, worst)
	}
}

// allow says whether a call may go to the store, and whether it is the
// half-open probe.
func (b *breaker) allow(now time.Time) (ok, probe bool) {
	if breakerState(b.state.Load()) == breakerClosed {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch breakerState(b.state.Load()) {
	case breakerClosed:
		return true, false
	case breakerOpen:
		if now.Sub(b.openedAt) >= b.cooldown {
			b.set(breakerHalfOpen) // exactly one probe
			return true, true
		}
	}
	return false, false
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
	at := now.UnixNano()
	b.failedAt.Store(at)
	if d := b.downSince.Load(); d == 0 || d < b.answered.Load() {
		b.downSince.Store(at)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := breakerState(b.state.Load())
	if s == breakerHalfOpen || (s == breakerClosed && n >= b.threshold) {
		b.openedAt = now
		b.set(breakerOpen)
	}
}

// probeEarly starts the half-open probe before the cooldown has passed,
// when the breaker is open (a probe already in flight is not doubled):
// the fallback asks for one when its evidence that the shard is down has
// grown stale (Limiter.downThroughWindow).
func (b *breaker) probeEarly() bool {
	if breakerState(b.state.Load()) != breakerOpen {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if breakerState(b.state.Load()) != breakerOpen {
		return false
	}
	b.set(breakerHalfOpen)
	return true
}

// set changes state; called locked.
func (b *breaker) set(s breakerState) {
	b.state.Store(int32(s))
	if b.onChange != nil {
		b.onChange(s)
	}
}
