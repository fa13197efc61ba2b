package limiter_test

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// edgeLimiter is one edge's limiter as the edge builds it: its own client,
// the default Config (deadline, breaker), its own metrics.
type edgeLimiter struct {
	*limiter.Limiter
	store *limiter.RedisStore
	reg   *prometheus.Registry
}

func newEdgeLimiters(t *testing.T, n int, url string, mode limiter.Mode) []edgeLimiter {
	out := make([]edgeLimiter, n)
	for i := range out {
		c, err := limiter.NewRedisClient(url, mode)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		st := connStore(t, limiter.Conn(c))
		reg := prometheus.NewRegistry()
		l, err := limiter.New(st, limiter.Config{}, reg, nil) // the defaults
		require.NoError(t, err)
		out[i] = edgeLimiter{l, st, reg}
	}
	return out
}

// metric sums a metric's series in reg whose labels include match.
func metric(t *testing.T, reg *prometheus.Registry, name string, match ...string) float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(match); i += 2 {
				ok := false
				for _, l := range m.GetLabel() {
					ok = ok || l.GetName() == match[i] && l.GetValue() == match[i+1]
				}
				if !ok {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// slowCalls counts store calls slower than 6.4 ms (a bucket bound above the
// old 5 ms deadline).
func slowCalls(t *testing.T, reg *prometheus.Registry) uint64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != "edgeguard_limiter_store_call_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			fast := uint64(0)
			for _, b := range h.GetBucket() {
				if b.GetUpperBound() <= 0.0064 {
					fast = b.GetCumulativeCount()
				}
			}
			n += h.GetSampleCount() - fast
		}
	}
	return n
}

// burnCPU keeps every core busy until the returned func is called: one
// busy shell loop per core, outside this process, so the edges, Redis and
// the load compete for CPU as on a loaded host.
func burnCPU(t *testing.T) (stop func()) {
	var procs []*exec.Cmd
	for range runtime.NumCPU() {
		c := exec.Command("sh", "-c", "while :; do :; done")
		require.NoError(t, c.Start())
		procs = append(procs, c)
	}
	return func() {
		for _, c := range procs {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
}

// clearOfWindowEdge returns once at least margin is left before the next
// epoch-aligned window boundary (Redis shares this host's clock): the
// window algorithms admit a fresh quota past it, which is their documented
// semantics, not a leak this test looks for.
func clearOfWindowEdge(window, margin time.Duration) {
	for {
		left := window - time.Duration(time.Now().UnixNano())%window
		if left >= margin {
			return
		}
		time.Sleep(left + 10*time.Millisecond) // the boundary is a time, not an event
	}
}

// Goal: a Redis that is merely slow keeps limits exact at the default
// settings. Three edges' limiters (own clients, default deadline and
// breaker) share one key on the Cluster while its master is frozen for
// 60 ms out of every 100 ms and every core is kept busy: the client gets
// exactly the limit, nothing is decided by the fallback, and the breaker
// does not flap. Witnesses: freeze bursts happened and calls past the old
// 5 ms deadline were observed.
func TestSlowStoreStaysExact(t *testing.T) {
	cl := clusterSrv()
	for _, alg := range []limit.Algorithm{limit.SlidingLog, limit.FixedWindow, limit.SlidingWindow, limit.TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			const quota, edges, perEdge = 300, 3, 20
			window := 2 * time.Minute
			if alg == limit.TokenBucket {
				window = 24 * time.Hour // no refill within the test
			}
			l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: alg, Limit: quota, Window: window}
			lims := newEdgeLimiters(t, edges, cl.URL(), limiter.ModeCluster)
			master, err := cl.MasterForKey(ctx(t), lims[0].store.Keys(l)[0])
			require.NoError(t, err)
			for _, e := range lims { // a running edge has its connections and slot map
				_, err := e.Decide(ctx(t), []limiter.Check{{Limit: limiter.Limit{Key: l.Key + "-warm", Algorithm: alg, Limit: 1, Window: time.Minute}, Cost: 1}})
				require.NoError(t, err)
			}

			if alg == limit.FixedWindow || alg == limit.SlidingWindow {
				clearOfWindowEdge(window, 5*time.Second)
			}
			bursts, longest, stopFreezing := freezeBursts(t, cl, master)
			unburn := burnCPU(t)
			defer func() {
				unburn()
				stopFreezing()
			}()

			admitted, decided, slowAdmits := decideFromEdges(t, lims, l, perEdge, 2*time.Second)
			slow, fallback, opens := storeStats(t, lims)
			frozen := time.Duration(longest.Load())
			t.Logf("%s: %d freeze bursts (longest %s), %d decisions, %d store calls slower than 6.4 ms, %d admissions slower than 10 ms, %v fallback decisions, %v breaker opens, %d admitted of %d",
				alg, bursts.Load(), frozen.Round(time.Millisecond), decided, slow, slowAdmits, fallback, opens, admitted, quota)
			require.GreaterOrEqual(t, bursts.Load(), int64(5), "witness: the master was frozen repeatedly")
			require.Positive(t, slow, "witness: calls past the old 5 ms deadline")
			require.Positive(t, slowAdmits, "witness: admissions were decided while Redis was slow")
			require.Greater(t, decided, int64(quota), "the load exceeded the limit")
			if frozen >= limiter.DefaultTimeout/2 {
				// The host was so loaded that the 60 ms freezes themselves
				// lasted half the deadline or more (the thaw is this
				// process's own timer): Redis was out, not merely slow, and
				// what an outage promises is what holds.
				t.Logf("%s: a freeze lasted %s (meant 60 ms): judged as an outage", alg, frozen.Round(time.Millisecond))
				require.LessOrEqual(t, admitted, int64(quota), "an outage admits no more than the limit")
				return
			}
			require.Zero(t, fallback, "slowness alone sent nothing to the fallback")
			require.LessOrEqual(t, opens, 2.0, "the breaker does not flap on a slow store")
			require.EqualValues(t, quota, admitted, "exactly the limit")
		})
	}
}

