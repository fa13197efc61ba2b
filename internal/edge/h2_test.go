package edge

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// h2Client is Go's HTTP/2 client, dialling the edge's TLS listener for any
// name.
func h2Client(site *tlsSite, r *running) *http.Client {
	var d net.Dialer
	return h2ClientVia(site, func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", r.TLSAddr()) })
}

// h2ClientVia is Go's HTTP/2 client trusting site's CA, each of its
// connections from dial, whatever the request's name.
func h2ClientVia(site *tlsSite, dial func(context.Context) (net.Conn, error)) *http.Client {
	var protos http.Protocols
	protos.SetHTTP2(true)
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		Protocols:       &protos,
		TLSClientConfig: &tls.Config{RootCAs: site.ca.Pool},
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
	}}
}

func h2Get(t *testing.T, c *http.Client, url string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	return resp, body
}

func TestH2RequestPath(t *testing.T) {
	waiting(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, perIP, nil)
	c := h2Client(site, r)

	var got []int
	for i := range 4 {
		resp, body := h2Get(t, c, "https://shop.example.com/a/b?q=%7e1",
			"X-Forwarded-For", "6.6.6.6", "X-Forwarded-Proto", "http", "X_Api_Key", "k", "Cookie", "a=1", "Cookie", "b=2")
		require.Equal(t, 2, resp.ProtoMajor)
		got = append(got, resp.StatusCode)
		if i == 0 {
			echo := echoed(t, body)
			require.Equal(t, "https", echo["proto"], "X-Forwarded-Proto from the real connection")
			require.Equal(t, "shop.example.com", echo["host"], ":authority is the Host")
			require.Equal(t, "/a/b?q=%7e1", echo["uri"], "the path and query as sent")
			require.Equal(t, "127.0.0.1", echo["xff"], "an untrusted client's X-Forwarded-For dropped")
			require.NotContains(t, echo["headers"], "X_api_key", "underscored names dropped")
			require.Contains(t, echo["headers"], "Cookie: a=1; b=2", "cookies joined for HTTP/1.1")
			require.Equal(t, `"per-ip";q=3;w=60`, resp.Header.Get("RateLimit-Policy"))
			require.Equal(t, strconv.Itoa(len(body)), resp.Header.Get("Content-Length"))
		}
		if i == 3 {
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
			require.NotEmpty(t, resp.Header.Get("Retry-After"))
		}
	}
	require.Equal(t, []int{200, 200, 200, 429}, got, "one limit for the connection's streams")

	t.Run("a body goes on to the origin", func(t *testing.T) {
		r2, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
		c := h2Client(site, r2)
		for _, n := range []int{100, 200 << 10} {
			resp, err := c.Post("https://shop.example.com/up", "application/octet-stream", bytes.NewReader(make([]byte, n)))
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, 200, resp.StatusCode)
			require.Equal(t, strconv.Itoa(n), echoed(t, body)["body"])
			require.Equal(t, "POST", echoed(t, body)["method"])
		}
	})
	require.Equal(t, []int{429}, codes(t, r, 1, "/"), "one client over plain HTTP and HTTP/2")
	require.Equal(t, float64(1), metricSum(t, r, "edgeguard_tls_connections_total", "protocol", "h2"), "four requests, one connection")
	require.Equal(t, float64(4), metricSum(t, r, "edgeguard_edge_requests_total", "outcome", "proxied")+metricSum(t, r, "edgeguard_edge_requests_total", "outcome", "denied")-1,
		"the streams counted as requests (the plain request is one more)")
}

func TestH2Off(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, perIP, func(c *config.Config) { c.H2MaxStreams = 0 })
	c, err := site.dialTLS(r, "shop.example.com", nil)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "http/1.1", c.ConnectionState().NegotiatedProtocol)
}

