package shedder

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Host queue settings bounds.
const (
	// DefaultHostQueueTimeout is how long a request over its host's share
	// waits for a place: long enough that a client retrying at once costs
	// the edge about one refusal a second, short enough that it is not
	// held far past the origin's own answer time.
	DefaultHostQueueTimeout = time.Second
	// MaxHostQueueTimeout bounds host_share.queue_timeout.
	MaxHostQueueTimeout = 30 * time.Second
	// MaxHostQueued bounds host_share.max_queued.
	MaxHostQueued = 1_000_000
	// hostQueuePerWorker is max_queued's default per worker.
	hostQueuePerWorker = 4
)

// ErrHostShare: the request's host is at its share and the host queues
// are off (host_share.queue_timeout 0).
var ErrHostShare = errors.New("shedder: the host is at its share of the workers")

// Wait outcomes, as the waits metric labels them.
const (
	waitAdmitted = iota
	waitTimedOut
	waitFull
	waitGone
	numWaitOutcomes
)

var waitOutcomeNames = [numWaitOutcomes]string{"admitted", "timed_out", "full", "client_gone"}

// hostWaiter is a request waiting for a place in its host's share. Its
// fields other than ready are guarded by HostShares.mu.
type hostWaiter struct {
	prev, next *hostWaiter
	ready      chan struct{} // one buffered wake-up
	slot       int32         // the slot it waits on (-1: the pooled rest)
	gen        uint32        // the table's generation then
	epoch      uint32        // the slot's epoch then
	queued     bool          // in its slot's list
	waited     bool          // queued once: goes back at the head
	woken      bool          // holds a reserved place of its slot
}

// waitList is one slot's queue, first come first served.
type waitList struct {
	head, tail *hostWaiter
	n          int32
	// reserved counts the places of the slot held for woken waiters that
	// have not judged themselves yet.
	reserved int32
}

// AcquireWait is AcquireFrom for a request that may wait: a request its
// host's share refuses waits in its host's queue (first come first served)
// up to host_share.queue_timeout for a place, holding none meanwhile, and
// is admitted when a release (or a recount growing the share) wakes it and
// it then passes AcquireFrom's judgement. While it waits, gone (nil:
// never) is asked every 50 ms (goneEvery; less often past 256 waiters,
// goneAskPerPass) by one goroutine for all the waiters, so it must be safe to call from another goroutine while this
// call waits (never after it returns), and ctx is watched; either ends
// the wait with ErrGone. Errors: ErrHostShare (no queue), ErrQueueFull
// (the queues hold max_queued), ErrQueueTimeout, ErrGone. A request
// admitted at once costs what AcquireFrom costs: nothing is allocated.
func (h *HostShares) AcquireWait(ctx context.Context, now time.Time, host string, client netip.Addr, tier Tier, gone func() bool) (HostLease, error) {
	if l, ok, _ := h.acquire(now, host, client, tier, nil); ok {
		return l, nil
	}
	h.mu.Lock()
	timeout := h.queueTimeout
	h.mu.Unlock()
	if timeout <= 0 {
		return HostLease{}, ErrHostShare
	}
	w := &hostWaiter{ready: make(chan struct{}, 1)}
	l, ok, queued := h.acquire(now, host, client, tier, w)
	switch {
	case ok:
		h.waits[waitAdmitted].Add(1)
		return l, nil
	case !queued:
		h.waits[waitFull].Add(1)
		return HostLease{}, ErrQueueFull
	}
	start := time.Now()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var left <-chan struct{}
	if gone != nil {
		// One goroutine asks every waiter's client in turn (and recounts
		// the hosts once a pass: no request may come to do it, and a host
		// that left frees places for these waiters all the same).
		gw := h.watch.add(gone, now, start)
		defer h.watch.remove(gw)
		left = gw.left
	}
	for {
		select {
		case <-w.ready:
			at := now.Add(time.Since(start))
			if l, ok, _ = h.acquire(at, host, client, tier, w); !ok {
				continue // back at the head of its queue
			}
			if gone != nil && gone() {
				l.Release() // the next waiter gets it
				h.waits[waitGone].Add(1)
				return HostLease{}, ErrGone
			}
			h.waits[waitAdmitted].Add(1)
			return l, nil
		case <-left:
			h.cancel(w)
			h.waits[waitGone].Add(1)
			return HostLease{}, ErrGone
		case <-timer.C:
			h.cancel(w)
			h.waits[waitTimedOut].Add(1)
			return HostLease{}, ErrQueueTimeout
		case <-ctx.Done():
			h.cancel(w)
			h.waits[waitGone].Add(1)
			return HostLease{}, fmt.Errorf("%w: %w", ErrGone, ctx.Err())
		}
	}
}

// maybeRecount recounts the active hosts (waking waiters for the places
// that frees) when the last recount is older than recountEvery.
func (h *HostShares) maybeRecount(now time.Time) {
	ns := now.UnixNano()
	h.mu.Lock()
	if h.enabled && ns-h.recountAt >= int64(recountEvery) {
		h.recountLocked(ns)
	}
	h.mu.Unlock()
}

