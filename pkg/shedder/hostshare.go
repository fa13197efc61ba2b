package shedder

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// HostShare settings bounds.
const (
	// DefaultTrackedHosts is how many hosts the share table tracks by name.
	DefaultTrackedHosts = 64
	// MaxTrackedHosts bounds tracked_hosts: the table is scanned on a miss
	// and at scrape time, so its size is the per-request cost's bound.
	MaxTrackedHosts = 1024
	// hostIdleAfter is how long a host with nothing in flight still counts
	// as active: a host whose requests are fast is often at zero in flight
	// between two requests, and must not lose its share at each of them.
	hostIdleAfter = 2 * time.Second
	// recountEvery is how often the active-host count is recomputed from
	// the table (a host becoming active counts at once).
	recountEvery = 100 * time.Millisecond
	// maxHostLen is the longest name tracked; a longer one (no valid DNS
	// name is) goes to the pooled rest, so slots stay bounded in memory.
	maxHostLen = 255
	// OtherHost names the pooled rest of the hosts in metrics; a request
	// whose host is named so is counted with them (the edge names so the
	// hosts its host table does not list).
	OtherHost = "_other"
	// pairCounters is how many counters hold the requests in flight per
	// host and client address, by hash: two pairs sharing one only make
	// both look heavier, which refuses no more than without them.
	pairCounters = 1 << 14
	// pairLevels bounds the part of one address's requests that counts
	// against its host's other clients: half a share, at most 64.
	pairLevels = 64
)

// HostShareConfig divides the workers fairly among the hosts being served.
type HostShareConfig struct {
	// Enabled gives each host active in the last 2 s a fair share of the
	// workers, workers / active hosts, rounded up (of the adaptive origin
	// limit instead, while it is enforced and smaller than the workers;
	// in proportion to their weights when Weights names some). A request of
	// a host at or over its share waits up to QueueTimeout for a place,
	// then is refused (503, reason host_share), unless more than a share's
	// worth of workers is idle, so an overloading host is shed
	// first, and only as much as the others need; a lone host may use
	// every worker. Critical requests are never refused for their host's
	// share, and a host within its share is exempt from the ramp while
	// another host is being held to its own. While the edge's host table
	// lists hosts, its entries are the hosts here: a wildcard entry's
	// hosts share one share, and the hosts it does not list share the
	// pooled rest's.
	Enabled bool `json:"enabled" yaml:"enabled"`
	// TrackedHosts is how many hosts are tracked by name (the ones with
	// the most requests in flight; the rest share one pooled share,
	// "_other"), in [1, 1024].
	TrackedHosts int `json:"tracked_hosts" yaml:"tracked_hosts"`
	// Weights weight the shares of the hosts they name: an active host's
	// share is the capacity times its weight over the sum of the active
	// hosts' weights, rounded up, so a host of weight 2 gets twice the
	// share of a host of weight 1 while both are active. Keys are host
	// patterns as in the host table and the rules (an exact name or IP
	// address, or "*." and a name, which weights each host under it on
	// its own: it does not pool them); an exact name wins over a wildcard,
	// a longer wildcard over a shorter one. Weights are in [1, 100], at
	// most 256 entries. A host in the pooled rest (past tracked_hosts)
	// weighs default_weight whatever it is named.
	Weights HostWeights `json:"weights,omitempty" yaml:"weights,omitempty"`
	// DefaultWeight is the weight of every host Weights does not name (and
	// of the pooled rest), in [1, 100]; 1 by default.
	DefaultWeight int `json:"default_weight" yaml:"default_weight"`
	// QueueTimeout is how long a request refused for its host's share
	// waits, in its host's queue (first come first served), for a place
	// in the share before it is refused (503 host_share): a release of
	// one of the host's places wakes one waiter, which judges itself
	// again. A waiter holds no worker and no place. 0 refuses at once;
	// in [0, 30s], 1s by default.
	QueueTimeout time.Duration `json:"queue_timeout" yaml:"queue_timeout"`
	// MaxQueued bounds the requests waiting for a place across all
	// hosts; a request that finds it reached is refused at once. 0: 4
	// times the workers; in [0, 1000000].
	MaxQueued int `json:"max_queued" yaml:"max_queued"`
	// CPUBusy starts the rate shares (hostrate.go): while the edge's CPU
	// use over a sampler tick is at least this fraction of what its
	// GOMAXPROCS could use and more than one host has sent requests in
	// the last 2 s, each host is also held to a fair share of the requests admitted per tick,
	// so a flood through a fast origin, which holds few workers, does not
	// take the CPU from the other hosts. In [0.5, 1], 0.9 by default; 0
	// turns the rate shares off.
	CPUBusy float64 `json:"cpu_busy" yaml:"cpu_busy"`
	// UnlistedHosts is what shares the hosts the edge's host table does
	// not list, while it lists some: "pooled" (the default) counts them
	// all as one host, the pooled rest ("_other"), so a client sending a
	// new Host name with each request takes one share, not one per name;
	// "each" gives each of them a share of its own, as with no table (such
	// a client then takes up to tracked_hosts shares). "" is "pooled".
	UnlistedHosts string `json:"unlisted_hosts" yaml:"unlisted_hosts"`
}

