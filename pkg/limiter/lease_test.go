package limiter_test

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// edge is one edge node of a leased test: its own limiter and store over a
// region's shared Redis.
type edge struct {
	lim   *limiter.Limiter
	store *limiter.RedisStore
}

func startEdges(t *testing.T, mode limiter.Mode, n int) []edge {
	out := make([]edge, n)
	for i := range out {
		st := redisStore(t, client(mode))
		lim, err := limiter.New(st, limiter.Config{Timeout: 5 * time.Second}, prometheus.NewRegistry(), nil)
		require.NoError(t, err)
		t.Cleanup(lim.Close)
		out[i] = edge{lim, st}
	}
	return out
}

// scriptCalls sums the script calls the edges' stores sent.
func scriptCalls(edges []edge) int64 {
	var n int64
	for _, e := range edges {
		_, c := e.store.Sent()
		n += c
	}
	return n
}

func leasedCheck(l limiter.Limit, tol float64, nodes int) []limiter.Check {
	return []limiter.Check{{Limit: l, Cost: 1, Nodes: nodes, Tolerance: tol}}
}

// inOneWindow runs f until it ran within one fixed window of w from start
// to end (a run straddling the epoch-aligned boundary is repeated once on a
// new key): f is given the key suffix to use. Each run first waits for a
// minute of room in the window (testenv.EarlyInWindow): f asserts as it
// goes and stops the test at the first assertion that fails, so a run
// counted in two windows would fail before it could be repeated.
func inOneWindow(t *testing.T, w time.Duration, f func(suffix string)) {
	for try := range 2 {
		testenv.EarlyInWindow(w, time.Minute)
		start := time.Now().Truncate(w)
		f(string(rune('a' + try)))
		if time.Now().Truncate(w).Equal(start) {
			return
		}
	}
	t.Fatal("two runs each straddled a window boundary")
}

// TestLeasedFixedWindowFlood floods one key from three edges: together they
// admit at most limit × (1 + tolerance) in the window, by construction, and
// at least the limit (the extra pays for what the edges hold unspent).
func TestLeasedFixedWindowFlood(t *testing.T) {
	const (
		quota   = 3000
		tol     = 0.05
		edges   = 3
		workers = 4
		each    = 2500 // per worker: 30,000 requests in all, 10× the quota
	)
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		t.Run(string(mode), func(t *testing.T) {
			es := startEdges(t, mode, edges)
			inOneWindow(t, time.Hour, func(suffix string) {
				l := limiter.Limit{Key: testenv.KeyPrefix(t) + suffix, Algorithm: limit.FixedWindow, Limit: quota, Window: time.Hour}
				before := scriptCalls(es)
				var admitted, denied atomic.Int64
				var wg sync.WaitGroup
				for _, e := range es {
					for range workers {
						wg.Go(func() {
							for range each {
								v, err := e.lim.Decide(context.Background(), leasedCheck(l, tol, edges))
								if err != nil {
									t.Error(err)
									return
								}
								if v.Allowed {
									admitted.Add(1)
								} else {
									denied.Add(1)
								}
							}
						})
					}
				}
				wg.Wait()
				calls := scriptCalls(es) - before
				total := int64(edges * workers * each)
				t.Logf("admitted %d of %d (limit %d, bound %d); %d script calls (%.4f per decision)",
					admitted.Load(), total, quota, int64(quota*(1+tol)), calls, float64(calls)/float64(total))
				require.LessOrEqual(t, admitted.Load(), int64(math.Floor(quota*(1+tol))), "over the bound")
				// A flood spends every unit carved: none is left stranded
				// on an edge (say, a batch carved ahead that landed after
				// the edge had cached a denial).
				require.Equal(t, int64(math.Floor(quota*(1+tol))), admitted.Load(), "allowance left stranded")
				// Denials of a flood are cached: the calls are the carving.
				require.Less(t, float64(calls)/float64(total), 0.05)
			})
		})
	}
}

// TestLeasedTokenBucketFlood floods a token bucket from three edges for a
// bounded time: over the run of length D they admit at most the exact bound
// (capacity + rate × D) with the capacity grown by the tolerance, plus
// rate × tolerance × window (an allowance is spent within tolerance × window
// of its carving).
func TestLeasedTokenBucketFlood(t *testing.T) {
	const (
		rate    = 400 // per second
		burst   = 200
		tol     = 0.1
		edges   = 3
		workers = 3
		run     = 1500 * time.Millisecond
	)
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		t.Run(string(mode), func(t *testing.T) {
			es := startEdges(t, mode, edges)
			l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.TokenBucket, Limit: rate, Window: time.Second, Burst: burst}
			var admitted, decided atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			stop := start.Add(run)
			for _, e := range es {
				for range workers {
					wg.Go(func() {
						for n := 0; n < 1_000_000 && time.Now().Before(stop); n++ {
							v, err := e.lim.Decide(context.Background(), leasedCheck(l, tol, edges))
							if err != nil {
								t.Error(err)
								return
							}
							decided.Add(1)
							if v.Allowed {
								admitted.Add(1)
							}
						}
					})
				}
			}
			wg.Wait()
			d := time.Since(start)
			bound := math.Floor(burst*(1+tol)) + rate*(d.Seconds()+tol)
			t.Logf("admitted %d of %d in %s; bound %.0f (exact bound %.0f)", admitted.Load(), decided.Load(), d, bound, burst+rate*d.Seconds())
			require.LessOrEqual(t, float64(admitted.Load()), bound+1)
			require.GreaterOrEqual(t, admitted.Load(), int64(burst), "a flood gets at least the burst")
		})
	}
}

