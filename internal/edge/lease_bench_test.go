package edge

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// BenchmarkHandlerLeased measures what a leased rule adds to a request in
// the handler (identify, match, limit, proxy to a loopback origin): an edge
// without rules (off) and one with a leased token_bucket keyed on host (every
// request spends from one key's allowance, carved from a real Redis in
// batches; nothing is denied) take requests alternately within one loop, so
// both see the same load on a busy host. Compare on-ns/req with off-ns/req
// (and on/off) of one run, over -count; added-ns/req is their difference.
// allocs/req are counted with testing.AllocsPerRun, carves/req from the
// leased edge's own metric. Profile the leased path
// with -cpuprofile: both edges run in this process.
func BenchmarkHandlerLeased(b *testing.B) {
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(b, err)
	defer rd.Close()
	const leased = `version: 1
rules:
  - {id: bench, key: [host], algorithm: token_bucket, limit: 1000000, window: 1s, burst: 1000000, accuracy: leased, tolerance: 0.05}
`
	edges := [2]*Edge{benchEdge(b, "version: 1\nrules: []\n", rd.URL()), benchEdge(b, leased, rd.URL())}
	one := benchRequests(b, 3)
	// Warm up: the first carves, then batches of the adaptive size.
	for range 2000 {
		one(edges[1])
	}
	carves := func() float64 {
		mfs, err := edges[1].reg.Gather()
		require.NoError(b, err)
		for _, mf := range mfs {
			if mf.GetName() == "edgeguard_limiter_lease_carves_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		b.Fatal("no edgeguard_limiter_lease_carves_total")
		return 0
	}
	carves0 := carves()
	offOn(b, edges, one)
	b.ReportMetric((carves()-carves0)/float64(b.N), "carves/req")
}
