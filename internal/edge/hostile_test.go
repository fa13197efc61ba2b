package edge

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// The attacks of a hostile client, each tried against a running edge over
// real sockets; every one must fail.

// dialFrom connects to addr from a chosen loopback source address, so one
// test has a trusted peer (127.0.0.2) and untrusted ones (127.0.0.1, .3).
func dialFrom(t *testing.T, src, addr string) *rawConn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(15*time.Second)))
	return &rawConn{Conn: c, r: bufio.NewReader(c)}
}

// httpFrom is an HTTP client whose connections come from src.
func httpFrom(src string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// No path, header or key makes an untrusted request critical: the default
// /healthcheck rule is trusted_only, and the classifier never answers
// critical for anyone else. The tier is read off the edge's own counters.
func TestUntrustedCannotBeCritical(t *testing.T) {
	r := startEdge(t, perIP, func(c *config.Config) { c.TrustedProxies = trust.Set{mustPrefix("127.0.0.2/32")} })
	untrusted, trusted := httpFrom("127.0.0.1"), httpFrom("127.0.0.2")
	send := func(c *http.Client, method, path string, headers ...string) {
		req, err := http.NewRequest(method, "http://"+r.Addr()+path, nil)
		require.NoError(t, err)
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, m := range []string{"GET", "POST"} {
		send(untrusted, m, "/healthcheck/x")
		send(untrusted, m, "/healthcheck")
		send(untrusted, m, "/a", "X-Priority", "critical")
		send(untrusted, m, "/healthcheck", "X-Priority", "critical", "X-Api-Key", "live_1")
	}
	require.Zero(t, metricSum(t, r, "edgeguard_edge_requests_total", "tier", "critical"), "an untrusted client reached the critical tier")
	require.Equal(t, 4.0, metricSum(t, r, "edgeguard_edge_requests_total", "tier", "read"))
	require.Equal(t, 4.0, metricSum(t, r, "edgeguard_edge_requests_total", "tier", "write"))

	send(trusted, "GET", "/healthcheck/x")
	require.Equal(t, 1.0, metricSum(t, r, "edgeguard_edge_requests_total", "tier", "critical"), "a trusted peer's health check is critical")
}

// A request waiting for a worker whose client has gone leaves the queue
// and never reaches the origin.
func TestQueuedRequestOfAGoneClientIsNeverProxied(t *testing.T) {
	var arrived, gone atomic.Int64 // requests at the origin (its health checks aside), and the gone client's
	hold := make(chan struct{})
	var holdOnce sync.Once
	release := func() { holdOnce.Do(func() { close(hold) }) }
	t.Cleanup(release) // first: the edge's shutdown waits for the held request
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	origin := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/": // the edge's origin health check
			return
		case "/healthcheck":
			gone.Add(1)
		case "/hold":
			arrived.Add(1)
			<-hold
		}
		arrived.Add(1)
	}}
	go func() { _ = origin.Serve(ln) }()
	t.Cleanup(func() { _ = origin.Shutdown() })
	r := startEdge(t, "version: 1\nrules: []\n", func(c *config.Config) {
		c.Origins = []string{"http://" + ln.Addr().String()}
		c.Workers = 1
		c.TrustedProxies = trust.Set{mustPrefix("127.0.0.2/32")}
	})

	holder := dialFrom(t, "127.0.0.1", r.Addr())
	_, err = io.WriteString(holder, "GET /hold HTTP/1.1\r\nHost: a.example\r\n\r\n")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return arrived.Load() == 1 }, 5*time.Second, time.Millisecond)

	// A critical request (a trusted health check: it may wait up to 2 s)
	// queues behind it, and its client leaves.
	waiter := dialFrom(t, "127.0.0.2", r.Addr())
	_, err = io.WriteString(waiter, "GET /healthcheck HTTP/1.1\r\nHost: a.example\r\n\r\n")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.shed.Workers.Queued() == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, waiter.Close())
	require.Eventually(t, func() bool { return r.shed.Workers.Queued() == 0 }, 5*time.Second, time.Millisecond, "the waiter left the queue")

	release()
	resp, err := http.ReadResponse(holder.r, nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 1.0, metricSum(t, r, "edgeguard_edge_requests_total", "outcome", "abandoned"))
	// A request after it is served, on the worker the gone one would
	// have taken.
	require.Equal(t, http.StatusOK, r.get(t, "/after").StatusCode)
	require.Zero(t, gone.Load(), "the gone client's request reached the origin")
}

