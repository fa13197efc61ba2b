package origin

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

func TestServeForwardsRequest(t *testing.T) {
	tests := []struct {
		name        string
		rewriteHost bool
		clientIP    string
		request     string
		wantMethod  string
		wantURI     string
		wantBody    string
		wantHost    func(originAddr string) string
		wantXFF     []string
		wantHeaders map[string]string
		absent      []string
	}{
		{
			name:     "post with body, chain and hop-by-hop headers",
			clientIP: "203.0.113.7",
			request: "POST /a/b%2Fc?x=1&y=two HTTP/1.1\n" +
				"Host: shop.example\n" +
				"Content-Type: application/json\n" +
				"Content-Length: 11\n" +
				"X-Forwarded-For: 198.51.100.1, 10.0.0.1\n" +
				"X-Forwarded-Proto: gopher\n" +
				"X-Request-ID: client-chosen\n" +
				"X-Custom: kept\n" +
				"Connection: keep-alive, X-Secret\n" +
				"X-Secret: per-hop\n" +
				"Keep-Alive: timeout=5\n" +
				"Proxy-Authorization: Basic Zm9vOmJhcg==\n" +
				"Proxy-Connection: keep-alive\n" +
				"TE: trailers\n" +
				"Upgrade: websocket\n" +
				"Expect: 100-continue\n" +
				"\n" +
				`{"a":"b"}` + "\n",
			wantMethod: "POST",
			wantURI:    "/a/b%2Fc?x=1&y=two",
			wantBody:   `{"a":"b"}` + "\r\n",
			wantHost:   func(string) string { return "shop.example" },
			wantXFF:    []string{"198.51.100.1, 10.0.0.1, 203.0.113.7"},
			wantHeaders: map[string]string{
				"X-Forwarded-Proto": "http",
				"X-Forwarded-Host":  "shop.example",
				"X-Request-Id":      "rid-42",
				"X-Custom":          "kept",
				"Content-Type":      "application/json",
			},
			absent: []string{"Connection", "X-Secret", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Te", "Upgrade", "Expect"},
		},
		{
			name:     "several forwarded-for lines are joined before appending",
			clientIP: "2001:db8::1",
			request: "GET /list HTTP/1.1\n" +
				"Host: shop.example\n" +
				"X-Forwarded-For: 198.51.100.1\n" +
				"X-Forwarded-For: 10.0.0.1\n" +
				"\n",
			wantMethod: "GET",
			wantURI:    "/list",
			wantHost:   func(string) string { return "shop.example" },
			wantXFF:    []string{"198.51.100.1, 10.0.0.1, 2001:db8::1"},
			wantHeaders: map[string]string{
				"X-Forwarded-Host": "shop.example",
			},
		},
		{
			name:     "chunked body, trailer and connection close",
			clientIP: "203.0.113.7",
			request: "PUT /upload HTTP/1.1\n" +
				"Host: shop.example\n" +
				"Transfer-Encoding: chunked\n" +
				"Trailer: X-Sum\n" +
				"Connection: close\n" +
				"\n" +
				"5\nhello\n6\n world\n0\nX-Sum: 1\n\n",
			wantMethod:  "PUT",
			wantURI:     "/upload",
			wantBody:    "hello world",
			wantHost:    func(string) string { return "shop.example" },
			wantXFF:     []string{"203.0.113.7"},
			wantHeaders: map[string]string{"Content-Length": "11"},
			absent:      []string{"Transfer-Encoding", "Trailer", "Connection"},
		},
		{
			name:        "rewrite host sends the origin's host, empty client ip adds nothing",
			rewriteHost: true,
			request: "GET / HTTP/1.1\n" +
				"Host: shop.example\n" +
				"X-Forwarded-For: 198.51.100.1\n" +
				"\n",
			wantMethod: "GET",
			wantURI:    "/",
			wantHost:   func(addr string) string { return addr },
			wantXFF:    []string{"198.51.100.1"},
			wantHeaders: map[string]string{
				"X-Forwarded-Host": "shop.example",
			},
		},
		{
			name:     "absolute-form request line goes upstream in origin form",
			clientIP: "203.0.113.7",
			request: "GET http://shop.example/p?q=1 HTTP/1.1\n" +
				"Host: shop.example\n" +
				"\n",
			wantMethod: "GET",
			wantURI:    "/p?q=1",
			wantHost:   func(string) string { return "shop.example" },
			wantXFF:    []string{"203.0.113.7"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := startOrigin(t, okHandler("ok"))
			cfg := DefaultConfig()
			cfg.URLs = []string{o.url()}
			cfg.HealthCheckInterval = 0
			cfg.RewriteHost = tc.rewriteHost
			edge := startEdge(t, newProxy(t, cfg), tc.clientIP, "rid-42")

			resp := rawExchange(t, edge, tc.request)
			require.Equal(t, fasthttp.StatusOK, resp.StatusCode())
			require.Equal(t, "ok", string(resp.Body()))

			seen := o.requests()
			require.Len(t, seen, 1)
			got := seen[0]
			require.Equal(t, tc.wantMethod, got.method)
			require.Equal(t, tc.wantURI, got.uri)
			require.Equal(t, tc.wantBody, string(got.body))
			require.Equal(t, tc.wantHost(o.addr), got.host)
			require.Equal(t, tc.wantXFF, got.header("X-Forwarded-For"))
			for k, v := range tc.wantHeaders {
				require.Equal(t, []string{v}, got.header(k), "header %s", k)
			}
			for _, k := range tc.absent {
				require.Nil(t, got.header(k), "header %s must not reach the origin", k)
			}
		})
	}
}

func TestServeStripsHopByHopFromResponse(t *testing.T) {
	o := startOrigin(t, func(ctx *fasthttp.RequestCtx) {
		h := &ctx.Response.Header
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "per-hop")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Proxy-Authenticate", `Basic realm="origin"`)
		h.Set("Upgrade", "h2c")
		h.Set("X-Origin", "kept")
		h.SetStatusCode(fasthttp.StatusCreated)
		// A streamed body without a length goes out chunked.
		ctx.SetBodyStream(strings.NewReader("streamed body"), -1)
	})
	cfg := DefaultConfig()
	cfg.URLs = []string{o.url()}
	cfg.HealthCheckInterval = 0
	edge := startEdge(t, newProxy(t, cfg), "203.0.113.7", "rid")

	resp := rawExchange(t, edge, "GET / HTTP/1.1\nHost: shop.example\n\n")
	require.Equal(t, fasthttp.StatusCreated, resp.StatusCode())
	require.Equal(t, "streamed body", string(resp.Body()))
	require.Equal(t, "kept", string(resp.Header.Peek("X-Origin")))
	for _, k := range []string{"Connection", "X-Hop", "Keep-Alive", "Proxy-Authenticate", "Upgrade"} {
		require.Empty(t, resp.Header.Peek(k), "header %s must not reach the client", k)
	}
	// A body of unknown length streams: chunked again on the edge's own
	// hop, never buffered to learn its length.
	require.Equal(t, -1, resp.Header.ContentLength())
}

