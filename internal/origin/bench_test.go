package origin

import (
	"bytes"
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkServe measures one proxied request: copy and rewrite the
// request, a keep-alive round trip to a loopback origin, response clean-up;
// a short body and the largest one read whole.
func BenchmarkServe(b *testing.B) {
	b.Run("11B", func(b *testing.B) { benchmarkServe(b, []byte("hello, edge")) })
	b.Run("64KiB", func(b *testing.B) { benchmarkServe(b, bytes.Repeat([]byte("0123456789abcdef"), smallBody/16)) })
}

func benchmarkServe(b *testing.B, body []byte) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	origin := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/plain")
		ctx.SetBody(body)
	}}
	go origin.Serve(ln) //nolint:errcheck // returns on Shutdown
	b.Cleanup(func() { _ = origin.Shutdown() })

	cfg := DefaultConfig()
	cfg.URLs = []string{"http://" + ln.Addr().String()}
	p, err := New(cfg, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)

	remote := &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 40000}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var req fasthttp.Request
		req.Header.SetMethod(fasthttp.MethodGet)
		req.SetRequestURI("/products/42?color=red")
		req.Header.SetHost("shop.example")
		req.Header.Set("X-Forwarded-For", "198.51.100.1")
		req.Header.Set("Accept", "text/plain")
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, remote, nil)
		for pb.Next() {
			p.Serve(&ctx, Hop{Peer: "203.0.113.7", RequestID: "0123456789abcdef"})
			if ctx.Response.StatusCode() != fasthttp.StatusOK || len(ctx.Response.Body()) != len(body) {
				b.Fatalf("status %d, %d bytes of %d", ctx.Response.StatusCode(), len(ctx.Response.Body()), len(body))
			}
			ctx.Response.Reset()
		}
	})
}

// BenchmarkStripHopByHop is what clearing hop-by-hop fields costs a
// request and its response that carry none, as most do: browser-like
// request fields, a cacheable response's.
func BenchmarkStripHopByHop(b *testing.B) {
	var req fasthttp.RequestHeader
	req.SetMethod(fasthttp.MethodGet)
	req.SetRequestURI("/products/42?color=red")
	req.SetHost("shop.example")
	for _, kv := range [][2]string{
		{"User-Agent", "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"},
		{"Accept", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"},
		{"Accept-Language", "en-GB,en;q=0.5"},
		{"Accept-Encoding", "gzip, deflate, br"},
		{"Referer", "https://shop.example/"},
		{"Cookie", "session=0123456789abcdef"},
		{"X-Forwarded-For", "198.51.100.1"},
	} {
		req.Set(kv[0], kv[1])
	}
	var resp fasthttp.ResponseHeader
	resp.SetContentType("text/html; charset=utf-8")
	resp.SetContentLength(5120)
	for _, kv := range [][2]string{
		{"Date", "Thu, 26 Nov 2026 00:00:00 GMT"},
		{"Cache-Control", "public, max-age=60"},
		{"ETag", `"5f3a-1c00"`},
		{"Vary", "Accept-Encoding"},
	} {
		resp.Set(kv[0], kv[1])
	}
	var ex exchange
	nreq, nresp := req.Len(), resp.Len()
	b.ReportAllocs()
	for b.Loop() {
		stripHopByHop(&req, &ex)
		stripHopByHop(&resp, &ex)
	}
	if req.Len() != nreq || resp.Len() != nresp {
		b.Fatalf("fields lost: %d of %d in the request, %d of %d in the response", req.Len(), nreq, resp.Len(), nresp)
	}
}
