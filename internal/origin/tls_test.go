package origin

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// tlsOrigin is an https origin on loopback whose certificate ca issued
// for "localhost" and "origin.test"; sni holds the server names its
// clients sent, resumed whether each handshake resumed a session.
type tlsOrigin struct {
	*testOrigin
	mu      sync.Mutex
	sni     []string
	resumed []bool
}

func startTLSOrigin(t *testing.T, ca *testenv.CA, handler fasthttp.RequestHandler) *tlsOrigin {
	t.Helper()
	leaf := ca.Issue(t, "ecdsa", "localhost", "origin.test")
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	o := &tlsOrigin{}
	o.testOrigin = &testOrigin{t: t, addr: ln.Addr().String(), handler: handler, tls: &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			o.mu.Lock()
			o.sni = append(o.sni, hello.ServerName)
			o.mu.Unlock()
			return nil, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			o.mu.Lock()
			o.resumed = append(o.resumed, cs.DidResume)
			o.mu.Unlock()
			return nil
		},
	}}
	o.serve(ln)
	t.Cleanup(o.stop)
	return o
}

// localURL names the origin "localhost", the name its certificate holds.
func (o *tlsOrigin) localURL() string {
	_, port, _ := net.SplitHostPort(o.addr)
	return "https://localhost:" + port
}

func (o *tlsOrigin) serverNames() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.sni...)
}

// slowHandshake is the dial timeout of the TLS tests (the handshake gets
// as much again): a loaded machine with the race detector can take more
// than the default second over a handshake.
const slowHandshake = 10 * time.Second

func problemDetail(t *testing.T, body []byte) string {
	t.Helper()
	var p problem
	require.NoError(t, json.Unmarshal(body, &p))
	return p.Detail
}

func TestTLSOrigin(t *testing.T) {
	ca := testenv.NewCA(t)
	other := testenv.NewCA(t)
	tests := []struct {
		name       string
		tls        TLSConfig
		ip         bool // the URL's host is 127.0.0.1, not localhost
		wantStatus int
		wantSNI    string
		wantLog    string
	}{
		{name: "ca_pem verifies the URL's host name", tls: TLSConfig{CAPEM: ca.PEM}, wantStatus: 200, wantSNI: "localhost"},
		{name: "system roots refuse a private CA", wantStatus: 502, wantLog: "certificate signed by unknown authority"},
		{name: "another CA is refused", tls: TLSConfig{CAPEM: other.PEM}, wantStatus: 502, wantLog: "certificate signed by unknown authority"},
		{name: "wrong server_name refused", tls: TLSConfig{CAPEM: ca.PEM, ServerName: "elsewhere.test"}, wantStatus: 502, wantLog: "not elsewhere.test"},
		{name: "server_name is the SNI and verified name", tls: TLSConfig{CAPEM: ca.PEM, ServerName: "origin.test"}, ip: true, wantStatus: 200, wantSNI: "origin.test"},
		{name: "an IP not in the certificate is refused", tls: TLSConfig{CAPEM: ca.PEM}, ip: true, wantStatus: 502, wantLog: "127.0.0.1"},
		{name: "insecure_skip_verify accepts", tls: TLSConfig{InsecureSkipVerify: true}, wantStatus: 200, wantSNI: "localhost"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := startTLSOrigin(t, ca, okHandler("secure"))
			cfg := DefaultConfig()
			cfg.URLs = []string{o.localURL()}
			if tc.ip {
				cfg.URLs = []string{o.url()}
			}
			cfg.HealthCheckInterval = 0
			cfg.DialTimeout = slowHandshake
			cfg.TLS = tc.tls
			var logs syncBuilder
			reg := prometheus.NewPedanticRegistry()
			p, err := New(cfg, reg, newTestLogger(&logs))
			require.NoError(t, err)
			t.Cleanup(p.Close)
			edge := startEdge(t, p, "203.0.113.7", "rid")

			resp := get(t, edge, "/")
			require.Equal(t, tc.wantStatus, resp.StatusCode(), "%s", resp.Body())
			if tc.wantStatus == 200 {
				require.Equal(t, "secure", string(resp.Body()))
				require.Equal(t, 1, len(o.requests()))
				require.Contains(t, o.serverNames(), tc.wantSNI)
				return
			}
			require.Equal(t, problemTLS.body, resp.Body())
			require.NotContains(t, problemDetail(t, resp.Body()), "x509", "no error text reaches the client")
			require.Empty(t, o.requests(), "nothing of the request reached the origin")
			got := gathered(t, reg)
			require.Equal(t, 1.0, got["edgeguard_origin_errors_total{pool=default,reason=tls}"])
			require.Equal(t, 0.0, got["edgeguard_origin_errors_total{pool=default,reason=other}"])
			require.Contains(t, logs.String(), "origin request failed")
			require.Contains(t, logs.String(), "reason=tls")
			require.Contains(t, logs.String(), tc.wantLog, "the log names the verification error")
		})
	}
}