func TestServeHead(t *testing.T) {
	o := startOrigin(t, okHandler("eleven char"))
	cfg := DefaultConfig()
	cfg.URLs = []string{o.url()}
	cfg.HealthCheckInterval = 0
	edge := startEdge(t, newProxy(t, cfg), "203.0.113.7", "rid")

	conn, err := net.DialTimeout("tcp", edge, time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	// HEAD then GET on one connection: a stray HEAD body would corrupt the
	// second response.
	_, err = conn.Write([]byte("HEAD / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"))
	require.NoError(t, err)
	br := bufio.NewReader(conn)

	var head fasthttp.Response
	head.SkipBody = true
	require.NoError(t, head.Read(br))
	require.Equal(t, fasthttp.StatusOK, head.StatusCode())
	require.Equal(t, len("eleven char"), head.Header.ContentLength(), "HEAD keeps the origin's length")

	var getResp fasthttp.Response
	require.NoError(t, getResp.Read(br))
	require.Equal(t, "eleven char", string(getResp.Body()))
}

// An origin closing its side must not close the client's keep-alive
// connection: that is a decision for each hop.
func TestServeKeepsClientConnectionWhenOriginCloses(t *testing.T) {
	o := startOrigin(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetConnectionClose()
		ctx.SetBodyString("bye")
	})
	cfg := DefaultConfig()
	cfg.URLs = []string{o.url()}
	cfg.HealthCheckInterval = 0
	edge := startEdge(t, newProxy(t, cfg), "203.0.113.7", "rid")

	c := &fasthttp.HostClient{Addr: edge, MaxConns: 1}
	for i := range 3 {
		code, body, err := c.Get(nil, "http://"+edge+"/")
		require.NoError(t, err, "request %d", i)
		require.Equal(t, fasthttp.StatusOK, code)
		require.Equal(t, "bye", string(body))
	}
	require.Len(t, o.requests(), 3)
}