// TestLeasedUnderLimitClient sends exactly the limit, each request to a
// random one of three edges: at most 1% may be denied (none should: the
// edges hold at most limit × tolerance unspent together).
func TestLeasedUnderLimitClient(t *testing.T) {
	const (
		quota = 2000
		tol   = 0.05
		edges = 3
	)
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		t.Run(string(mode), func(t *testing.T) {
			es := startEdges(t, mode, edges)
			inOneWindow(t, time.Hour, func(suffix string) {
				l := limiter.Limit{Key: testenv.KeyPrefix(t) + suffix, Algorithm: limit.FixedWindow, Limit: quota, Window: time.Hour}
				var denied atomic.Int64
				var wg sync.WaitGroup
				// Three client connections, each to a random edge per request.
				for w := range 3 {
					wg.Go(func() {
						r := rand.New(rand.NewPCG(uint64(w), 1))
						for range quota / 3 {
							v, err := es[r.IntN(edges)].lim.Decide(context.Background(), leasedCheck(l, tol, edges))
							if err != nil {
								t.Error(err)
								return
							}
							if !v.Allowed {
								denied.Add(1)
							}
						}
					})
				}
				wg.Wait()
				t.Logf("denied %d of %d under-limit requests", denied.Load(), quota/3*3)
				require.LessOrEqual(t, denied.Load(), int64(quota/100))
			})
		})
	}
}

// TestLeasedTokenBucketUnderLimitClient spends a bucket's whole capacity
// (the rate is negligible: 2000 per hour), each request on a random one of
// three edges: at most 1% may be denied (none should: the capacity carved
// from is grown by what the edges may hold unspent).
func TestLeasedTokenBucketUnderLimitClient(t *testing.T) {
	const (
		capacity = 2000
		edges    = 3
	)
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		t.Run(string(mode), func(t *testing.T) {
			es := startEdges(t, mode, edges)
			l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.TokenBucket, Limit: capacity, Window: time.Hour}
			var denied atomic.Int64
			var wg sync.WaitGroup
			for w := range 2 {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(w), 2))
					for range capacity / 2 {
						v, err := es[r.IntN(edges)].lim.Decide(context.Background(), leasedCheck(l, 0.05, edges))
						if err != nil {
							t.Error(err)
							return
						}
						if !v.Allowed {
							denied.Add(1)
						}
					}
				})
			}
			wg.Wait()
			t.Logf("denied %d of %d requests within the capacity", denied.Load(), capacity)
			require.LessOrEqual(t, denied.Load(), int64(capacity/100))
		})
	}
}

// TestLeasedKeyMovesBetweenEdges sends most of a client's quota through
// one edge, then moves it to another: the client still gets its limit, and
// once the first edge gives its idle allowance back, the whole carving
// budget (limit × (1 + tolerance)) is spendable from the second.
func TestLeasedKeyMovesBetweenEdges(t *testing.T) {
	const (
		quota = 1000
		tol   = 0.05
		edges = 3
	)
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		t.Run(string(mode), func(t *testing.T) {
			es := startEdges(t, mode, edges)
			inOneWindow(t, time.Hour, func(suffix string) {
				l := limiter.Limit{Key: testenv.KeyPrefix(t) + suffix, Algorithm: limit.FixedWindow, Limit: quota, Window: time.Hour}
				decide := func(e edge) bool {
					v, err := e.lim.Decide(context.Background(), leasedCheck(l, tol, edges))
					require.NoError(t, err)
					return v.Allowed
				}
				var admitted int64
				for range 600 {
					require.True(t, decide(es[0]), "first edge")
					admitted++
				}
				for range quota - 600 {
					require.True(t, decide(es[1]), "after the move")
					admitted++
				}
				// The first edge has been idle: it gives back what it holds.
				es[0].lim.ReturnIdle(time.Now().Add(3 * time.Second))
				for decide(es[1]) {
					admitted++
					require.LessOrEqual(t, admitted, int64(quota*(1+tol)))
				}
				require.Equal(t, int64(math.Floor(quota*(1+tol))), admitted, "the whole carving budget once the first edge gave back")
			})
		})
	}
}

// TestLeasedCallsPerDecision is steady load under the limit from three
// edges: the edges ask Redis about once per batch, at most once per 20
// decisions.
func TestLeasedCallsPerDecision(t *testing.T) {
	const (
		edges   = 3
		workers = 2
		each    = 4000
	)
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		for _, alg := range []limit.Algorithm{limit.FixedWindow, limit.TokenBucket} {
			t.Run(string(mode)+"/"+alg.String(), func(t *testing.T) {
				es := startEdges(t, mode, edges)
				// A 10 s window: a token bucket's allowance is then held up
				// to 0.5 s, so batches grow even on a slow, loaded machine.
				l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: alg, Limit: 1_000_000, Window: 10 * time.Second}
				before := scriptCalls(es)
				var denied atomic.Int64
				var wg sync.WaitGroup
				for _, e := range es {
					for range workers {
						wg.Go(func() {
							for range each {
								v, err := e.lim.Decide(context.Background(), leasedCheck(l, 0.05, edges))
								if err != nil {
									t.Error(err)
									return
								}
								if !v.Allowed {
									denied.Add(1)
								}
							}
						})
					}
				}
				wg.Wait()
				calls := scriptCalls(es) - before
				total := float64(edges * workers * each)
				t.Logf("%d script calls for %.0f decisions: %.4f per decision", calls, total, float64(calls)/total)
				require.Zero(t, denied.Load())
				require.LessOrEqual(t, float64(calls)/total, 0.05)
			})
		}
	}
}