func TestInsecureSkipVerifyWarns(t *testing.T) {
	cfg := DefaultConfig()
	cfg.URLs, cfg.HealthCheckInterval = []string{"https://" + closedAddr(t)}, 0
	for _, insecure := range []bool{false, true} {
		cfg.TLS.InsecureSkipVerify = insecure
		var logs syncBuilder
		p, err := New(cfg, nil, newTestLogger(&logs))
		require.NoError(t, err)
		p.Close()
		require.Equal(t, insecure, strings.Contains(logs.String(), "insecure_skip_verify"), logs.String())
	}
}

// A TLS handshake failure is a connection failure: retried on another
// origin (nothing of the request was sent, so a POST too), and counted
// toward ejection.
func TestTLSFailureRetriedAndEjected(t *testing.T) {
	ca := testenv.NewCA(t)
	good := startTLSOrigin(t, ca, okHandler("good"))
	bad := startTLSOrigin(t, testenv.NewCA(t), okHandler("bad"))
	cfg := DefaultConfig()
	cfg.URLs = []string{good.localURL(), bad.localURL()}
	cfg.HealthCheckInterval = 0
	cfg.DialTimeout = slowHandshake
	cfg.UnhealthyAfter = 2
	cfg.TLS.CAPEM = ca.PEM
	reg := prometheus.NewPedanticRegistry()
	p, err := New(cfg, reg, nil)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	for i := range 10 {
		resp := rawExchange(t, edge, "POST / HTTP/1.1\nHost: shop.example\nContent-Length: 2\n\nhi")
		require.Equal(t, 200, resp.StatusCode(), "request %d: %s", i, resp.Body())
		require.Equal(t, "good", string(resp.Body()))
	}
	require.Len(t, good.requests(), 10, "every POST reached the good origin once")
	require.Empty(t, bad.requests())
	require.Equal(t, []OriginStatus{{URL: good.localURL(), Healthy: true}, {URL: bad.localURL(), Healthy: false}}, p.Origins())
	got := gathered(t, reg)
	require.Equal(t, 2.0, got["edgeguard_origin_errors_total{pool=default,reason=tls}"], "tried until ejected, then no more")
	require.Equal(t, 1.0, got["edgeguard_origin_ejections_total{pool=default}"])
}

// Health checks speak the same TLS as requests.
func TestTLSHealthCheck(t *testing.T) {
	ca := testenv.NewCA(t)
	o := startTLSOrigin(t, ca, okHandler("ok"))
	for _, tc := range []struct {
		name    string
		ca      []byte
		healthy bool
	}{{"trusted", ca.PEM, true}, {"untrusted", testenv.NewCA(t).PEM, false}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.URLs = []string{o.localURL()}
			cfg.HealthCheckInterval = time.Hour // the first round runs at once
			cfg.DialTimeout = slowHandshake
			cfg.UnhealthyAfter = 1
			cfg.TLS.CAPEM = tc.ca
			before := o.checks() // before the first round, which starts at once
			p := newProxy(t, cfg)
			require.Eventually(t, func() bool {
				return o.checks() > before || !tc.healthy && p.Healthy() == 0
			}, 10*time.Second, 5*time.Millisecond)
			require.Equal(t, tc.healthy, p.Healthy() == 1)
		})
	}
}