func TestServeStreamedRequestBody(t *testing.T) {
	o := startOrigin(t, okHandler("ok"))
	cfg := DefaultConfig()
	cfg.URLs = []string{o.url()}
	cfg.HealthCheckInterval = 0
	edge := startEdge(t, newProxy(t, cfg), "203.0.113.7", "rid", func(s *fasthttp.Server) {
		s.StreamRequestBody = true
	})

	body := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB, far past the read buffer
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI("http://" + edge + "/upload")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetBodyString(body)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	require.NoError(t, edgeClient.DoTimeout(req, resp, 10*time.Second))
	require.Equal(t, fasthttp.StatusOK, resp.StatusCode())

	seen := o.requests()
	require.Len(t, seen, 1)
	require.Equal(t, len(body), len(seen[0].body))
	require.Equal(t, body, string(seen[0].body))
}

// problemBody is the JSON shape clients see on 502/504.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

func TestServeFailures(t *testing.T) {
	tests := []struct {
		name       string
		origin     func(t *testing.T) string // returns the origin URL
		timeout    time.Duration
		wantStatus int
		wantReason reason
		minTime    time.Duration
		maxTime    time.Duration
	}{
		{
			name:       "connection refused fails fast",
			origin:     func(t *testing.T) string { return "http://" + closedAddr(t) },
			timeout:    5 * time.Second,
			wantStatus: fasthttp.StatusBadGateway,
			wantReason: reasonConnect,
			maxTime:    time.Second,
		},
		{
			name: "slow origin times out near the deadline",
			origin: func(t *testing.T) string {
				release := make(chan struct{})
				o := startOrigin(t, func(ctx *fasthttp.RequestCtx) {
					<-release // an origin that answers only after the deadline
					ctx.SetBodyString("late")
				})
				t.Cleanup(func() { close(release) }) // runs before the origin stops (last in, first out)
				return o.url()
			},
			timeout:    200 * time.Millisecond,
			wantStatus: fasthttp.StatusGatewayTimeout,
			wantReason: reasonTimeout,
			minTime:    200 * time.Millisecond,
			maxTime:    time.Second,
		},
		{
			name: "origin drops the connection without answering",
			origin: func(t *testing.T) string {
				return startOrigin(t, func(ctx *fasthttp.RequestCtx) {
					ctx.HijackSetNoResponse(true)
					ctx.Hijack(func(c net.Conn) { _ = c.Close() })
				}).url()
			},
			timeout:    5 * time.Second,
			wantStatus: fasthttp.StatusBadGateway,
			wantReason: reasonConnect,
			maxTime:    time.Second,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.URLs = []string{tc.origin(t)}
			cfg.HealthCheckInterval = 0
			cfg.HeaderTimeout = tc.timeout
			p := newProxy(t, cfg)
			edge := startEdge(t, p, "203.0.113.7", "rid")

			start := time.Now()
			resp := get(t, edge, "/x")
			took := time.Since(start)

			require.Equal(t, tc.wantStatus, resp.StatusCode())
			require.GreaterOrEqual(t, took, tc.minTime)
			require.Less(t, took, tc.maxTime, "must answer long before the %v timeout", tc.timeout)
			require.Equal(t, "application/problem+json", string(resp.Header.ContentType()))
			require.Equal(t, "no-store", string(resp.Header.Peek("Cache-Control")))

			var pb problemBody
			require.NoError(t, json.Unmarshal(resp.Body(), &pb))
			require.Equal(t, tc.wantStatus, pb.Status)
			require.Equal(t, "about:blank", pb.Type)
			require.Equal(t, fasthttp.StatusMessage(tc.wantStatus), pb.Title)
			require.NotEmpty(t, pb.Detail)
			require.NotContains(t, string(resp.Body()), "127.0.0.1", "origin addresses must not leak")

			require.Equal(t, 1.0, counterValue(t, p.metrics.errors[tc.wantReason]))
			if tc.wantReason == reasonTimeout {
				require.Equal(t, 1.0, counterValue(t, p.metrics.timeouts[phaseHeader]))
			}
		})
	}
}

