package shedder

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Adaptive is the adaptive concurrency limit on requests in flight to the
// origin: instead of an operator's --workers it learns how many requests
// the origin serves at once without queueing, from the latency of live
// traffic (the gradient controller of Netflix's concurrency-limits and
// Envoy's adaptive concurrency filter).
//
// Every window (100 ms by default) it takes the median origin latency of
// the window (sampleRTT) and moves the limit L by the gradient
//
//	g = clamp(minRTT·(1+buffer) / sampleRTT, 0.5, 2)
//	L' = L·g + √(L·g)   if g ≥ 1
//	L' = L·g            otherwise
//
// smoothed by smoothing: latency above the no-queue latency (minRTT) plus
// the buffer shrinks the limit; latency within it grows the limit by about
// its square root per window, and only while traffic uses at least half of it
// (an idle edge learns nothing about the origin's capacity). minRTT is the
// smallest of the windows' 10th-percentile latencies over min_rtt_window,
// measured from live traffic: unlike Envoy's filter, which drops the limit
// to a handful of requests while it measures, nothing is held back to
// refresh it. An origin whose latency inflates at constant concurrency
// (fewer cores, a slow dependency) shows as a gradient below 1 and a
// shrinking limit before the origin's queues time out; if it is still slow
// with the limit at its floor, its latency there becomes the new minRTT.
//
// The edges of a region share their origin, and each learns its own limit
// from the same latency: min_limit is the floor for all of them together,
// so each edge's floor is min_limit divided by the edges sharing the
// origin (SetEdges), rounded up. Otherwise N edges would hold N·min_limit
// requests at an origin that serves fewer at once, and queue behind it by
// construction.
//
// Each tier has a guaranteed share of L, kept free for it: the tiers below
// it cannot use it, so tiers keep their order, and no tier is held below
// its share by the others. Critical requests are not refused by the limit
// at all (the worker cap bounds them, as it always has), but they count
// against it, so under overload the lower tiers get what critical leaves.
//
// Methods take the time as an argument; the controller has no clock.
type Adaptive struct {
	mu      sync.Mutex
	cfg     AdaptiveConfig
	limit   float64
	edges   int  // edges sharing the origin (≥ 1): they split min_limit
	learned bool // a window has moved the limit
	// slowAtFloor counts the windows in a row with the limit at its floor
	// and the latency above minRTT·(1+buffer).
	slowAtFloor int
	gradient    float64
	inflight    [numTiers]int
	total       int
	// enforced is the limit while it refuses requests, rounded up, 0 when
	// it does not: host shares read it without taking mu.
	enforced atomic.Int64

	winStart    time.Time
	winSamples  []time.Duration // bounded by maxWindowSamples
	winSeen     int             // samples offered this window
	winMaxTotal int             // highest in-flight total seen this window

	minRTT    time.Duration
	buckets   [minRTTBuckets]rttBucket // sliding minimum over min_rtt_window
	sample    time.Duration            // the last window's sampleRTT
	sampleLow time.Duration            // and its 10th percentile

	rejected [numTiers]uint64
}

// maxWindowSamples bounds a window's memory; past it the newest samples
// overwrite the oldest.
const maxWindowSamples = 1024

// minWindowSamples is how many samples a window needs before it moves the
// limit: a median of two requests says little. A window with fewer is
// extended until it has them.
const minWindowSamples = 8

// slowWindowsAtFloor is how many windows in a row the latency must stay
// high with the limit at its floor before it is taken as the new minRTT.
const slowWindowsAtFloor = 3

// minRTTBuckets splits min_rtt_window so the minimum slides in steps of a
// sixteenth of it rather than resetting all at once.
const minRTTBuckets = 16

type rttBucket struct {
	start time.Time
	min   time.Duration
}

// NewAdaptive returns a controller at cfg.InitialLimit. cfg must be valid
// (Config.Validate checks it).
func NewAdaptive(cfg AdaptiveConfig) *Adaptive {
	a := &Adaptive{cfg: cfg, limit: float64(cfg.InitialLimit), gradient: 1, edges: 1}
	a.winSamples = make([]time.Duration, 0, 64)
	a.publishLocked()
	return a
}

// setConfig switches to cfg live; the learned limit and minRTT are kept,
// clamped to the new bounds, so a settings push does not relearn, and
// switching the limit on enforces what it learned while off. Until a window
// has moved the limit, it starts from the new initial_limit.
func (a *Adaptive) setConfig(cfg AdaptiveConfig) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.learned {
		a.limit = float64(cfg.InitialLimit)
	}
	a.cfg = cfg
	a.limit = clamp(a.limit, a.floorLocked(), float64(cfg.MaxLimit))
	a.publishLocked()
}

