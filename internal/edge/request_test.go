package edge

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/problem"
)

// startEdgeArgs starts an in-process edge from command-line flags, as an
// operator would: loopback ports, the test origin, rulesYAML, then args.
func startEdgeArgs(t *testing.T, rulesYAML string, args ...string) *running {
	t.Helper()
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(rulesFile, []byte(rulesYAML), 0o600))
	cfg, err := config.ParseFlags(append([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--drain-delay", "0",
		"--origin", testOrigin(t), "--rules", rulesFile}, args...), func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	return startEdge(t, rulesYAML, func(c *config.Config) {
		origins, rules := c.Origins, c.Rules
		*c = cfg
		c.Origins, c.Rules = origins, rules
	})
}

// rawConn is a client connection that writes requests byte for byte, as no
// well-behaved HTTP client would.
type rawConn struct {
	net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(15*time.Second)))
	return &rawConn{Conn: c, r: bufio.NewReader(c)}
}

// do writes req as is and reads one response in full.
func (c *rawConn) do(t *testing.T, req string) (*http.Response, []byte) {
	t.Helper()
	_, err := io.WriteString(c, req)
	require.NoError(t, err)
	resp, err := http.ReadResponse(c.r, nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	return resp, body
}

// raw sends req on a fresh connection and reads one response.
func raw(t *testing.T, addr, req string) (*http.Response, []byte) {
	t.Helper()
	return dialRaw(t, addr).do(t, req)
}

func echoed(t *testing.T, body []byte) map[string]string {
	t.Helper()
	var m map[string]string
	require.NoError(t, json.Unmarshal(body, &m), "%s", body)
	return m
}

func requireProblem(t *testing.T, resp *http.Response, body []byte, status int) problem.Problem {
	t.Helper()
	require.Equal(t, status, resp.StatusCode, "%s", body)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), "%s", body)
	var p problem.Problem
	require.NoError(t, json.Unmarshal(body, &p), "%s", body)
	require.Equal(t, status, p.Status)
	return p
}

const apiHostOnce = `
version: 1
rules:
  - id: api-host
    match: {hosts: [api.example.com]}
    key: [ip]
    algorithm: sliding_log
    limit: 1
    window: 1h
`

