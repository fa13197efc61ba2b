package origin

import (
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkServe measures one proxied request: copy and rewrite the
// request, a keep-alive round trip to a loopback origin, response clean-up.
func BenchmarkServe(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	origin := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/plain")
		ctx.SetBodyString("hello, edge")
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
			if ctx.Response.StatusCode() != fasthttp.StatusOK {
				b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
			}
			ctx.Response.Reset()
		}
	})
}
