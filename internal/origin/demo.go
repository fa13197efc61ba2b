package origin

import (
	"encoding/json"
	"net"

	"github.com/valyala/fasthttp"
)

// StartDemo serves a tiny origin on a loopback port (--demo-origin), so a
// newcomer's `make run` proxies somewhere real. It echoes what it received.
func StartDemo() (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		body, _ := json.Marshal(map[string]string{
			"origin":          "edgeguard demo origin",
			"method":          string(ctx.Method()),
			"path":            string(ctx.Path()),
			"x-forwarded-for": string(ctx.Request.Header.Peek("X-Forwarded-For")),
			"x-request-id":    string(ctx.Request.Header.Peek("X-Request-ID")),
		})
		ctx.SetBody(append(body, '\n'))
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return ln.Addr().String(), func() { _ = srv.Shutdown(); <-done }, nil
}