func TestFailoverAndRejoin(t *testing.T) {
	a := startOrigin(t, okHandler("a"))
	b := startOrigin(t, okHandler("b"))
	cfg := DefaultConfig()
	cfg.URLs = []string{a.url(), b.url()}
	cfg.HealthCheckInterval = 50 * time.Millisecond
	cfg.UnhealthyAfter = 2
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	served := map[string]int{}
	for range 20 {
		resp := get(t, edge, "/")
		require.Equal(t, fasthttp.StatusOK, resp.StatusCode())
		served[string(resp.Body())]++
	}
	require.Positive(t, served["a"], "both origins take traffic: %v", served)
	require.Positive(t, served["b"], "both origins take traffic: %v", served)
	require.Equal(t, 2, p.Healthy())

	b.stop()
	failures := 0
	for range 50 {
		resp := get(t, edge, "/")
		if resp.StatusCode() != fasthttp.StatusOK {
			failures++
			continue
		}
		require.Equal(t, "a", string(resp.Body()))
	}
	require.LessOrEqual(t, failures, cfg.UnhealthyAfter)
	require.Eventually(t, func() bool { return p.Healthy() == 1 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, []OriginStatus{{URL: a.url(), Healthy: true}, {URL: b.url(), Healthy: false}}, p.Origins())

	b.restart()
	require.Eventually(t, func() bool { return p.Healthy() == 2 }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return string(get(t, edge, "/").Body()) == "b"
	}, 5*time.Second, 10*time.Millisecond, "the restarted origin takes traffic again")
}

// Without active checks, real traffic alone takes a dead origin out, and
// the dial retry keeps every client request succeeding meanwhile.
func TestPassiveHealth(t *testing.T) {
	a := startOrigin(t, okHandler("a"))
	cfg := DefaultConfig()
	cfg.URLs = []string{a.url(), "http://" + closedAddr(t)}
	cfg.HealthCheckInterval = 0
	cfg.UnhealthyAfter = 3
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	for i := range 20 {
		resp := get(t, edge, "/")
		require.Equal(t, fasthttp.StatusOK, resp.StatusCode(), "request %d", i)
	}
	require.Equal(t, 1, p.Healthy())
	require.Equal(t, float64(cfg.UnhealthyAfter), counterValue(t, p.metrics.errors[reasonConnect]),
		"the dead origin is tried until it leaves rotation, then no more")
}

// With every origin out of rotation the proxy still tries one, so an origin
// that comes back is used at once instead of after a health check.
func TestNoHealthyOriginStillTried(t *testing.T) {
	addr := closedAddr(t)
	cfg := DefaultConfig()
	cfg.URLs = []string{"http://" + addr}
	cfg.HealthCheckInterval = 0
	cfg.UnhealthyAfter = 1
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	require.Equal(t, fasthttp.StatusBadGateway, get(t, edge, "/").StatusCode())
	require.Equal(t, 0, p.Healthy())

	ln, err := testenv.Listen(addr)
	require.NoError(t, err)
	o := &testOrigin{t: t, addr: addr, handler: okHandler("back")}
	o.serve(ln)
	t.Cleanup(o.stop)

	resp := get(t, edge, "/")
	require.Equal(t, fasthttp.StatusOK, resp.StatusCode())
	require.Equal(t, "back", string(resp.Body()))
	require.Equal(t, 1, p.Healthy(), "a real success brings the origin back")
}

