package origin

import (
	"bufio"
	"crypto/tls"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// testOrigin is a real fasthttp server on loopback that can be stopped and
// started again on the same port.
type testOrigin struct {
	t       *testing.T
	addr    string
	handler fasthttp.RequestHandler
	// tls, when set, makes it an https origin.
	tls *tls.Config

	mu     sync.Mutex
	server *fasthttp.Server
	ln     net.Listener
	seen   []seenRequest
}

// seenRequest is what the origin received, copied out of the handler.
type seenRequest struct {
	method, uri, host string
	body              []byte
	headers           map[string][]string
}

func (s seenRequest) header(k string) []string { return s.headers[k] }

func startOrigin(t *testing.T, handler fasthttp.RequestHandler) *testOrigin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	o := &testOrigin{t: t, addr: ln.Addr().String(), handler: handler}
	o.serve(ln)
	t.Cleanup(o.stop)
	return o
}

func (o *testOrigin) url() string {
	if o.tls != nil {
		return "https://" + o.addr
	}
	return "http://" + o.addr
}

func (o *testOrigin) serve(ln net.Listener) {
	if o.tls != nil {
		ln = tls.NewListener(ln, o.tls)
	}
	s := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			r := seenRequest{
				method:  string(ctx.Method()),
				uri:     string(ctx.RequestURI()),
				host:    string(ctx.Request.Header.Host()),
				body:    append([]byte(nil), ctx.PostBody()...),
				headers: map[string][]string{},
			}
			for k, v := range ctx.Request.Header.All() {
				r.headers[string(k)] = append(r.headers[string(k)], string(v))
			}
			o.mu.Lock()
			o.seen = append(o.seen, r)
			o.mu.Unlock()
			o.handler(ctx)
		},
		CloseOnShutdown: true,
	}
	o.mu.Lock()
	o.server, o.ln = s, ln
	o.mu.Unlock()
	go s.Serve(ln) //nolint:errcheck // returns when stopped
}

// stop shuts the server down and waits until its port refuses connections.
// The listener is closed here too: a Shutdown that comes before Serve has
// taken the listener (a short test) would leave Serve accepting.
func (o *testOrigin) stop() {
	o.mu.Lock()
	s, ln := o.server, o.ln
	o.server, o.ln = nil, nil
	o.mu.Unlock()
	if s != nil {
		_ = s.Shutdown()
		_ = ln.Close()
	}
}

// restart listens on the same port again.
func (o *testOrigin) restart() {
	o.t.Helper()
	var ln net.Listener
	require.Eventually(o.t, func() bool {
		var err error
		ln, err = net.Listen("tcp", o.addr)
		return err == nil
	}, 5*time.Second, 20*time.Millisecond, "re-listening on %s", o.addr)
	o.serve(ln)
}

func (o *testOrigin) requests() []seenRequest {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]seenRequest, 0, len(o.seen))
	for _, r := range o.seen {
		if ua := r.header("User-Agent"); len(ua) == 1 && ua[0] == checkUserAgent {
			continue
		}
		out = append(out, r)
	}
	return out
}

func (o *testOrigin) checks() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, r := range o.seen {
		if ua := r.header("User-Agent"); len(ua) == 1 && ua[0] == checkUserAgent {
			n++
		}
	}
	return n
}

func okHandler(body string) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/plain")
		ctx.SetBodyString(body)
	}
}

// closedAddr returns a loopback address nothing listens on (reserved for
// the test: no other test can start listening there meanwhile).
func closedAddr(t *testing.T) string { return testenv.ClosedAddr(t) }

// startEdge serves p on loopback the way the edge does, so tests speak
// real HTTP on both sides of the proxy.
func startEdge(t *testing.T, p *Proxy, clientIP, requestID string, tune ...func(*fasthttp.Server)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &fasthttp.Server{
		Handler:         func(ctx *fasthttp.RequestCtx) { p.Serve(ctx, Hop{Peer: clientIP, RequestID: requestID}) },
		CloseOnShutdown: true,
	}
	for _, f := range tune {
		f(s)
	}
	go s.Serve(ln) //nolint:errcheck // returns when stopped
	t.Cleanup(func() { _ = s.Shutdown() })
	return ln.Addr().String()
}

func newProxy(t *testing.T, cfg Config) *Proxy {
	t.Helper()
	p, err := New(cfg, nil, nil)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// rawExchange writes a literal request to addr and parses the response,
// so headers fasthttp's client would tidy up reach the edge untouched.
func rawExchange(t *testing.T, addr, request string) *fasthttp.Response {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	require.NoError(t, err)
	defer conn.Close()
	// A bound for a hung exchange, not a speed: one test moves 64 MiB
	// through the edge, which under -race on a busy machine took over 5 s.
	require.NoError(t, conn.SetDeadline(time.Now().Add(60*time.Second)))
	_, err = conn.Write([]byte(strings.ReplaceAll(request, "\n", "\r\n")))
	require.NoError(t, err)
	resp := fasthttp.AcquireResponse()
	t.Cleanup(func() { fasthttp.ReleaseResponse(resp) })
	require.NoError(t, resp.Read(bufio.NewReader(conn)))
	return resp
}

// get sends one request through the edge with fasthttp's client.
func get(t *testing.T, addr, path string) *fasthttp.Response {
	t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI("http://" + addr + path)
	resp := fasthttp.AcquireResponse()
	t.Cleanup(func() { fasthttp.ReleaseResponse(resp) })
	require.NoError(t, edgeClient.DoTimeout(req, resp, 10*time.Second))
	return resp
}

var edgeClient = &fasthttp.Client{}
