// Package shedder is edgeguard's load shedder: Stripe's worker-utilization
// shedder, made tiered and live-tunable.
//
// The edge caps concurrent requests with Workers and samples their
// utilization into a Shedder, which integrates it into a shed level S: S
// climbs while utilization is at or above "bad", holds in the dead zone,
// and recovers below "good". S starts at -start_after/full_after, so
// sustained overload sheds nothing for start_after and everything
// sheddable after start_after+full_after. S > 0 is the fraction of
// sheddable offered traffic to drop, taken from the lowest tier first
// (test, then read, then write); critical traffic is never shed by the
// ramp, only bounded by the worker cap.
//
// The package imports no HTTP library: the edge passes plain values, and
// every method that depends on time takes it as an argument.
package shedder

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Option customises a Shedder.
type Option func(*options)

type options struct {
	clock func() time.Time
	rand  func() float64
}

// WithClock sets the clock Run stamps samples with (default time.Now).
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.clock = now }
}

// WithRand sets the source of uniform [0,1) draws for partial tiers. It is
// called concurrently from Admit, so it must be safe for that (the default,
// math/rand/v2's Float64, is, and takes no lock).
func WithRand(f func() float64) Option {
	return func(o *options) { o.rand = f }
}

// WithRandSource draws from r behind a mutex; meant for seeded,
// reproducible tests, not the hot path.
func WithRandSource(r *rand.Rand) Option {
	var mu sync.Mutex
	return WithRand(func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	})
}

// decision is what Admit needs, published as one immutable value so the
// request path is a single atomic load with no lock.
type decision struct {
	drop       [numTiers]float64 // drop probability per tier
	level      float64
	util       float64
	cutoff     Tier
	enabled    bool
	lastObs    time.Time
	staleAfter time.Duration
}

// Shedder decides, per request, whether to shed it. Safe for concurrent
// use: Admit is lock-free; observations and updates serialise on a mutex.
type Shedder struct {
	mu      sync.Mutex
	cfg     Config
	level   float64
	util    float64
	started bool
	last    time.Time
	weights [numTiers]float64 // decayed offered-request counts per tier
	seen    [numTiers]uint64  // request counters at the last observation
	workers *Workers
	lag     time.Duration // the last runtime lag observed (ObserveLag)

	adaptive *Adaptive
	hosts    *HostShares

	dec   atomic.Pointer[decision]
	cls   atomic.Pointer[Classifier]
	m     *metrics
	rand  func() float64
	clock func() time.Time
	// cpuTime is the process's CPU time so far as Run reads it for the
	// rate shares (SetCPUTime); nil: processCPU.
	cpuTime func() time.Duration
}

// New returns a Shedder at rest (S = -start_after/full_after). A nil reg
// leaves the metrics unregistered.
func New(cfg Config, reg prometheus.Registerer, opts ...Option) (*Shedder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("shedder: new: %w", err)
	}
	cls, err := NewClassifier(cfg.Tiers)
	if err != nil {
		return nil, fmt.Errorf("shedder: new: %w", err)
	}
	o := options{clock: time.Now, rand: rand.Float64}
	for _, opt := range opts {
		opt(&o)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Shedder{cfg: cfg.Clone(), m: m, rand: o.rand, clock: o.clock}
	s.adaptive = NewAdaptive(cfg.adaptive())
	m.adaptive.Store(s.adaptive)
	// Capacity 1 until AttachWorkers: with no workers attached there is
	// nothing to share.
	s.hosts = NewHostShares(1, cfg.HostShare)
	s.hosts.originLimit = s.adaptive.EnforcedLimit
	m.hosts.Store(s.hosts)
	s.level = s.cfg.floor()
	s.cls.Store(cls)
	s.m.setConfig(s.cfg, s.clock())
	s.publishLocked()
	return s, nil
}

// Admit counts the request as offered traffic of its tier and reports
// whether to serve it (false: shed it). An out-of-range tier is treated as
// write. If no utilization sample has arrived for start_after, Admit fails
// open: a stuck sampler must not freeze the node at a high shed level.
func (s *Shedder) Admit(now time.Time, tier Tier) bool {
	if !tier.valid() {
		tier = TierWrite
	}
	s.m.requests[tier].Add(1)
	d := s.dec.Load()
	p := d.drop[tier]
	if p <= 0 || !d.enabled || now.Sub(d.lastObs) > d.staleAfter {
		return true
	}
	if p < 1 && s.rand() >= p {
		return true
	}
	s.m.shed[tier].Add(1)
	return false
}