// host_share.unlisted_hosts's values.
const (
	UnlistedPooled = "pooled"
	UnlistedEach   = "each"
)

// DefaultHostShareConfig is on, tracking 64 hosts, every host of weight 1.
func DefaultHostShareConfig() HostShareConfig {
	return HostShareConfig{Enabled: true, TrackedHosts: DefaultTrackedHosts, DefaultWeight: 1, QueueTimeout: DefaultHostQueueTimeout, CPUBusy: DefaultHostCPUBusy, UnlistedHosts: UnlistedPooled}
}

func (c HostShareConfig) validate(bad func(field, format string, args ...any)) {
	if c.TrackedHosts < 1 || c.TrackedHosts > MaxTrackedHosts {
		bad("host_share.tracked_hosts", "must be in [1, %d], got %d", MaxTrackedHosts, c.TrackedHosts)
	}
	if c.QueueTimeout < 0 || c.QueueTimeout > MaxHostQueueTimeout {
		bad("host_share.queue_timeout", "must be in [0s, %v] (0: refuse at once), got %v", MaxHostQueueTimeout, c.QueueTimeout)
	}
	if c.CPUBusy != 0 && !(c.CPUBusy >= 0.5 && c.CPUBusy <= 1) {
		bad("host_share.cpu_busy", "must be 0 (off) or in [0.5, 1], got %v", c.CPUBusy)
	}
	if c.UnlistedHosts != "" && c.UnlistedHosts != UnlistedPooled && c.UnlistedHosts != UnlistedEach {
		bad("host_share.unlisted_hosts", "must be %q or %q, got %q", UnlistedPooled, UnlistedEach, c.UnlistedHosts)
	}
	if c.MaxQueued < 0 || c.MaxQueued > MaxHostQueued {
		bad("host_share.max_queued", "must be in [0, %d] (0: 4 times the workers), got %d", MaxHostQueued, c.MaxQueued)
	}
	c.validateWeights(bad)
}