// freezeBursts freezes the Cluster node master for 60 ms out of every
// 100 ms until stop is called, which thaws it. bursts counts the freezes,
// and longest is the longest as it happened (the thaw is this process's
// own timer, late on a loaded machine).
func freezeBursts(t *testing.T, cl *testenv.Cluster, master string) (bursts, longest *atomic.Int64, stop func()) {
	bursts, longest = new(atomic.Int64), new(atomic.Int64)
	// These freezes are the stress: no stall from outside lands between
	// them (under scripts/busy.sh), which would make one silence of their
	// sum, past the store's deadline.
	release, err := cl.ExemptNode(master)
	require.NoError(t, err)
	done := make(chan struct{})
	var stressed sync.WaitGroup
	stressed.Add(1)
	go func() { // the stress: the pattern itself is timed
		defer stressed.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			frozeAt := time.Now()
			require.NoError(t, cl.FreezeNode(master))
			time.Sleep(60 * time.Millisecond) // the fault's length: frozen 60 ms
			require.NoError(t, cl.ThawNode(master))
			if d := int64(time.Since(frozeAt)); d > longest.Load() {
				longest.Store(d)
			}
			bursts.Add(1)
			time.Sleep(40 * time.Millisecond) // then 40 ms awake, out of every 100 ms
		}
	}()
	return bursts, longest, func() {
		close(done)
		stressed.Wait()
		require.NoError(t, cl.ThawNode(master))
		release()
	}
}