// ObserveUtilization feeds one raw utilization sample (busy/capacity) taken
// at now. It smooths the sample, advances the ramp by the time since the
// previous sample, and re-derives the per-tier cut-off from the offered
// traffic counted since. Call it from one sampler every 10-100 ms; samples
// out of time order advance nothing. Non-finite samples are ignored.
func (s *Shedder) ObserveUtilization(now time.Time, u float64) {
	if !finite(u) {
		return
	}
	u = max(u, 0)
	s.mu.Lock()
	defer s.mu.Unlock()
	if bad := s.cfg.RuntimeLagBad; bad > 0 {
		// Lag the workers cannot show (CPU starvation, GC pauses) counts
		// as utilization: lag_bad or more is a saturated node.
		u = max(u, min(s.lag.Seconds()/bad.Seconds(), 1))
	}

	var dt float64
	if s.started {
		dt = max(now.Sub(s.last).Seconds(), 0)
	}
	if !s.started || now.After(s.last) {
		s.last = now
	}
	s.started = true
	cfg := &s.cfg

	if hl := cfg.Smoothing.Seconds(); hl > 0 {
		s.util += (1 - math.Exp2(-dt/hl)) * (u - s.util)
	} else {
		s.util = u
	}

	// Capping dt means a sampler that stalled cannot jump S by more than a
	// start_after's worth of ramp in one step.
	tStart, tAll := cfg.StartAfter.Seconds(), cfg.FullAfter.Seconds()
	step := min(dt, tStart) * clamp(rampAmount(s.util, cfg.Good, cfg.Bad), -1, 1) / tAll
	s.level = clamp(s.level+step, cfg.floor(), 1)

	decay := math.Exp2(-dt / cfg.ShareWindow.Seconds())
	for t := range numTiers {
		n := s.m.requests[t].Load()
		s.weights[t] = s.weights[t]*decay + float64(n-s.seen[t])
		s.seen[t] = n
	}
	s.publishLocked()
}

// rampAmount is the design doc's rate of change of S, before clamping.
func rampAmount(u, good, bad float64) float64 {
	switch {
	case u < good:
		return u/good - 1
	case u < bad:
		return 0
	default:
		return (u - bad) / (1 - bad)
	}
}

func clamp(v, lo, hi float64) float64 { return min(max(v, lo), hi) }

// cutoffs maps level S to per-tier drop probabilities over the sheddable
// tiers' shares of offered traffic w, cutting the lowest tier first, and
// returns the highest tier that loses anything.
func cutoffs(level float64, w [numTiers]float64) (drop [numTiers]float64, top Tier) {
	top = TierNone
	if level <= 0 {
		return drop, top
	}
	if level >= 1 {
		for _, t := range sheddable {
			drop[t] = 1
		}
		return drop, sheddable[len(sheddable)-1]
	}
	var total float64
	for _, t := range sheddable {
		total += w[t]
	}
	var cum float64
	for _, t := range sheddable {
		// With no traffic seen yet any split is as good as another; equal
		// shares keep the lowest-first order meaningful.
		share := 1 / float64(len(sheddable))
		if total > 0 {
			share = w[t] / total
		}
		switch {
		case level >= cum+share:
			drop[t], top = 1, t
		case level > cum:
			drop[t], top = (level-cum)/share, t
		}
		cum += share
	}
	return drop, top
}

// publishLocked recomputes and publishes the decision; s.mu must be held
// (or s not yet shared).
func (s *Shedder) publishLocked() {
	d := &decision{
		level:      s.level,
		util:       s.util,
		enabled:    s.cfg.Enabled,
		lastObs:    s.last,
		staleAfter: s.cfg.StartAfter,
	}
	d.drop, d.cutoff = cutoffs(s.level, s.weights)
	s.dec.Store(d)
	s.m.level.Set(d.level)
	s.m.utilization.Set(d.util)
	s.m.cutoffTier.Set(float64(d.cutoff))
}