// MarshalJSON leaves default_weight out while it is 1, as weights while
// there are none, and queue_timeout, max_queued, cpu_busy and
// unlisted_hosts while they hold their defaults: a document that sets
// none of them reads as it did before they existed, so an edge of an
// older release still takes it. Durations are spelled as "1s".
func (c HostShareConfig) MarshalJSON() ([]byte, error) {
	type plain HostShareConfig
	w := struct {
		plain
		DefaultWeight int           `json:"default_weight,omitempty"`
		QueueTimeout  *jsonDuration `json:"queue_timeout,omitempty"`
		MaxQueued     int           `json:"max_queued,omitempty"`
		CPUBusy       *float64      `json:"cpu_busy,omitempty"`
		UnlistedHosts string        `json:"unlisted_hosts,omitempty"`
	}{plain: plain(c), MaxQueued: c.MaxQueued}
	if c.UnlistedHosts != UnlistedPooled {
		w.UnlistedHosts = c.UnlistedHosts
	}
	if c.CPUBusy != DefaultHostCPUBusy {
		w.CPUBusy = &c.CPUBusy
	}
	if c.DefaultWeight != 1 {
		w.DefaultWeight = c.DefaultWeight
	}
	if c.QueueTimeout != DefaultHostQueueTimeout {
		d := jsonDuration(c.QueueTimeout)
		w.QueueTimeout = &d
	}
	return json.Marshal(w)
}

// UnmarshalJSON overlays data on c strictly (an unknown field is an
// error), reading queue_timeout as a duration ("1s").
func (c *HostShareConfig) UnmarshalJSON(data []byte) error {
	type plain HostShareConfig
	w := struct {
		*plain
		QueueTimeout jsonDuration `json:"queue_timeout"`
	}{plain: (*plain)(c), QueueTimeout: jsonDuration(c.QueueTimeout)}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return err
	}
	c.QueueTimeout = time.Duration(w.QueueTimeout)
	return nil
}

// hostSlot is one tracked host (or the pooled rest).
type hostSlot struct {
	name     [maxHostLen]byte
	nameLen  uint8
	hash     uint64
	used     bool
	inflight int
	weight   int32 // its weight (host_share.weights), set when it takes the slot
	// levels[k] counts the requests in flight that were an address's
	// (k+1)th on this host when admitted: the host's requests counting
	// each address's first n only are levels[0]+…+levels[n-1].
	levels [pairLevels]int32
	epoch  uint32 // bumped when another host takes the slot
	last   int64  // Unix ns of its last admitted request: cheaper than a time.Time
	// prev, next link the slots with nothing in flight, least recently
	// used first (-1 ends the list), so a new host takes one in O(1).
	prev, next int32
	// wq holds the requests waiting for a place in this host's share.
	wq waitList
	// admits counts the requests admitted since the last sampler tick,
	// and rateCap is how many its rate share admits in this one (0: none;
	// hostrate.go).
	admits, rateCap int32
	// refusedRate counts the requests refused at once (not waiting) for
	// its rate share since the last tick.
	refusedRate int32
}

func (s *hostSlot) active(now int64) bool {
	return s.used && (s.inflight > 0 || now-s.last < int64(hostIdleAfter))
}

// HostShares counts requests in flight per host in a fixed table: the
// hosts with the most in flight by name, the rest pooled. Its cost per
// request is a hash and a lookup under a mutex and, when the host is not
// tracked, taking the least recently used idle slot off a list: none of it
// grows with the number of hosts.
type HostShares struct {
	mu       sync.Mutex
	enabled  bool
	capacity int
	slots    []hostSlot
	// index finds a host's slot by its hash: open addressing with linear
	// probing over 4× the slots (entries are slot+1, 0 is empty); a Go map
	// costs twice as much when every request changes a slot.
	index     []int32
	mask      uint64
	other     hostSlot
	idleHead  int32 // least recently used slot with nothing in flight, -1: none
	idleTail  int32
	gen       uint32 // bumped when a resize moves every count to the pool
	inflight  int
	active    int
	weight    int // the active hosts' weights, summed (the pooled rest's too)
	weights   *weightIndex
	recountAt int64 // Unix ns
	// lastRefusal is when a host was last held to its share (Unix ns): a
	// host within its share is exempt from the ramp shortly after.
	lastRefusal atomic.Int64
	seed        maphash.Seed
	// pairs counts requests in flight per (host, client address) hash.
	pairs []int32
	// originLimit, when set, is the adaptive origin limit while enforced
	// (0 otherwise): the hosts share the smaller of it and the workers.
	originLimit func() int

	// The host queues (hostqueue.go): the settings, the waiters in every
	// slot's list, the places woken waiters hold until they judge
	// themselves, and counts for tests and metrics.
	queueTimeout time.Duration
	maxQueued    int // 0: 4 × capacity
	queued       int
	reserved     int
	wakeups      uint64
	waits        [numWaitOutcomes]atomic.Uint64
	// watch asks the waiters' clients whether they are still there.
	watch goneWatch

	// The rate shares (hostrate.go): host_share.cpu_busy, their level in
	// admissions per tick and unit of weight (0: none), and ObserveBusy's
	// scratch.
	cpuBusy   float64
	rateLevel float64
	rateTick  time.Duration
	demands   []rateDemand
	// seen is the newest request's time (Unix ns): the table's clock when
	// the sampler asks which hosts are active.
	seen int64
	// unlistedEach is host_share.unlisted_hosts "each" (ShareName).
	unlistedEach atomic.Bool
}

