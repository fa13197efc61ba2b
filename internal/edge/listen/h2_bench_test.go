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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// BenchmarkH2Stream measures one HTTP/2 stream on the edge's side of
// net/http's HTTP/2 server: serveStream builds the fasthttp request from the
// stream's, runs a handler that answers 200 at once (the request path's own
// cost is BenchmarkHandlerAccessLog's, in internal/edge) and hands the
// response back to net/http. net/http's own cost per stream (framing,
// HPACK, its goroutine) is not in it.
func BenchmarkH2Stream(b *testing.B) {
	sm := NewH2StreamMetrics()
	cfg := H2Config{
		Handler:       func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") },
		Counts:        NewConnCounts(256, 64, nil, prometheus.NewCounter(prometheus.CounterOpts{Name: "refused"})),
		Log:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics:       NewH2Metrics(),
		StreamMetrics: sm,
		MaxHeldBytes:  256 << 20,
		WriteTimeout:  10 * time.Second,
	}
	h := &H2Server{cfg: cfg, m: cfg.Metrics, streams: sm, held: newH2Budget(cfg.MaxHeldBytes, sm.held)}

	mc := &h2MeteredConn{Conn: benchConn{}, state: tls.ConnectionState{Version: tls.VersionTLS13, HandshakeComplete: true, NegotiatedProtocol: "h2"}}
	mc.streams = h.openConnStreams(mc)
	r, err := http.NewRequestWithContext(context.WithValue(context.Background(), h2ConnKey{}, mc), http.MethodGet, "https://bench.test/p/1?q=2", nil)
	require.NoError(b, err)
	r.RequestURI, r.Proto, r.ProtoMajor, r.ProtoMinor = "/p/1?q=2", "HTTP/2.0", 2, 0
	r.Header = http.Header{
		"User-Agent":      {"h2load nghttp2/1.52.0"},
		"Accept":          {"*/*"},
		"Accept-Encoding": {"gzip, deflate"},
	}
	w := &benchResponseWriter{header: http.Header{}}
	one := func() {
		clear(w.header)
		w.status = 0
		h.serveStream(w, r)
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
