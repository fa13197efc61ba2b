package limiter

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"time"
)

// Per-key coalescing: while a call for a key is in flight, checks for that key
// queue up and then travel together as one call carrying their summed cost.
// The admitted units are split first-come first-served, so a flood from one
// key costs the store at most one call per key per in-flight batch on each
// node, and nothing Redis would allow is denied. The map holds only keys with
// a call in flight, so its size is bounded by concurrency.
type flights struct {
	seed   maphash.Seed
	shards [64]flightShard
}

// flightShard maps each key in flight to the batch queued behind its call
// (nil while none is): marking a key in flight allocates nothing.
type flightShard struct {
	mu sync.Mutex
	m  map[string]*batch
}

// batch is one coalesced call: the checks that joined while the previous
// call for the key was in flight.
type batch struct {
	key   string
	limit Limit
	cost  int64 // every item's cost
	items []*item
	done  chan struct{} // closed once every item is settled
	// mu guards settled and the items' left: an item's owner leaves the
	// batch (waitJoined) only while it is not settled.
	mu      sync.Mutex
	settled bool // every item not left has its out or err
}

// item is one check's place in a batch.
type item struct {
	check Check
	out   Decision
	err   error // the store failed: the owner decides it per the fail mode
	// left: the owner stopped waiting (waitJoined) and the fallback decided
	// it; the batch neither counts it nor admits it, and gives back what
	// the store took for it.
	left bool
}

// leave takes it out of b unless b is settled, and reports whether it did.
func (b *batch) leave(it *item) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.settled {
		return false
	}
	it.left = true
	return true
}

// in is how many of b's items are still in it. Under b.mu.
func (b *batch) in() int {
	n := 0
	for _, it := range b.items {
		if !it.left {
			n++
		}
	}
	return n
}

// settle marks b settled and returns how many of its items are still in it.
// Under b.mu.
func (b *batch) settle() int {
	b.settled = true
	return b.in()
}

func newFlights() *flights {
	f := &flights{seed: maphash.MakeSeed()}
	for i := range f.shards {
		f.shards[i].m = make(map[string]*batch)
	}
	return f
}

func (f *flights) shard(key string) *flightShard {
	return &f.shards[maphash.String(f.seed, key)%uint64(len(f.shards))]
}

// joined says how a check travels.
type joined int

const (
	lead   joined = iota // the key was idle: the caller's call is the one in flight
	follow               // queued behind the call in flight
	alone                // a call is in flight with another cost: the caller calls on its own
)

// join queues c behind the call in flight for its key (follow), or marks the
// key in flight (lead); key is memKey(c.Limit).
func (f *flights) join(c Check, key string) (*batch, *item, joined) {
	sh := f.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	next, busy := sh.m[key]
	if !busy {
		sh.m[key] = nil
		return nil, nil, lead
	}
	if next == nil {
		next = &batch{key: key, limit: c.Limit, cost: c.Cost, done: make(chan struct{})}
		sh.m[key] = next
	} else if next.cost != c.Cost {
		// A batch admits whole requests of one cost; a rule has one cost, so
		// this happens only across a rules change.
		return nil, nil, alone
	}
	it := &item{check: c}
	next.items = append(next.items, it)
	return next, it, follow
}

// done ends the call in flight for c's key; the batch that queued behind it,
// if any, is handed to send (which must not block) and keeps the key in
// flight.
func (f *flights) done(key string, send func(*batch)) {
	sh := f.shard(key)
	sh.mu.Lock()
	b := sh.m[key]
	if b == nil {
		delete(sh.m, key)
	} else {
		sh.m[key] = nil // b's call is now the one in flight
	}
	sh.mu.Unlock()
	if b != nil {
		send(b)
	}
}

// sendLater sends a batch in the background, tracked by Close.
func (l *Limiter) sendLater(b *batch) { l.bg.Go(func() { l.sendBatch(b) }) }

// sendBatch makes one call for a batch and settles its items. Items whose
// owners left before it is sent are not sent; a batch that every owner
// left makes no call.
func (l *Limiter) sendBatch(b *batch) {
	b.mu.Lock()
	n := b.in()
	b.settled = n == 0
	b.mu.Unlock()
	if n > 0 {
		l.callBatch(b, int64(n)*b.cost)
	}
	close(b.done)
	l.flights.done(b.key, l.sendLater)
}