// HostLease is a request's place in its host's share, given back with
// Release when the request ends.
type HostLease struct {
	h      *HostShares
	slot   int32 // -1: the pooled rest
	gen    uint32
	exempt bool
	owed   time.Duration // see Owed
	level  int8          // its index in its slot's levels, -1: none
	pair   int32         // its pairs counter, -1: none
}

// noTable marks a lease of a disabled table: Release does nothing.
const noTable = -2

// NewHostShares returns a table for capacity workers.
func NewHostShares(capacity int, cfg HostShareConfig) *HostShares {
	h := &HostShares{seed: maphash.MakeSeed(), capacity: max(capacity, 1), pairs: make([]int32, pairCounters)}
	// The pooled rest is always in use: a request of its hosts makes it
	// active once, as a tracked host's does (marked unused, each of its
	// requests counted one more active host until the next recount, and
	// the recount counted it never).
	h.other.used = true
	h.watch.tick = h.maybeRecount
	h.setConfig(cfg)
	return h
}

func (h *HostShares) setConfig(cfg HostShareConfig) {
	n := min(max(cfg.TrackedHosts, 1), MaxTrackedHosts)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.enabled = cfg.Enabled
	h.queueTimeout, h.maxQueued = cfg.QueueTimeout, cfg.MaxQueued
	h.cpuBusy = cfg.CPUBusy
	h.unlistedEach.Store(cfg.UnlistedHosts == UnlistedEach)
	if !cfg.Enabled || cfg.QueueTimeout <= 0 {
		// Nothing waits any more: every waiter judges itself again now.
		h.flushAllLocked()
	}
	h.weights = newWeightIndex(cfg)
	h.other.weight = h.weights.def
	// The active hosts' weights are summed anew at the next request.
	h.recountAt = 0
	if len(h.slots) == n {
		for i := range h.slots {
			if s := &h.slots[i]; s.used {
				s.weight = h.weights.of(string(s.name[:s.nameLen]))
			}
		}
		return
	}
	// A resize starts a new table: requests in flight give back to the
	// pool they came from only if their slot still exists, so move every
	// count to the pooled rest. Waiters judge themselves again.
	h.flushAllLocked()
	for i := range h.slots {
		h.other.inflight += h.slots[i].inflight
		for k, n := range h.slots[i].levels {
			h.other.levels[k] += n
		}
	}
	if h.other.inflight > 0 {
		h.other.used = true
	}
	h.gen++
	h.slots = make([]hostSlot, n)
	size := 4
	for size < 4*n {
		size *= 2
	}
	h.index = make([]int32, size)
	h.mask = uint64(size - 1)
	h.recountAt = 0
	h.idleHead, h.idleTail = -1, -1
	for i := range h.slots {
		h.pushIdleLocked(int32(i))
	}
}

// pushIdleLocked appends slot i (now with nothing in flight) to the idle
// list, as its most recently used.
func (h *HostShares) pushIdleLocked(i int32) {
	s := &h.slots[i]
	s.prev, s.next = h.idleTail, -1
	if h.idleTail >= 0 {
		h.slots[h.idleTail].next = i
	} else {
		h.idleHead = i
	}
	h.idleTail = i
}