// cancel takes w out of its queue; a place it was woken for goes to the
// next waiter of its host.
func (h *HostShares) cancel(w *hostWaiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.slotOfLocked(w)
	if w.queued && s != nil {
		h.unlinkLocked(s, w)
	}
	if w.woken {
		h.unreserveLocked(w)
		if s != nil {
			h.wakeLocked(s, min(h.roomLocked(s), 1))
		}
	}
}

// slotOfLocked is the slot w waits on, nil when a resize or another host
// has since taken it (its reservation went with it).
func (h *HostShares) slotOfLocked(w *hostWaiter) *hostSlot {
	if w.slot < 0 {
		if h.other.epoch != w.epoch {
			return nil
		}
		return &h.other
	}
	if w.gen != h.gen || int(w.slot) >= len(h.slots) || h.slots[w.slot].epoch != w.epoch {
		return nil
	}
	return &h.slots[w.slot]
}

// enqueueLocked puts w in slot i's queue (-1: the pooled rest), at the
// head when it waited before; a new waiter finding max_queued waiting is
// not queued (false).
func (h *HostShares) enqueueLocked(w *hostWaiter, i int32) bool {
	limit := h.maxQueued
	if limit <= 0 {
		limit = hostQueuePerWorker * h.capacity
	}
	if !w.waited && h.queued >= limit {
		return false
	}
	s := &h.other
	if i >= 0 {
		s = &h.slots[i]
	}
	w.slot, w.gen, w.epoch, w.queued = i, h.gen, s.epoch, true
	q := &s.wq
	if w.waited && q.head != nil {
		w.prev, w.next = nil, q.head
		q.head.prev = w
		q.head = w
	} else {
		w.prev, w.next = q.tail, nil
		if q.tail != nil {
			q.tail.next = w
		} else {
			q.head = w
		}
		q.tail = w
	}
	w.waited = true
	q.n++
	h.queued++
	return true
}

// unlinkLocked takes w, queued in s, out of s's list.
func (h *HostShares) unlinkLocked(s *hostSlot, w *hostWaiter) {
	q := &s.wq
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next, w.queued = nil, nil, false
	q.n--
	h.queued--
}

// unreserveLocked gives back the place w was woken for, if it holds one.
func (h *HostShares) unreserveLocked(w *hostWaiter) {
	if !w.woken {
		return
	}
	w.woken = false
	if s := h.slotOfLocked(w); s != nil {
		s.wq.reserved--
		h.reserved--
	}
}

// wakeLocked wakes the first n waiters of s, each holding a place of s
// until it judges itself.
func (h *HostShares) wakeLocked(s *hostSlot, n int) {
	for ; n > 0 && s.wq.head != nil; n-- {
		w := s.wq.head
		h.unlinkLocked(s, w)
		w.woken = true
		s.wq.reserved++
		h.reserved++
		h.wakeups++
		signal(w.ready)
	}
}

// flushLocked wakes every waiter of s with no place held, and drops the
// places its woken waiters hold: each judges itself again.
func (h *HostShares) flushLocked(s *hostSlot) {
	for w := s.wq.head; w != nil; w = s.wq.head {
		h.unlinkLocked(s, w)
		signal(w.ready)
	}
	h.reserved -= int(s.wq.reserved)
	s.wq.reserved = 0
}

// flushAllLocked flushes every slot and the pooled rest; the slots' epochs
// move on so no woken waiter gives back a place twice.
func (h *HostShares) flushAllLocked() {
	for i := range h.slots {
		h.flushLocked(&h.slots[i])
		h.slots[i].epoch++
	}
	h.flushLocked(&h.other)
	h.other.epoch++
	h.reserved = 0
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// roomLocked is how many more requests s's host could take now, judged on
// its whole count: the rest of its share, or the idle workers beyond a
// share (at least 1 for a lone host, which is never held to a share).
func (h *HostShares) roomLocked(s *hostSlot) int {
	capacity := h.capacityLocked()
	idle := capacity - h.inflight - h.reserved
	if h.active <= 1 {
		return max(idle, 1)
	}
	share := shareOf(capacity, int(s.weight), h.weight)
	room := share - s.inflight - int(s.wq.reserved)
	if idle > share {
		room = max(room, idle-share)
	}
	if s.rateCap > 0 {
		room = min(room, int(s.rateCap-s.admits-s.wq.reserved))
	}
	return room
}

// wakeRoomLocked wakes, in every queue, as many waiters as its host has
// room for (after a recount or a capacity change).
func (h *HostShares) wakeRoomLocked() {
	if h.queued == 0 {
		return
	}
	for i := range h.slots {
		if s := &h.slots[i]; s.wq.n > 0 {
			h.wakeLocked(s, h.roomLocked(s))
		}
	}
	if h.other.wq.n > 0 {
		h.wakeLocked(&h.other, h.roomLocked(&h.other))
	}
}

// Queued is how many requests wait for a place in their host's share.
func (h *HostShares) Queued() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.queued
}