// decideFromEdges has perEdge clients on each edge decide check l (cost 1,
// the edges as its nodes), each every 100 ms, for d: how many were
// admitted, decided, and admitted after more than 10 ms.
func decideFromEdges(t *testing.T, lims []edgeLimiter, l limiter.Limit, perEdge int, d time.Duration) (admitted, decided, slowAdmits int64) {
	var nAdmitted, nDecided, nSlow atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for e := range lims {
		for range perEdge {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					start := time.Now()
					v, err := lims[e].Decide(context.Background(), []limiter.Check{{Limit: l, Cost: 1, Nodes: len(lims)}})
					if err != nil {
						t.Error(err)
						return
					}
					nDecided.Add(1)
					if v.Allowed {
						nAdmitted.Add(1)
						if time.Since(start) > 10*time.Millisecond {
							nSlow.Add(1)
						}
					}
					// A client's pace: ~600 requests/s in all, so the
					// quota runs out over half a second of stress.
					time.Sleep(100 * time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	return nAdmitted.Load(), nDecided.Load(), nSlow.Load()
}

// storeStats sums the edges' store calls slower than 6.4 ms, fallback
// decisions and breaker opens.
func storeStats(t *testing.T, lims []edgeLimiter) (slow uint64, fallback, opens float64) {
	for _, e := range lims {
		slow += slowCalls(t, e.reg)
		fallback += metric(t, e.reg, "edgeguard_limiter_checks_total", "reason", "fallback")
		opens += metric(t, e.reg, "edgeguard_limiter_breaker_opens_total")
	}
	return slow, fallback, opens
}

// Goals: a frozen Redis is available (the fallback decides within a second,
// only the requests of the first deadline wait it out), an outage is exact
// (a freeze shorter than the window: the fallback denies, and the region's
// edges admit at most the limit per window, counting what Redis had
// admitted before it froze), and recovery is bounded (the window straddling
// it holds at most limit + ceil(limit/N)), whether Redis comes back with its
// data or empty (as a replica promoted in its place with none of it).
func TestFrozenStoreIsAvailableAndBounded(t *testing.T) {
	// Each case has a Redis of its own and spends most of its time in the
	// freeze: they wait side by side, beside the package's other waiters.
	t.Parallel()
	for _, empty := range []bool{false, true} {
		t.Run(fmt.Sprintf("back empty=%v", empty), func(t *testing.T) {
			t.Parallel()
			srv, err := testenv.StartStandalone(testenv.StandaloneOptions{})
			require.NoError(t, err)
			t.Cleanup(func() { srv.Thaw(); _ = srv.Close() })
			const quota, edges, before = 60, 3, 30
			const freeze = 10 * time.Second
			lims := newEdgeLimiters(t, edges, srv.URL(), limiter.ModeStandalone)
			l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.SlidingLog, Limit: quota, Window: time.Minute}

			c := &frozenClients{lims: lims, l: l}
			c.frozeAt = time.Now().Add(time.Hour) // "before the freeze" for phase A
			// Redis admits before requests. A call that outlives the
			// deadline on a busy machine is decided by the fallback
			// instead (and denied: its edge has no answer for the key
			// yet); such a request is asked again, and is counted in
			// before if the fallback admitted it.
			var fromStore int
			for i := 0; fromStore < before; i++ {
				require.Less(t, i, 3*before, "Redis decides the requests before the freeze")
				c.decide(t, i%edges)
				r := c.results[len(c.results)-1]
				if r.source == limiter.SourceStore {
					require.True(t, r.allowed, "Redis admits the requests before the freeze")
					fromStore++
				}
			}
			results := len(c.results)
			admittedBefore := 0
			for _, r := range c.results {
				if r.allowed {
					admittedBefore++
				}
			}

			// Phase B: frozen. 4 clients per edge, one request every 20 ms each.
			// A Redis that comes back empty loses its data here, while no
			// call is in flight (phase A is over): emptied after the thaw,
			// it could also lose what the edges replayed to it at the thaw
			// (a probe in flight when it froze succeeds the moment it
			// thaws), an acknowledged write no limiter can account for.
			if empty {
				require.NoError(t, srv.ComeBackEmpty(ctx(t)))
			}
			srv.Freeze()
			c.frozeAt = time.Now()
			initial := storeWaits(t, lims)
			lifeBefore := lifeWaits(t, lims)
			clients := make(chan struct{})
			go func() {
				defer close(clients)
				c.run(t, freeze)
			}()
			atOpen := breakersOpened(t, lims)
			<-clients
			waits := frozenWaits{total: sumOf(storeWaits(t, lims)) - sumOf(initial), afterOpen: sumOf(storeWaits(t, lims)) - sumOf(atOpen)}
			// Slow is not dead, and frozen is not slow: a frozen store
			// answers nothing, so no caller sees it alive and waits past
			// its deadline for it (each gives up at the deadline, as before
			// callers waited on life). Read before the thaw, whose answers
			// are life again.
			lifeFrozen := lifeWaits(t, lims) - lifeBefore
			frozenTook := tookWhileFrozen(c.results[results:])
			// Phase C: back, with its data or empty.
			srv.Thaw()
			thawedAt := time.Since(c.frozeAt)
			c.run(t, thawedAt+4*time.Second)
			n := tallyFrozen(c.results[results:], thawedAt)
			var fallback, replayed float64
			for _, e := range lims {
				fallback += metric(t, e.reg, "edgeguard_limiter_checks_total", "reason", "fallback")
				replayed += metric(t, e.reg, "edgeguard_limiter_replayed_units_total")
			}
			t.Logf("frozen %s: %d requests, %v waited the %s deadline out (%v after their edge's breaker opened; %d took as long, on this machine), %d admitted while frozen, %d in the window in all (limit %d), %v fallback decisions, %v units replayed, %d decided by Redis after the thaw",
				freeze, len(c.results)-results, waits.total, limiter.DefaultTimeout, waits.afterOpen, n.slow, n.duringFreeze, admittedBefore+n.total, quota, fallback, replayed, n.storeAfter)
			t.Logf("decisions sent while frozen: p50 %v, p99 %v, max %v (deadline %v); life waits while frozen: %v", pctOf(frozenTook, 50), pctOf(frozenTook, 99), pctOf(frozenTook, 100), limiter.DefaultTimeout, lifeFrozen)
			require.Positive(t, fallback, "witness: the fallback decided")
			require.Zero(t, lifeFrozen, "a frozen store showed no life: no caller waited past its deadline for it")
			require.Positive(t, n.storeAfter, "witness: Redis decided again after the thaw")
			// Redis answered every edge within the minute's window: no
			// edge's last answer is a safe share (the others counted
			// after it), so the fallback denies and has nothing to replay.
			require.Zero(t, n.duringFreeze, "the fallback admits nothing while Redis answered within the window")
			require.Zero(t, replayed, "nothing admitted by the fallback, nothing replayed")
			// Counted by the limiters (a check whose store call failed),
			// not by the time a request took: on a loaded machine a request
			// decided locally can take as long as the deadline too.
			require.LessOrEqual(t, waits.afterOpen, float64(edges*4), "once its edge's breaker is open no request waits for Redis (probes run in the background): only the clients' requests already in flight, one each, still end")
			require.LessOrEqual(t, waits.total, float64(edges*4*3), "only requests sent before the breakers opened wait the deadline out: at most three per client")
			require.LessOrEqual(t, admittedBefore+n.duringFreeze, quota, "outage: at most the limit in the window, Redis's own admissions included")
			require.LessOrEqual(t, admittedBefore+n.total, quota+(quota+edges-1)/edges, "recovery: at most limit + ceil(limit/N)")
		})
	}
}

// frozenClients are clients of the edges' limiters lims deciding l, with
// what each decision was, when it was sent and how long it took, since
// frozeAt.
type frozenClients struct {
	lims    []edgeLimiter
	l       limiter.Limit
	frozeAt time.Time
	mu      sync.Mutex
	results []frozenResult
}

type frozenResult struct {
	sent, took time.Duration // since the freeze
	source     limiter.Source
	allowed    bool
}

// decide has edge e decide one request.
func (c *frozenClients) decide(t *testing.T, e int) {
	start := time.Now()
	v, err := c.lims[e].Decide(context.Background(), []limiter.Check{{Limit: c.l, Cost: 1, Nodes: len(c.lims)}})
	require.NoError(t, err)
	c.mu.Lock()
	c.results = append(c.results, frozenResult{start.Sub(c.frozeAt), time.Since(start), v.Checks[0].Source, v.Allowed})
	c.mu.Unlock()
}

// run has 4 clients per edge send a request every 20 ms each, until until
// after frozeAt.
func (c *frozenClients) run(t *testing.T, until time.Duration) {
	var wg sync.WaitGroup
	for e := range c.lims {
		for range 4 {
			wg.Go(func() {
				for time.Since(c.frozeAt) < until {
					c.decide(t, e)
					time.Sleep(20 * time.Millisecond) // the clients' pace
				}
			})
		}
	}
	wg.Wait()
}

// frozenTally counts the decisions of a freeze and its thaw.
type frozenTally struct {
	slow         int // sent while frozen, and took the deadline or longer (logged only)
	duringFreeze int // admitted, sent while frozen
	total        int // admitted
	storeAfter   int // decided by Redis (or its prefilter), sent after the thaw
}

func tallyFrozen(results []frozenResult, thawedAt time.Duration) frozenTally {
	var n frozenTally
	for _, r := range results {
		if r.allowed {
			n.total++
		}
		switch {
		case r.sent < thawedAt:
			if r.allowed {
				n.duringFreeze++
			}
			if r.took >= limiter.DefaultTimeout {
				n.slow++
			}
		case r.source == limiter.SourceStore || r.source == limiter.SourcePrefilter:
			n.storeAfter++
		}
	}
	return n
}

// storeWaits is, for each edge, how many of its checks waited for the
// store and failed (edgeguard_limiter_fallback_total, reason error).
func storeWaits(t *testing.T, lims []edgeLimiter) []float64 {
	out := make([]float64, len(lims))
	for i, e := range lims {
		out[i] = metric(t, e.reg, "edgeguard_limiter_fallback_total", "reason", "error")
	}
	return out
}

// lifeWaits is how many store calls the edges' callers waited on past
// the deadline because the store showed life, summed.
func lifeWaits(t *testing.T, lims []edgeLimiter) (n float64) {
	for _, e := range lims {
		n += metric(t, e.reg, "edgeguard_limiter_life_waits_total")
	}
	return n
}

// tookWhileFrozen is how long each decision sent while the store was
// frozen took, sorted.
func tookWhileFrozen(results []frozenResult) []time.Duration {
	var took []time.Duration
	for _, r := range results {
		took = append(took, r.took)
	}
	slices.Sort(took)
	return took
}

// pctOf is the p-th percentile of sorted (0 when empty).
func pctOf(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)*p/100, len(sorted)-1)]
}