// unlinkIdleLocked takes slot i off the idle list.
func (h *HostShares) unlinkIdleLocked(i int32) {
	s := &h.slots[i]
	if s.prev >= 0 {
		h.slots[s.prev].next = s.next
	} else {
		h.idleHead = s.next
	}
	if s.next >= 0 {
		h.slots[s.next].prev = s.prev
	} else {
		h.idleTail = s.prev
	}
	s.prev, s.next = -1, -1
}

// capacityLocked is what the hosts share: the workers, or the adaptive
// origin limit while it is enforced and smaller.
func (h *HostShares) capacityLocked() int {
	c := h.capacity
	if h.originLimit != nil {
		if l := h.originLimit(); l > 0 {
			c = min(c, l)
		}
	}
	return c
}

// setCapacity follows the worker cap.
func (h *HostShares) setCapacity(n int) {
	h.mu.Lock()
	h.capacity = max(n, 1)
	h.wakeRoomLocked()
	h.mu.Unlock()
}

// Acquire counts a request for host (normalised by the caller as the rules
// normalise it) of tier at now, and says whether its host's share lets it
// in; see AcquireFrom. It judges every request by its host's whole count,
// as for a client address that cannot be told apart.
func (h *HostShares) Acquire(now time.Time, host string, tier Tier) (HostLease, bool) {
	return h.AcquireFrom(now, host, netip.Addr{}, tier)
}

// AcquireFrom counts a request for host (normalised by the caller as the
// rules normalise it) from the client address client (the zero Addr: not
// known) of tier at now, and says whether its host's share lets it in. A
// refused request holds nothing; an admitted one must Release its lease
// once.
//
// A host is held to its share by its requests in flight, except that one
// address's requests beyond half a share do not count against the host's
// other clients: a request from an address holding less than half a share
// of its host is judged on the host's requests from such addresses, so one
// address that took a whole share while the edge was idle (slow streams up
// to its per-address connection cap) cannot shut its host's other clients
// out. Its own further requests are judged on the host's whole count, as
// before. A host therefore holds at most a share plus what heavy addresses
// took while the edge had room, and a flood from many addresses is held to
// the share as before.
func (h *HostShares) AcquireFrom(now time.Time, host string, client netip.Addr, tier Tier) (HostLease, bool) {
	l, ok, _ := h.acquire(now, host, client, tier, nil)
	return l, ok
}

