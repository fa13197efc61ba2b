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
		{"chunked, identity", post + "Host: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", reasonTransferEncoding, 400},
		{"chunked, chunked", post + "Host: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", reasonTransferEncoding, 400},
		{"two TE fields", post + "Host: a\r\nTransfer-Encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n", reasonTransferEncoding, 400},
		{"TE in HTTP/1.0", "POST /t/refused HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", reasonTransferEncoding, 400},
		{"obs-folded TE", post + "Host: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", reasonTransferEncoding, 400},
		{"xchunked", post + "Host: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", reasonTransferCoding, 501},
		{"identity with a length", post + "Host: a\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello", reasonTransferCoding, 501},
		{"obs-fold", get + "Host: a\r\nX-A: b\r\n c\r\n\r\n", reasonObsFold, 400},
		{"space before the colon", post + "Host: a\r\nTransfer-Encoding : chunked\r\nContent-Length: 3\r\n\r\nabc", reasonFieldSyntax, 400},
		{"no colon", get + "Host: a\r\nX-A\r\n\r\n", reasonFieldSyntax, 400},
		{"two lengths", post + "Host: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nab", reasonContentLength, 400},
		{"a signed length", post + "Host: a\r\nContent-Length: +1\r\n\r\na", reasonContentLength, 400},
		{"bare LF everywhere", "GET /t/refused HTTP/1.1\nHost: a\n\n", reasonLineEnding, 400},
		{"bare LF after the request line", "GET /t/refused HTTP/1.1\nHost: a\r\n\r\n", reasonLineEnding, 400},
		{"bare LF after a field", get + "Host: a\nX-A: b\r\n\r\n", reasonLineEnding, 400},
		{"bare LF ends the header", get + "Host: a\r\n\n", reasonLineEnding, 400},
		{"bare CR", get + "Host: a\rX-A: b\r\n\r\n", reasonLineEnding, 400},
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
		{"control byte in a field", "GET /t HTTP/1.1\r\nHost: a\r\nX-A: a\x01b\r\n\r\n", reasonMalformed, 400},
		{"control byte in the path", "GET /t\x01 HTTP/1.1\r\nHost: a\r\n\r\n", reasonMalformed, 400},
		{"NUL in X-Forwarded-For", "GET /t HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.1\x00\r\n\r\n", reasonMalformed, 400},
		{"HTTP/1.0 without Host", "GET /t HTTP/1.0\r\n\r\n", reasonHost, 400},
		{"a space in Host", "GET /t HTTP/1.1\r\nHost: a b\r\n\r\n", reasonMalformed, 400}, // fasthttp refuses the URI
		{"two Host fields", "GET /t HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", reasonMalformed, 400},
		{"a 100 KB header", "GET /t HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("b", 100<<10) + "\r\n\r\n", reasonHeaderTooLarge, 431},
		{"TRACE", "TRACE /t HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", reasonMethod, 405},
		{"CONNECT", "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\nConnection: close\r\n\r\n", reasonMethod, 405},
		{"a header that never ends", "GET /t HTTP/1.1\r\nHost: a\r\n", reasonTimeout, 408},
		{"a bare LF", "GET /t HTTP/1.1\nHost: a\n\n", reasonLineEnding, 400},
		{"a body too large, announced", "POST /t HTTP/1.1\r\nHost: a\r\nContent-Length: 20000000\r\nExpect: 100-continue\r\n\r\n", reasonBodyTooLarge, 413},
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
	require.Equal(t, 1.0, metricSum(t, r, "edgeguard_edge_requests_refused_total", "reason", reasonTimeout))
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

// The framer reads a stream the same however it is cut into reads.
func TestFramerReadsAnyCut(t *testing.T) {
	for _, tc := range []struct {
		name, stream string
		stop         string // what does not go on: the stream's end from the violation (or after the request that closes)
		err          *framingError
		closed       bool
	}{
		{"keep-alive requests", "GET / HTTP/1.1\r\nHost: a\r\n\r\n\r\nPOST / HTTP/1.1\r\ncontent-length: 3\r\n\r\nabcPOST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\nA;x=\"y\"\r\n0123456789\r\n0\r\nT: 1\r\n\r\n", "", nil, false},
		{"TE+CL ends the stream", "POST / HTTP/1.1\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\r\n\r\n", nil, true},
		{"a body's LF is body", "POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n\n\nGET /\n", "\n", errBareLF, false},
		{"a chunk's CRLF missing", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n", "y\r\n", errChunk, false},
		{"a chunk-size of 16 digits", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1000000000000000\r\n", "0\r\n", errChunk, false},
		{"a bare LF in a trailer", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: 1\n\r\n", "\n\r\n", errBareLF, false},
		{"obs-fold in a trailer", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: 1\r\n 2\r\n\r\n", " 2\r\n\r\n", errObsFold, false},
		{"a bare LF in a chunk extension", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1;a\nx\r\n", "\nx\r\n", errBareLF, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := len(tc.stream) - len(tc.stop)
			require.True(t, strings.HasSuffix(tc.stream, tc.stop))
			for _, cut := range []int{len(tc.stream), 1, 2, 7} {
				var f framer
				got := 0
				for i := 0; i < len(tc.stream); i += cut {
					p := []byte(tc.stream[i:min(i+cut, len(tc.stream))])
					k := f.scan(p)
					got += k
					if k < len(p) {
						break
					}
				}
				require.Equal(t, want, got, "cut %d", cut)
				require.Equal(t, tc.err, f.err, "cut %d", cut)
				require.Equal(t, tc.closed, f.state == fsClosed, "cut %d", cut)
			}
		})
	}
}

// BenchmarkFramer is what the framer adds to a typical browser request
// (a header block of about 500 bytes, no body).
func BenchmarkFramer(b *testing.B) {
	req := []byte("GET /v1/orders/12345?expand=items&limit=20 HTTP/1.1\r\nHost: api.example.com\r\n" +
		"User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n" +
		"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n" +
		"Accept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br, zstd\r\n" +
		"Cookie: session=0123456789abcdef0123456789abcdef; theme=dark\r\n" +
		"Connection: keep-alive\r\nUpgrade-Insecure-Requests: 1\r\nSec-Fetch-Dest: document\r\n" +
		"Sec-Fetch-Mode: navigate\r\nSec-Fetch-Site: none\r\nPriority: u=0, i\r\n\r\n")
	b.SetBytes(int64(len(req)))
	b.ReportAllocs()
	var f framer
	for b.Loop() {
		if f.scan(req) != len(req) {
			b.Fatal(f.err)
		}
	}
}

// FuzzFramerCuts: however a stream is cut into reads, the framer lets the
// same bytes on and ends in the same state.
func FuzzFramerCuts(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\n\n",
		"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n2;a=b\r\nxy\r\n0\r\nT: 1\r\n\r\nGET",
		"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
	} {
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, stream []byte, cut uint8) {
		var whole framer
		want := whole.scan(stream)
		var parts framer
		got := 0
		step := int(cut%64) + 1
		for i := 0; i < len(stream); i += step {
			p := stream[i:min(i+step, len(stream))]
			k := parts.scan(p)
			got += k
			if k < len(p) {
				break
			}
		}
		if got != want || parts.err != whole.err || (parts.state == fsClosed) != (whole.state == fsClosed) {
			t.Fatalf("cut %d: %d bytes on (%v), whole: %d (%v)", step, got, parts.err, want, whole.err)
		}
	})
}
