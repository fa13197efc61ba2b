package limiter

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// overLimitCache remembers keys the store denied, until a retry could fit:
// the hot-key protection for denied floods. It is bounded (a flood of random
// keys evicts, never grows it), and flushed when the rules change — a
// generation number also stops calls sent before a flush from writing stale
// entries after it.
type overLimitCache struct {
	gen atomic.Uint64
	// n counts the entries of every shard: with none (no key denied
	// lately, the usual case) a lookup takes no lock.
	n      atomic.Int64
	seed   maphash.Seed
	perCap int
	shards [64]cacheShard
}

type cacheShard struct {
	mu sync.Mutex
	m  map[cacheKey]cached
	// givenBack is when units of one of the shard's keys were last given
	// back to the store (dropAfterGiveBack): a denial from a call sent
	// before then may have been decided before the units were back, so
	// it is not kept.
	givenBack time.Time
	// drops counts the give-backs dropped (dropAfterGiveBack), for the
	// schedule harness to wait for each.
	drops uint64
}

// cacheKey is a limit's key, algorithms apart (as memKey keeps them): a
// lookup builds no string, so a denial the cache answers allocates nothing.
type cacheKey struct {
	alg Algorithm
	key string
}

func cacheKeyOf(l Limit) cacheKey { return cacheKey{l.Algorithm, l.Key} }

type cached struct {
	until, reset time.Time
	need, limit  int64
	gen          uint64
}

func newOverLimitCache(size int) *overLimitCache {
	c := &overLimitCache{seed: maphash.MakeSeed()}
	c.perCap = max(1, size/len(c.shards))
	for i := range c.shards {
		c.shards[i].m = make(map[cacheKey]cached)
	}
	return c
}

func (c *overLimitCache) shard(key cacheKey) *cacheShard {
	return &c.shards[maphash.String(c.seed, key.key)%uint64(len(c.shards))]
}

func (c *overLimitCache) generation() uint64 { return c.gen.Load() }

// get returns a local denial for a check of cost, if one is known: only for a
// cost at least the one the cached retry time was computed for.
func (c *overLimitCache) get(l Limit, cost int64, now time.Time) (Decision, bool) {
	if c.n.Load() == 0 {
		return Decision{}, false
	}
	key := cacheKeyOf(l)
	sh := c.shard(key)
	sh.mu.Lock()
	e, ok := sh.m[key]
	if ok && (e.gen != c.gen.Load() || !now.Before(e.until)) {
		sh.delete(c, key)
		ok = false
	}
	sh.mu.Unlock()
	// A denial at a lower limit says nothing about a check with a higher
	// one: the behaviour layer tightens one client's limit on a key that
	// another client, at the full limit, may still use.
	if !ok || cost < e.need || l.Limit > e.limit {
		return Decision{}, false
	}
	retry := roundUpMs(e.until.Sub(now))
	return Decision{Limit: e.limit, RetryAfter: retry, ResetAfter: max(retry, roundUpMs(e.reset.Sub(now))), Lease: Lease{Limit: l}}, true
}

func roundUpMs(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

func (c *overLimitCache) put(l Limit, need int64, d Decision, sent time.Time, gen uint64) {
	if gen != c.gen.Load() {
		return
	}
	key := cacheKeyOf(l)
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sent.Before(sh.givenBack) {
		return
	}
	n := len(sh.m)
	defer func() { c.n.Add(int64(len(sh.m) - n)) }()
	if _, ok := sh.m[key]; !ok && len(sh.m) >= c.perCap {
		victims := 0
		for k, e := range sh.m { // map order is random: a cheap sample
			if !sent.Before(e.until) || victims == 0 {
				delete(sh.m, k)
			}
			if victims++; victims == 8 {
				break
			}
		}
	}
	sh.m[key] = cached{until: sent.Add(d.RetryAfter), reset: sent.Add(d.ResetAfter), need: need, limit: d.Limit, gen: gen}
}

func (c *overLimitCache) drop(l Limit) {
	key := cacheKeyOf(l)
	sh := c.shard(key)
	sh.mu.Lock()
	sh.delete(c, key)
	sh.mu.Unlock()
}

// dropAfterGiveBack forgets l's denial once units of its key are back in
// the store (at: when the give-back returned), and keeps out the denials of
// calls sent before then, which the store may have decided before the
// units were back: cached, they would deny the flood's next requests until
// the window's end, and the units would go to nobody (clients would get
// fewer than the limit).
func (c *overLimitCache) dropAfterGiveBack(l Limit, at time.Time) {
	key := cacheKeyOf(l)
	sh := c.shard(key)
	sh.mu.Lock()
	sh.delete(c, key)
	if at.After(sh.givenBack) {
		sh.givenBack = at
	}
	sh.drops++
	sh.mu.Unlock()
}

// delete takes key out of sh (locked), counted in c.n.
func (sh *cacheShard) delete(c *overLimitCache, key cacheKey) {
	if _, ok := sh.m[key]; ok {
		delete(sh.m, key)
		c.n.Add(-1)
	}
}

func (c *overLimitCache) flush() {
	c.gen.Add(1)
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		c.n.Add(-int64(len(sh.m)))
		clear(sh.m)
		sh.mu.Unlock()
	}
}

// len is the number of entries held (for tests and metrics).
func (c *overLimitCache) len() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