func TestPickLeastRecentlyFailedWhenNoneHealthy(t *testing.T) {
	cfg := DefaultConfig()
	cfg.URLs = []string{"http://" + closedAddr(t), "http://" + closedAddr(t), "http://" + closedAddr(t)}
	cfg.HealthCheckInterval = 0
	p := newProxy(t, cfg)
	for i, o := range p.origins {
		o.healthy.Store(false)
		o.lastFail.Store(int64([]int{30, 10, 20}[i]))
	}
	require.Same(t, p.origins[1], p.pick(nil))
	require.Same(t, p.origins[2], p.pick(p.origins[1]), "a retry never goes back to the origin that just failed")

	p.origins[0].healthy.Store(true)
	for range 10 {
		require.Same(t, p.origins[0], p.pick(nil), "a healthy origin always wins")
	}
}

func TestHealthCheck(t *testing.T) {
	var status atomic.Int32
	status.Store(fasthttp.StatusOK)
	o := startOrigin(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/healthz" {
			ctx.SetStatusCode(int(status.Load()))
			return
		}
		ctx.SetBodyString("ok")
	})
	cfg := DefaultConfig()
	cfg.URLs = []string{o.url()}
	cfg.HealthCheckInterval = 20 * time.Millisecond
	cfg.HealthCheckPath = "/healthz"
	cfg.UnhealthyAfter = 2
	p := newProxy(t, cfg)

	require.Eventually(t, func() bool { return o.checks() > 0 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, p.Healthy())

	// Healthy after more 4xx checks than it takes to leave rotation: the
	// checks counted are the witness that they ran.
	status.Store(fasthttp.StatusNotFound)
	n := o.checks()
	require.Eventually(t, func() bool { return o.checks() > n+cfg.UnhealthyAfter }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, p.Healthy(), "a 4xx check is still healthy")

	status.Store(fasthttp.StatusServiceUnavailable)
	require.Eventually(t, func() bool { return p.Healthy() == 0 }, 5*time.Second, 5*time.Millisecond)

	status.Store(fasthttp.StatusOK)
	require.Eventually(t, func() bool { return p.Healthy() == 1 }, 5*time.Second, 5*time.Millisecond)

	p.Close()
	p.Close() // idempotent
	n = o.checks()
	// Kept: an absence is seen only over a span of the real clock; five
	// intervals in which a surviving checker would have checked again.
	time.Sleep(5 * cfg.HealthCheckInterval)
	require.Equal(t, n, o.checks(), "no checks after Close")
	for _, r := range o.requests() {
		require.Fail(t, "checks are not real requests", "%+v", r)
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	_, err := New(Config{}, nil, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// The log must say what went wrong where, since the client is told nothing.
func TestFailureIsLoggedNotLeaked(t *testing.T) {
	addr := closedAddr(t)
	var logs syncBuilder
	cfg := DefaultConfig()
	cfg.URLs = []string{"http://" + addr}
	cfg.HealthCheckInterval = 0
	p, err := New(cfg, nil, newTestLogger(&logs))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	edge := startEdge(t, p, "203.0.113.7", "rid-7")

	resp := get(t, edge, "/")
	require.Equal(t, fasthttp.StatusBadGateway, resp.StatusCode())
	require.NotContains(t, string(resp.Body()), addr)
	out := logs.String()
	require.Contains(t, out, "origin request failed")
	require.Contains(t, out, addr)
	require.Contains(t, out, "rid-7")
	require.Contains(t, out, fmt.Sprintf("reason=%s", reasonConnect))
}

// When every connection of the pool is busy, the edge itself is out of
// capacity: 503 with Retry-After, counted, and the origin stays healthy.
func TestPoolFullAnswers503(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 4)
	o := startOrigin(t, func(ctx *fasthttp.RequestCtx) {
		arrived <- struct{}{}
		<-release
		ctx.SetBodyString("slow")
	})
	cfg := DefaultConfig()
	cfg.URLs = []string{o.url()}
	cfg.HealthCheckInterval = 0
	cfg.MaxConnsPerHost = 1
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	slow := make(chan int, 1)
	go func() {
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		req.SetRequestURI("http://" + edge + "/slow")
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		if err := edgeClient.DoTimeout(req, resp, 10*time.Second); err != nil {
			slow <- 0
			return
		}
		slow <- resp.StatusCode()
	}()
	<-arrived // the pool's one connection is taken
	resp := get(t, edge, "/")
	close(release)
	require.Equal(t, fasthttp.StatusServiceUnavailable, resp.StatusCode())
	require.Equal(t, "1", string(resp.Header.Peek("Retry-After")))
	var pb problemBody
	require.NoError(t, json.Unmarshal(resp.Body(), &pb))
	require.Equal(t, "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity", pb.Type)
	require.Equal(t, 200, <-slow)
	require.Equal(t, 1.0, counterValue(t, p.metrics.errors[reasonNoFreeConns]))
	require.Equal(t, 1, p.Healthy(), "a full pool says nothing about the origin")
}

// A streamed body that grows past MaxRequestBodySize stops the exchange
// with 413; a client body that breaks off gets 400. Neither counts against
// the origin's health, and the client connection is closed (the rest of
// its body must not be read as a request).
func TestStreamedRequestBodyLimit(t *testing.T) {
	o := startOrigin(t, okHandler("ok"))
	cfg := DefaultConfig()
	cfg.URLs = []string{o.url()}
	cfg.HealthCheckInterval = 0
	cfg.UnhealthyAfter = 1
	cfg.MaxRequestBodySize = 1000
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid", func(s *fasthttp.Server) { s.StreamRequestBody = true })

	chunk := "200\n" + strings.Repeat("a", 0x200) + "\n"
	resp := rawExchange(t, edge, "POST / HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\n\n"+strings.Repeat(chunk, 3)+"0\n\n")
	require.Equal(t, fasthttp.StatusRequestEntityTooLarge, resp.StatusCode())
	require.True(t, resp.ConnectionClose())
	require.Equal(t, 1.0, counterValue(t, p.metrics.errors[reasonRequestTooLarge]))

	resp = rawExchange(t, edge, "POST / HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\n\n"+strings.Repeat(chunk, 1)+"0\n\n")
	require.Equal(t, fasthttp.StatusOK, resp.StatusCode(), "within the limit")
	require.False(t, resp.ConnectionClose())

	// A chunk size line that is not hex: the client's body is broken.
	resp = rawExchange(t, edge, "POST / HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\n\n"+chunk+"zz\n\n")
	require.Equal(t, fasthttp.StatusBadRequest, resp.StatusCode())
	require.Equal(t, 1.0, counterValue(t, p.metrics.errors[reasonClientBody]))
	require.Equal(t, 1, p.Healthy(), "the client's body is not the origin's failure")
}

// A small streamed body (one the server has already read in full) goes to
// the origin as a plain body, so the client may resend it when a pooled
// connection turns out closed, as it does for a bodyless request.
func TestSmallStreamedBodyResentOnStaleConnection(t *testing.T) {
	closed := make(chan struct{}, 16)
	var mu sync.Mutex
	var bodies []string
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	origin := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			mu.Lock()
			bodies = append(bodies, string(ctx.PostBody()))
			mu.Unlock()
			ctx.SetBodyString("ok")
		},
		// Closes a kept-alive connection quickly, behind the pool's back.
		IdleTimeout: 50 * time.Millisecond,
		ConnState: func(_ net.Conn, s fasthttp.ConnState) {
			if s == fasthttp.StateClosed {
				closed <- struct{}{}
			}
		},
	}
	go origin.Serve(ln) //nolint:errcheck // returns when stopped
	t.Cleanup(func() { _ = origin.Shutdown() })

	cfg := DefaultConfig()
	cfg.URLs = []string{"http://" + ln.Addr().String()}
	cfg.HealthCheckInterval = 0
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid", func(s *fasthttp.Server) { s.StreamRequestBody = true })

	resp := rawExchange(t, edge, "PUT /a HTTP/1.1\nHost: x\nContent-Length: 5\n\nfirst")
	require.Equal(t, fasthttp.StatusOK, resp.StatusCode())
	<-closed // the origin dropped the pooled connection
	resp = rawExchange(t, edge, "PUT /b HTTP/1.1\nHost: x\nContent-Length: 6\n\nsecond")
	require.Equal(t, fasthttp.StatusOK, resp.StatusCode(), "%s", resp.Body())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"first", "second"}, bodies)
}