const apiHostTwice = `
version: 1
rules:
  - id: api-host
    match: {hosts: [api.example.com]}
    key: [ip]
    algorithm: sliding_log
    limit: 2
    window: 1h
`

// HTTP/1.0 may leave Host out; a request without one must not skip host
// rules nor reach the origin under the origin's own name.
func TestRequestWithoutHost(t *testing.T) {
	r := startEdge(t, apiHostTwice, nil)
	for range 2 {
		resp, body := raw(t, r.Addr(), "GET /x HTTP/1.0\r\n\r\n")
		p := requireProblem(t, resp, body, http.StatusBadRequest)
		require.Contains(t, p.Detail, "no usable Host")
	}
	for _, host := range []string{"", " ", "a b", "evil.com/x", "a@b", "user:pw@b", "[::1", "[::1]x", "h:99999999", "."} {
		resp, body := raw(t, r.Addr(), "GET /x HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "Host %q: %s", host, body)
	}

	// User info in an absolute-form target would reach the origin as an
	// Authorization field the rules never saw.
	resp, body := raw(t, r.Addr(), "GET http://user:pw@api.example.com/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", body)

	d := startEdge(t, apiHostTwice, func(c *config.Config) { c.DefaultHost = "api.example.com" })
	var got []int
	for range 4 {
		resp, body := raw(t, d.Addr(), "GET /x HTTP/1.0\r\n\r\n")
		got = append(got, resp.StatusCode)
		if resp.StatusCode == http.StatusOK {
			require.Equal(t, "api.example.com", echoed(t, body)["host"], "the origin sees the host the rules saw")
		}
	}
	require.Equal(t, []int{200, 200, 429, 429}, got)
}

// What an untrusted peer sends to steer the origin — a client address, a
// scheme, a host, a path or a method — never reaches it; the edge writes
// its own forwarding fields. A trusted peer's pass.
func TestForwardingFieldsFromUntrustedPeersStripped(t *testing.T) {
	r := startEdge(t, perIP, func(c *config.Config) { c.TrustedProxies = trust.Set{mustPrefix("127.0.0.2/32")} })
	var spoof strings.Builder
	for _, name := range spoofedFields {
		fmt.Fprintf(&spoof, "%s: 6.6.6.6\r\n", name)
	}
	spoof.WriteString("X_Api_Key: smuggled\r\nX-Forwarded_For: 6.6.6.6\r\nX-Priority: critical\r\nX-Test-Mode: 0\r\n")
	req := "GET /p?q=1 HTTP/1.1\r\nHost: site.example\r\n" + spoof.String() + "\r\n"

	resp, body := dialFrom(t, "127.0.0.1", r.Addr()).do(t, req)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	got := echoed(t, body)
	headers := strings.ToLower(got["headers"])
	for _, name := range spoofedFields {
		switch name {
		case "x-forwarded-for", "forwarded", "x-forwarded-proto", "x-forwarded-host":
			continue // written by the edge, checked below
		}
		require.NotContains(t, headers, name+":", "untrusted %s reached the origin", name)
	}
	require.NotContains(t, headers, "6.6.6.6")
	require.NotContains(t, headers, "_", "header names with underscores are dropped")
	require.NotContains(t, headers, "x-priority", "an untrusted priority claim reached the origin")
	require.NotContains(t, headers, "x-test-mode", "an untrusted test-mode claim reached the origin")
	require.Equal(t, "127.0.0.1", got["xff"])
	require.Equal(t, "http", got["proto"])
	require.Equal(t, "for=127.0.0.1;proto=http;host=site.example", got["fwd"])

	resp, body = dialFrom(t, "127.0.0.2", r.Addr()).do(t, "GET /p HTTP/1.1\r\nHost: site.example\r\nX-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\nForwarded: for=203.0.113.9;proto=https\r\nX-Real-IP: 203.0.113.9\r\n\r\n")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	got = echoed(t, body)
	require.Equal(t, "203.0.113.9, 127.0.0.2", got["xff"])
	require.Equal(t, "https", got["proto"], "a trusted proxy's scheme is kept")
	require.Equal(t, "for=203.0.113.9;proto=https, for=127.0.0.2;proto=http;host=site.example", got["fwd"])
	require.Contains(t, got["headers"], "X-Real-Ip: 203.0.113.9")
	resp, body = dialFrom(t, "127.0.0.2", r.Addr()).do(t, "GET /p HTTP/1.1\r\nHost: site.example\r\nX-Priority: critical\r\n\r\n")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, echoed(t, body)["headers"], "X-Priority: critical", "a trusted proxy's priority is passed on")

	u := startEdge(t, perIP, func(c *config.Config) { c.AllowUnderscoresInHeaders = true })
	resp, body = raw(t, u.Addr(), "GET /p HTTP/1.1\r\nHost: site.example\r\nX_Api_Key: k\r\n\r\n")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, echoed(t, body)["headers"], "X_api_key: k", "--allow-underscores-in-headers passes them")
}

