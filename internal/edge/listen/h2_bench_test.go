package listen

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// benchH2Stream is an H2Server around handler (no listener: streams are
// handed to serveStream directly) and a GET of h2load's shape on one of
// its connections.
func benchH2Stream(t testing.TB, handler fasthttp.RequestHandler) (*H2Server, *http.Request) {
	cfg := testH2Config(handler)
	sm := cfg.StreamMetrics
	h := &H2Server{cfg: cfg, m: cfg.Metrics, streams: sm, held: newH2Budget(cfg.MaxHeldBytes, sm.held)}
	mc := &h2MeteredConn{Conn: benchConn{}, state: tls.ConnectionState{Version: tls.VersionTLS13, HandshakeComplete: true, NegotiatedProtocol: "h2"}}
	mc.streams = h.openConnStreams(mc)
	r, err := http.NewRequestWithContext(context.WithValue(context.Background(), h2ConnKey{}, mc), http.MethodGet, "https://bench.test/p/1?q=2", nil)
	require.NoError(t, err)
	r.RequestURI, r.Proto, r.ProtoMajor, r.ProtoMinor = "/p/1?q=2", "HTTP/2.0", 2, 0
	r.Header = http.Header{
		"User-Agent":      {"h2load nghttp2/1.52.0"},
		"Accept":          {"*/*"},
		"Accept-Encoding": {"gzip, deflate"},
	}
	return h, r
}

// testH2Config is an HTTP/2 server's settings around handler, with metrics
// of its own and a discarding log (no listener address).
func testH2Config(handler fasthttp.RequestHandler) h2Config {
	return h2Config{
		Handler:       handler,
		Counts:        NewConnCounts(256, 64, nil, prometheus.NewCounter(prometheus.CounterOpts{Name: "refused"})),
		Log:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics:       newH2Metrics(),
		StreamMetrics: newH2StreamMetrics(),
		MaxHeldBytes:  256 << 20,
		WriteTimeout:  10 * time.Second,
	}
}

// pathStackDepth is how many of useStack's frames stand for the request
// path at its deepest: about 11 KiB of stack, between the 8 KiB the path
// outgrows and the 16 KiB it fits in (the edge's CPU profile under h2load:
// the stack grew once, at the proxy's write of the request).
const pathStackDepth = 20

// useStack takes about n × 550 bytes of stack.
//
//go:noinline
func useStack(n int) byte {
	var frame [512]byte
	frame[n%len(frame)] = byte(n)
	if n == 0 {
		return frame[0]
	}
	return useStack(n-1) + frame[n%len(frame)]
}

// deepHandler answers 200 after reaching the request path's depth.
func deepHandler(ctx *fasthttp.RequestCtx) {
	useStack(pathStackDepth)
	ctx.SetBodyString("ok")
}

// onNewGoroutine runs f on a goroutine of its own, as net/http runs each
// stream's handler.
func onNewGoroutine(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

// BenchmarkH2Stream measures one HTTP/2 stream on the edge's side of
// net/http's HTTP/2 server: serveStream, on a new goroutine as net/http
// runs it, builds the fasthttp request from the stream's, runs a handler
// that reaches the request path's stack depth and answers 200 (the path's
// own cost is the pipeline's benchmarks'), and hands the response back to
// net/http. net/http's own cost per stream (framing, HPACK) is not in it.
func BenchmarkH2Stream(b *testing.B) {
	h, r := benchH2Stream(b, deepHandler)
	w := &benchResponseWriter{header: http.Header{}}
	one := func() {
		clear(w.header)
		w.status = 0
		onNewGoroutine(func() { h.serveStream(w, r) })
		if w.status != http.StatusOK {
			b.Fatalf("status %d", w.status)
		}
	}
	allocs := testing.AllocsPerRun(200, one)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		one()
	}
	b.ReportMetric(allocs, "allocs/stream")
}

// A stream's handler runs on a stack serveStream grew on entry: reaching
// the request path's depth does not move it (the runtime copies a stack
// to grow it, so a local's address tells). The same handler on a new
// goroutine of its own does move, or the check proves nothing.
func TestH2StreamStackGrownOnEntry(t *testing.T) {
	var moved bool
	handler := func(ctx *fasthttp.RequestCtx) {
		var here byte
		at := uintptr(unsafe.Pointer(&here))
		deepHandler(ctx)
		moved = uintptr(unsafe.Pointer(&here)) != at
	}
	onNewGoroutine(func() { handler(new(fasthttp.RequestCtx)) })
	require.True(t, moved, "a new goroutine's stack grows to the path's depth (else this test shows nothing)")

	h, r := benchH2Stream(t, handler)
	w := &benchResponseWriter{header: http.Header{}}
	for range 3 {
		onNewGoroutine(func() { h.serveStream(w, r) })
		require.Equal(t, http.StatusOK, w.status)
		require.False(t, moved, "the stack grew under the request path")
	}
}

// benchConn is a client connection that is never read or written.
type benchConn struct{ net.Conn }

func (benchConn) RemoteAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(10, 3, 0, 1), Port: 40000} }
func (benchConn) LocalAddr() net.Addr  { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443} }

// benchResponseWriter keeps the status and drops the body.
type benchResponseWriter struct {
	header http.Header
	status int
}

func (w *benchResponseWriter) Header() http.Header         { return w.header }
func (w *benchResponseWriter) WriteHeader(code int)        { w.status = code }
func (w *benchResponseWriter) Write(p []byte) (int, error) { return len(p), nil }
