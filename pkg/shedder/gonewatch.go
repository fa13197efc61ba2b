package shedder

import (
	"runtime"
	"sync"
	"time"
)

// goneEvery is how often the clients of the requests waiting in a queue
// are asked whether they are still there: a client that left holds its
// place at most this long (plus one pass over the waiters).
const goneEvery = 50 * time.Millisecond

// goneYieldEvery is how many clients a pass asks before it lets the
// other goroutines run.
const goneYieldEvery = 32

// goneAskPerPass is how many clients one pass asks at most, in turn from
// where the last pass stopped: with more waiters, each is asked every
// ceil(waiters / goneAskPerPass) passes. Each ask is a system call; a
// slow origin's thousand queued clients asked every pass cost the edge
// twenty thousand a second, a third of what its one core spent beside
// the host the queue protects (a profile of bench-tenants' slowdown).
// This bounds them to about five thousand a second, whatever the
// waiters; a client that left then holds its place about 200 ms with a
// thousand waiting instead of 50 (and is asked once more before it is
// admitted, so it never takes a worker).
const goneAskPerPass = 256

// goneWatch asks, every goneEvery, the waiters it holds (goneAskPerPass of
// them at most, in turn) whether their clients are still there, from one
// goroutine for all of them. A waiter polling on a ticker of its own cost
// the edge a timer, a wake-up and a select per waiter per period: with a
// host's thousand clients queued behind a slow origin, twenty thousand
// wake-ups a second on the edge's one core, beside the host the queue
// protects. The goroutine runs while a waiter is held and stops with the
// last.
type goneWatch struct {
	mu      sync.Mutex
	waiters []*goneWaiter
	stop    chan struct{} // closed when the last waiter leaves; nil: no goroutine
	// tick, if set, runs once a pass (outside mu) at the newest waiter's
	// clock: the host queue recounts its hosts then, as no request may
	// come to do it.
	tick            func(now time.Time)
	clock, clockRef time.Time
	// next is where the next pass starts asking in waiters (guarded by
	// mu): passes take the waiters in turn, goneAskPerPass at a time.
	next int
}

// goneWaiter is one request's client, watched while it waits.
type goneWaiter struct {
	// mu is held while gone is asked, so the request never moves on (and
	// its client's connection to another request) in the middle of it.
	mu   sync.Mutex
	gone func() bool
	done bool // guarded by mu: left the watch; gone is asked no more
	i    int  // index in goneWatch.waiters; guarded by goneWatch.mu
	// left is signalled once gone said true.
	left chan struct{}
}

// add watches gone (never nil) for a waiter whose clock read now at
// start; the waiter must call remove once it stops waiting.
func (g *goneWatch) add(gone func() bool, now, start time.Time) *goneWaiter {
	w := &goneWaiter{gone: gone, left: make(chan struct{}, 1)}
	g.mu.Lock()
	w.i = len(g.waiters)
	g.waiters = append(g.waiters, w)
	g.clock, g.clockRef = now, start
	if g.stop == nil {
		g.stop = make(chan struct{})
		go g.run(g.stop)
	}
	g.mu.Unlock()
	return w
}

// remove stops watching w; after it returns gone is not being asked and
// will not be.
func (g *goneWatch) remove(w *goneWaiter) {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
	g.mu.Lock()
	if last := len(g.waiters) - 1; w.i <= last && g.waiters[w.i] == w {
		g.waiters[w.i] = g.waiters[last]
		g.waiters[w.i].i = w.i
		g.waiters[last] = nil
		g.waiters = g.waiters[:last]
	}
	if len(g.waiters) == 0 && g.stop != nil {
		close(g.stop)
		g.stop = nil
	}
	g.mu.Unlock()
}

func (g *goneWatch) run(stop chan struct{}) {
	t := time.NewTicker(goneEvery)
	defer t.Stop()
	var batch []*goneWaiter
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		g.mu.Lock()
		batch = g.nextLocked(batch[:0])
		now := g.clock.Add(time.Since(g.clockRef))
		g.mu.Unlock()
		for i, w := range batch {
			w.mu.Lock()
			if !w.done && w.gone() {
				w.done = true
				signal(w.left)
			}
			w.mu.Unlock()
			if i%goneYieldEvery == goneYieldEvery-1 {
				// A pass over a thousand waiters is a couple of
				// milliseconds of system calls: on the edge's one core,
				// the requests being served would wait it out whole.
				runtime.Gosched()
			}
		}
		clear(batch) // no waiter kept past its wait
		if g.tick != nil {
			g.tick(now)
		}
	}
}

// nextLocked appends to batch the waiters the next pass asks: every one
// while there are at most goneAskPerPass, else goneAskPerPass of them
// from where the last pass stopped, wrapping around. (A waiter that
// leaves moves the last one into its place: when that place was already
// asked in this turn, the moved waiter is asked a turn late.)
func (g *goneWatch) nextLocked(batch []*goneWaiter) []*goneWaiter {
	n := len(g.waiters)
	if n <= goneAskPerPass {
		g.next = 0
		return append(batch, g.waiters...)
	}
	if g.next >= n {
		g.next = 0
	}
	end := g.next + goneAskPerPass
	batch = append(batch, g.waiters[g.next:min(end, n)]...)
	if end > n {
		end -= n
		batch = append(batch, g.waiters[:end]...)
	}
	g.next = end
	return batch
}