// acquire is AcquireFrom for a request that waits when w is not nil: w
// gives back the place it was woken for before it is judged, and a
// refused w is put in its host's queue (queued true) under the same lock,
// so no release between the judgement and the queueing is missed, unless
// the queues are full (a waiter already queued once always goes back, at
// the head).
func (h *HostShares) acquire(now time.Time, host string, client netip.Addr, tier Tier, w *hostWaiter) (_ HostLease, _ bool, queued bool) {
	if h == nil {
		return HostLease{slot: noTable}, true, false
	}
	hash := maphash.String(h.seed, host)
	pair := int32(-1)
	if client.IsValid() {
		a := client.As16()
		pair = int32((hash ^ maphash.Bytes(h.seed, a[:])*0x9e3779b97f4a7c15) >> 50) // 14 bits: pairCounters
	}
	ns := now.UnixNano()
	h.mu.Lock()
	h.seen = max(h.seen, ns)
	if h.enabled && ns-h.recountAt >= int64(recountEvery) {
		// Before a woken waiter gives back the place it holds: the
		// recount's wakes count it as taken, so it is not handed on to
		// the next waiter while this one judges itself for it.
		h.recountLocked(ns)
	}
	if w != nil {
		h.unreserveLocked(w)
	}
	if !h.enabled {
		h.mu.Unlock()
		return HostLease{slot: noTable}, true, false
	}
	i := h.lookupLocked(ns, host, hash)
	s := &h.other
	if i >= 0 {
		s = &h.slots[i]
	}
	if !s.active(ns) {
		h.active++
		h.weight += int(s.weight)
	}
	capacity := h.capacityLocked()
	share := shareOf(capacity, int(s.weight), h.weight)
	// The places woken waiters hold count as taken: a newcomer does not
	// pass the host's queue.
	held := s.inflight + int(s.wq.reserved)
	level := int8(-1)
	if pair >= 0 {
		if c := int(h.pairs[pair]); c < pairLevels {
			level = int8(c)
		}
		if half := min((share+1)/2, pairLevels); int(level) >= 0 && int(level) < half && held >= share {
			// A light address: judged on the host's requests counting each
			// address's first half share only.
			held = int(s.wq.reserved)
			for _, n := range s.levels[:half] {
				held += int(n)
			}
		}
	}
	over := h.active > 1 && held >= share && capacity-h.inflight-h.reserved <= share
	// Over its rate share (hostrate.go): the places woken waiters hold
	// count as taken, as above.
	overRate := s.rateCap > 0 && s.admits+s.wq.reserved >= s.rateCap
	if (over || overRate) && tier != TierCritical {
		if w != nil {
			queued = h.enqueueLocked(w, i)
		}
		if overRate && !queued {
			s.refusedRate++ // demand its rate share did not meet, not waiting
		}
		h.mu.Unlock()
		h.lastRefusal.Store(ns)
		return HostLease{}, false, queued
	}
	exempt := h.active > 1 && held < share
	if i >= 0 && s.inflight == 0 {
		h.unlinkIdleLocked(i)
	}
	s.inflight++
	s.admits++
	if level >= 0 {
		s.levels[level]++
	}
	if pair >= 0 {
		h.pairs[pair]++
	}
	s.last = ns
	h.inflight++
	lease := HostLease{h: h, slot: i, gen: h.gen, level: level, pair: pair}
	if exempt {
		lease.owed = h.queueTimeout
	}
	h.mu.Unlock()
	lease.exempt = exempt && ns-h.lastRefusal.Load() < int64(hostIdleAfter)
	return lease, true, false
}

// ShareName is the name a request for host is held to a share under, given
// its tenant, the host table's name for it (the edge's hostroute): the
// tenant, but host itself for a host the table does not list (OtherHost)
// while host_share.unlisted_hosts is "each".
func (h *HostShares) ShareName(host, tenant string) string {
	if tenant == OtherHost && h != nil && h.unlistedEach.Load() {
		return host
	}
	return tenant
}

// lookupLocked finds host's slot, taking one for it when it has none: the
// least recently used with nothing in flight (an unused one first). With
// every slot busy (or a hash collision, or an overlong name, or OtherHost:
// the host table's name for the hosts it does not list) it returns -1, the
// pooled rest.
func (h *HostShares) lookupLocked(now int64, host string, hash uint64) int32 {
	if len(host) > maxHostLen || host == OtherHost {
		return -1
	}
	p := hash & h.mask
	for ; h.index[p] != 0; p = (p + 1) & h.mask {
		if i := h.index[p] - 1; h.slots[i].hash == hash {
			if s := &h.slots[i]; string(s.name[:s.nameLen]) == host {
				return i
			}
			return -1 // another host with the same hash holds the slot
		}
	}
	best := h.idleHead
	if best < 0 {
		return -1
	}
	s := &h.slots[best]
	// Its waiters (whose reserved places its last lease woke them for)
	// judge themselves again under their own host's name.
	h.flushLocked(s)
	s.epoch++
	if s.used {
		if s.active(now) {
			h.active-- // its recency goes with it
			h.weight -= int(s.weight)
		}
		h.unindexLocked(best)
		// The deletion may have moved entries back: find host's place anew.
		for p = hash & h.mask; h.index[p] != 0; p = (p + 1) & h.mask {
		}
	}
	s.hash, s.used, s.nameLen, s.last = hash, true, uint8(len(host)), 0
	s.weight = h.weights.of(host)
	copy(s.name[:], host)
	h.index[p] = best + 1
	return best
}