func TestH2Curl(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "rsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, perIP, nil)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, site.ca.PEM, 0o600))
	_, port, _ := net.SplitHostPort(r.TLSAddr())
	for _, tc := range []struct{ flag, want string }{{"--http2", "2 200"}, {"--http1.1", "1.1 200"}} {
		out, err := exec.Command("curl", "-sS", tc.flag, "--cacert", ca, "--resolve", "shop.example.com:"+port+":127.0.0.1",
			"-o", "/dev/null", "-w", "%{http_version} %{http_code}", "https://shop.example.com:"+port+"/").CombinedOutput()
		require.NoError(t, err, string(out))
		require.Equal(t, tc.want, string(out))
	}
	require.Equal(t, float64(1), metricSum(t, r, "edgeguard_tls_connections_total", "protocol", "h2"))
	require.Equal(t, float64(1), metricSum(t, r, "edgeguard_tls_connections_total", "protocol", "http/1.1"))
}

// rawH2 is a hand-driven HTTP/2 client connection, for what Go's client
// will not send.
type rawH2 struct {
	c   *tls.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	buf bytes.Buffer
}

func dialRawH2(t *testing.T, site *tlsSite, r *running) *rawH2 {
	t.Helper()
	c, err := site.dialTLS(r, "shop.example.com", func(c *tls.Config) { c.NextProtos = []string{"h2"} })
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.Equal(t, "h2", c.ConnectionState().NegotiatedProtocol)
	_, err = io.WriteString(c, http2.ClientPreface)
	require.NoError(t, err)
	h := &rawH2{c: c, fr: http2.NewFramer(c, c)}
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	h.enc = hpack.NewEncoder(&h.buf)
	require.NoError(t, h.fr.WriteSettings())
	return h
}

// headers opens stream id with the given fields (pseudo-fields first).
func (h *rawH2) headers(t *testing.T, id uint32, end bool, fields ...string) error {
	h.buf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		require.NoError(t, h.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]}))
	}
	return h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.buf.Bytes(), EndStream: end, EndHeaders: true})
}

// status reads frames until stream id's response header, and returns its
// :status (0 if the stream was reset).
func (h *rawH2) status(t *testing.T, id uint32) int {
	t.Helper()
	for {
		f, err := h.fr.ReadFrame()
		require.NoError(t, err)
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamID == id {
				n, _ := strconv.Atoi(f.PseudoValue("status"))
				return n
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				return 0
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(t, h.fr.WriteSettingsAck())
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v before stream %d's answer", f.ErrCode, id)
		}
	}
}

// untilClosed reads until the edge ends the connection, reporting whether
// it did within the deadline and the GOAWAY code, if one came.
func (h *rawH2) untilClosed(d time.Duration) (closed bool, goAway http2.ErrCode) {
	_ = h.c.SetReadDeadline(time.Now().Add(d))
	goAway = ^http2.ErrCode(0)
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			var ne net.Error
			return !(errors.As(err, &ne) && ne.Timeout()), goAway
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			goAway = g.ErrCode
		}
	}
}

func TestH2Screen(t *testing.T) {
	waiting(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, perIP, nil)
	h := dialRawH2(t, site, r)
	get := func(authority string, extra ...string) []string {
		f := []string{":method", "GET", ":scheme", "https", ":path", "/", ":authority", authority}
		return append(f, extra...)
	}
	// Each refused request is answered (or its stream reset by x/net,
	// status 0) and never reaches the origin.
	before := metricSum(t, r, "edgeguard_edge_requests_total", "outcome", "proxied")
	var many []string
	for i := range 12 {
		many = append(many, "x-big-"+strconv.Itoa(i), strings.Repeat("a", 1000))
	}
	for i, tc := range []struct {
		name   string
		fields []string
		body   bool // the request goes on with a body (not sent)
		want   []int
	}{
		{"authority with user info", get("u@shop.example.com"), false, []int{0, 400}},
		{"authority no host rule could match", get("shop.example.com/x"), false, []int{0, 400}},
		{"empty authority", get(""), false, []int{0, 400}},
		{"method refused", []string{":method", "TRACE", ":scheme", "https", ":path", "/", ":authority", "shop.example.com"}, false, []int{405}},
		{"declared body above the limit", get("shop.example.com", "content-length", "99999999999"), true, []int{413}},
		{"header list above --max-header-bytes", get("shop.example.com", many...), false, []int{431}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := uint32(2*i + 1)
			require.NoError(t, h.headers(t, id, !tc.body, tc.fields...))
			require.Contains(t, tc.want, h.status(t, id))
		})
	}
	require.Equal(t, before, metricSum(t, r, "edgeguard_edge_requests_total", "outcome", "proxied"))
	require.NoError(t, h.headers(t, 101, true, get("shop.example.com")...))
	require.Equal(t, 200, h.status(t, 101), "the connection still serves")

	t.Run("one field above the header list limit ends the connection", func(t *testing.T) {
		h := dialRawH2(t, site, r)
		require.NoError(t, h.headers(t, 1, true, get("shop.example.com", "x-big", strings.Repeat("a", 16<<10))...))
		closed, code := h.untilClosed(5 * time.Second)
		require.True(t, closed)
		require.Equal(t, http2.ErrCodeCompression, code)
	})
}

