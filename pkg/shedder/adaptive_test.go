package shedder

import (
	"container/heap"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// simOrigin is a FIFO origin with `servers` requests served at once, each
// taking `service`: past its servers, requests queue. Time is simulated,
// so the runs are exact and take no wall time.
type simOrigin struct {
	servers []time.Time // when each server is next free
	service time.Duration
}

// admit returns when a request arriving at now completes.
func (o *simOrigin) admit(now time.Time) time.Time {
	i := 0
	for j, f := range o.servers {
		if f.Before(o.servers[i]) {
			i = j
		}
	}
	done := later(now, o.servers[i]).Add(o.service)
	o.servers[i] = done
	return done
}

// resize keeps the n servers that free first (n <= len); requests already
// admitted to the others still complete.
func (o *simOrigin) resize(n int) {
	slices.SortFunc(o.servers, func(a, b time.Time) int { return a.Compare(b) })
	o.servers = o.servers[:n]
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

type completion struct {
	at, sent time.Time
	tier     Tier
	edge     *Adaptive
}

type completions []completion

func (c completions) Len() int           { return len(c) }
func (c completions) Less(i, j int) bool { return c[i].at.Before(c[j].at) }
func (c completions) Swap(i, j int)      { c[i], c[j] = c[j], c[i] }
func (c *completions) Push(x any)        { *c = append(*c, x.(completion)) }
func (c *completions) Pop() any {
	old := *c
	x := old[len(old)-1]
	*c = old[:len(old)-1]
	return x
}

// phase is a stretch of a simulated run with fixed origin and offered load.
type phase struct {
	d        time.Duration
	servers  int           // origin concurrency; 0 keeps the previous
	service  time.Duration // origin service time; 0 keeps the previous
	offered  float64       // requests per second, one in ten critical
	measured time.Duration // the phase's tail over which results are taken
}

type phaseResult struct {
	goodput     float64 // completions per second over the measured tail
	capacity    float64 // servers / service
	p99         time.Duration
	rejected    [numTiers]int
	limitMean   float64 // of the edges' limits summed
	limitStdDev float64
}

// simulate drives a through the phases with evenly spaced arrivals.
func simulate(t *testing.T, a *Adaptive, phases []phase) []phaseResult {
	t.Helper()
	return simulateEdges(t, []*Adaptive{a}, phases)
}

// simulateEdges drives edges that share one origin through the phases,
// the arrivals dealt to them in turn, each edge getting every tier.
func simulateEdges(t *testing.T, edges []*Adaptive, phases []phase) []phaseResult {
	t.Helper()
	now := time.Unix(1_700_000_000, 0)
	o := &simOrigin{}
	var pending completions
	var results []phaseResult
	n := 0
	for _, p := range phases {
		if p.service > 0 {
			o.service = p.service
		}
		if p.servers > len(o.servers) {
			for len(o.servers) < p.servers {
				o.servers = append(o.servers, now)
			}
		} else if p.servers > 0 {
			o.resize(p.servers)
		}
		end := now.Add(p.d)
		from := end.Add(-p.measured)
		gap := time.Duration(float64(time.Second) / p.offered)
		var r phaseResult
		r.capacity = float64(len(o.servers)) / o.service.Seconds()
		var lat []time.Duration
		var limits []float64
		done := 0
		for now.Before(end) {
			// Completions due before the next arrival go first.
			for len(pending) > 0 && !pending[0].at.After(now) {
				c := heap.Pop(&pending).(completion)
				c.edge.Release(c.at, c.tier, c.at.Sub(c.sent), true)
				if !c.at.Before(from) && c.at.Before(end) {
					done++
					lat = append(lat, c.at.Sub(c.sent))
				}
			}
			tier := TierRead
			switch n % 10 {
			case 0:
				tier = TierCritical
			case 1, 2, 3:
				tier = TierWrite
			}
			a := edges[(n+n/10)%len(edges)] // every tier to every edge
			n++
			if a.Acquire(now, tier) {
				heap.Push(&pending, completion{at: o.admit(now), sent: now, tier: tier, edge: a})
			} else if !now.Before(from) {
				r.rejected[tier]++
			}
			if !now.Before(from) {
				var sum float64
				for _, e := range edges {
					sum += e.State().Limit
				}
				limits = append(limits, sum)
			}
			now = now.Add(gap)
		}
		r.goodput = float64(done) / p.measured.Seconds()
		slices.Sort(lat)
		if len(lat) > 0 {
			r.p99 = lat[len(lat)*99/100]
		}
		var sum, sq float64
		for _, l := range limits {
			sum += l
		}
		r.limitMean = sum / float64(len(limits))
		for _, l := range limits {
			sq += (l - r.limitMean) * (l - r.limitMean)
		}
		r.limitStdDev = math.Sqrt(sq / float64(len(limits)))
		results = append(results, r)
	}
	return results
}

func adaptiveOn() AdaptiveConfig {
	c := DefaultAdaptiveConfig()
	c.Enabled = true
	return c
}

// TestAdaptiveConvergesOnChangingCapacity offers 3× an origin's capacity
// and then halves the capacity, twice over: by its servers (latency rises
// only through queueing) and by its speed (latency doubles at constant
// concurrency). After each change the limit settles so the origin stays
// ≥ 90% busy with admitted requests' p99 within 2× the unloaded service
// time, critical traffic loses nothing, and the limit holds steady.
func TestAdaptiveConvergesOnChangingCapacity(t *testing.T) {
	const service = 20 * time.Millisecond
	for _, tc := range []struct {
		name   string
		change phase
	}{
		{"servers halve", phase{servers: 20}},
		{"service time doubles", phase{service: 2 * service}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAdaptive(adaptiveOn())
			step := tc.change
			step.d, step.offered, step.measured = 10*time.Second, 3*2000, 5*time.Second
			res := simulate(t, a, []phase{
				{d: 10 * time.Second, servers: 40, service: service, offered: 3 * 2000, measured: 5 * time.Second},
				step,
			})
			for i, r := range res {
				t.Logf("phase %d: capacity %.0f/s goodput %.0f/s (%.1f%%), p99 %v, limit %.1f±%.1f, rejected %v",
					i, r.capacity, r.goodput, 100*r.goodput/r.capacity, r.p99, r.limitMean, r.limitStdDev, r.rejected)
				require.GreaterOrEqual(t, r.goodput, 0.9*r.capacity, "phase %d goodput", i)
				unloaded := service
				if i == 1 && tc.change.service > 0 {
					unloaded = tc.change.service
				}
				require.LessOrEqual(t, r.p99, 2*unloaded, "phase %d p99", i)
				require.Zero(t, r.rejected[TierCritical], "phase %d critical rejected", i)
				require.Greater(t, r.rejected[TierRead], 0, "phase %d: 3× overload must shed", i)
				require.Less(t, r.limitStdDev, 0.25*r.limitMean, "phase %d: the limit oscillates", i)
			}
		})
	}
}

// TestAdaptiveEdgesSplitTheFloor: two edges in front of an origin of 4
// servers × 20 ms, offered 3× its capacity, which then drops to 2 servers
// (the stack benchmark's origin), with min_limit 2. Each edge alone would
// keep min_limit in flight, 4 against 2 servers, queueing by construction
// (and, slow at its floor, take the queue for the origin's latency); told
// that they are two, each keeps its half of the floor, and the admitted
// p99 stays within 2× the service time with the origin ≥ 90% busy.
func TestAdaptiveEdgesSplitTheFloor(t *testing.T) {
	const service = 20 * time.Millisecond
	phases := []phase{
		{d: 10 * time.Second, servers: 4, service: service, offered: 3 * 200, measured: 5 * time.Second},
		{d: 10 * time.Second, servers: 2, offered: 3 * 200, measured: 5 * time.Second},
	}
	cfg := adaptiveOn()
	cfg.MinLimit = 2 // the halved origin's concurrency
	run := func(told int) ([]phaseResult, []*Adaptive) {
		edges := []*Adaptive{NewAdaptive(cfg), NewAdaptive(cfg)}
		for _, e := range edges {
			e.SetEdges(told)
			require.Equal(t, float64(2/told), e.State().Floor)
		}
		res := simulateEdges(t, edges, phases)
		for i, r := range res {
			t.Logf("told %d edges, phase %d: capacity %.0f/s goodput %.0f/s (%.1f%%), p99 %v, limits %.1f±%.1f, rejected %v",
				told, i, r.capacity, r.goodput, 100*r.goodput/r.capacity, r.p99, r.limitMean, r.limitStdDev, r.rejected)
		}
		return res, edges
	}
	split, edges := run(2)
	for i, r := range split {
		require.GreaterOrEqual(t, r.goodput, 0.9*r.capacity, "phase %d goodput", i)
		require.LessOrEqual(t, r.p99, 2*service, "phase %d p99", i)
		require.Zero(t, r.rejected[TierCritical], "phase %d critical rejected", i)
	}
	alone, _ := run(1)
	require.Greater(t, alone[1].p99, 3*service, "each edge at the whole floor queues at the halved origin")

	// The count is live: the other edge leaving raises this one's floor
	// to the whole min_limit at once, and the limit with it.
	a := edges[0]
	require.Less(t, a.State().Limit, 2.0, "at its half of the floor after the halving")
	a.SetEdges(0) // under 1 counts as 1
	require.Equal(t, 2.0, a.State().Floor)
	require.Equal(t, 2.0, a.State().Limit)
}

// TestAdaptiveShares fills a fixed limit of 20 (shares: read 1, write 2,
// critical 5 requests) tier by tier: a tier's share stays free for it, the
// tiers below cannot take it, and critical is never refused.
func TestAdaptiveShares(t *testing.T) {
	cfg := adaptiveOn()
	cfg.InitialLimit = 20
	a := NewAdaptive(cfg)
	now := time.Unix(0, 0)
	fill := func(tier Tier) int {
		n := 0
		for a.Acquire(now, tier) {
			n++
			require.Less(t, n, 1000, "tier %s never refused", tier)
		}
		return n
	}
	// Reads take all but the unused shares of write (2) and critical (5).
	require.Equal(t, 13, fill(TierRead))
	// Write gets its own share, not critical's.
	require.Equal(t, 2, fill(TierWrite))
	// Critical's 5 are still there, and more: critical is never refused.
	for range 30 {
		require.True(t, a.Acquire(now, TierCritical))
	}
	st := a.State()
	require.Equal(t, [numTiers]int{0, 13, 2, 30}, st.InFlight)
	require.Equal(t, [numTiers]uint64{0, 1, 1, 0}, st.Rejected)
	// Over the limit now, a tier under its share is still admitted: after
	// its reads end, read gets its one guaranteed slot back, no more.
	for range 13 {
		a.Release(now, TierRead, 0, false)
	}
	require.Equal(t, 1, fill(TierRead))

	// Disabled (or shadow mode), nothing is refused but in-flight is kept.
	cfg.Enabled = false
	a.setConfig(cfg)
	for range 50 {
		require.True(t, a.Acquire(now, TierTest))
	}
	require.Equal(t, 50, a.State().InFlight[TierTest])
}

// TestAdaptiveIdleDoesNotGrow: latency at minRTT says nothing about a
// higher limit while traffic uses less than half of it.
func TestAdaptiveIdleDoesNotGrow(t *testing.T) {
	a := NewAdaptive(adaptiveOn())
	now := time.Unix(0, 0)
	for range 2000 {
		require.True(t, a.Acquire(now, TierRead))
		now = now.Add(time.Millisecond)
		a.Release(now, TierRead, 5*time.Millisecond, true)
	}
	st := a.State()
	require.InDelta(t, 20, st.Limit, 0.001)
	require.Equal(t, 5*time.Millisecond, st.MinRTT)
	require.InDelta(t, 1.25, st.Gradient, 0.001)
}

// TestShedderAdaptiveFollowsSettings: the limit is opt-in, follows live
// updates, and learns without refusing in shadow mode.
func TestShedderAdaptiveFollowsSettings(t *testing.T) {
	cfg := rawConfig()
	cfg.Adaptive.InitialLimit, cfg.Adaptive.MinLimit = 4, 1
	s := newShedder(t, cfg)
	now := time.Unix(0, 0)
	for range 10 {
		require.True(t, s.AcquireOrigin(now, TierRead), "off by default")
	}
	for range 10 {
		s.ReleaseOrigin(now, TierRead, 0, false)
	}

	cfg.Adaptive.Enabled = true
	require.NoError(t, s.Update(cfg))
	require.True(t, s.Adaptive().State().Enabled)
	n := 0
	for s.AcquireOrigin(now, TierRead) {
		n++
	}
	// A limit of 4 less the unused shares above read: write 0.4, critical 1.
	require.Equal(t, 3, n)
	require.True(t, s.AcquireOrigin(now, TierCritical), "critical is never refused")

	cfg.Enabled = false // shadow mode
	require.NoError(t, s.Update(cfg))
	require.False(t, s.Adaptive().State().Enabled)
	require.True(t, s.AcquireOrigin(now, TierRead))

	bad := cfg
	bad.Adaptive.Shares.Read = 2
	require.ErrorIs(t, s.Update(bad), ErrInvalidConfig)
	require.Equal(t, cfg.Adaptive, s.Config().Adaptive, "a refused update keeps the settings in force")
}

// TestAdaptiveKeepsWhatItLearnedWhenSwitchedOn: the limit learned in
// shadow is the one enforced when the limit is switched on.
func TestAdaptiveKeepsWhatItLearnedWhenSwitchedOn(t *testing.T) {
	cfg := DefaultAdaptiveConfig() // off
	a := NewAdaptive(cfg)
	// 1,500 req/s to an origin of 2,000: about 30 in flight, no queue.
	simulate(t, a, []phase{{d: 5 * time.Second, servers: 40, service: 20 * time.Millisecond, offered: 1500, measured: time.Second}})
	learned := a.State().Limit
	require.Greater(t, learned, 30.0, "the limit is learned while off")
	cfg.Enabled, cfg.InitialLimit = true, 10
	a.setConfig(cfg)
	require.Equal(t, learned, a.State().Limit)

	// Before anything is learned, a new initial_limit applies.
	fresh := NewAdaptive(DefaultAdaptiveConfig())
	fresh.setConfig(cfg)
	require.Equal(t, 10.0, fresh.State().Limit)
}
