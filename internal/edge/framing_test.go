package edge

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// recordingOrigin is an origin that keeps every byte it receives and
// counts the requests for /t/ paths (the edge's health checks are not).
type recordingOrigin struct {
	mu       sync.Mutex
	raw      bytes.Buffer
	requests atomic.Int64
}

func (o *recordingOrigin) bytes() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.raw.String()
}

type recordingListener struct {
	net.Listener
	o *recordingOrigin
}

func (l recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return recordingConn{c, l.o}, nil
}

type recordingConn struct {
	net.Conn
	o *recordingOrigin
}

func (c recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.o.mu.Lock()
	c.o.raw.Write(p[:n])
	c.o.mu.Unlock()
	return n, err
}

func startRecordingOrigin(t *testing.T) (*recordingOrigin, string) {
	t.Helper()
	o := &recordingOrigin{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if strings.HasPrefix(string(ctx.Path()), "/t/") {
			o.requests.Add(1)
		}
		ctx.SetBodyString("from the origin")
	}}
	go func() { _ = srv.Serve(recordingListener{ln, o}) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return o, "http://" + ln.Addr().String()
}

// exchangeAll writes req in one write on c, then reads every response
// until the edge closes the connection (a read deadline fails the test: a
// connection left open is what these tests look for).
func exchangeAll(t *testing.T, c net.Conn, req string) []*http.Response {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	_, err := io.WriteString(c, req)
	require.NoError(t, err)
	br := bufio.NewReader(c)
	var out []*http.Response
	for {
		if _, err := br.Peek(1); err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection is still open after %d responses", len(out))
			if !errors.Is(err, syscall.ECONNRESET) { // closed with bytes of ours unread
				require.ErrorIs(t, err, io.EOF)
			}
			return out
		}
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		out = append(out, resp)
	}
}