// Update switches to cfg live. An invalid cfg is refused with every
// problem listed, and the current settings stay in force. S is kept,
// clamped to the new floor; a shedder at rest stays at rest (moves to the
// new floor) so a longer start_after takes effect at once.
func (s *Shedder) Update(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("shedder: update refused, keeping current settings: %w", err)
	}
	cls, err := NewClassifier(cfg.Tiers)
	if err != nil {
		return fmt.Errorf("shedder: update refused, keeping current settings: %w", err)
	}
	cfg = cfg.Clone()
	s.mu.Lock()
	defer s.mu.Unlock()
	atRest := s.level <= s.cfg.floor()
	s.cfg = cfg
	if atRest {
		s.level = cfg.floor()
	}
	s.level = clamp(s.level, cfg.floor(), 1)
	s.cls.Store(cls)
	s.adaptive.setConfig(cfg.adaptive())
	s.hosts.setConfig(cfg.HostShare)
	if s.workers != nil {
		// Validated above, so these cannot fail.
		_ = s.workers.SetQueue(cfg.QueueSize, cfg.QueueTimeout)
		_ = s.workers.SetCriticalTimeout(cfg.CriticalQueueTimeout)
	}
	s.m.setConfig(cfg, s.clock())
	s.publishLocked()
	return nil
}

// AttachWorkers wires w into the shedder's metrics (busy, capacity, queue
// wait) and makes it follow queue_size, queue_timeout and
// critical_queue_timeout from this and every later config; its current
// queue settings are overwritten.
func (s *Shedder) AttachWorkers(w *Workers) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.workers = w
	s.m.workers.Store(w)
	w.setWaitObserver(s.m.queueWaitOf)
	w.setRejectCounter(s.m.countRejected)
	_ = w.SetQueue(s.cfg.QueueSize, s.cfg.QueueTimeout)
	_ = w.SetCriticalTimeout(s.cfg.CriticalQueueTimeout)
	s.hosts.setCapacity(w.Capacity())
}

// Run samples utilization every interval (e.g. Workers.Utilization) into
// ObserveUtilization, stamped by the Shedder's clock, until ctx ends. Each
// tick also measures the runtime's lag (see LagProbe) into ObserveLag.
func (s *Shedder) Run(ctx context.Context, interval time.Duration, sample func() float64) error {
	if interval <= 0 {
		return fmt.Errorf("%w: sampler interval must be > 0, got %v", ErrInvalidConfig, interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	s.mu.Lock()
	cpuTime := s.cpuTime
	s.mu.Unlock()
	if cpuTime == nil {
		cpuTime = processCPU
	}
	probe, cpu := NewLagProbe(), newCPUProbe(cpuTime)
	s.ObserveUtilization(s.clock(), sample())
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("shedder: sampler stopped: %w", ctx.Err())
		case tick := <-t.C:
			now := time.Now()
			s.ObserveLag(probe.Measure(tick, now))
			s.hosts.ObserveBusy(cpu.Measure(now), interval)
			s.ObserveUtilization(s.clock(), sample())
		}
	}
}

// SetCPUTime replaces what Run reads as the process's CPU time so far, the
// rate shares' signal (by default the user and system time getrusage
// reports): a test decides when an edge's CPU looks busy without having
// to make the machine's cores busy. Call it before Run.
func (s *Shedder) SetCPUTime(f func() time.Duration) {
	s.mu.Lock()
	s.cpuTime = f
	s.mu.Unlock()
}

// ObserveLag records the runtime's lag (scheduling delay, GC pauses) for
// the next ObserveUtilization: with runtime_lag_bad set, the ramp acts on
// the larger of worker utilization and lag/runtime_lag_bad.
func (s *Shedder) ObserveLag(lag time.Duration) {
	s.mu.Lock()
	s.lag = max(lag, 0)
	s.mu.Unlock()
	s.m.lag.Set(lag.Seconds())
}