// unindexLocked removes slot i's entry from the index, moving back the
// entries after it that could not sit in their own place (deletion by
// backward shift: linear probing then needs no tombstones).
func (h *HostShares) unindexLocked(i int32) {
	hash := h.slots[i].hash
	p := hash & h.mask
	for h.index[p] != i+1 {
		if h.index[p] == 0 {
			return
		}
		p = (p + 1) & h.mask
	}
	h.index[p] = 0
	for q := (p + 1) & h.mask; h.index[q] != 0; q = (q + 1) & h.mask {
		home := h.slots[h.index[q]-1].hash & h.mask
		// The entry at q stays unless the hole at p lies between its home
		// and q (cyclically).
		if (p < q && (home <= p || home > q)) || (p > q && home <= p && home > q) {
			h.index[p], h.index[q] = h.index[q], 0
			p = q
		}
	}
}

func (h *HostShares) recountLocked(now int64) {
	n, w := 0, 0
	if h.other.active(now) {
		n, w = 1, int(h.other.weight)
	}
	for i := range h.slots {
		if s := &h.slots[i]; s.active(now) {
			n++
			w += int(s.weight)
		}
	}
	h.active, h.weight, h.recountAt = n, w, now
	if h.queued > 0 {
		// The share may have grown, or a host left.
		h.wakeRoomLocked()
	}
}

// shareOf is the share of capacity of a host of weight w among active
// hosts weighing total in all (w included), rounded up: at least 1.
func shareOf(capacity, w, total int) int {
	w = max(w, 1)
	total = max(total, w)
	return (capacity*w + total - 1) / total
}

// Exempt says whether the request's host was within its share while
// another host was being held to its own: the ramp must not shed it for
// that host's load.
func (l HostLease) Exempt() bool { return l.exempt }

// Owed is how long the request may wait for a worker its share owes it
// (Workers.TakeOwed): host_share.queue_timeout while its host was within
// its share and other hosts were active, so that the workers it may find
// busy are held by hosts at or over their own; 0 otherwise (a lone host,
// a host at its share, shares off).
func (l HostLease) Owed() time.Duration { return l.owed }

// Release gives the lease's place back; call it once.
func (l HostLease) Release() {
	if l.h == nil || l.slot == noTable {
		return
	}
	h := l.h
	h.mu.Lock()
	s := &h.other
	if l.slot >= 0 && l.gen == h.gen {
		s = &h.slots[l.slot]
		s.inflight--
		if s.inflight == 0 {
			h.pushIdleLocked(l.slot)
		}
	} else {
		// Pooled, or tracked in a table a resize has since replaced (its
		// count moved to the pool then).
		h.other.inflight = max(h.other.inflight-1, 0)
	}
	if l.level >= 0 {
		s.levels[l.level] = max(s.levels[l.level]-1, 0)
	}
	if l.pair >= 0 {
		h.pairs[l.pair]--
	}
	h.inflight = max(h.inflight-1, 0)
	if s.wq.n > 0 {
		// One place freed: at most one waiter woken.
		h.wakeLocked(s, min(h.roomLocked(s), 1))
	}
	h.mu.Unlock()
}

// HostInFlight is one host's requests in flight, for metrics and CLIs.
type HostInFlight struct {
	Host     string
	InFlight int
	Queued   int // requests waiting for a place in its share
}

// Top returns the tracked hosts with requests in flight or waiting, and the pooled
// rest as OtherHost (at most tracked_hosts+1 entries), how many hosts are
// active and the share of a host of the default weight.
func (h *HostShares) Top() (out []HostInFlight, active, share int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.slots {
		if s := &h.slots[i]; s.used && (s.inflight > 0 || s.wq.n > 0) {
			out = append(out, HostInFlight{Host: string(s.name[:s.nameLen]), InFlight: s.inflight, Queued: int(s.wq.n)})
		}
	}
	out = append(out, HostInFlight{Host: OtherHost, InFlight: h.other.inflight, Queued: int(h.other.wq.n)})
	return out, h.active, shareOf(h.capacityLocked(), int(h.weights.def), h.weight)
}