func sumOf(v []float64) (s float64) {
	for _, x := range v {
		s += x
	}
	return s
}

// breakersOpened waits for every edge's breaker to open and returns, for
// each edge, storeWaits when it was first seen open (polled every 5 ms: a
// request sent between an opening and its sighting is decided locally
// anyway, so the sighting is never early).
func breakersOpened(t *testing.T, lims []edgeLimiter) []float64 {
	atOpen := make([]float64, len(lims))
	seen := make([]bool, len(lims))
	err := proc.PollEvery(testenv.Within(t, 30*time.Second), 5*time.Millisecond, "every edge's breaker to open", func(context.Context) error {
		missing := 0
		for i, e := range lims {
			if seen[i] {
				continue
			}
			// The waits first: one counted after the opening was
			// sighted would be taken for a wait after it.
			waits := metric(t, e.reg, "edgeguard_limiter_fallback_total", "reason", "error")
			if metric(t, e.reg, "edgeguard_limiter_breaker_opens_total") > 0 {
				seen[i], atOpen[i] = true, waits
				continue
			}
			missing++
		}
		if missing > 0 {
			return fmt.Errorf("%d breakers still closed", missing)
		}
		return nil
	})
	require.NoError(t, err, "the breakers open while the store is frozen")
	return atOpen
}

// frozenWaits are the checks that waited for a frozen store and failed: in
// all, and after their edge's breaker opened.
type frozenWaits struct{ total, afterOpen float64 }
