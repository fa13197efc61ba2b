package limiter_test

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// maxInWindow is the most admitted times in any half-open window (t−w, t].
func maxInWindow(times []time.Time, w time.Duration) int {
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	best, lo := 0, 0
	for hi, t := range times {
		for !times[lo].After(t.Add(-w)) {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// admitAt sends one unit at each (simulated) time and returns the admitted
// times. Requests go 200 to a call (one pipeline, executed in order): Redis
// expires keys by its own clock, so a long sequence of single calls on a
// loaded machine could outlive TTLs that the simulated times set.
func admitAt(t *testing.T, st limiter.Store, l limiter.Limit, at []time.Time) (admitted []time.Time, decided []bool) {
	for len(at) > 0 {
		n := min(len(at), 200)
		reqs := make([]limiter.Request, n)
		for i, a := range at[:n] {
			reqs[i] = limiter.Request{Limit: l, Cost: 1, At: a}
		}
		ds, err := st.Take(ctx(t), reqs)
		require.NoError(t, err)
		for i, d := range ds {
			decided = append(decided, d.Allowed)
			if d.Allowed {
				admitted = append(admitted, at[i])
			}
		}
		at = at[n:]
	}
	return admitted, decided
}

func boundaryStores(t *testing.T) []namedStore {
	return []namedStore{
		{"memory", limiter.NewMemoryStore()},
		{"redis", redisStore(t, client(limiter.ModeStandalone))},
	}
}

// Fixed window is the cheapest algorithm and the least exact: a client that
// spends its quota at the end of one window and again at the start of the
// next gets 2× the limit within one window's length. This is documented
// behaviour; the test pins it so a change to it is noticed.
func TestFixedWindowAdmitsTwiceAcrossBoundary(t *testing.T) {
	const quota = 50
	base := time.Now().Add(time.Hour).Truncate(time.Second)
	var at []time.Time
	for i := range 2 * quota {
		at = append(at, base.Add(900*ms+time.Duration(i)*2*ms)) // 900ms..1098ms
	}
	for _, st := range boundaryStores(t) {
		t.Run(st.name, func(t *testing.T) {
			l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.FixedWindow, Limit: quota, Window: time.Second}
			admitted, _ := admitAt(t, st.store, l, at)
			require.Len(t, admitted, 2*quota)
			require.Equal(t, 2*quota, maxInWindow(admitted, time.Second))
		})
	}
}

// The buckets admit a full burst and then the steady rate: the worst window
// of length W holds burst + limit (a full bucket at its start, limit more
// refilled or leaked during it), which README states.
func TestBucketsWorstWindowIsBurstPlusLimit(t *testing.T) {
	const quota, burst = 20, 10
	base := time.Now().Add(time.Hour).Truncate(time.Second)
	var at []time.Time
	for i := range 3000 { // one request per ms for 3 windows
		at = append(at, base.Add(time.Duration(i)*ms))
	}
	for _, alg := range []limiter.Algorithm{limit.TokenBucket, limit.LeakyBucket} {
		for _, st := range boundaryStores(t) {
			t.Run(st.name+"/"+alg.String(), func(t *testing.T) {
				l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: alg, Limit: quota, Window: time.Second, Burst: burst}
				admitted, _ := admitAt(t, st.store, l, at)
				worst := maxInWindow(admitted, time.Second)
				require.LessOrEqual(t, worst, burst+quota)
				require.GreaterOrEqual(t, worst, burst+quota-1, "the pattern reaches the stated bound")
			})
		}
	}
}

// The sliding log is exact: under random overload, no window of its length
// ever holds more than the limit.
func TestSlidingLogNeverExceedsLimit(t *testing.T) {
	const quota = 20
	window := time.Second
	rng := rand.New(rand.NewPCG(7, 7))
	at := poisson(rng, time.Now().Add(time.Hour), 3*quota, window, 5)
	for _, st := range boundaryStores(t) {
		t.Run(st.name, func(t *testing.T) {
			l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.SlidingLog, Limit: quota, Window: window}
			admitted, _ := admitAt(t, st.store, l, at)
			require.Equal(t, quota, maxInWindow(admitted, window))
			require.GreaterOrEqual(t, len(admitted), 4*quota, "an exact log still admits a full quota per window")
		})
	}
}

