package peerbench

import (
	"encoding/json"
	"fmt"
	"net"
	"os"

	"github.com/valyala/fasthttp"
)

// fastOriginEnv, when set in the environment, makes ServeOriginIfAsked
// serve the fasthttp origin of the request benchmarks on the address it
// holds.
const fastOriginEnv = "PEERBENCH_FAST_ORIGIN"

// fastBody is what the fasthttp origin answers every request with: a small
// constant, so what a request costs is the proxies' work and not the body's.
var fastBody = []byte("edgeguard peer benchmark: a small constant response body.\n")

// echoHeaders are the request fields the fasthttp origin's /echo reports:
// those each proxy writes, and those a client could spoof that each proxy
// clears.
var echoHeaders = []string{
	"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded", "X-Request-ID",
	"X-Real-IP", "True-Client-IP", "X-Client-IP", "CF-Connecting-IP", "X-Cluster-Client-IP",
}

// fastOrigin answers /echo with a JSON object of echoHeaders as received
// (each joined, absent ones left out), /hold never (it holds a worker of
// the proxy in front: the shed scenario), and every other request with
// fastBody.
func fastOrigin(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/echo":
		seen := map[string]string{}
		for _, h := range echoHeaders {
			if vs := ctx.Request.Header.PeekAll(h); len(vs) > 0 {
				var v string
				for i, b := range vs {
					if i > 0 {
						v += ", "
					}
					v += string(b)
				}
				seen[h] = v
			}
		}
		b, _ := json.Marshal(seen)
		ctx.SetContentType("application/json")
		ctx.SetBody(b)
	case "/hold":
		<-holdForever
	default:
		ctx.SetContentType("text/plain")
		ctx.SetBody(fastBody)
	}
}

// holdForever is never closed: /hold lasts as long as the origin process.
var holdForever = make(chan struct{})

func serveFastOrigin(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "origin:", err)
		os.Exit(1)
	}
	err = (&fasthttp.Server{Handler: fastOrigin, Name: "origin"}).Serve(ln)
	fmt.Fprintln(os.Stderr, "origin:", err)
	os.Exit(1)
}