func TestH2RapidResetClosesTheConnection(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
	h := dialRawH2(t, site, r)
	// HEADERS then RST_STREAM, as fast as the client can write, for at
	// most 20,000 streams: the edge must end it long before.
	sent := 0
	var werr error
	start := time.Now()
	for id := uint32(1); id < 40_000 && werr == nil; id += 2 {
		werr = h.headers(t, id, true, ":method", "GET", ":scheme", "https", ":path", "/slow?ms=50", ":authority", "shop.example.com")
		if werr == nil {
			werr = h.fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
		sent++
	}
	closed := werr != nil
	if !closed {
		closed, _ = h.untilClosed(10 * time.Second)
	}
	took := time.Since(start)
	require.True(t, closed, "the edge kept a connection that reset %d streams", sent)
	require.Less(t, sent, 20_000)
	t.Logf("closed after %d streams opened and reset", sent)
	floods := metricSum(t, r, "edgeguard_tls_h2_floods_total", "frame", "rst_stream") + metricSum(t, r, "edgeguard_tls_h2_floods_total", "frame", "early_resets")
	require.Equal(t, float64(1), floods)
	// What reached the request path is bounded by the budget (its burst,
	// and its rate over the flood's time), not by what the client sent.
	last := -1.0
	require.Eventually(t, func() bool { // the closed connection's handlers end
		n := metricSum(t, r, "edgeguard_edge_requests_total")
		stable := n == last
		last = n
		return stable
	}, 10*time.Second, 200*time.Millisecond)
	bound := 200 + 100*took.Seconds() + 50 // the reset budget: a burst of 200, 100 a second
	require.LessOrEqual(t, last, bound, "%d streams sent in %s", sent, took)
	t.Logf("%.0f reached the request path (bound %.0f) in %s", last, bound, took.Round(time.Millisecond))
}

func TestH2ControlFloodClosesTheConnection(t *testing.T) {
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, perIP, nil)
	for _, tc := range []struct {
		name string
		send func(h *rawH2) error
	}{
		{"PING", func(h *rawH2) error { return h.fr.WritePing(false, [8]byte{1}) }},
		{"SETTINGS", func(h *rawH2) error { return h.fr.WriteSettings() }},
		{"PRIORITY", func(h *rawH2) error {
			return h.fr.WritePriority(1, http2.PriorityParam{StreamDep: 0, Weight: 1})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := metricSum(t, r, "edgeguard_tls_h2_floods_total", "frame", "control")
			h := dialRawH2(t, site, r)
			var err error
			n := 0
			for ; n < 5000 && err == nil; n++ {
				err = tc.send(h)
			}
			closed := err != nil
			if !closed {
				closed, _ = h.untilClosed(10 * time.Second)
			}
			require.True(t, closed)
			require.Equal(t, before+1, metricSum(t, r, "edgeguard_tls_h2_floods_total", "frame", "control"))
		})
	}
	t.Run("a few pings are fine", func(t *testing.T) {
		h := dialRawH2(t, site, r)
		for range 20 {
			require.NoError(t, h.fr.WritePing(false, [8]byte{2}))
		}
		require.NoError(t, h.headers(t, 1, true, ":method", "GET", ":scheme", "https", ":path", "/", ":authority", "shop.example.com"))
		require.Equal(t, 200, h.status(t, 1))
	})
}