// Bodies stream from an https origin as from a plain one: a large one
// whole and intact, an event stream event by event.
func TestTLSStreamedResponses(t *testing.T) {
	ca := testenv.NewCA(t)
	big := make([]byte, 8<<20)
	_, err := rand.Read(big)
	require.NoError(t, err)
	next := make(chan struct{})
	o := startTLSOrigin(t, ca, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/big":
			ctx.SetBody(big)
		case "/events":
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				_, _ = w.WriteString("data: 1\n\n")
				_ = w.Flush()
				<-next // the client has seen event 1 before event 2 exists
				_, _ = w.WriteString("data: 2\n\n")
			})
		}
	})
	cfg := DefaultConfig()
	cfg.URLs = []string{o.localURL()}
	cfg.HealthCheckInterval = 0
	cfg.DialTimeout = slowHandshake
	cfg.TLS.CAPEM = ca.PEM
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	resp := get(t, edge, "/big")
	require.Equal(t, 200, resp.StatusCode())
	require.Equal(t, sha256.Sum256(big), sha256.Sum256(resp.Body()))
	require.Equal(t, 1.0, counterValue(t, p.metrics.streams[endComplete]))

	conn, err := net.Dial("tcp", edge)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(conn, "GET /events HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	var head strings.Builder
	for !strings.Contains(head.String(), "data: 1\n\n") {
		line, err := br.ReadString('\n')
		require.NoError(t, err, "event 1 arrives while the stream is open: %q", head.String())
		head.WriteString(line)
	}
	require.Contains(t, head.String(), "Transfer-Encoding: chunked")
	close(next)
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	require.Contains(t, string(rest), "data: 2\n\n")
	require.Contains(t, string(rest), "\r\n0\r\n\r\n", "the stream ends properly")
}

// A new connection to an origin resumes the session of an earlier one.
func TestTLSSessionResumed(t *testing.T) {
	ca := testenv.NewCA(t)
	o := startTLSOrigin(t, ca, func(ctx *fasthttp.RequestCtx) {
		ctx.SetConnectionClose() // every request on a new connection
		ctx.SetBodyString("ok")
	})
	cfg := DefaultConfig()
	cfg.URLs = []string{o.localURL()}
	cfg.HealthCheckInterval = 0
	cfg.DialTimeout = slowHandshake
	cfg.TLS.CAPEM = ca.PEM
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")
	for range 3 {
		require.Equal(t, 200, get(t, edge, "/").StatusCode())
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	require.Equal(t, []bool{false, true, true}, o.resumed)
}

// An https URL pointing at a plain HTTP server (or anything else that is
// not TLS) is a failed handshake, never a response parsed from garbage.
func TestTLSToPlainOrigin(t *testing.T) {
	plain := startOrigin(t, okHandler("plain"))
	cfg := DefaultConfig()
	cfg.URLs = []string{"https://" + plain.addr}
	cfg.HealthCheckInterval = 0
	cfg.DialTimeout = slowHandshake
	reg := prometheus.NewPedanticRegistry()
	p, err := New(cfg, reg, nil)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	resp := get(t, edge, "/")
	require.Equal(t, 502, resp.StatusCode())
	require.Equal(t, problemTLS.body, resp.Body())
	require.Equal(t, 1.0, gathered(t, reg)["edgeguard_origin_errors_total{pool=default,reason=tls}"])
}

// EndStreams cuts a body streaming from an https origin as from a plain one.
func TestTLSEndStreams(t *testing.T) {
	ca := testenv.NewCA(t)
	hold := make(chan struct{})
	o := startTLSOrigin(t, ca, func(ctx *fasthttp.RequestCtx) {
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			_, _ = w.WriteString("data: 1\n\n")
			_ = w.Flush()
			<-hold
		})
	})
	t.Cleanup(func() { close(hold) }) // before the origin's shutdown waits for the writer
	cfg := DefaultConfig()
	cfg.URLs = []string{o.localURL()}
	cfg.HealthCheckInterval = 0
	cfg.DialTimeout = slowHandshake
	cfg.TLS.CAPEM = ca.PEM
	p := newProxy(t, cfg)
	edge := startEdge(t, p, "203.0.113.7", "rid")

	conn, err := net.Dial("tcp", edge)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: shop.example\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	status, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 200 OK\r\n", status)
	p.EndStreams()
	rest, err := io.ReadAll(br)
	require.NoError(t, err, "the edge closes the connection")
	require.NotContains(t, string(rest), "\r\n0\r\n\r\n", "no last chunk: cut short")
	require.Equal(t, 1.0, counterValue(t, p.metrics.streams[endShutdown]))
}