// Each hop-by-hop field is stripped on its own too, in any case, without a
// Connection field naming it (the look over the names that spares the
// deletions must see every one of them); fields that only look like one
// pass.
func TestServeStripsEachHopByHopAlone(t *testing.T) {
	o := startOrigin(t, func(ctx *fasthttp.RequestCtx) {
		okHandler("ok")(ctx)
		if v := ctx.Request.Header.Peek("X-Echo"); len(v) > 0 {
			ctx.Response.Header.SetBytesV(string(v), []byte("per-hop"))
		}
	})
	cfg := DefaultConfig()
	cfg.URLs = []string{o.url()}
	cfg.HealthCheckInterval = 0
	edge := startEdge(t, newProxy(t, cfg), "203.0.113.7", "rid")

	hop := []string{"proxy-connection", "KEEP-ALIVE", "Proxy-Authenticate", "proxy-authorization", "te", "Trailer", "upgrade"}
	near := []string{"Upgrade-Insecure-Requests", "Tee", "Keep-Alivf", "Trailers", "Proxy-Authorizations"}
	for i, k := range append(hop, near...) {
		resp := rawExchange(t, edge, "GET / HTTP/1.1\nHost: shop.example\n"+k+": x\nX-Echo: "+k+"\n\n")
		require.Equal(t, fasthttp.StatusOK, resp.StatusCode(), k)
		seen := o.requests()
		require.Len(t, seen, i+1)
		stripped := i < len(hop)
		require.Equal(t, stripped, seen[i].header(http.CanonicalHeaderKey(k)) == nil, "request field %s", k)
		require.Equal(t, stripped, resp.Header.Peek(k) == nil, "response field %s", k)
	}
}