func TestH2MaxConcurrentStreams(t *testing.T) {
	waiting(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", func(c *config.Config) { c.H2MaxStreams = 3 })
	h := dialRawH2(t, site, r)
	// The server's SETTINGS name the limit.
	for {
		f, err := h.fr.ReadFrame()
		require.NoError(t, err)
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			v, ok := s.Value(http2.SettingMaxConcurrentStreams)
			require.True(t, ok)
			require.Equal(t, uint32(3), v)
			require.NoError(t, h.fr.WriteSettingsAck())
			break
		}
	}
	// A fourth stream beyond the three slow ones is refused.
	for id := uint32(1); id <= 7; id += 2 {
		require.NoError(t, h.headers(t, id, true, ":method", "GET", ":scheme", "https", ":path", "/slow?ms=2000", ":authority", "shop.example.com"))
	}
	for {
		f, err := h.fr.ReadFrame()
		require.NoError(t, err)
		if rst, ok := f.(*http2.RSTStreamFrame); ok {
			require.Equal(t, uint32(7), rst.StreamID)
			// PROTOCOL_ERROR once the client acknowledged the limit (RFC 9113 §5.1.2).
			require.Contains(t, []http2.ErrCode{http2.ErrCodeRefusedStream, http2.ErrCodeProtocol}, rst.ErrCode)
			break
		}
	}
}

func TestH2GracefulShutdown(t *testing.T) {
	waiting(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
	h := dialRawH2(t, site, r)
	require.NoError(t, h.headers(t, 1, true, ":method", "GET", ":scheme", "https", ":path", "/", ":authority", "shop.example.com"))
	require.Equal(t, 200, h.status(t, 1))
	start := time.Now()
	r.stop()
	require.NoError(t, r.stopErr)
	require.Less(t, time.Since(start), 10*time.Second, "an idle h2 connection does not hold the shutdown")
	closed, code := h.untilClosed(5 * time.Second)
	require.True(t, closed)
	require.Equal(t, http2.ErrCodeNo, code, "a GOAWAY, not a dropped connection")
}

// Streams reuse their fasthttp request and response (h2Streams): streams
// running at once on one connection each get their own request through and
// their own response back, fields included.
func TestH2ConcurrentStreamsKeepTheirOwnRequests(t *testing.T) {
	waiting(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, "version: 1\nrules: []\n", nil)
	c := h2Client(site, r)
	resp, _ := h2Get(t, c, "https://shop.example.com/") // the connection, before the streams race to dial their own
	require.Equal(t, 200, resp.StatusCode)

	const workers, each = 4, 25
	errs := make(chan error, workers*each)
	for w := range workers {
		go func() {
			for i := range each {
				path := "/w" + strconv.Itoa(w) + "/" + strconv.Itoa(i)
				cookie := "a=" + strconv.Itoa(w) + "; b=" + strconv.Itoa(i)
				req, err := http.NewRequest(http.MethodGet, "https://shop.example.com"+path, nil)
				if err != nil {
					errs <- err
					continue
				}
				req.Header.Add("Cookie", "a="+strconv.Itoa(w))
				req.Header.Add("Cookie", "b="+strconv.Itoa(i))
				resp, err := c.Do(req)
				if err != nil {
					errs <- err
					continue
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case err != nil:
					errs <- err
				case resp.StatusCode != 200:
					errs <- errors.New(path + ": status " + resp.Status)
				case resp.Header.Get("Content-Length") != strconv.Itoa(len(body)):
					errs <- errors.New(path + ": Content-Length " + resp.Header.Get("Content-Length") + " for " + strconv.Itoa(len(body)) + " bytes")
				case !bytes.Contains(body, []byte(`"uri":"`+path+`"`)):
					errs <- errors.New(path + ": another stream's request: " + string(body))
				case !bytes.Contains(body, []byte("Cookie: "+cookie)) || bytes.Count(body, []byte("Cookie:")) != 1:
					errs <- errors.New(path + ": cookies not " + cookie + ": " + string(body))
				default:
					errs <- nil
				}
			}
		}()
	}
	for range workers * each {
		require.NoError(t, <-errs)
	}
	require.Equal(t, float64(1), metricSum(t, r, "edgeguard_tls_connections_total", "protocol", "h2"), "one connection for all streams")
}
