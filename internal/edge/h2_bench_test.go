package edge

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// BenchmarkH2Stream measures one HTTP/2 stream on the edge's side of
// net/http's HTTP/2 server: serveStream builds the fasthttp request from the
// stream's, runs the request path (one limit on the memory store, proxied to
// a loopback origin) and hands the response back to net/http. net/http's own
// cost per stream (framing, HPACK, its goroutine) is not in it.
func BenchmarkH2Stream(b *testing.B) {
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Origins = []string{benchOrigin(b)}
	cfg.Rules = filepath.Join(b.TempDir(), "rules.yaml")
	require.NoError(b, os.WriteFile(cfg.Rules, []byte("version: 1\nrules:\n  - {id: per-ip, key: [ip], algorithm: token_bucket, limit: 1000000, window: 1s}\n"), 0o600))
	e, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	h := &h2Server{e: e, m: e.metrics.h2, streams: e.metrics.h2Streams, held: newH2Budget(cfg.H2MaxHeldBytes, e.metrics.h2Streams.held)}

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