// AcquireHost takes a place in host's share of the workers for a request
// from client (the zero Addr: not known) of tier at now; see
// HostShares.AcquireFrom. A refusal is counted as a rejection of reason
// host_share.
func (s *Shedder) AcquireHost(now time.Time, host string, client netip.Addr, tier Tier) (HostLease, bool) {
	l, ok := s.hosts.AcquireFrom(now, host, client, tier)
	if !ok {
		if !tier.valid() {
			tier = TierWrite
		}
		s.m.hostShare[tier].Add(1)
	}
	return l, ok
}

// HostShareName is HostShares.ShareName: the name a request for host of
// the host table's tenant is held to a share under.
func (s *Shedder) HostShareName(host, tenant string) string { return s.hosts.ShareName(host, tenant) }

// AcquireHostWait is AcquireHost for a request that may wait for a place
// in its host's share (host_share.queue_timeout); see
// HostShares.AcquireWait. A refusal (no queue, the queues full, the wait
// timed out) is counted as a rejection of reason host_share; a client that
// left (ErrGone) is not.
func (s *Shedder) AcquireHostWait(ctx context.Context, now time.Time, host string, client netip.Addr, tier Tier, gone func() bool) (HostLease, error) {
	l, err := s.hosts.AcquireWait(ctx, now, host, client, tier, gone)
	if err != nil && !errors.Is(err, ErrGone) {
		if !tier.valid() {
			tier = TierWrite
		}
		s.m.hostShare[tier].Add(1)
	}
	return l, err
}

// AdmitExempt counts a request the ramp must not shed (its host is within
// its share while another is held to its own) as offered traffic of its
// tier, so the cut-off shares still see it.
func (s *Shedder) AdmitExempt(tier Tier) {
	if !tier.valid() {
		tier = TierWrite
	}
	s.m.requests[tier].Add(1)
}

// Hosts returns the per-host share table (never nil).
func (s *Shedder) Hosts() *HostShares { return s.hosts }

// AcquireOrigin asks the adaptive limit for an origin slot for a request of
// tier at now; see Adaptive.Acquire. With the adaptive limit off, or in
// shadow mode, it always admits (and still learns).
func (s *Shedder) AcquireOrigin(now time.Time, tier Tier) bool {
	return s.adaptive.Acquire(now, tier)
}

// ReleaseOrigin ends an exchange AcquireOrigin admitted; see
// Adaptive.Release.
func (s *Shedder) ReleaseOrigin(now time.Time, tier Tier, rtt time.Duration, sample bool) {
	s.adaptive.Release(now, tier, rtt, sample)
}

// SetEdges says how many edges share the origin; see Adaptive.SetEdges.
func (s *Shedder) SetEdges(n int) { s.adaptive.SetEdges(n) }

// Adaptive returns the adaptive concurrency controller (never nil).
func (s *Shedder) Adaptive() *Adaptive { return s.adaptive }

// Classify classifies with the live configuration's rules; see
// Classifier.Classify.
func (s *Shedder) Classify(method, path string, header func(string) (string, bool), trusted bool) Tier {
	return s.cls.Load().Classify(method, path, header, trusted)
}

// Classifier returns the live classifier; it is replaced, not mutated, on
// Update.
func (s *Shedder) Classifier() *Classifier { return s.cls.Load() }

// Level returns S: <= 0 sheds nothing, 1 sheds every sheddable request.
// It moves in shadow mode too.
func (s *Shedder) Level() float64 { return s.dec.Load().level }

// Utilization returns the smoothed utilization the ramp is acting on.
func (s *Shedder) Utilization() float64 { return s.dec.Load().util }

// CutoffTier returns the highest tier currently losing requests, or
// TierNone.
func (s *Shedder) CutoffTier() Tier { return s.dec.Load().cutoff }

// DropProbability returns the current probability a request of tier is
// shed (ignoring shadow mode and staleness); for CLIs and dashboards.
func (s *Shedder) DropProbability(tier Tier) float64 {
	if !tier.valid() {
		tier = TierWrite
	}
	return s.dec.Load().drop[tier]
}

// Config returns a copy of the live configuration.
func (s *Shedder) Config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Clone()
}

// setLevel forces S, for tests of the cut-off at fixed levels.
func (s *Shedder) setLevel(level float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.level = clamp(level, s.cfg.floor(), 1)
	s.publishLocked()
}
