package shedder

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Named so the edge can map each to its own response and log line.
var (
	// ErrQueueFull: every worker is busy and the wait queue is at its bound.
	ErrQueueFull = errors.New("shedder: worker queue full")
	// ErrQueueTimeout: the request waited queue_timeout without a slot.
	ErrQueueTimeout = errors.New("shedder: timed out waiting for a worker")
	// ErrGone: the request's client went away while it waited; it left
	// the queue (or gave back the slot it had just been granted).
	ErrGone = errors.New("shedder: the client left while waiting for a worker")
)

// Workers is the hard cap on requests the edge runs at once, with a short
// bounded queue in front of it. It is the only protection critical traffic is
// subject to, so the queue is ordered by tier: a freed slot goes to the
// highest tier waiting (first come first served within a tier). So before
// the ramp has had time to shed, critical requests still get the slots.
//
// The sheddable tiers (test, read, write) share queue_size places, and a
// full queue makes room for a higher of them by turning away its lowest-tier
// waiter; they wait at most the queue timeout. Critical requests wait in
// places of their own, as many as the workers (so the node holds at most
// twice its cap of critical requests), up to their own, longer bound.
// When the workers are held by requests waiting on an overloaded origin
// shared with other edges, a slot frees only when the origin reaches one of
// this edge's requests, and that gap is set by the origin's queue, not by
// this edge: a critical request given the sheddable tiers' short timeout, or
// a place among them, would be refused while the next slot is already
// promised to it.
//
// A mutex (not a channel semaphore) because the queue is ordered and its
// settings change live.
type Workers struct {
	mu              sync.Mutex
	capacity        int
	busy            int
	queueSize       int
	queueTimeout    time.Duration
	criticalTimeout time.Duration // 0: queueTimeout
	queue           []*waiter
	criticalWaiting int // critical waiters in queue
	waitObs         [numTiers]prometheus.Observer
	onReject        func(Tier, error)
	watch           goneWatch // asks the waiters' clients whether they are still there
}

type waiter struct {
	tier    Tier
	owed    bool          // its host's share owes it a worker (TakeOwed)
	ready   chan struct{} // closed when a slot is handed over or the waiter is evicted
	granted bool          // guarded by Workers.mu; settles timeout races
	evicted bool          // guarded by Workers.mu: turned away for a higher tier
}

// NewWorkers returns a cap of capacity slots with up to queueSize waiters
// of the sheddable tiers (and capacity critical ones), each waiting at most
// queueTimeout (critical ones too, until SetCriticalTimeout or a Shedder's
// settings say otherwise). It panics on capacity < 1 or negative queue
// settings, like make does on a negative size: those are programming
// errors; live queue changes go through SetQueue, which returns errors.
func NewWorkers(capacity, queueSize int, queueTimeout time.Duration) *Workers {
	if capacity < 1 {
		panic(fmt.Sprintf("shedder: NewWorkers: capacity must be >= 1, got %d", capacity))
	}
	if queueSize < 0 || queueTimeout < 0 {
		panic(fmt.Sprintf("shedder: NewWorkers: negative queue setting (size %d, timeout %v)", queueSize, queueTimeout))
	}
	return &Workers{capacity: capacity, queueSize: queueSize, queueTimeout: queueTimeout}
}

// Acquire takes a worker slot for a request of the given tier, waiting in the
// queue if all are busy. On success the caller must call release once when
// the request is done; further calls are no-ops so a deferred release is
// always safe. An out-of-range tier is treated as write. Errors:
// ErrQueueFull (also when evicted for a higher tier),
// ErrQueueTimeout, or the context's error (wrapped).
func (w *Workers) Acquire(ctx context.Context, tier Tier) (release func(), err error) {
	return w.AcquireUnless(ctx, tier, nil)
}

// AcquireUnless is Acquire for a request whose client may leave: while it
// waits in the queue, gone is asked every 50 ms (goneEvery; less often
// past 256 waiters, goneAskPerPass; by one goroutine for all the waiters, so it must be cheap and safe to call from
// another goroutine while this call waits, never after it returns) and
// once more when a slot is granted after a wait, and a true answer ends
// the wait with ErrGone, so a slot never goes to a request nobody will
// read the answer of; nil never leaves. A slot taken without waiting does
// not ask.
func (w *Workers) AcquireUnless(ctx context.Context, tier Tier, gone func() bool) (release func(), err error) {
	if err := w.take(ctx, tier, gone, 0); err != nil {
		return nil, err
	}
	return w.releaser(), nil
}

// Slot is a worker slot TakeUnless took. Its Release gives the slot back
// and must be called exactly once (a deferred call, say); unlike
// AcquireUnless's release func, a second call would give back a slot
// another request holds.
type Slot struct{ w *Workers }

