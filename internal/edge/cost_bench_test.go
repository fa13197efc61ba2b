package edge

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// Rules of the cost benchmarks and tests. floodRule denies a client its
// eleventh request for the next hour: every later request is a denial the
// over-limit cache already knows, for as long as any run takes (a
// per-second rule would let one request through to the store every
// 100 ms, more of them the slower the machine; a fixed window of an hour
// would start again on the hour, in the middle of a run).
const (
	noRules   = "version: 1\nrules: []\n"
	floodRule = "version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: sliding_log, limit: 10, window: 1h}\n"
	openRule  = "version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: leaky_bucket, limit: 1000000, window: 1s}\n"
)

// costPath is one path through the pipeline: the rules its edge runs,
// what its requests are answered, and how the edge is put on it.
type costPath struct {
	name   string
	rules  string
	status int
	setup  func(tb testing.TB, e *Edge)
}

var costPaths = []costPath{
	// A flooding client already denied: the over-limit cache answers 429.
	{"denied", floodRule, fasthttp.StatusTooManyRequests, nil},
	// No rule applies: proxied to a loopback origin (its server's work is
	// in the figures too).
	{"proxied", noRules, fasthttp.StatusOK, nil},
	// One rule per client counted in the embedded store, never reached:
	// proxied, with the rule's check and its RateLimit fields.
	{"ruled", openRule, fasthttp.StatusOK, nil},
	// The shedder at full level: every sheddable request gets its 503.
	{"shed", noRules, fasthttp.StatusServiceUnavailable, shedEverything},
}

// BenchmarkPipelineCost measures what one request costs on each path
// through the pipeline, called in process (no socket between client and
// edge): ns/op, B/op and allocs/op per request. Instruction counts come from
// running it under callgrind with a fixed -benchtime (BENCHMARKS.md).
func BenchmarkPipelineCost(b *testing.B) {
	for _, p := range costPaths {
		b.Run(p.name, func(b *testing.B) {
			one := costEdge(b, p)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				one()
			}
		})
	}
}

// costEdge starts an edge for p and returns a func that sends it one GET
// from one client through the pipeline, failing unless the answer is p's.
// The edge has already answered one such request (and, denied, its first
// ten), so what the func measures is the path's steady state.
func costEdge(tb testing.TB, p costPath) func() {
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Origins = []string{costOrigin(tb)}
	cfg.DrainDelay = 0 // the cleanup's shutdown is not what is measured
	cfg.Rules = filepath.Join(tb.TempDir(), "rules.yaml")
	require.NoError(tb, os.WriteFile(cfg.Rules, []byte(p.rules), 0o600))
	e, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(tb, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
	if p.setup != nil {
		p.setup(tb, e)
	}
	// The request as fasthttp's server hands it to the handler, read off
	// the wire as wrk sends it (origin form, a Host field) and its URI
	// parsed (the server parses every request's URI before its handler
	// runs, to refuse one it cannot parse), given to one context set up
	// once: ctx.Init would allocate a connection per call, the harness's
	// cost, not the pipeline's.
	var req fasthttp.Request
	require.NoError(tb, req.Read(bufio.NewReader(strings.NewReader("GET /p/1 HTTP/1.1\r\nHost: bench.test\r\n\r\n"))))
	req.URI()
	var rctx fasthttp.RequestCtx
	rctx.Init(&req, &net.TCPAddr{IP: net.IPv4(10, 9, 0, 1), Port: 40000}, nil)
	send := func() int {
		req.CopyTo(&rctx.Request)
		rctx.Response.Reset()
		e.pipe.Handle(&rctx)
		return rctx.Response.StatusCode()
	}
	for range 11 { // the rule's ten, and the denial the store makes
		send()
	}
	return func() {
		if code := send(); code != p.status {
			tb.Fatalf("%s: status %d, want %d: %s", p.name, code, p.status, rctx.Response.Body())
		}
	}
}

// shedEverything puts e's shedder at full level: two samples of full
// utilization, an hour ahead of the clock, each a whole ramp's worth. The
// edge's own sampler cannot undo it: its samples are older than the last
// one, and older samples advance nothing.
func shedEverything(tb testing.TB, e *Edge) {
	cfg := shedder.DefaultConfig()
	cfg.Enabled, cfg.StartAfter, cfg.FullAfter = true, time.Hour, time.Hour
	require.NoError(tb, e.shed.Update(cfg))
	at := time.Now().Add(time.Hour)
	for i := range 3 {
		e.shed.ObserveUtilization(at.Add(time.Duration(i)*2*time.Hour), 1)
	}
	require.Equal(tb, 1.0, e.shed.Level())
}

// costOrigin answers 200 "ok" on loopback.
func costOrigin(tb testing.TB) string { return countingOrigin(tb, nil) }

// countingOrigin is costOrigin counting what it served in served (nil:
// not counted).
func countingOrigin(tb testing.TB, served *atomic.Int64) string {
	return holdingOrigin(tb, served, nil)
}

// holdingOrigin is countingOrigin holding each request for /held until
// release is closed (nil: none is held), without counting it. The caller
// closes release before the test's cleanups reach the origin's shutdown,
// which waits for its requests.
func holdingOrigin(tb testing.TB, served *atomic.Int64, release <-chan struct{}) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if release != nil && string(ctx.Path()) == "/held" {
			<-release
		} else if served != nil {
			served.Add(1)
		}
		ctx.SetBodyString("ok")
	}}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}
