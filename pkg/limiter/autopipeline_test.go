package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

var allModes = []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster, limiter.ModeSentinel}

// autoPipelined is an autopipelined client over c, stopped with the test.
func autoPipelined(t testing.TB, c redis.UniversalClient) limiter.RedisConn {
	ap, stop, err := limiter.AutoPipelined(c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = stop() })
	return ap
}

func modeURL(mode limiter.Mode) string {
	switch mode {
	case limiter.ModeCluster:
		return clusterSrv().URL()
	case limiter.ModeSentinel:
		return sentinelSrv().URL()
	}
	return standaloneSrv().URL()
}

// TestAutoPipelinedAtomicity is TestAtomicityAcrossNodes over autopipelined
// clients: three nodes × 200 goroutines on one key, whose calls share the
// autopipeliner's batches, admit exactly the limit.
func TestAutoPipelinedAtomicity(t *testing.T) {
	const nodes, goroutines, each, quota = 3, 200, 2, 500
	for _, mode := range allModes {
		stores := make([]*limiter.RedisStore, nodes)
		for i := range stores {
			c, err := limiter.NewRedisClient(modeURL(mode), mode)
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			stores[i] = connStore(t, autoPipelined(t, c))
		}
		for _, alg := range []limiter.Algorithm{limit.SlidingLog, limit.FixedWindow} {
			t.Run(string(mode)+"/"+alg.String(), func(t *testing.T) {
				l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: alg, Limit: quota, Window: time.Minute}
				// One explicit instant for every call keeps the window away
				// from a boundary (a run straddling one admitted 943: two
				// windows' quotas); the batches' atomicity is under test.
				at := time.Now().Truncate(time.Minute).Add(time.Second)
				var admitted, failed atomic.Int64
				var wg sync.WaitGroup
				for n := range nodes {
					for range goroutines {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for range each {
								ds, err := stores[n].Take(ctx(t), []limiter.Request{{Limit: l, Cost: 1, At: at}})
								if err != nil {
									failed.Add(1)
									continue
								}
								admitted.Add(ds[0].Admitted)
							}
						}()
					}
				}
				wg.Wait()
				require.Zero(t, failed.Load())
				require.EqualValues(t, quota, admitted.Load())
			})
		}
	}
}

// After SCRIPT FLUSH, concurrent lone calls that meet NOSCRIPT in a shared
// batch, and a Take of many calls (its own pipeline), are each counted once.
func TestAutoPipelinedNoScript(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			c := client(mode)
			st := connStore(t, autoPipelined(t, c))
			p := testenv.KeyPrefix(t)
			var reqs []limiter.Request
			for i := range 32 {
				l := limiter.Limit{Key: p + strconv.Itoa(i), Algorithm: limit.SlidingLog, Limit: 5, Window: time.Minute}
				reqs = append(reqs, limiter.Request{Limit: l, Cost: 1})
			}
			for round := int64(1); round <= 4; round++ {
				require.NoError(t, c.ScriptFlush(ctx(t)).Err())
				ds := make([]limiter.Decision, len(reqs))
				var wg sync.WaitGroup
				for i := range reqs[1:] { // lone calls
					wg.Add(1)
					go func() {
						defer wg.Done()
						d, err := st.Take(ctx(t), reqs[1+i:2+i])
						if !assertNoError(t, err) {
							return
						}
						ds[1+i] = d[0]
					}()
				}
				wg.Wait()
				for i, d := range ds[1:] {
					require.EqualValues(t, 5-round, d.Remaining, "key %d, round %d: counted once", 1+i, round)
				}
			}
			require.NoError(t, c.ScriptFlush(ctx(t)).Err())
			ds, err := st.Take(ctx(t), reqs)
			require.NoError(t, err)
			require.EqualValues(t, 4, ds[0].Remaining)
			for _, d := range ds[1:] {
				require.EqualValues(t, 0, d.Remaining)
			}
		})
	}
}

func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
	}
	return err == nil
}