// Release gives the slot back.
func (s Slot) Release() { s.w.release() }

// TakeUnless is AcquireUnless for a caller that releases exactly once: the
// slot it returns is a value, where AcquireUnless allocates its release
// func (two allocations per request on the edge's request path).
func (w *Workers) TakeUnless(ctx context.Context, tier Tier, gone func() bool) (Slot, error) {
	return w.TakeOwed(ctx, tier, gone, 0)
}

// TakeOwed is TakeUnless for a request its host's share owes a worker
// (HostLease.Owed: its host is within its share while other hosts are
// served, so the workers it finds busy are held by hosts at or over their
// own). With owed > 0 it waits ahead of the waiters of its tier that are
// owed none, a full queue turns the newest of those away for it (as it
// does for a higher tier), and it waits up to the longer of the queue
// timeout and owed: a host within its share waits for a worker at least as
// long as a request over its share waits for a place (host_share.
// queue_timeout), instead of losing the workers the hosts over their share
// give back to their own queued requests. With owed 0 it is TakeUnless.
func (w *Workers) TakeOwed(ctx context.Context, tier Tier, gone func() bool, owed time.Duration) (Slot, error) {
	if err := w.take(ctx, tier, gone, owed); err != nil {
		return Slot{}, err
	}
	return Slot{w}, nil
}

// take is acquire, with a refusal counted.
func (w *Workers) take(ctx context.Context, tier Tier, gone func() bool, owed time.Duration) error {
	err := w.acquire(ctx, tier, gone, owed)
	if err != nil {
		w.mu.Lock()
		count := w.onReject
		w.mu.Unlock()
		if count != nil {
			count(tier, err)
		}
	}
	return err
}

// acquire takes a slot (counted in busy) or says why not; owed > 0 is
// TakeOwed's.
func (w *Workers) acquire(ctx context.Context, tier Tier, gone func() bool, owed time.Duration) (err error) {
	if !tier.valid() {
		tier = TierWrite // as Shedder.Admit classes it
	}
	w.mu.Lock()
	// Skipping ahead of waiters would starve them under steady load.
	if w.busy < w.capacity && len(w.queue) == 0 {
		w.busy++
		w.mu.Unlock()
		return nil
	}
	if w.queueTimeout <= 0 || w.queueSize == 0 {
		w.mu.Unlock()
		return ErrQueueFull
	}
	switch {
	case tier == TierCritical:
		// Places of their own, as many as the workers: a burst of critical
		// requests (after a stall, say) must not find them taken by the
		// tiers shed before it.
		if w.criticalWaiting >= w.capacity {
			w.mu.Unlock()
			return ErrQueueFull
		}
	case len(w.queue)-w.criticalWaiting >= w.queueSize:
		low := w.lowestLocked()
		if w.queue[low].rank() >= rankOf(tier, owed > 0) {
			w.mu.Unlock()
			return ErrQueueFull
		}
		ev := w.queue[low]
		w.removeAt(low)
		ev.evicted = true
		close(ev.ready)
	}
	if err := ctx.Err(); err != nil {
		w.mu.Unlock()
		return fmt.Errorf("shedder: waiting for a worker: %w", err)
	}
	wt := &waiter{tier: tier, owed: owed > 0, ready: make(chan struct{})}
	w.queue = append(w.queue, wt)
	timeout := max(w.queueTimeout, owed)
	if tier == TierCritical {
		w.criticalWaiting++
		timeout = max(timeout, w.criticalTimeout)
	}
	obs := w.waitObs[tier]
	w.mu.Unlock()

	start := time.Now()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var left <-chan struct{}
	if gone != nil {
		gw := w.watch.add(gone, start, start)
		defer w.watch.remove(gw)
		left = gw.left
	}
wait:
	for {
		select {
		case <-wt.ready:
			observeWait(obs, start)
			w.mu.Lock()
			evicted := wt.evicted
			w.mu.Unlock()
			if evicted {
				return ErrQueueFull
			}
			if gone != nil && gone() {
				w.release()
				return ErrGone
			}
			return nil
		case <-left:
			err = ErrGone
			break wait
		case <-timer.C:
			err = ErrQueueTimeout
			break wait
		case <-ctx.Done():
			err = fmt.Errorf("shedder: waiting for a worker: %w", ctx.Err())
			break wait
		}
	}

	w.mu.Lock()
	if wt.evicted {
		w.mu.Unlock()
		observeWait(obs, start)
		return ErrQueueFull
	}
	if wt.granted {
		// A slot was handed over as we gave up: it is ours now, and
		// refusing it would leak it.
		w.mu.Unlock()
		observeWait(obs, start)
		if err == ErrGone {
			w.release() // nobody to serve: the next waiter gets it
			return ErrGone
		}
		return nil
	}
	w.removeLocked(wt)
	w.mu.Unlock()
	observeWait(obs, start)
	return err
}