const queryKeyed = `
version: 1
rules:
  - id: per-key
    key: ["query:key"]
    algorithm: fixed_window
    limit: 1000
    window: 1m
`

// The request line reaches the origin byte for byte, even when the rules
// read the query (signed URLs must keep their exact bytes).
func TestRequestLineReachesOriginByteForByte(t *testing.T) {
	r := startEdge(t, queryKeyed, nil)
	for _, target := range []string{
		"/x?%7e=a%20b&%zz&a==b&a=1&&b=2&key=k",
		"/sig?X-Amz-Signature=ab%2Bcd%3D&X-Amz-Date=20260101T000000Z&key=k;v",
		"/a//b/%2e%2e/c%2Fd?key=k&key2=a+b",
		"/nokey?=",
		"/%7Euser/?key=%E2%82%AC",
	} {
		resp, body := raw(t, r.Addr(), "GET "+target+" HTTP/1.1\r\nHost: site.example\r\n\r\n")
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", target, body)
		require.Equal(t, target, echoed(t, body)["uri"])
	}
	resp, body := raw(t, r.Addr(), "GET http://site.example/abs?%7e=1&key=k HTTP/1.1\r\nHost: other.example\r\n\r\n")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "/abs?%7e=1&key=k", echoed(t, body)["uri"])
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// Shedder settings that would let anyone be critical, or hold critical
// waiters for a year, are refused at start and on reload, saying why.
func TestShedderSettingsThatHelpAttackersRefused(t *testing.T) {
	for name, doc := range map[string]string{
		"critical path any client chooses": `{"tiers": {"paths": [{"prefix": "/healthcheck", "tier": "critical"}]}}`,
		"critical waits a year":            `{"critical_queue_timeout": "8760h"}`,
	} {
		t.Run(name, func(t *testing.T) {
			cfg := config.DefaultConfig()
			cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
			cfg.DemoOrigin = true
			cfg.Shedder = filepath.Join(t.TempDir(), "shedder.json")
			require.NoError(t, os.WriteFile(cfg.Shedder, []byte(doc), 0o600))
			_, err := New(cfg, slog.New(slog.DiscardHandler))
			require.Error(t, err)
			require.Regexp(t, "critical needs trusted_only|critical_queue_timeout: must be in", err.Error())
		})
	}
}

const oneSlotPerIP = `
version: 1
rules:
  - id: one-at-a-time
    key: [ip]
    algorithm: concurrency
    limit: 1
    window: 1m
`

// A concurrency slot's release never holds the response back, even with
// Redis frozen (the response used to wait for the release call's whole
// timeout), and the slot is free again once Redis is back.
func TestReleaseNeverDelaysTheResponse(t *testing.T) {
	redis, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	defer redis.Close()
	thawed := false
	defer func() {
		if !thawed {
			redis.Thaw()
		}
	}()
	r := startEdge(t, oneSlotPerIP, func(c *config.Config) {
		c.Redis, c.KeySalt = redis.URL(), "release-test-salt-0123"
		// A release call may wait 10 × this (10 s) for a frozen Redis.
		c.RedisTimeout = time.Second
	})
	for len(slowArrived) > 0 {
		<-slowArrived
	}
	done := make(chan int, 1)
	go func() {
		resp, err := http.Get("http://" + r.Addr() + "/slow?ms=300")
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	<-slowArrived // at the origin, its slot taken
	redis.Freeze()
	select {
	case code := <-done:
		require.Equal(t, http.StatusOK, code)
	case <-time.After(5 * time.Second):
		t.Fatal("the response waited for the release of its slot")
	}
	redis.Thaw()
	thawed = true
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + r.Addr() + "/after")
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 15*time.Second, 50*time.Millisecond, "the slot was given back once Redis answered")
}