// A small body is handed to the response rather than copied into it: the
// response must keep its bytes after Serve has returned and its exchange
// has gone back to the pool and served the next request, whatever the
// sizes (a buffer too small for the next body, or one larger than it).
func TestSmallBodyOutlivesItsExchange(t *testing.T) {
	body := func(path string) []byte {
		n, fill := 0, byte('x')
		switch path {
		case "/big":
			n, fill = smallBody, 'b' // the largest read whole
		case "/mid":
			n, fill = 20<<10, 'm'
		case "/tiny":
			n, fill = 3, 't'
		}
		return []byte(strings.Repeat(string(fill), n))
	}
	o := startOrigin(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBody(body(string(ctx.Path()))) })
	cfg := DefaultConfig()
	cfg.URLs = []string{o.url()}
	cfg.HealthCheckInterval = 0
	p := newProxy(t, cfg)

	remote := &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 40000}
	serve := func(path string) *fasthttp.RequestCtx {
		var req fasthttp.Request
		req.SetRequestURI(path)
		req.Header.SetHost("shop.example")
		ctx := &fasthttp.RequestCtx{}
		ctx.Init(&req, remote, nil)
		p.Serve(ctx, Hop{Peer: "203.0.113.7"})
		require.Equal(t, fasthttp.StatusOK, ctx.Response.StatusCode(), path)
		require.False(t, ctx.Response.IsBodyStream(), "%s: read whole", path)
		return ctx
	}
	paths := []string{"/big", "/tiny", "/mid", "/big", "/big", "/mid", "/tiny", "/tiny", "/big"}
	var held []*fasthttp.RequestCtx
	for round := 0; round < 20; round++ {
		for _, path := range paths {
			held = append(held, serve(path))
		}
		// Every response served since is still whole, byte for byte.
		for i, ctx := range held {
			path := paths[i%len(paths)]
			require.Equal(t, body(path), ctx.Response.Body(), "response %d (%s) after %d more", i, path, len(held)-1-i)
		}
		for _, ctx := range held {
			ctx.Response.Reset() // gives its body buffer back to the pool
		}
		held = held[:0]
	}
}