// hostCollector exports the tracked hosts' requests in flight: at most
// tracked_hosts+1 series (the pooled rest is "_other"), only hosts with
// something in flight.
type hostCollector struct {
	hosts    func() *HostShares
	inflight *prometheus.Desc
	active   *prometheus.Desc
	share    *prometheus.Desc
	queued   *prometheus.Desc
	waits    *prometheus.Desc
	rate     *prometheus.Desc
}

func newHostCollector(hosts func() *HostShares) *hostCollector {
	return &hostCollector{
		hosts:    hosts,
		inflight: prometheus.NewDesc(namespace+"host_in_flight", "Requests in flight per host (while the host table lists hosts, per entry: a wildcard entry's hosts under its pattern, the hosts it does not list as _other): the hosts with the most (at most host_share.tracked_hosts) by name, the rest as _other.", []string{"host"}, nil),
		active:   prometheus.NewDesc(namespace+"host_active", "Hosts active in the last 2 s (the tracked ones, plus 1 for the pooled rest): the workers are shared among them.", nil, nil),
		queued:   prometheus.NewDesc(namespace+"host_queued", "Requests waiting for a place in their host's share (host_share.queue_timeout at most), per host as edgeguard_shedder_host_in_flight names them.", []string{"host"}, nil),
		waits:    prometheus.NewDesc(namespace+"host_queue_waits_total", "Requests that waited for a place in their host's share, by outcome: admitted, timed_out (503 host_share after host_share.queue_timeout), full (503 host_share at once: host_share.max_queued were waiting), client_gone.", []string{"outcome"}, nil),
		rate:     prometheus.NewDesc(namespace+"host_rate_share", "The rate share of a host of host_share.default_weight, in requests a second: while the edge's CPU is busy (host_share.cpu_busy) and another host, active in the last 2 s, is not held by its share of the workers (one waiting for its slow origin could not use the CPU), a host asking for more waits in its host's queue as one over its share of the workers does; 0 while there are no rate shares. A host of weight w gets w / default weight times as much.", nil, nil),
		share:    prometheus.NewDesc(namespace+"host_share", "The fair share of the workers (of the adaptive origin limit while it is enforced and smaller) of an active host of host_share.default_weight: workers × default weight / the active hosts' weights summed, rounded up (workers / active hosts while no weights are set); a host of weight w gets w / default weight times as much.", nil, nil),
	}
}

func (c *hostCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inflight
	ch <- c.active
	ch <- c.share
	ch <- c.queued
	ch <- c.waits
	ch <- c.rate
}

func (c *hostCollector) Collect(ch chan<- prometheus.Metric) {
	h := c.hosts()
	if h == nil {
		return
	}
	top, active, share := h.Top()
	other, otherQueued := 0, 0
	for _, t := range top {
		if t.Host == OtherHost || !utf8.ValidString(t.Host) {
			// A name a label cannot carry (the client chose its bytes),
			// or a host spelled like the pool, is counted with the pool.
			other += t.InFlight
			otherQueued += t.Queued
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(t.InFlight), t.Host)
		if t.Queued > 0 {
			ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(t.Queued), t.Host)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(other), OtherHost)
	ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(otherQueued), OtherHost)
	for o, name := range waitOutcomeNames {
		ch <- prometheus.MustNewConstMetric(c.waits, prometheus.CounterValue, float64(h.waits[o].Load()), name)
	}
	ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, float64(active))
	ch <- prometheus.MustNewConstMetric(c.share, prometheus.GaugeValue, float64(share))
	h.mu.Lock()
	rate := h.rateShareLocked()
	h.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.rate, prometheus.GaugeValue, rate)
}
