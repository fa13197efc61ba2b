// Command denyfloor is the floor of scripts/bench-deny-floor.sh: the
// edge's public HTTP/1.1 server without the edge's request pipeline,
// answering every request with the 429 the edge sends a client over a
// per-address rule (sliding_log, 10 per hour): its status line, fields and
// problem+json body, byte for byte but the Date. Set against the edge
// answering the same 429 from its over-limit cache, it shows what the
// pipeline costs on a denial, apart from what the server costs anyway.
//
// The server is built as the edge builds it, at the edge's defaults
// (listen.Public.NewServer: fasthttp, its buffers, timeouts and streaming).
// -listeners adds the edge's accept stack (the per-write deadline and the
// per-client connection cap, listen.Public.Stack) and the HTTP/1.1 framing
// reader (listen.Framed), so the two floors split what the edge adds into
// the listeners' part and the pipeline's.
//
//	denyfloor -listen 127.0.0.1:8081 [-listeners]
package main

import (
	"flag"
	"io"
	"log"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/listen"
)

// The edge's 429 over the rule the benchmark gives it (scripts/bench-deny-floor.sh
// checks that the two answers match before it measures).
const body = `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"request quota exceeded; retry after the time in Retry-After","violated-policies":["per-ip"]}`

func main() {
	addr := flag.String("listen", "127.0.0.1:8081", "listen address")
	listeners := flag.Bool("listeners", false, "serve through the edge's accept stack and framing reader")
	flag.Parse()

	m, err := listen.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		log.Fatal(err)
	}
	public := listen.NewPublic(listen.SettingsFrom(config.DefaultConfig()), m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := public.NewServer(deny, nil, nil)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if *listeners {
		ln = listen.Framed(public.Stack(ln, []byte(listen.TooManyConns)), nil)
	}
	log.Fatal(srv.Serve(ln))
}

func deny(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	h := &ctx.Response.Header
	h.SetContentType("application/problem+json")
	for _, f := range fields {
		h.SetCanonical(f[0], f[1])
	}
	ctx.SetBodyString(body)
}

// fields are the 429's other fields, spelled as the edge spells them.
var fields = [][2][]byte{
	{[]byte("Server"), []byte("edgeguard")},
	{[]byte("Retry-After"), []byte("3600")},
	{[]byte("Cache-Control"), []byte("no-store")},
	{[]byte("RateLimit-Policy"), []byte(`"per-ip";q=10;w=3600`)},
	{[]byte("RateLimit"), []byte(`"per-ip";r=0;t=3600`)},
}
