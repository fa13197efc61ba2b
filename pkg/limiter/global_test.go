package limiter_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/faults"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// The two regions of the global tests: the keys they use are homed in
// homeRegion, whose Redis the other region reaches over a WAN-like link.
const (
	homeRegion = "eu-west"
	awayRegion = "us-east"
)

var regionNames = []string{homeRegion, awayRegion}

// gEdge is one edge of a global test.
type gEdge struct {
	region string
	lim    *limiter.Limiter
	global *limiter.Global
	reg    *prometheus.Registry
	// link is an away edge's client of the home's Redis, over the link.
	link redis.UniversalClient
}

// twoRegions starts the away region's Redis and, per region, perRegion
// edges: the home region's over the shared standalone Redis, the away
// region's over their own, leasing from the home's Redis through wan (one
// link between the regions: every away edge dials the home through it,
// with a client of its own, as an edge process has).
func twoRegions(t testing.TB, wan *faults.Net, perRegion int, timeout time.Duration) (edges []gEdge) {
	return twoRegionsHome(t, wan, perRegion, timeout, standaloneHome)
}

// homeRedis returns a client of the home region's Redis, dialing with
// dial (nil: directly), closed when t ends.
type homeRedis func(t testing.TB, dial func(context.Context, string, string) (net.Conn, error)) redis.UniversalClient