// publishLocked publishes the enforced limit for host shares.
func (a *Adaptive) publishLocked() {
	var n int64
	if a.cfg.Enabled {
		n = int64(math.Ceil(a.limit))
	}
	a.enforced.Store(n)
}

// EnforcedLimit is the limit, rounded up, while it refuses requests; 0
// while it only learns.
func (a *Adaptive) EnforcedLimit() int { return int(a.enforced.Load()) }

// SetEdges says how many edges share the origin (the edges registered for
// the region, this one included); they split min_limit between them. Less
// than 1 counts as 1.
func (a *Adaptive) SetEdges(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.edges = max(n, 1)
	a.limit = clamp(a.limit, a.floorLocked(), float64(a.cfg.MaxLimit))
	a.publishLocked()
}

// floorLocked is this edge's part of min_limit: min_limit / edges,
// rounded up, at least 1.
func (a *Adaptive) floorLocked() float64 {
	return float64(max((a.cfg.MinLimit+a.edges-1)/a.edges, 1))
}

// Acquire asks for an origin slot for a request of tier at now. It returns
// false when the limit refuses it; otherwise the caller must call Release
// once, with the same tier, when the origin exchange ends. A disabled
// controller admits everything and still counts in-flight requests, so
// switching it on starts from the true concurrency.
func (a *Adaptive) Acquire(now time.Time, tier Tier) bool {
	if !tier.valid() {
		tier = TierWrite
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.advanceLocked(now)
	if a.cfg.Enabled && !a.admitLocked(tier) {
		a.rejected[tier]++
		return false
	}
	a.inflight[tier]++
	a.total++
	a.winMaxTotal = max(a.winMaxTotal, a.total)
	return true
}

// admitLocked applies the guaranteed shares. Critical requests are never
// refused here (as the ramp never sheds them; the worker cap bounds them),
// but they count in the total, so the other tiers have what they leave.
// A lower tier is admitted within its own share (whole requests: a share
// of 0.4 requests guarantees none, or a small limit would be exceeded by
// one request of every tier), or while the total plus
// the unused shares of the tiers above it stays under the limit: a share
// nobody uses is kept for its tier, not lent to the tiers below. That
// costs no throughput, because the limit is learned from latency: while
// reserved slots sit idle the origin does not queue, and the limit grows
// until the traffic that is there fills the origin.
func (a *Adaptive) admitLocked(tier Tier) bool {
	if tier == TierCritical || float64(a.inflight[tier]+1) <= a.cfg.Shares.of(tier)*a.limit {
		return true
	}
	used := float64(a.total)
	for t := tier + 1; t < numTiers; t++ {
		used += max(a.cfg.Shares.of(t)*a.limit-float64(a.inflight[t]), 0)
	}
	return used < a.limit
}

// Release ends an origin exchange begun by a successful Acquire of tier.
// rtt is how long the origin took; sample says whether it measures the
// origin (a response came back, or the exchange timed out): an exchange
// that failed at once (connection refused) or never reached the origin
// must not count as a fast answer.
func (a *Adaptive) Release(now time.Time, tier Tier, rtt time.Duration, sample bool) {
	if !tier.valid() {
		tier = TierWrite
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inflight[tier] > 0 {
		a.inflight[tier]--
		a.total--
	}
	if sample && rtt > 0 {
		if len(a.winSamples) < maxWindowSamples {
			a.winSamples = append(a.winSamples, rtt)
		} else {
			a.winSamples[a.winSeen%maxWindowSamples] = rtt
		}
		a.winSeen++
	}
	a.advanceLocked(now)
}

// advanceLocked closes the window when it has lasted cfg.Window and holds
// enough samples, and moves the limit.
func (a *Adaptive) advanceLocked(now time.Time) {
	if a.winStart.IsZero() || now.Before(a.winStart) {
		a.winStart = now
		return
	}
	if now.Sub(a.winStart) < a.cfg.Window {
		return
	}
	if len(a.winSamples) < minWindowSamples {
		if now.Sub(a.winStart) > 50*a.cfg.Window {
			// Too quiet to learn from: start afresh rather than let one
			// window span minutes of unrelated traffic.
			a.resetWindowLocked(now)
		}
		return
	}
	slices.Sort(a.winSamples)
	n := len(a.winSamples)
	sample := a.winSamples[n/2]
	low := a.winSamples[n/10]
	a.observeMinLocked(now, low)
	a.sample, a.sampleLow = sample, low
	a.updateLimitLocked(now, sample)
	a.resetWindowLocked(now)
}

func (a *Adaptive) resetWindowLocked(now time.Time) {
	a.winStart = now
	a.winSamples = a.winSamples[:0]
	a.winSeen = 0
	a.winMaxTotal = a.total
}

// observeMinLocked folds a window's low latency into the sliding minimum
// and recomputes minRTT over the buckets still inside min_rtt_window.
func (a *Adaptive) observeMinLocked(now time.Time, low time.Duration) {
	width := a.cfg.MinRTTWindow / minRTTBuckets
	idx, oldest := -1, 0
	for i, b := range a.buckets {
		if !b.start.IsZero() && !now.Before(b.start) && now.Sub(b.start) < width {
			idx = i
			break
		}
		if b.start.Before(a.buckets[oldest].start) {
			oldest = i
		}
	}
	if idx < 0 {
		// Empty buckets have the zero start, so they are reused first.
		idx = oldest
		a.buckets[idx] = rttBucket{start: now, min: low}
	}
	cur := &a.buckets[idx]
	cur.min = min(cur.min, low)
	a.minRTT = 0
	for _, b := range a.buckets {
		if b.start.IsZero() || now.Sub(b.start) >= a.cfg.MinRTTWindow {
			continue
		}
		if a.minRTT == 0 || b.min < a.minRTT {
			a.minRTT = b.min
		}
	}
}

// updateLimitLocked is the gradient step.
func (a *Adaptive) updateLimitLocked(now time.Time, sample time.Duration) {
	cfg := &a.cfg
	g := clamp(float64(a.minRTT)*(1+cfg.Buffer)/float64(sample), 0.5, 2)
	a.gradient = g
	a.learned = true
	next := a.limit * g
	if g >= 1 {
		// Headroom only while there is no queue: added at every step (as
		// Envoy's filter does), √L would hold a small limit where the
		// latency is twice minRTT (L·g + √(L·g) = L at g ≈ 0.6 for L = 4).
		next += math.Sqrt(next)
	}
	if next > a.limit && float64(a.winMaxTotal) < a.limit/2 {
		// Application-limited: the traffic never came near the limit, so
		// low latency says nothing about a higher one.
		next = a.limit
	}
	a.limit += cfg.Smoothing * (next - a.limit)
	floor := a.floorLocked()
	a.limit = clamp(a.limit, floor, float64(cfg.MaxLimit))
	a.publishLocked()
	if g >= 1 || a.limit > floor {
		a.slowAtFloor = 0
	} else if a.slowAtFloor++; a.slowAtFloor >= slowWindowsAtFloor {
		// Still slow at the floor for a few windows (the queue built
		// while the limit was higher has drained by then: these windows'
		// responses were sent at the floor), where no more are in flight
		// than an origin sized at least to min_limit serves at once: the
		// origin itself got slower (a deploy, a slow dependency, fewer
		// cores). Its latency now is the new no-queue latency; waiting
		// out min_rtt_window instead would hold the limit at the floor
		// all that time. (Above the floor, a slow window may be the
		// edges' own queue: taking it as minRTT would ratchet minRTT up.)
		a.buckets = [minRTTBuckets]rttBucket{}
		a.observeMinLocked(now, a.sampleLow)
		a.slowAtFloor = 0
	}
}

// AdaptiveState is a snapshot for metrics, CLIs and tests.
type AdaptiveState struct {
	Enabled bool
	Limit   float64
	// Floor is the lowest Limit goes on this edge: min_limit over the
	// edges sharing the origin.
	Floor     float64
	Gradient  float64
	MinRTT    time.Duration
	SampleRTT time.Duration
	InFlight  [numTiers]int
	// Share is each tier's guaranteed share of Limit, in requests.
	Share    [numTiers]float64
	Rejected [numTiers]uint64
}

// State returns the controller's current values.
func (a *Adaptive) State() AdaptiveState {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := AdaptiveState{
		Enabled: a.cfg.Enabled, Limit: a.limit, Floor: a.floorLocked(), Gradient: a.gradient,
		MinRTT: a.minRTT, SampleRTT: a.sample, InFlight: a.inflight, Rejected: a.rejected,
	}
	for t := range Tier(numTiers) {
		s.Share[t] = a.cfg.Shares.of(t) * a.limit
	}
	return s
}

// Limit returns the learned limit, rounded down.
func (a *Adaptive) Limit() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int(a.limit)
}