// callBatch asks the store for sum units for b and settles its items.
func (l *Limiter) callBatch(b *batch, sum int64) {
	need := b.cost
	gen := l.cache.generation()
	sent := l.now()
	ds, errs := l.call(context.Background(), []Request{{Limit: b.limit, Cost: sum, Need: need}}, []string{b.key}, sent, nil)
	if errs[0] != nil {
		b.mu.Lock()
		b.settle()
		for _, it := range b.items {
			it.err = errs[0]
		}
		b.mu.Unlock()
		return
	}
	l.split(b, ds[0], need, sent, gen)
}

// split shares a batch's admitted units first-come first-served among the
// items still in it, gives back what none of them could use (an item's
// owner that left: its share too), and reports each item's remaining as if
// the items had been decided one after another.
func (l *Limiter) split(b *batch, d Decision, need int64, sent time.Time, gen uint64) {
	lease, left := d.Lease, d.Admitted
	// What the answer does not count of this edge's admissions
	// (Decision.holdBack) is kept back from the items, and given back
	// with what they leave.
	var held int64
	if d.Remaining -= d.unseen; d.Remaining < 0 {
		held = min(left, -d.Remaining)
		left -= held
		d.Remaining = 0
	}
	b.mu.Lock()
	n := b.settle()
	for _, it := range b.items {
		if it.left {
			continue
		}
		out := Decision{Limit: d.Limit, ResetAfter: d.ResetAfter, Lease: Lease{Limit: d.Lease.Limit}, Source: SourceStore, store: l.store}
		if c := it.check.Cost; c <= left {
			out.Admitted, out.Allowed = c, true
			out.Lease, lease = lease.Split(c)
			left -= c
		} else if held > 0 { // not cached, as holdBack's denial
			out.RetryAfter = max(d.RetryAfter, d.ResetAfter, time.Millisecond)
		} else {
			out.RetryAfter = d.RetryAfter
			l.remember(it.check, out, need, sent, gen)
		}
		it.out = out
	}
	remaining := d.Remaining + lease.Units - held
	for i := len(b.items) - 1; i >= 0; i-- {
		if it := b.items[i]; !it.left {
			it.out.Remaining = remaining
			remaining += it.out.Admitted
		}
	}
	b.mu.Unlock()
	if lease.Units > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), l.refundTimeout())
		if err := l.store.Refund(ctx, []Lease{lease}); err != nil {
			l.metrics.refundErrors.Inc()
		}
		cancel()
		l.dropGivenBack([]Lease{lease})
		l.metrics.refunds.Inc()
	}
	l.metrics.record(SourceStore, n)
}

// waitJoined waits for p's batch to settle p, as a lead waits for its own
// call (take): until the store deadline counted from when p joined, on
// while the store shows life (keepWaiting) up to maxLifeWait deadlines, and
// no longer than the caller (ctx). Past that p leaves its batch and the
// error says why: the fallback decides p, as it decides a lead given up,
// and the batch neither counts nor admits p. A check that joined behind a
// call in flight so waits one call's time, not the rest of that call's
// and then its batch's whole call. now is when p joined (l.now).
func (l *Limiter) waitJoined(ctx context.Context, p pending, now time.Time) error {
	if p.wait == nil { // a local store: its batches do not wait on anything
		<-p.b.done
		return p.item.err
	}
	var shard *breaker // looked up only once the deadline has passed
	cause := l.awaitAnswer(ctx, p.wait, p.b.done, func() bool {
		if shard == nil {
			shard = l.breakers.get(l.store.Shard(p.check.Limit))
		}
		return waitsOnLife(l.now(), now, l.cfg.Timeout, func(yield func(int64) bool) { yield(shard.answered.Load()) })
	})
	if cause == nil || !p.b.leave(p.item) {
		<-p.b.done // settled, or settled just now
		return p.item.err
	}
	if ctx.Err() == nil {
		// It waited a call's time for the store and got no answer (so
		// awaitAnswer asked alive, which found the shard): a failure for
		// the shard's breaker, as a lead's call given up is (its caller's
		// end is not).
		shard.failure(l.now())
	}
	return fmt.Errorf("%w: %w", errGaveUp, cause)
}
