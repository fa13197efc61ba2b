package limiter_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// BenchmarkDecideGlobal compares one edge's decisions of a region rule and
// of a global rule whose keys are homed in another region, 80–140 ms away
// (toxiproxy), alternated within each -count round: region-exact,
// region-leased (each on the edge's own Redis), global-away (leased from
// the other region in the background), global-home (homed here). Each
// reports the p99 of a decision and the share of decisions allowed (the
// quota is never reached: a global-away denial is a lease still on its
// way). A global rule's request never waits on the link.
func BenchmarkDecideGlobal(b *testing.B) {
	edges := twoRegions(b, wanLink(b), 1, time.Second)
	var away, home gEdge
	for _, e := range edges {
		if e.region == awayRegion {
			away = e
		} else {
			home = e
		}
	}
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = homedKey(b, strconv.Itoa(i))
	}
	for _, c := range []struct {
		name   string
		edge   gEdge
		tol    float64
		global bool
	}{
		{"region-exact", away, 0, false},
		{"region-leased", away, 0.05, false},
		{"global-away", away, 0.05, true},
		{"global-home", home, 0.05, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			var next, allowed atomic.Uint64
			var mu sync.Mutex
			var all []time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var mine []time.Duration
				checks := []limiter.Check{{Cost: 1, Tolerance: c.tol, Global: c.global, Nodes: 1}}
				for pb.Next() {
					checks[0].Limit = limiter.Limit{Key: keys[next.Add(1)%uint64(len(keys))], Algorithm: limit.FixedWindow, Limit: limit.MaxLimit, Window: time.Hour}
					start := time.Now()
					v, err := c.edge.lim.Decide(context.Background(), checks)
					mine = append(mine, time.Since(start))
					if v.Allowed {
						allowed.Add(1)
					}
					if err != nil || !v.Allowed && !c.global {
						b.Errorf("%+v, %v", v, err)
						return
					}
				}
				mu.Lock()
				all = append(all, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			slices.Sort(all)
			if len(all) > 0 {
				b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
				b.ReportMetric(100*float64(allowed.Load())/float64(len(all)), "allowed-%")
			}
		})
	}
}
