package shedder

import (
	"math"
	"slices"
	"time"
)

// The rate shares. A host whose origin answers fast holds few requests in
// flight however many it sends, so the shares of the workers do not keep
// its flood from the other hosts when the CPU, not the workers, runs out:
// every request waits its turn for the CPU before the shares see it. While
// the edge's CPU use over a sampler tick is at least host_share.cpu_busy of
// what its GOMAXPROCS could use and another host that has sent requests in
// the last 2 s is not held by its share of the workers (one that is waits
// for its origin, not for the CPU), each host is also held to a share of
// the requests admitted per tick: the budget, 90 % of what was admitted in
// the last busy tick, divided max-min fair by weight among the hosts'
// demands (a host asking for less than an even share gets all it asks for,
// the rest is divided among the others). A request over its host's rate
// share waits in its host's queue as one over its share of the workers
// does, holding no worker and taking no CPU, until a tick opens the next
// budget. Once the CPU is under cpu_busy the budget grows by 11 % a tick (a
// quiet tick undoes a busy one), and the rate shares end when it is twice
// what the busiest host asks for, or at once when no such other host is
// left.
const (
	// DefaultHostCPUBusy is host_share.cpu_busy's default.
	DefaultHostCPUBusy = 0.9
	// rateShrink is a busy tick's budget, from what was admitted in the
	// last one: the CPU's headroom that keeps the requests of the hosts
	// within their rate share from waiting for it.
	rateShrink = 0.9
	// rateGrow is the budget's growth per tick while the CPU is not busy:
	// one quiet tick undoes one busy tick's shrink, so the budget settles
	// where the ticks over and under cpu_busy are as many, with the CPU
	// at cpu_busy. (A growth of 5 % against a shrink of 10 % settled it
	// where one tick in three was busy, well under cpu_busy: a host that
	// filled the core alone beside another host held by its slow origin
	// was cut to 58 % of its rate, with the core 73 % used.)
	rateGrow = 1 / rateShrink
)

// rateDemand is one host's demand in a tick, per unit of its weight.
type rateDemand struct {
	s         *hostSlot
	d, weight float64
}

// ObserveBusy sets the rate shares for the next tick from the CPU the edge
// used in this one, busy (its CPU time over what GOMAXPROCS could use; see
// the rate shares above). Call it from the one sampler, every tick of
// length tick.
func (h *HostShares) ObserveBusy(busy float64, tick time.Duration) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rateTick = tick
	ds := h.demands[:0]
	asked, most := 0.0, 0.0 // asked: with no rate shares yet, what was admitted
	// free counts the active hosts not held by their share of the workers,
	// and topFree says whether the one asking the most is one of them.
	free, topFree := 0, false
	note := func(s *hostSlot) {
		capped := s.rateCap > 0 && s.admits >= s.rateCap
		d := float64(s.admits + s.refusedRate)
		if capped {
			// Its waiters wait for the rate share (others may wait for
			// a place in the share of the workers: not for more rate).
			d += float64(s.wq.n)
		}
		// Requests waiting for a place in the host's share of the
		// workers, not for its rate share: its origin, not the CPU, is
		// what holds it back.
		isFree := s.used && s.active(h.seen) && (capped || s.wq.n == 0)
		if isFree {
			free++
		}
		s.admits, s.rateCap, s.refusedRate = 0, 0, 0
		if !s.used || d == 0 {
			return
		}
		w := float64(max(s.weight, 1))
		asked += d
		if d/w > most {
			most, topFree = d/w, isFree
		}
		ds = append(ds, rateDemand{s: s, d: d / w, weight: w})
	}
	for i := range h.slots {
		note(&h.slots[i])
	}
	note(&h.other)
	// The rate shares keep the CPU for the hosts that could use more of
	// it: while another host is active (a request in the last 2 s, as for
	// the shares of the workers, not only asking in this tick: a host that
	// sends a request every few ticks beside a flood needs the headroom in
	// the ticks between as well) and not held by its share of the workers.
	// A host waiting for its share of the workers is bounded by its origin:
	// holding the busiest host back would leave the CPU idle, not give it
	// any (a host filling the core alone beside a host whose origin is slow
	// was cut to 58 % of its rate, the core 73 % used).
	if topFree {
		free--
	}
	several := len(ds) > 0 && free > 0
	busyNow := h.enabled && h.cpuBusy > 0 && busy >= h.cpuBusy && several
	switch {
	case busyNow:
		let := asked // what the last tick let in: all it asked, with no level
		if h.rateLevel > 0 {
			let = 0
			for _, d := range ds {
				let += min(d.d, h.rateLevel) * d.weight
			}
		}
		h.rateLevel = max(waterLevel(ds, rateShrink*let), 1)
	case !several || !h.enabled || h.cpuBusy == 0:
		h.rateLevel = 0 // the rate shares are between hosts
	case h.rateLevel > 0:
		h.rateLevel *= rateGrow
		if h.rateLevel >= 2*most {
			h.rateLevel = 0
		}
	}
	if h.rateLevel > 0 {
		// A host that asked for nothing in this tick has no rate share in
		// the next: it cannot be the one taking the CPU.
		for _, d := range ds {
			d.s.rateCap = int32(min(math.Ceil(h.rateLevel*d.weight), math.MaxInt32))
		}
	}
	clear(ds)
	h.demands = ds[:0]
	if h.queued > 0 {
		h.wakeRoomLocked()
	}
}

// rateShareLocked is the rate share of a host of the default weight in
// requests a second, 0 while there are no rate shares.
func (h *HostShares) rateShareLocked() float64 {
	if h.rateLevel == 0 || h.rateTick <= 0 {
		return 0
	}
	return h.rateLevel * float64(h.weights.def) / h.rateTick.Seconds()
}

// waterLevel is the level L at which the demands, each capped at L (per
// unit of weight), sum to budget: max-min fairness by weight. Every demand
// under L is met whole; with budget enough for all, L is the largest.
func waterLevel(ds []rateDemand, budget float64) float64 {
	slices.SortFunc(ds, func(a, b rateDemand) int {
		switch {
		case a.d < b.d:
			return -1
		case a.d > b.d:
			return 1
		}
		return 0
	})
	weights := 0.0
	for _, x := range ds {
		weights += x.weight
	}
	for _, x := range ds {
		if x.d*weights >= budget {
			return budget / weights
		}
		budget -= x.d * x.weight
		weights -= x.weight
	}
	return ds[len(ds)-1].d
}
