package edge

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// BenchmarkHandlerAccessLog measures the request handler (identify, match,
// one limit on the memory store, proxy to a loopback origin) on two edges,
// one without and one with --access-log, taking requests alternately in one
// loop so both see the same load: compare on-ns/req with off-ns/req (and
// on/off) of one run, over -count. The writer goroutine's CPU is not in
// these figures (BenchmarkAccessLogWrk in internal/edge/e2e measures the
// whole process); allocs/req are counted with testing.AllocsPerRun.
func BenchmarkHandlerAccessLog(b *testing.B) {
	origin := benchOrigin(b)
	start := func(log bool) *Edge {
		cfg := DefaultConfig()
		cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Origins = []string{origin}
		cfg.Rules = filepath.Join(b.TempDir(), "rules.yaml")
		require.NoError(b, os.WriteFile(cfg.Rules, []byte("version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: token_bucket, limit: 1000000, window: 1s}\n"), 0o600))
		if log {
			cfg.AccessLog = filepath.Join(b.TempDir(), "access.log")
		}
		e, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		require.NoError(b, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		b.Cleanup(func() { cancel(); <-done })
		return e
	}
	edges := []*Edge{start(false), start(true)}
	addrs := make([]net.Addr, 1024)
	for i := range addrs {
		addrs[i] = &net.TCPAddr{IP: net.IPv4(10, 2, byte(i>>8), byte(i)), Port: 40000}
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
	var allocs [2]float64
	for k, e := range edges {
		allocs[k] = testing.AllocsPerRun(200, func() { one(e) })
	}
	var took [2]time.Duration
	b.ResetTimer()
	for b.Loop() {
		for k, e := range edges {
			start := time.Now()
			one(e)
			took[k] += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(took[0].Nanoseconds())/n, "off-ns/req")
	b.ReportMetric(float64(took[1].Nanoseconds())/n, "on-ns/req")
	b.ReportMetric(float64(took[1])/float64(took[0]), "on/off")
	b.ReportMetric(allocs[0], "off-allocs/req")
	b.ReportMetric(allocs[1], "on-allocs/req")
}
