package limiter_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// TestAtomicityAcrossNodes plays three edge nodes — three independent clients
// — each with 200 goroutines hammering one key. The scripts are atomic, so
// the admitted total is exactly the limit: never more, and (with a generous
// deadline and no errors) never less.
func TestAtomicityAcrossNodes(t *testing.T) {
	const nodes, goroutines, each, quota = 3, 200, 3, 500
	urls := map[limiter.Mode]string{
		limiter.ModeStandalone: standaloneSrv().URL(),
		limiter.ModeCluster:    clusterSrv().URL(),
		limiter.ModeSentinel:   sentinelSrv().URL(),
	}
	cases := []struct {
		name       string
		limit      limiter.Limit
		serverTime bool
	}{
		{"sliding_log server time", limiter.Limit{Algorithm: limit.SlidingLog, Limit: quota, Window: time.Minute}, true},
		{"sliding_log", limiter.Limit{Algorithm: limit.SlidingLog, Limit: quota, Window: time.Minute}, false},
		{"sliding_window", limiter.Limit{Algorithm: limit.SlidingWindow, Limit: quota, Window: time.Minute}, false},
		{"token_bucket", limiter.Limit{Algorithm: limit.TokenBucket, Limit: quota, Window: time.Hour}, false},
		{"fixed_window", limiter.Limit{Algorithm: limit.FixedWindow, Limit: quota, Window: time.Minute}, false},
		{"concurrency", limiter.Limit{Algorithm: limit.Concurrency, Limit: quota, Window: time.Minute}, false},
	}
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster, limiter.ModeSentinel} {
		stores := make([]*limiter.RedisStore, nodes)
		for i := range stores {
			c, err := limiter.NewRedisClient(urls[mode], mode)
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			stores[i] = redisStore(t, c)
		}
		for _, c := range cases {
			t.Run(string(mode)+"/"+c.name, func(t *testing.T) {
				l := c.limit
				l.Key = testenv.KeyPrefix(t)
				// One explicit instant for every call keeps fixed and sliding
				// windows away from a boundary; the scripts' atomicity is what
				// is under test.
				at := time.Now().Truncate(time.Minute).Add(time.Second)
				if c.serverTime {
					at = time.Time{}
				}
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
				require.Zero(t, failed.Load(), "no call may fail under a generous deadline")
				require.EqualValues(t, quota, admitted.Load(), "%d calls", nodes*goroutines*each)
			})
		}
	}
}
