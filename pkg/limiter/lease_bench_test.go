package limiter_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// BenchmarkDecideLeased compares exact and leased decisions of one rule at
// the edge's defaults (autopipelined connection), alternated within each
// -count round: <mode>/<keys>/exact, then <mode>/<keys>/leased. keys is how
// many clients share the load: 100 busy keys, or 10,000 (each then sees
// about a hundredth of the rate, so batches stay smaller). Each reports the
// script calls per decision (from the store's own count) and the CPU per
// decision of Redis and of this process.
func BenchmarkDecideLeased(b *testing.B) {
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		b.Run(string(mode), func(b *testing.B) {
			for _, keys := range []int{100, benchKeys} {
				b.Run(benchKeyCount(keys), func(b *testing.B) {
					for _, tol := range []float64{0, 0.05} {
						name := "exact"
						if tol > 0 {
							name = "leased"
						}
						b.Run(name, func(b *testing.B) {
							st := connStore(b, defaultConn(b, client(mode)))
							require.NoError(b, st.Load(context.Background()))
							lim, err := limiter.New(st, limiter.Config{}, nil, nil)
							require.NoError(b, err)
							b.Cleanup(lim.Close)
							limits := benchLimits(b, limiter.Limit{Algorithm: limit.FixedWindow, Limit: 1_000_000_000, Window: time.Minute}, keys)
							var next atomic.Uint64
							_, calls0 := st.Sent()
							b.SetParallelism(benchParallelism)
							b.ReportAllocs()
							cpu := startCPU(b, nodesOf(mode))
							b.ResetTimer()
							b.RunParallel(func(pb *testing.PB) {
								c := context.Background()
								checks := []limiter.Check{{Cost: 1, Tolerance: tol, Nodes: 3}}
								for pb.Next() {
									checks[0].Limit = limits[next.Add(1)%uint64(len(limits))]
									v, err := lim.Decide(c, checks)
									if err != nil || !v.Allowed {
										b.Errorf("%+v, %v", v, err)
										return
									}
								}
							})
							b.StopTimer()
							_, calls := st.Sent()
							cpu.report(b, selfCPU()-cpu.self, "decision")
							b.ReportMetric(float64(calls-calls0)/float64(b.N), "calls/decision")
							b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
						})
					}
				})
			}
		})
	}
}

func benchKeyCount(n int) string { return "keys=" + strconv.Itoa(n) }
