package limiter

import (
	"context"
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
}

// item is one check's place in a batch.
type item struct {
	check Check
	out   Decision
	err   error // the store failed: the owner decides it per the fail mode
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

// sendBatch makes one call for a batch and settles its items.
func (l *Limiter) sendBatch(b *batch) {
	sum, need := int64(len(b.items))*b.cost, b.cost
	gen := l.cache.generation()
	sent := l.now()
	ds, errs := l.call(context.Background(), []Request{{Limit: b.limit, Cost: sum, Need: need}}, []string{b.key}, sent, nil)
	if errs[0] != nil {
		for _, it := range b.items {
			it.err = errs[0]
		}
	} else {
		l.split(b, ds[0], need, sent, gen)
	}
	close(b.done)
	l.flights.done(b.key, l.sendLater)
}

// split shares a batch's admitted units first-come first-served, gives back
// what no item could use, and reports each item's remaining as if the items
// had been decided one after another.
func (l *Limiter) split(b *batch, d Decision, need int64, sent time.Time, gen uint64) {
	lease, left := d.Lease, d.Admitted
	for _, it := range b.items {
		out := Decision{Limit: d.Limit, ResetAfter: d.ResetAfter, Lease: Lease{Limit: d.Lease.Limit}, Source: SourceStore, store: l.store}
		if c := it.check.Cost; c <= left {
			out.Admitted, out.Allowed = c, true
			out.Lease, lease = lease.Split(c)
			left -= c
		} else {
			out.RetryAfter = d.RetryAfter
			l.remember(it.check, out, need, sent, gen)
		}
		it.out = out
	}
	if lease.Units > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), l.refundTimeout())
		if err := l.store.Refund(ctx, []Lease{lease}); err != nil {
			l.metrics.refundErrors.Inc()
		}
		cancel()
		l.metrics.refunds.Inc()
	}
	remaining := d.Remaining + lease.Units
	for i := len(b.items) - 1; i >= 0; i-- {
		it := b.items[i]
		it.out.Remaining = remaining
		remaining += it.out.Admitted
	}
	l.metrics.record(SourceStore, len(b.items))
}