// poisson returns arrival times at rate per window over n windows.
func poisson(rng *rand.Rand, start time.Time, rate int, window time.Duration, n int) []time.Time {
	var at []time.Time
	for t := start; t.Before(start.Add(time.Duration(n) * window)); {
		t = t.Add(time.Duration(rng.ExpFloat64() * float64(window) / float64(rate)))
		at = append(at, t.Truncate(time.Millisecond))
	}
	return at
}

// The sliding window counter assumes the previous window's requests were
// spread evenly. Worst case: the previous window's whole quota arrived at its
// very end; the estimate then lets the current window admit up to
// limit·elapsed/W, so a window of length W straddling the boundary can hold
// up to (but never) 2× the limit. On steady traffic it is almost exact; the
// test reports the share of decisions that differ from an exact sliding log
// fed the same admitted history.
func TestSlidingWindowWorstCaseAndError(t *testing.T) {
	const quota = 100
	window := time.Second
	for _, st := range boundaryStores(t) {
		t.Run(st.name+"/worst case", func(t *testing.T) {
			l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.SlidingWindow, Limit: quota, Window: window}
			base := time.Now().Add(time.Hour).Truncate(time.Second)
			var at []time.Time
			for range quota { // the whole quota at the end of the previous window
				at = append(at, base.Add(999*ms))
			}
			for i := range 2000 { // then a flood across the next window
				at = append(at, base.Add(time.Second+time.Duration(i)*ms/2))
			}
			admitted, _ := admitAt(t, st.store, l, at)
			worst := maxInWindow(admitted, window)
			t.Logf("worst case: %d admitted within one window of length W (limit %d)", worst, quota)
			require.Less(t, worst, 2*quota)
			require.Greater(t, worst, quota+quota/2, "the adversarial pattern must reach the documented overshoot")
		})
	}
	for _, load := range []float64{0.8, 0.9, 1.0, 1.2, 2} {
		for seed := uint64(1); seed <= 5; seed++ {
			t.Run(fmt.Sprintf("steady mix at %.1fx seed %d", load, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 2))
				st := limiter.NewMemoryStore()
				l := limiter.Limit{Key: "steady", Algorithm: limit.SlidingWindow, Limit: quota, Window: window}
				at := poisson(rng, t0, int(load*quota), window, 60) // fixed start: the same figures every run
				_, decided := admitAt(t, st, l, at)
				wrongAllow, wrongDeny, over := 0, 0, 0
				var history []time.Time
				for i, a := range at {
					exact := countAfter(history, a.Add(-window)) < quota
					switch {
					case decided[i] && !exact:
						wrongAllow++
					case !decided[i] && exact:
						wrongDeny++
					}
					if decided[i] {
						history = append(history, a)
						over = max(over, countAfter(history, a.Add(-window))-quota)
					}
				}
				pct := func(n int) float64 { return 100 * float64(n) / float64(len(at)) }
				t.Logf("Poisson at %.1f× the limit, %d requests: wrongly allowed %.2f%%, wrongly denied %.2f%% (against an exact sliding log over the same admitted history); worst overshoot %d over a limit of %d",
					load, len(at), pct(wrongAllow), pct(wrongDeny), over, quota)
				require.Less(t, pct(wrongAllow), 15.0)
				require.Less(t, over, quota/5)
			})
		}
	}
}

func countAfter(times []time.Time, after time.Time) int {
	n := 0
	for i := len(times) - 1; i >= 0 && times[i].After(after); i-- {
		n++
	}
	return n
}