// standaloneHome is the shared standalone Redis.
func standaloneHome(t testing.TB, dial func(context.Context, string, string) (net.Conn, error)) redis.UniversalClient {
	c := redis.NewClient(&redis.Options{Addr: standaloneSrv().Addr, Dialer: dial, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// twoRegionsHome is twoRegions with the home region's Redis given by
// home.
func twoRegionsHome(t testing.TB, wan *faults.Net, perRegion int, timeout time.Duration, home homeRedis) (edges []gEdge) {
	t.Helper()
	away, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = away.Close() })
	awayDirect := redis.NewClient(&redis.Options{Addr: away.Addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = awayDirect.Close() })
	homeDirect := home(t, nil)
	for _, region := range regionNames {
		for range perRegion {
			local := homeDirect
			stores := map[string]limiter.Store{awayRegion: redisStore(t, awayDirect)}
			var link redis.UniversalClient
			if region == awayRegion {
				local = awayDirect
				link = home(t, wan.Dial)
				stores = map[string]limiter.Store{homeRegion: redisStore(t, link)}
			}
			reg := prometheus.NewRegistry()
			lim, err := limiter.New(redisStore(t, local), limiter.Config{Timeout: 5 * time.Second}, reg, nil)
			require.NoError(t, err)
			g, err := limiter.NewGlobal(limiter.GlobalConfig{Timeout: timeout}, reg, nil)
			require.NoError(t, err)
			require.NoError(t, g.Update(limiter.Regions{Local: region, Names: regionNames, Stores: stores}))
			lim.SetGlobal(g)
			// Closed in this order: the global (gives back over the
			// link) before the limiter.
			t.Cleanup(lim.Close)
			t.Cleanup(g.Close)
			edges = append(edges, gEdge{region: region, lim: lim, global: g, reg: reg, link: link})
		}
	}
	return edges
}

// wanLink is a link between regions: 80–140 ms round trips.
func wanLink(t testing.TB) *faults.Net {
	n := faults.NewNet()
	t.Cleanup(n.Close)
	for _, stream := range []string{"upstream", "downstream"} {
		require.NoError(t, n.Add(faults.Toxic{Name: "wan-" + stream, Type: "latency", Stream: stream, Attributes: map[string]any{"latency": 55, "jitter": 15}}))
	}
	return n
}

// homedKey is a key of the test homed in homeRegion.
func homedKey(t testing.TB, suffix string) string {
	for i := range 1000 {
		k := fmt.Sprintf("%s%s-%d", testenv.KeyPrefix(t), suffix, i)
		if limiter.Home(regionNames, k) == homeRegion {
			return k
		}
	}
	t.Fatal("no key homed in " + homeRegion)
	return ""
}

func globalCheck(l limiter.Limit, tol float64, nodes int) []limiter.Check {
	return []limiter.Check{{Limit: l, Cost: 1, Nodes: nodes, Tolerance: tol, Global: true}}
}

// metricSum sums a metric's series over the edges' registries, those
// whose labels include want.
func metricSum(t *testing.T, edges []gEdge, name string, want map[string]string) float64 {
	var sum float64
	for _, e := range edges {
		mfs, err := e.reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
		series:
			for _, m := range mf.GetMetric() {
				for k, v := range want {
					if !hasLabel(m, k, v) {
						continue series
					}
				}
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == k {
			return lp.GetValue() == v
		}
	}
	return false
}

// flood sends n requests from each of workers roaming clients, each
// request to a random edge of edges; it returns what was admitted, and
// admitted from the static share (decided by the store, not a lease).
func flood(t *testing.T, edges []gEdge, checks []limiter.Check, workers, n int) (admitted, share int64) {
	return paced(t, edges, checks, workers, n, 0)
}

// paced is flood with each client sending one request per every (0: as
// fast as it can).
func paced(t *testing.T, edges []gEdge, checks []limiter.Check, workers, n int, every time.Duration) (admitted, share int64) {
	var a, s atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			var tick <-chan time.Time
			if every > 0 {
				tk := time.NewTicker(every)
				defer tk.Stop()
				tick = tk.C
			}
			for range n {
				if tick != nil {
					<-tick
				}
				e := edges[rand.IntN(len(edges))]
				v, err := e.lim.Decide(context.Background(), checks)
				if err != nil {
					t.Error(err)
					return
				}
				if v.Allowed {
					a.Add(1)
					if v.Checks[0].Source == limiter.SourceStore && e.region == awayRegion {
						s.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	return a.Load(), s.Load()
}

func inRegion(edges []gEdge, region string) []gEdge {
	var out []gEdge
	for _, e := range edges {
		if e.region == region {
			out = append(out, e)
		}
	}
	return out
}

// TestGlobalRoamingFlood sends roaming clients over both regions' edges,
// the away region leasing across an 80–140 ms link, at twice the quota's
// pace and then as fast as they can: together they admit at most
// limit × (1 + tolerance) in the window and at least the limit, and the
// away region's share comes from leased allowance, not only overdraft.
func TestGlobalRoamingFlood(t *testing.T) {
	const (
		quota = 2000
		tol   = 0.05
		nodes = 2
	)
	edges := twoRegions(t, wanLink(t), nodes, time.Second)
	awayEdges := inRegion(edges, awayRegion)
	inOneWindow(t, time.Hour, func(suffix string) {
		l := limiter.Limit{Key: homedKey(t, suffix), Algorithm: limit.FixedWindow, Limit: quota, Window: time.Hour}
		checks := globalCheck(l, tol, nodes)
		// 8 clients at 250/s each: the quota lasts about 1 s, ten round
		// trips of the link.
		admitted, _ := paced(t, edges, checks, 8, 250, 4*time.Millisecond)
		// Then flood rounds until the quota is spent.
		for round := 0; round < 20 && admitted < quota; round++ {
			a, _ := flood(t, edges, checks, 8, 400)
			admitted += a
		}
		leased := metricSum(t, awayEdges, "edgeguard_limiter_global_decisions_total", map[string]string{"from": "allowance"})
		overdraft := metricSum(t, awayEdges, "edgeguard_limiter_global_decisions_total", map[string]string{"from": "overdraft"})
		calls := metricSum(t, awayEdges, "edgeguard_limiter_global_lease_calls_total", map[string]string{"result": "ok"})
		t.Logf("admitted %d (limit %d, bound %d); the away region admitted %.0f from leased allowance and %.0f on overdraft, over %.0f lease calls",
			admitted, quota, int64(quota*(1+tol)), leased, overdraft, calls)
		require.LessOrEqual(t, admitted, int64(math.Floor(quota*(1+tol))), "over the bound")
		require.GreaterOrEqual(t, admitted, int64(quota), "allowance left stranded")
		require.Positive(t, leased, "the away region never spent leased allowance")
	})
}

// TestGlobalUnderLimitClient paces one roaming client at its quota spread
// over 5 s, each request on a random edge of either region: the lag of the
// link costs few false denials when the quota takes well over
// 2 × RTT / tolerance to spend (docs/guarantees.md; here 2.4 s). The
// edges start as an edge does once its catalog is loaded: the links to
// the home readied (TestGlobalLinkWarmedBeforeFirstCarve).
func TestGlobalUnderLimitClient(t *testing.T) {
	const (
		quota = 400
		tol   = 0.1
		nodes = 2
		over  = 5 * time.Second
	)
	edges := twoRegions(t, wanLink(t), nodes, time.Second)
	linksWarmed(t, edges)
	inOneWindow(t, time.Hour, func(suffix string) {
		l := limiter.Limit{Key: homedKey(t, suffix), Algorithm: limit.FixedWindow, Limit: quota, Window: time.Hour}
		checks := globalCheck(l, tol, nodes)
		tick := time.NewTicker(over / quota)
		defer tick.Stop()
		start := time.Now()
		var denials []string
		for i := range quota {
			<-tick.C
			e := rand.IntN(len(edges))
			at := time.Since(start)
			v, err := edges[e].lim.Decide(context.Background(), checks)
			require.NoError(t, err)
			if !v.Allowed {
				d := v.Checks[0]
				denials = append(denials, fmt.Sprintf("request %d at +%v on edge %d (%s): %s, retry %v", i, at.Round(time.Millisecond), e, edges[e].region, d.Source, d.RetryAfter))
			}
		}
		t.Logf("false denials: %d of %d", len(denials), quota)
		if len(denials) > quota/20 {
			away := inRegion(edges, awayRegion)
			for _, from := range []string{"allowance", "overdraft", "share", "denied"} {
				t.Logf("away region's decisions from %s: %.0f", from, metricSum(t, away, "edgeguard_limiter_global_decisions_total", map[string]string{"from": from}))
			}
			for _, d := range denials {
				t.Log(d)
			}
		}
		require.LessOrEqual(t, len(denials), quota/20, "more than 5%% false denials")
	})
}

// linksWarmed waits until every away edge readied its link to the home
// (Global.Warmed): Update starts it in the background.
func linksWarmed(t *testing.T, edges []gEdge) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, e := range inRegion(edges, awayRegion) {
			if !e.global.Warmed(homeRegion) {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "the away edges never readied their link to the home")
}

// TestGlobalLinkWarmedBeforeFirstCarve: once the regions are given
// (Update), an away edge readies its link to the home in the background,
// so its first carve of a key finds a connection greeted and the scripts
// loaded and pays one round trip of the link. Cold, it dialed, greeted
// and met NOSCRIPT first: four round trips or more (busy runs: 0.47–0.54
// s over an 80–140 ms link), spent on overdraft and then denials.
func TestGlobalLinkWarmedBeforeFirstCarve(t *testing.T) {
	edges := twoRegions(t, wanLink(t), 1, time.Second)
	linksWarmed(t, edges)
	away := inRegion(edges, awayRegion)[0]
	before := *away.link.PoolStats()
	require.Positive(t, before.IdleConns, "no connection kept from the warm-up")
	check := globalCheck(limiter.Limit{Key: homedKey(t, "w"), Algorithm: limit.FixedWindow, Limit: 100, Window: time.Hour}, 0.1, 1)
	v, err := away.lim.Decide(context.Background(), check)
	require.NoError(t, err)
	require.True(t, v.Allowed)
	require.Eventually(t, func() bool {
		return metricSum(t, []gEdge{away}, "edgeguard_limiter_global_lease_calls_total", map[string]string{"result": "ok"}) >= 1
	}, 10*time.Second, 5*time.Millisecond, "the first carve never came back")
	after := *away.link.PoolStats()
	t.Logf("the link's pools before the first carve: main %+v, pipelines %+v; after: main %+v, pipelines %+v", before, *before.PipelineStats, after, *after.PipelineStats)
	require.Equal(t, before.Misses, after.Misses, "the first carve or the clock reading beside it dialed a connection of its own")
	require.Equal(t, before.PipelineStats.Misses, after.PipelineStats.Misses, "a pipeline to the home dialed a connection of its own")
	require.Greater(t, after.Hits, before.Hits, "the first carve took no connection from the pool")
}

// TestGlobalPartitionAndHeal partitions the away region from the key's
// home and heals it: while cut off, no request waits on the link and the
// regions together admit at most the connected bound plus the away
// region's share; once healed, what the share admitted is charged to the
// home exactly once, so the window's total falls back within the
// connected bound.
func TestGlobalPartitionAndHeal(t *testing.T) { partitionAndHeal(t, standaloneHome) }

// partitionAndHeal is TestGlobalPartitionAndHeal with the home region's
// Redis given by home.
func partitionAndHeal(t *testing.T, home homeRedis) {
	const (
		quota = 2000
		tol   = 0.05
		nodes = 2
		share = quota / 2
	)
	wan := wanLink(t)
	edges := twoRegionsHome(t, wan, nodes, 2*time.Second, home)
	awayEdges := inRegion(edges, awayRegion)
	inOneWindow(t, time.Hour, func(suffix string) {
		l := limiter.Limit{Key: homedKey(t, suffix), Algorithm: limit.FixedWindow, Limit: quota, Window: time.Hour}
		checks := globalCheck(l, tol, nodes)

		// Connected: a little traffic everywhere, so the away edges hold
		// allowance when the link goes.
		before, _ := flood(t, edges, checks, 4, 50)

		// Partition: the link black-holes (connections stay open, nothing
		// gets through). The away edges keep answering from what they
		// hold, their overdraft, then denials, while their lease calls
		// hang: every decision below is made before any call failed.
		require.NoError(t, wan.Add(faults.Toxic{Name: "partition", Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": 0}}))
		var during int64
		for range 40 {
			v, err := awayEdges[rand.IntN(len(awayEdges))].lim.Decide(context.Background(), checks)
			require.NoError(t, err)
			if v.Allowed {
				during++
			}
		}
		require.Zero(t, metricSum(t, awayEdges, "edgeguard_limiter_global_lease_calls_total", map[string]string{"result": "error"}),
			"a lease call failed before 40 decisions were made: something waited on the link")
		require.Eventually(t, func() bool {
			for _, e := range awayEdges {
				if len(e.global.Unreachable()) == 0 {
					return false
				}
			}
			return true
		}, 20*time.Second, 10*time.Millisecond, "the away edges never noticed the partition")
		require.Equal(t, float64(len(awayEdges)), metricSum(t, awayEdges, "edgeguard_limiter_global_fallback_share", map[string]string{"home": homeRegion}))

		// Cut: the hung calls fail at once, and so do new ones.
		wan.Cut()

		// Cut off: the away region floods its share, the home its quota.
		lateBefore := metricSum(t, awayEdges, "edgeguard_limiter_late_given_back_total", nil)
		awayAdmitted, fromShare := flood(t, awayEdges, checks, 4, 600)
		homeAdmitted, _ := flood(t, inRegion(edges, homeRegion), checks, 2, 200)
		partitioned := before + during + awayAdmitted + homeAdmitted
		t.Logf("partition: admitted %d (away %d, %d of them from the share; home %d); bound %d",
			partitioned, awayAdmitted+during, fromShare, homeAdmitted, int64(quota*(1+tol))+share)
		require.LessOrEqual(t, fromShare, int64(share), "the share is counted exactly in the away region's Redis")
		// The whole share is flooded: each unit was admitted from it, or
		// taken by a call answered after its deadline (the fallback decided
		// that request) and given back once the answer came in.
		require.Eventually(t, func() bool {
			late := metricSum(t, awayEdges, "edgeguard_limiter_late_given_back_total", nil) - lateBefore
			return fromShare+int64(late) >= int64(share)
		}, 20*time.Second, 10*time.Millisecond, "the away region flooded %d of its share of %d", fromShare, share)
		require.LessOrEqual(t, partitioned, int64(math.Floor(quota*(1+tol)))+share, "over the partition bound")

		// Heal: the probes find the home again and the sweep charges
		// each edge's debt to it, once.
		wan.Clear()
		require.NoError(t, wan.Restore())
		for _, stream := range []string{"upstream", "downstream"} {
			require.NoError(t, wan.Add(faults.Toxic{Name: "wan-" + stream, Type: "latency", Stream: stream, Attributes: map[string]any{"latency": 55, "jitter": 15}}))
		}
		require.Eventually(t, func() bool {
			return metricSum(t, awayEdges, "edgeguard_limiter_global_debt_units", nil) == 0 &&
				metricSum(t, awayEdges, "edgeguard_limiter_global_fallback_share", nil) == 0
		}, 20*time.Second, 10*time.Millisecond, "debts never settled")
		settled := metricSum(t, awayEdges, "edgeguard_limiter_global_settled_units_total", nil)
		t.Logf("heal: settled %.0f units (from the share %d, plus overdraft)", settled, fromShare)
		require.GreaterOrEqual(t, settled, float64(fromShare))
		require.LessOrEqual(t, settled, float64(fromShare)+float64(quota)*tol/2, "charged more than the share and the overdraft")

		// After the heal the window is one quota again: the share's
		// admissions count against it.
		var after int64
		for round := 0; round < 20; round++ {
			a, _ := flood(t, edges, checks, 8, 200)
			after += a
			if a == 0 {
				break
			}
		}
		total := partitioned + after
		t.Logf("window total after the heal: %d (limit %d, bound %d)", total, quota, int64(quota*(1+tol)))
		require.LessOrEqual(t, total, max(partitioned, int64(math.Floor(quota*(1+tol)))), "the healed window admitted past its bound")
		require.GreaterOrEqual(t, total, int64(quota*0.95), "debts charged twice")
	})
}

// TestGlobalSlowHomeHoldsNoSweep: a give-back to a home whose link
// black-holes waits up to 10 × the deadline; meanwhile the sweep goes on
// (gauges, debts, probes), so a debt made after the give-back started
// shows at once.
func TestGlobalSlowHomeHoldsNoSweep(t *testing.T) {
	wan := faults.NewNet()
	t.Cleanup(wan.Close)
	edges := twoRegions(t, wan, 1, time.Second)
	away := inRegion(edges, awayRegion)
	check := func(suffix string) []limiter.Check {
		return globalCheck(limiter.Limit{Key: homedKey(t, suffix), Algorithm: limit.FixedWindow, Limit: 2000, Window: time.Hour}, 0.05, 1)
	}
	held := check("held")
	for range 3 {
		_, err := away[0].lim.Decide(context.Background(), held)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		return metricSum(t, away, "edgeguard_limiter_global_outstanding_units", nil) >= 1
	}, 10*time.Second, 10*time.Millisecond, "the away edge never held allowance")
	// The link black-holes; the key goes idle and its units are given
	// back, a call that hangs.
	require.NoError(t, wan.Add(faults.Toxic{Name: "partition", Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": 0}}))
	require.Eventually(t, func() bool {
		return metricSum(t, away, "edgeguard_limiter_global_returned_units_total", nil) >= 1
	}, 10*time.Second, 10*time.Millisecond, "the idle allowance was never given back")
	// A new key's first check is admitted on overdraft: a debt the next
	// sweeps report, well before the hung give-back's 10 s end.
	v, err := away[0].lim.Decide(context.Background(), check("debt"))
	require.NoError(t, err)
	require.True(t, v.Allowed)
	require.Eventually(t, func() bool {
		return metricSum(t, away, "edgeguard_limiter_global_debt_units", nil) >= 1
	}, 4*time.Second, 10*time.Millisecond, "the sweep stood still behind the hung give-back")
}

// Home is the same for every caller, whatever the order of the names, and
// spreads keys over the regions; removing a region moves only its keys.
func TestGlobalHome(t *testing.T) {
	three := []string{"ap-south", "eu-west", "us-east"}
	count := map[string]int{}
	moved := 0
	for i := range 3000 {
		k := fmt.Sprintf("tenant-%d", i)
		h := limiter.Home(three, k)
		require.Equal(t, h, limiter.Home([]string{"us-east", "ap-south", "eu-west"}, k))
		count[h]++
		if h2 := limiter.Home([]string{"eu-west", "us-east"}, k); h2 != h {
			require.Equal(t, "ap-south", h, "a key not homed in the removed region moved")
			moved++
		}
	}
	for _, n := range three {
		require.InDelta(t, 1000, count[n], 150, "keys homed in %s", n)
	}
	require.Equal(t, count["ap-south"], moved)
}

// TestGlobalDebtDroppedWithItsWindow is TestGlobalDebtHealAfterItsWindow
// on real Redis over a real link, on the clock: the away region, its link
// to the home refused, admits on overdraft and then its whole share 4 s
// into a 10 s window; the link heals in the next. The debt is dropped, not
// charged to the window the heal lands in: the home region's edge then
// admits that window's full quota.
func TestGlobalDebtDroppedWithItsWindow(t *testing.T) {
	// Its own away Redis and WAN link, its own key at home; most of its
	// time is spent waiting for a window's boundaries: beside the
	// package's other waiters.
	t.Parallel()
	const (
		quota  = 1000
		tol    = 0.1
		window = 10 * time.Second
	)
	wan := wanLink(t)
	edges := twoRegions(t, wan, 1, time.Second)
	away, near := inRegion(edges, awayRegion), inRegion(edges, homeRegion)
	l := limiter.Limit{Key: homedKey(t, "dropped"), Algorithm: limit.FixedWindow, Limit: quota, Window: window}
	checks := globalCheck(l, tol, 1)
	decide := func(e gEdge) bool {
		v, err := e.lim.Decide(context.Background(), checks)
		require.NoError(t, err)
		return v.Allowed
	}
	// Cut 4 s into a window (windows are aligned to the epoch; Redis
	// runs on this machine's clock): the heal at its end comes less than
	// a window after the first unit admitted on overdraft.
	start := time.Now().Truncate(window).Add(window)
	<-time.After(time.Until(start.Add(4 * time.Second)))

	wan.Cut()
	var admitted int64
	if decide(away[0]) { // on overdraft; its carve is refused
		admitted++
	}
	require.Eventually(t, func() bool { return len(away[0].global.Unreachable()) == 1 },
		5*time.Second, 10*time.Millisecond, "the away edge never noticed the cut")
	for range quota {
		if decide(away[0]) {
			admitted++
		}
	}
	debt := metricSum(t, away, "edgeguard_limiter_global_debt_units", nil)
	require.Eventually(t, func() bool {
		debt = metricSum(t, away, "edgeguard_limiter_global_debt_units", nil)
		return debt == float64(admitted)
	}, 5*time.Second, 10*time.Millisecond, "the debt is what the cut-off edge admitted")
	require.True(t, time.Now().Before(start.Add(window)), "the partition outlasted its window: too slow a machine for this test")

	// The next window: heal.
	<-time.After(time.Until(start.Add(window)))
	require.NoError(t, wan.Restore())
	require.Eventually(t, func() bool {
		return len(away[0].global.Unreachable()) == 0 &&
			metricSum(t, away, "edgeguard_limiter_global_debt_units", nil) == 0
	}, 5*time.Second, 10*time.Millisecond, "the away edge never healed")
	settled := metricSum(t, away, "edgeguard_limiter_global_settled_units_total", nil)

	var next int64
	for range 2 * quota {
		if !decide(near[0]) {
			break
		}
		next++
	}
	t.Logf("cut off: admitted %d (debt %.0f, share %d); healed in the next window: settled %.0f, then the home's edge admitted %d (quota %d)",
		admitted, debt, quota/2, settled, next, quota)
	require.True(t, time.Now().Before(start.Add(2*window)), "the next window ended before its flood did: too slow a machine for this test")
	require.GreaterOrEqual(t, next, int64(quota), "the next window paid the old one's debt")
	require.Zero(t, settled, "debt charged after its window ended")
}