// An absolute-form request-target names the host (RFC 9112 §3.2.2): the
// rules match it and the origin receives it, whatever Host says.
func TestAbsoluteFormMatchesAndForwardsOneHost(t *testing.T) {
	r := startEdgeArgs(t, apiHostOnce)
	resp, body := raw(t, r.Addr(), "GET /x HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "api.example.com", echoed(t, body)["host"])

	// The quota of api.example.com is spent; an absolute-form request for
	// another host cannot reach api.example.com by naming it in Host.
	resp, body = raw(t, r.Addr(), "GET http://other.test/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode, "other.test has no rule")
	require.Equal(t, "other.test", echoed(t, body)["host"], "the origin gets the host the rules matched")
	require.Empty(t, resp.Header.Get("RateLimit-Policy"))

	resp, _ = raw(t, r.Addr(), "GET http://api.example.com/x HTTP/1.1\r\nHost: other.test\r\n\r\n")
	require.Equal(t, 429, resp.StatusCode, "the authority wins over Host")
}

const perAPIKey = `
version: 1
rules:
  - id: per-key
    key: ["header:X-Api-Key"]
    algorithm: sliding_log
    limit: 1
    window: 1h
`

// A header the edge decides on (a rule key, a match, the priority) must
// have one value: a repeated one is refused with 400 before anything is
// counted or forwarded.
func TestRepeatedDecisionHeaderRefused(t *testing.T) {
	r := startEdgeArgs(t, perAPIKey)
	resp, body := raw(t, r.Addr(), "GET / HTTP/1.1\r\nHost: a\r\nX-Api-Key: k1\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "k1", echoed(t, body)["keys"])
	resp, _ = raw(t, r.Addr(), "GET / HTTP/1.1\r\nHost: a\r\nX-Api-Key: k1\r\n\r\n")
	require.Equal(t, 429, resp.StatusCode)

	for name, req := range map[string]string{
		"first empty":      "GET / HTTP/1.1\r\nHost: a\r\nX-Api-Key:\r\nX-Api-Key: k1\r\n\r\n",
		"two values":       "GET / HTTP/1.1\r\nHost: a\r\nX-Api-Key: k2\r\nx-api-key: k1\r\n\r\n",
		"repeated same":    "GET / HTTP/1.1\r\nHost: a\r\nX-Api-Key: k1\r\nX-Api-Key: k1\r\n\r\n",
		"repeated on post": "POST / HTTP/1.1\r\nHost: a\r\nX-Api-Key: k4\r\nX-Api-Key: k5\r\nContent-Length: 2\r\n\r\nhi",
	} {
		t.Run(name, func(t *testing.T) {
			resp, body := raw(t, r.Addr(), req)
			p := requireProblem(t, resp, body, 400)
			require.Contains(t, p.Detail, "repeated")
		})
	}
	require.EqualValues(t, 4, metricSum(t, r, "edgeguard_edge_requests_total", "outcome", "refused"))

	// A repeated query parameter a rule keys on, likewise.
	byQuery := startEdgeArgs(t, "version: 1\nrules:\n  - id: per-token\n    key: [\"query:token\"]\n    algorithm: fixed_window\n    limit: 1\n    window: 1m\n")
	resp, _ = raw(t, byQuery.Addr(), "GET /?token=a HTTP/1.1\r\nHost: a\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode)
	resp, body = raw(t, byQuery.Addr(), "GET /?token=&token=a HTTP/1.1\r\nHost: a\r\n\r\n")
	p := requireProblem(t, resp, body, 400)
	require.Contains(t, p.Detail, "query parameter token")

	// The priority header counts only from a trusted proxy; from one, it
	// too must not be repeated.
	trusted := startEdgeArgs(t, perAPIKey, "--trusted-proxies", "127.0.0.1")
	resp, body = raw(t, trusted.Addr(), "GET / HTTP/1.1\r\nHost: a\r\nX-Priority: critical\r\nX-Priority: test\r\nX-Api-Key: k3\r\n\r\n")
	p = requireProblem(t, resp, body, 400)
	require.Contains(t, p.Detail, "X-Priority")
}

// CONNECT and TRACE are refused with 405 unless --allow-methods names
// them; HTTP versions other than 1.0 and 1.1 get 505.
func TestMethodsAndVersionsRefused(t *testing.T) {
	r := startEdgeArgs(t, "version: 1\nrules: []\n")
	for _, c := range []struct {
		req    string
		status int
	}{
		{"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n", 405},
		{"TRACE / HTTP/1.1\r\nHost: a\r\n\r\n", 405},
		{"trace / HTTP/1.1\r\nHost: a\r\n\r\n", 405},
		{"GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505},
		{"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505},
		{"GET / HTTP/0.9\r\nHost: a\r\n\r\n", 505},
	} {
		t.Run(strings.Fields(c.req)[0]+" "+strings.Fields(c.req)[2], func(t *testing.T) {
			resp, body := raw(t, r.Addr(), c.req)
			requireProblem(t, resp, body, c.status)
			if c.status == 405 {
				require.NotEmpty(t, resp.Header.Get("Allow"))
				require.NotContains(t, resp.Header.Get("Allow"), "TRACE")
			}
		})
	}
	for _, req := range []string{"GET / HTTP/1.0\r\nHost: a\r\n\r\n", "PROPFIND / HTTP/1.1\r\nHost: a\r\n\r\n"} {
		resp, body := raw(t, r.Addr(), req)
		require.Equal(t, 200, resp.StatusCode, req)
		require.Equal(t, strings.Fields(req)[0], echoed(t, body)["method"])
	}

	allowed := startEdgeArgs(t, "version: 1\nrules: []\n", "--allow-methods", "TRACE")
	resp, body := raw(t, allowed.Addr(), "TRACE / HTTP/1.1\r\nHost: a\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "TRACE", echoed(t, body)["method"])
	resp, body = raw(t, allowed.Addr(), "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n")
	requireProblem(t, resp, body, 405)
}

// A body larger than --max-body-bytes gets 413 problem+json, whether its
// length is declared or it arrives in chunks.
func TestOversizedBodyAnswers413(t *testing.T) {
	r := startEdgeArgs(t, "version: 1\nrules: []\n", "--max-body-bytes", "10000")
	t.Run("declared", func(t *testing.T) {
		// The edge reads at most 8 KiB of a body before deciding.
		resp, body := raw(t, r.Addr(), "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 20000000\r\n\r\n"+strings.Repeat("x", 8<<10))
		requireProblem(t, resp, body, 413)
		require.True(t, resp.Close, "Connection: close")
	})
	t.Run("chunked", func(t *testing.T) {
		chunk := "1000\r\n" + strings.Repeat("y", 0x1000) + "\r\n"
		resp, body := raw(t, r.Addr(), "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"+strings.Repeat(chunk, 3)+"0\r\n\r\n")
		requireProblem(t, resp, body, 413)
	})
	t.Run("expect 100-continue", func(t *testing.T) {
		resp, body := raw(t, r.Addr(), "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 20000000\r\nExpect: 100-continue\r\n\r\n")
		requireProblem(t, resp, body, 413)
	})
	t.Run("within the limit", func(t *testing.T) {
		resp, body := raw(t, r.Addr(), "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10000\r\n\r\n"+strings.Repeat("z", 10000))
		require.Equal(t, 200, resp.StatusCode)
		require.Equal(t, "10000", echoed(t, body)["body"], "streamed to the origin in full")
		chunk := "800\r\n" + strings.Repeat("y", 0x800) + "\r\n"
		resp, body = raw(t, r.Addr(), "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"+strings.Repeat(chunk, 4)+"0\r\n\r\n")
		require.Equal(t, 200, resp.StatusCode)
		require.Equal(t, "8192", echoed(t, body)["body"])
	})
}

// A body the edge answers without reading (a 429 here) must not be read as
// the next request on the connection: the edge closes it.
func TestUnreadBodyClosesConnection(t *testing.T) {
	r := startEdgeArgs(t, perIP)
	c := dialRaw(t, r.Addr())
	for range 3 {
		resp, _ := c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		require.Equal(t, 200, resp.StatusCode)
	}
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
	resp, _ := c.do(t, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: "+strconv.Itoa(len(smuggled))+"\r\n\r\n"+smuggled)
	require.Equal(t, 429, resp.StatusCode)
	require.True(t, resp.Close, "Connection: close")
	n, err := c.r.Read(make([]byte, 1))
	require.Zero(t, n, "nothing after the 429: the body was not taken for a request")
	require.Error(t, err)
}

// While draining, every response carries Connection: close, so keep-alive
// clients leave before the listener closes.
func TestDrainTellsKeepAliveClientsToLeave(t *testing.T) {
	waiting(t)
	r := startEdgeArgs(t, "version: 1\nrules: []\n", "--drain-delay", "2s")
	c := dialRaw(t, r.Addr())
	resp, _ := c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode)
	require.False(t, resp.Close, "keep-alive before the drain")

	go r.stop()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + r.AdminAddr() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 503
	}, 5*time.Second, 5*time.Millisecond)
	resp, _ = c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode, "still served during the drain delay")
	require.True(t, resp.Close, "Connection: close")
	_, err := c.r.ReadByte()
	require.ErrorIs(t, err, io.EOF, "the edge closed the connection after answering")
}

// A trusted proxy given in IPv4-mapped form is the IPv4 proxy.
func TestTrustedProxyMappedForm(t *testing.T) {
	r := startEdgeArgs(t, perIP, "--trusted-proxies", "::ffff:127.0.0.1/128")
	resp, body := raw(t, r.Addr(), "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.7\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "203.0.113.7, 127.0.0.1", echoed(t, body)["xff"], "the proxy's hop is kept: it is trusted")
}

// One client address holds at most --max-conns-per-ip connections (256 by
// default); further ones are answered 429 and closed at accept. Other
// addresses, and trusted proxies, are not held back by it.
func TestConnectionCapPerClient(t *testing.T) {
	r := startEdgeArgs(t, "version: 1\nrules: []\n")
	const limit = 256 // the default
	var held []*rawConn
	for range limit {
		c := dialRaw(t, r.Addr())
		resp, _ := c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		require.Equal(t, 200, resp.StatusCode)
		held = append(held, c)
	}
	resp, body := raw(t, r.Addr(), "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	require.Equal(t, 429, resp.StatusCode, "%s", body)
	require.True(t, resp.Close)
	require.Contains(t, scrape(t, r), "edgeguard_edge_connections_refused_total 1\n")

	other := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	c, err := other.Dial("tcp", r.Addr())
	require.NoError(t, err)
	defer c.Close()
	oc := &rawConn{Conn: c, r: bufio.NewReader(c)}
	resp, _ = oc.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode, "another client is not affected")

	held[0].Close()
	require.Eventually(t, func() bool {
		c := dialRaw(t, r.Addr())
		defer c.Close()
		resp, _ := c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		return resp.StatusCode == 200
	}, 5*time.Second, 20*time.Millisecond, "a closed connection gives its slot back")

	// IPv6 clients are counted by their --ipv6-prefix network (::1 is one).
	v6 := startEdgeArgs(t, "version: 1\nrules: []\n", "--listen", "[::1]:0", "--max-conns-per-ip", "2")
	for range 2 {
		c := dialRaw(t, v6.Addr())
		resp, _ := c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		require.Equal(t, 200, resp.StatusCode)
	}
	resp, _ = raw(t, v6.Addr(), "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	require.Equal(t, 429, resp.StatusCode, "an IPv6 client is capped too")

	proxied := startEdgeArgs(t, "version: 1\nrules: []\n", "--max-conns-per-ip", "2", "--trusted-proxies", "127.0.0.1")
	for range 3 {
		c := dialRaw(t, proxied.Addr())
		resp, _ := c.do(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		require.Equal(t, 200, resp.StatusCode, "a trusted proxy carries many clients")
	}
}