// A call that fails in a shared batch fails alone: the other callers of the
// batch get their decisions.
func TestAutoPipelinedErrorsPerCall(t *testing.T) {
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		t.Run(string(mode), func(t *testing.T) {
			c := client(mode)
			st := connStore(t, autoPipelined(t, c))
			p := testenv.KeyPrefix(t)
			bad := limiter.Limit{Key: p + "bad", Algorithm: limit.FixedWindow, Limit: 1000, Window: time.Minute}
			require.NoError(t, c.LPush(ctx(t), st.Keys(bad)[0], "x").Err()) // WRONGTYPE for the script
			var wg sync.WaitGroup
			var good, wrong atomic.Int64
			for g := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 10 {
						l := limiter.Limit{Key: p + strconv.Itoa(g*10+i), Algorithm: limit.FixedWindow, Limit: 1000, Window: time.Minute}
						if g%8 == 0 {
							l = bad
						}
						ds, err := st.Take(ctx(t), []limiter.Request{{Limit: l, Cost: 1}})
						switch {
						case l == bad:
							var te *limiter.TakeError
							if !errors.As(err, &te) || !redis.HasErrorPrefix(te.Errs[0], "WRONGTYPE") {
								t.Errorf("bad key: %v", err)
							}
							wrong.Add(1)
						case err != nil || ds[0].Remaining != 999:
							t.Errorf("good key: %v %+v", err, ds)
						default:
							good.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			require.EqualValues(t, 56*10, good.Load())
			require.EqualValues(t, 8*10, wrong.Load())
		})
	}
}

// The caller's deadline bounds a Take even though a batch is not bound by
// its callers' deadlines, and the abandoned call still runs once Redis
// answers (as a call already written to a plain connection does). The
// lane's places are taken by calls in flight, so the Take under test
// queues for the lane's next batch.
func TestAutoPipelinedDeadline(t *testing.T) {
	c := client(limiter.ModeStandalone)
	st := connStore(t, autoPipelined(t, c))
	require.NoError(t, st.Load(ctx(t)))
	l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.FixedWindow, Limit: 10, Window: time.Hour}
	pauser := redis.NewClient(&redis.Options{Addr: standaloneSrv().Addr})
	defer pauser.Close()
	require.NoError(t, pauser.Do(ctx(t), "CLIENT", "PAUSE", 200, "ALL").Err())
	// The calls in flight: they hold the direct path until the pause ends.
	otherDone := make(chan error, limiter.LoneDirect)
	for i := range limiter.LoneDirect {
		other := l
		other.Key += "-other" + strconv.Itoa(i)
		go func() {
			_, err := st.Take(ctx(t), []limiter.Request{{Limit: other, Cost: 1}})
			otherDone <- err
		}()
	}
	require.Eventually(t, func() bool { return st.LoneInFlight() >= limiter.LoneDirect }, 2*time.Second, time.Millisecond, "the other calls are in flight")
	short, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := st.Take(short, []limiter.Request{{Limit: l, Cost: 1}})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 150*time.Millisecond, "the deadline, not the pause, ended the wait")
	for range limiter.LoneDirect {
		require.NoError(t, <-otherDone)
	}
	// The abandoned call was taken out of the queue: once nothing is in
	// flight, Redis has counted only this check (an abandoned call that
	// still ran would count twice: its caller's fallback decided it too).
	require.Eventually(t, func() bool { return st.LoneInFlight() == 0 }, 2*time.Second, time.Millisecond, "the abandoned call's batch ends")
	ds, err := st.Take(ctx(t), []limiter.Request{{Limit: l, Cost: 1}})
	require.NoError(t, err)
	require.EqualValues(t, 9, ds[0].Remaining, "the abandoned call was never sent")
}

// TestAutoPipelinedDifferential is TestDifferentialMemoryRedis's random
// sequences, takes and refunds, through an autopipelined client.
func TestAutoPipelinedDifferential(t *testing.T) {
	red := connStore(t, autoPipelined(t, client(limiter.ModeStandalone)))
	for _, alg := range []limiter.Algorithm{limit.SlidingLog, limit.SlidingWindow, limit.TokenBucket, limit.FixedWindow, limit.Concurrency} {
		t.Run(alg.String(), func(t *testing.T) {
			differential(t, red, rand.New(rand.NewPCG(7, uint64(alg))), alg, 150)
		})
	}
}

// BenchmarkTakeConcurrency measures whether batching concurrent requests'
// script calls together (the store's lanes, limiter.AutoPipelined) raises
// throughput over one pipeline per Take (plain):
//
//	<mode>/<plain|autopipeline>/<goroutines>
//
// Each of the goroutines runs single-request Takes back to back (one
// FixedWindow limit, 10 000 keys round robin, a quota no key reaches). One op
// is one decision; decisions/s is b.N over wall time and p99-µs the 99th
// percentile of one Take's latency. Compare plain and autopipeline within one
// run: on a small shared machine absolute rates drift between runs.
func BenchmarkTakeConcurrency(b *testing.B) {
	prefix := fmt.Sprintf("tc%06x:", rand.Uint32()&0xffffff)
	limits := make([]limiter.Limit, 10_000)
	for i := range limits {
		limits[i] = limiter.Limit{
			Key:       prefix + strconv.FormatUint(uint64(i)*0x9e3779b97f4a7c15, 16),
			Algorithm: limit.FixedWindow, Limit: 1_000_000_000, Window: time.Minute,
		}
	}
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		b.Run(string(mode), func(b *testing.B) {
			c := client(mode)
			plain, ap := redisStore(b, c), connStore(b, autoPipelined(b, c))
			require.NoError(b, plain.Load(context.Background()))
			// Both variants at one concurrency, then the next: neighbours in
			// time see the same machine.
			for _, g := range []int{1, 16, 128, 512} {
				b.Run("plain/"+strconv.Itoa(g), func(b *testing.B) { benchConcurrentTakes(b, plain, limits, g) })
				b.Run("autopipeline/"+strconv.Itoa(g), func(b *testing.B) { benchConcurrentTakes(b, ap, limits, g) })
			}
		})
	}
}

func benchConcurrentTakes(b *testing.B, st limiter.Store, limits []limiter.Limit, goroutines int) {
	var next atomic.Int64
	lat := make([][]time.Duration, goroutines)
	errs := make(chan error, goroutines)
	ctx := context.Background()
	var wg sync.WaitGroup
	b.ResetTimer()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := make([]time.Duration, 0, b.N/goroutines+1)
			defer func() { lat[g] = own }()
			req := []limiter.Request{{Cost: 1}}
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				req[0].Limit = limits[int(i)%len(limits)]
				t0 := time.Now()
				ds, err := st.Take(ctx, req)
				own = append(own, time.Since(t0))
				if err == nil && !ds[0].Allowed {
					err = fmt.Errorf("denied: %+v", ds[0])
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(float64(all[len(all)*99/100])/1e3, "p99-µs")
}
