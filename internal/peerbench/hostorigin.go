package peerbench

import (
	"fmt"
	"net"
	"os"
	"time"

	"github.com/valyala/fasthttp"
)

// hostOriginEnv, when set in the environment, makes ServeOriginIfAsked
// serve the two-tenant origin of Tenants on the address it holds;
// hostDelayEnv is how long it takes to answer the slow host (a duration,
// 0 when unset).
const (
	hostOriginEnv = "PEERBENCH_HOST_ORIGIN"
	hostDelayEnv  = "PEERBENCH_HOST_DELAY"
	slowHost      = "a.example"
)

// hostOrigin answers every request with fastBody, requests for slowHost
// after delay and every other host at once: one customer's origin slow,
// the others' not, behind one address.
func hostOrigin(delay time.Duration) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if delay > 0 && string(ctx.Host()) == slowHost {
			select {
			case <-time.After(delay):
			case <-ctx.Done(): // the server is shutting down
				return
			}
		}
		ctx.SetContentType("text/plain")
		ctx.SetBody(fastBody)
	}
}

func serveHostOrigin(addr string) {
	delay, err := time.ParseDuration(os.Getenv(hostDelayEnv))
	if err != nil && os.Getenv(hostDelayEnv) != "" {
		fmt.Fprintln(os.Stderr, "origin:", err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "origin:", err)
		os.Exit(1)
	}
	err = (&fasthttp.Server{Handler: hostOrigin(delay), Name: "origin"}).Serve(ln)
	fmt.Fprintln(os.Stderr, "origin:", err)
	os.Exit(1)
}