func observeWait(obs prometheus.Observer, start time.Time) {
	if obs != nil {
		obs.Observe(time.Since(start).Seconds())
	}
}

func (w *Workers) releaser() func() {
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			w.release()
		}
	}
}

func (w *Workers) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.queue) > 0 && w.busy <= w.capacity {
		w.grantLocked()
		return
	}
	w.busy--
}

// rankOf orders waiters: by tier, then those owed a worker (TakeOwed)
// before those owed none.
func rankOf(tier Tier, owed bool) int {
	r := int(tier) * 2
	if owed {
		r++
	}
	return r
}

func (wt *waiter) rank() int { return rankOf(wt.tier, wt.owed) }

// grantLocked hands a slot (already counted in busy) to the oldest waiter of
// the highest rank waiting (rankOf).
func (w *Workers) grantLocked() {
	best := 0
	for i, q := range w.queue {
		if q.rank() > w.queue[best].rank() {
			best = i
		}
	}
	wt := w.queue[best]
	w.removeAt(best)
	wt.granted = true
	close(wt.ready)
}

// lowestLocked is the newest waiter of the lowest rank waiting (rankOf):
// the one a higher sheddable tier, or a waiter of its tier owed a worker,
// may turn away when the sheddable places are full (so it is never a
// critical waiter).
func (w *Workers) lowestLocked() int {
	low := len(w.queue) - 1
	for i := len(w.queue) - 1; i >= 0; i-- {
		if w.queue[i].rank() < w.queue[low].rank() {
			low = i
		}
	}
	return low
}

func (w *Workers) removeAt(i int) {
	if w.queue[i].tier == TierCritical {
		w.criticalWaiting--
	}
	copy(w.queue[i:], w.queue[i+1:])
	w.queue[len(w.queue)-1] = nil
	w.queue = w.queue[:len(w.queue)-1]
}

func (w *Workers) removeLocked(wt *waiter) {
	for i, q := range w.queue {
		if q == wt {
			w.removeAt(i)
			return
		}
	}
}

// SetQueue changes the queue bound and the sheddable tiers' timeout live.
// Requests already queued keep the timeout they started with.
func (w *Workers) SetQueue(size int, timeout time.Duration) error {
	var errs []error
	if size < 0 {
		errs = append(errs, fmt.Errorf("%w: queue_size: must be >= 0, got %d", ErrInvalidConfig, size))
	}
	if timeout < 0 {
		errs = append(errs, fmt.Errorf("%w: queue_timeout: must be >= 0, got %v", ErrInvalidConfig, timeout))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	w.mu.Lock()
	w.queueSize, w.queueTimeout = size, timeout
	w.mu.Unlock()
	return nil
}

// SetCriticalTimeout changes how long critical requests may wait for a
// slot, live: they wait the longer of it and the queue timeout (0: the
// queue timeout, like every tier). Requests already queued keep the
// timeout they started with.
func (w *Workers) SetCriticalTimeout(timeout time.Duration) error {
	if timeout < 0 {
		return fmt.Errorf("%w: critical_queue_timeout: must be >= 0, got %v", ErrInvalidConfig, timeout)
	}
	w.mu.Lock()
	w.criticalTimeout = timeout
	w.mu.Unlock()
	return nil
}

// setWaitObserver makes every queued request's wait observed on obs(tier).
func (w *Workers) setWaitObserver(obs func(Tier) prometheus.Observer) {
	w.mu.Lock()
	for t := range Tier(numTiers) {
		w.waitObs[t] = obs(t)
	}
	w.mu.Unlock()
}

// setRejectCounter makes every refused Acquire call count(tier, err).
func (w *Workers) setRejectCounter(count func(Tier, error)) {
	w.mu.Lock()
	w.onReject = count
	w.mu.Unlock()
}

// Busy returns the slots in use.
func (w *Workers) Busy() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.busy
}

// queued returns the requests waiting for a slot (tests wait on it).
// Queued is how many requests wait for a slot now.
func (w *Workers) Queued() int { return w.queued() }

func (w *Workers) queued() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue)
}

// Capacity returns the cap.
func (w *Workers) Capacity() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.capacity
}

// Utilization is busy/capacity, the shedder's input.
func (w *Workers) Utilization() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return float64(w.busy) / float64(w.capacity)
}

// SetCapacity changes the cap live: a larger cap hands the new slots to
// the waiters at once; a smaller one takes effect as requests end.
func (w *Workers) SetCapacity(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.capacity = max(n, 1)
	for w.busy < w.capacity && len(w.queue) > 0 {
		w.busy++
		w.grantLocked()
	}
}
