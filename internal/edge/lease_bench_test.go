package edge

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

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
	edges := []*Edge{benchEdge(b, "version: 1\nrules: []\n", rd.URL()), benchEdge(b, leased, rd.URL())}
	addrs := make([]net.Addr, 1024)
	for i := range addrs {
		addrs[i] = &net.TCPAddr{IP: net.IPv4(10, 3, byte(i>>8), byte(i)), Port: 40000}
	}
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	i := 0
	one := func(e *Edge) {
		req.Reset()
		req.SetRequestURI("http://bench.test/p/" + strconv.Itoa(i%20))
		ctx.Init(&req, addrs[i%len(addrs)], nil)
		e.handle(&ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		i++
	}
	// Warm up: the first carves, then batches of the adaptive size.
	for range 2000 {
		one(edges[1])
	}
	var allocs [2]float64
	for k, e := range edges {
		allocs[k] = testing.AllocsPerRun(200, func() { one(e) })
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
	var took [2]time.Duration
	b.ResetTimer()
	for b.Loop() {
		for k, e := range edges {
			start := time.Now()
			one(e)
			took[k] += time.Since(start)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric((carves()-carves0)/n, "carves/req")
	b.ReportMetric(float64(took[0].Nanoseconds())/n, "off-ns/req")
	b.ReportMetric(float64(took[1].Nanoseconds())/n, "on-ns/req")
	b.ReportMetric(float64((took[1]-took[0]).Nanoseconds())/n, "added-ns/req")
	b.ReportMetric(float64(took[1])/float64(took[0]), "on/off")
	b.ReportMetric(allocs[0], "off-allocs/req")
	b.ReportMetric(allocs[1], "on-allocs/req")
}