func dialEdge(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// A request with Transfer-Encoding and Content-Length is read as chunked
// and answered, then the connection ends (RFC 9112 §6.3): a balancer that
// took Content-Length for the body cannot slip the edge a request the
// balancer took for body bytes.
func TestTransferEncodingWithContentLengthAnsweredThenClosed(t *testing.T) {
	o, origin := startRecordingOrigin(t)
	r := startEdge(t, "version: 1\nrules: []\n", func(c *config.Config) { c.Origins = []string{origin} })
	for _, order := range []string{
		"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
		"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
	} {
		before := o.requests.Load()
		resps := exchangeAll(t, dialEdge(t, r.Addr()),
			"POST /t/first HTTP/1.1\r\nHost: a\r\n"+order+"\r\n0\r\n\r\n"+
				"GET /t/smuggled HTTP/1.1\r\nHost: a\r\n\r\n")
		require.Len(t, resps, 1, "one response, then the connection ends")
		require.Equal(t, 200, resps[0].StatusCode)
		require.True(t, resps[0].Close, "the answer says Connection: close")
		require.Equal(t, int64(1), o.requests.Load()-before, "the origin saw one request")
	}
	require.NotContains(t, o.bytes(), "/t/smuggled")
	require.NotContains(t, o.bytes(), "Content-Length: 4", "the origin gets the chunked body, chunked")

	// Without Content-Length, a chunked request keeps the connection.
	resps := exchangeAll(t, dialEdge(t, r.Addr()),
		"POST /t/a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n"+
			"GET /t/b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
	require.Len(t, resps, 2)
	require.False(t, resps[0].Close)
	require.Equal(t, 200, resps[1].StatusCode)
}

// A request line with two readings is refused and the connection closed:
// the origin sees nothing of it, the refusal is counted by reason.
func TestAmbiguousFramingRefused(t *testing.T) {
	o, origin := startRecordingOrigin(t)
	site := newTLSSite(t)
	site.put(t, "a.pem", "ecdsa", "a.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", func(c *config.Config) { c.Origins = []string{origin} })
	const get = "GET /t/refused HTTP/1.1\r\n"
	const post = "POST /t/refused HTTP/1.1\r\n"
	for _, tc := range []struct {
		name, req, reason string
		status            int
	}{
		{"chunked, identity", post + "Host: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", "transfer_encoding", 400},
		{"chunked, chunked", post + "Host: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", "transfer_encoding", 400},
		{"two TE fields", post + "Host: a\r\nTransfer-Encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n", "transfer_encoding", 400},
		{"TE in HTTP/1.0", "POST /t/refused HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "transfer_encoding", 400},
		{"obs-folded TE", post + "Host: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", "transfer_encoding", 400},
		{"xchunked", post + "Host: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", "transfer_coding", 501},
		{"identity with a length", post + "Host: a\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello", "transfer_coding", 501},
		{"obs-fold", get + "Host: a\r\nX-A: b\r\n c\r\n\r\n", "obs_fold", 400},
		{"space before the colon", post + "Host: a\r\nTransfer-Encoding : chunked\r\nContent-Length: 3\r\n\r\nabc", "field_syntax", 400},
		{"no colon", get + "Host: a\r\nX-A\r\n\r\n", "field_syntax", 400},
		{"two lengths", post + "Host: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nab", "content_length", 400},
		{"a signed length", post + "Host: a\r\nContent-Length: +1\r\n\r\na", "content_length", 400},
		{"bare LF everywhere", "GET /t/refused HTTP/1.1\nHost: a\n\n", "line_ending", 400},
		{"bare LF after the request line", "GET /t/refused HTTP/1.1\nHost: a\r\n\r\n", "line_ending", 400},
		{"bare LF after a field", get + "Host: a\nX-A: b\r\n\r\n", "line_ending", 400},
		{"bare LF ends the header", get + "Host: a\r\n\n", "line_ending", 400},
		{"bare CR", get + "Host: a\rX-A: b\r\n\r\n", "line_ending", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := metricSum(t, r, "edgeguard_edge_requests_refused_total", "reason", tc.reason)
			for _, over := range []string{"plain", "tls"} {
				var c net.Conn = dialEdge(t, r.Addr())
				if over == "tls" {
					tlsc, err := site.dialTLS(r, "a.example.com", nil)
					require.NoError(t, err)
					t.Cleanup(func() { tlsc.Close() })
					c = tlsc
				}
				resps := exchangeAll(t, c, tc.req)
				require.Len(t, resps, 1, over)
				body, _ := io.ReadAll(resps[0].Body)
				requireProblem(t, resps[0], body, tc.status)
				require.True(t, resps[0].Close, over)
			}
			require.Equal(t, before+2, metricSum(t, r, "edgeguard_edge_requests_refused_total", "reason", tc.reason))
		})
	}

	t.Run("pipelined after a good request", func(t *testing.T) {
		resps := exchangeAll(t, dialEdge(t, r.Addr()),
			"POST /t/good HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nGET /x"+
				"GET /t/refused HTTP/1.1\r\nHost: a\n\n")
		require.Len(t, resps, 2)
		require.Equal(t, 200, resps[0].StatusCode, "the body's bytes are body, not a request")
		require.Equal(t, 400, resps[1].StatusCode)
	})
	require.Equal(t, int64(1), o.requests.Load(), "only the good request reached the origin")
	require.NotContains(t, o.bytes(), "/t/refused")
}

// Every answer the edge gives itself is logged once, with its status and
// the client; the trust model's client where the request could be read.
func TestSelfAnsweredRequestsLogged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	r := startEdge(t, "version: 1\nrules: []\n", func(c *config.Config) {
		c.AccessLog = path
		c.ReadTimeout = time.Second // the slow header's 408
	})
	cases := []struct {
		name, req, reason string
		status            int
	}{
		{"control byte in a field", "GET /t HTTP/1.1\r\nHost: a\r\nX-A: a\x01b\r\n\r\n", "malformed", 400},
		{"control byte in the path", "GET /t\x01 HTTP/1.1\r\nHost: a\r\n\r\n", "malformed", 400},
		{"NUL in X-Forwarded-For", "GET /t HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.1\x00\r\n\r\n", "malformed", 400},
		{"HTTP/1.0 without Host", "GET /t HTTP/1.0\r\n\r\n", "host", 400},
		{"a space in Host", "GET /t HTTP/1.1\r\nHost: a b\r\n\r\n", "malformed", 400}, // fasthttp refuses the URI
		{"two Host fields", "GET /t HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "malformed", 400},
		{"a 100 KB header", "GET /t HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("b", 100<<10) + "\r\n\r\n", "header_too_large", 431},
		{"TRACE", "TRACE /t HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", "method", 405},
		{"CONNECT", "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\nConnection: close\r\n\r\n", "method", 405},
		{"a header that never ends", "GET /t HTTP/1.1\r\nHost: a\r\n", "timeout", 408},
		{"a bare LF", "GET /t HTTP/1.1\nHost: a\n\n", "line_ending", 400},
		{"a body too large, announced", "POST /t HTTP/1.1\r\nHost: a\r\nContent-Length: 20000000\r\nExpect: 100-continue\r\n\r\n", "body_too_large", 413},
	}
	for i, tc := range cases {
		before := metricSum(t, r, "edgeguard_edge_requests_refused_total", "reason", tc.reason)
		resps := exchangeAll(t, dialEdge(t, r.Addr()), tc.req)
		require.Len(t, resps, 1, tc.name)
		require.Equal(t, tc.status, resps[0].StatusCode, tc.name)
		lines := accessLines(t, path, i+1)
		require.Len(t, lines, i+1, "%s: one line per answer", tc.name)
		l := lines[i]
		require.Equal(t, tc.status, l.Status, tc.name)
		require.Equal(t, "127.0.0.1", l.Client, tc.name)
		require.Equal(t, "refused", l.Outcome, tc.name)
		require.Equal(t, tc.reason, l.Refusal, tc.name)
		require.Equal(t, before+1, metricSum(t, r, "edgeguard_edge_requests_refused_total", "reason", tc.reason), tc.name)
	}
	// A connection that sends nothing is answered 408 but asked nothing:
	// neither logged nor counted.
	resps := exchangeAll(t, dialEdge(t, r.Addr()), "")
	require.Equal(t, 408, resps[0].StatusCode)
	// One more request, logged: nothing else was written in between.
	resps = exchangeAll(t, dialEdge(t, r.Addr()), "TRACE /t HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
	require.Equal(t, 405, resps[0].StatusCode)
	require.Len(t, accessLines(t, path, len(cases)+1), len(cases)+1)
	require.Equal(t, 1.0, metricSum(t, r, "edgeguard_edge_requests_refused_total", "reason", "timeout"))
}

// A TLS handshake that fails asked nothing: no access-log line, no
// refusal (edgeguard_tls_handshakes_total counts it).
func TestFailedHandshakeIsNoRefusal(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "a.pem", "ecdsa", "a.example.com")
	path := filepath.Join(t.TempDir(), "access.log")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", func(c *config.Config) { c.AccessLog = path })
	_, err := site.dialTLS(r, "unknown.example.org", nil)
	require.Error(t, err)
	require.Eventually(t, func() bool {
		return metricSum(t, r, "edgeguard_tls_handshakes_total", "result", "no_cert") == 1
	}, 10*time.Second, 10*time.Millisecond)
	exchangeAll(t, dialEdge(t, r.Addr()), "TRACE /t HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
	lines := accessLines(t, path, 1)
	require.Len(t, lines, 1)
	require.Equal(t, 405, lines[0].Status)
	require.Equal(t, 1.0, metricSum(t, r, "edgeguard_edge_requests_refused_total"))
}

// A trusted proxy's refused request is logged with the client its
// X-Forwarded-For names, when the request could be read; with the socket
// peer when it could not (no field of it is trusted).
func TestRefusalLogsTheTrustModelsClient(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	r := startEdge(t, "version: 1\nrules: []\n", func(c *config.Config) {
		c.AccessLog = path
		c.TrustedProxies = append(c.TrustedProxies, mustPrefix("127.0.0.1/32"))
	})
	exchangeAll(t, dialEdge(t, r.Addr()), "TRACE /t HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.7\r\nConnection: close\r\n\r\n")
	exchangeAll(t, dialEdge(t, r.Addr()), "GET /t HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.7\nX: y\r\n\r\n")
	lines := accessLines(t, path, 2)
	require.Equal(t, "203.0.113.7", lines[0].Client)
	require.Equal(t, 405, lines[0].Status)
	require.Equal(t, "127.0.0.1", lines[1].Client)
	require.Equal(t, 400, lines[1].Status)
}

// A header that never ends, as a kept-alive connection's second request, is
// cut at --read-timeout from when that request began, though the socket's
// read deadline was set for the first (package deadline keeps it, and
// moves it on when it passes first): not earlier, which would cut a client
// that is slow but in time, and not never, which a slowloris counts on.
func TestSlowHeaderOnAKeptAliveConnectionCutAtItsOwnTimeout(t *testing.T) {
	waiting(t)
	const readTimeout = time.Second
	r := startEdge(t, "version: 1\nrules: []\n", func(c *config.Config) { c.ReadTimeout = readTimeout })
	c := dialEdge(t, r.Addr())
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	br := bufio.NewReader(c)
	_, err := io.WriteString(c, "GET /t HTTP/1.1\r\nHost: a\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	// The second request starts most of a timeout after the first (the
	// clock is the subject): the socket's deadline, set for the first,
	// passes while the second's header is awaited.
	time.Sleep(readTimeout * 3 / 4)
	start := time.Now()
	_, err = io.WriteString(c, "GET /t HTTP/1.1\r\nHost: a\r\n")
	require.NoError(t, err)
	resp, err = http.ReadResponse(br, nil)
	require.NoError(t, err, "the slow header was never cut")
	resp.Body.Close()
	require.Equal(t, 408, resp.StatusCode)
	require.GreaterOrEqual(t, time.Since(start), readTimeout, "cut before its own read timeout")
}
