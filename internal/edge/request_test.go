package edge

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startEdgeArgs starts an in-process edge from command-line flags, as an
// operator would: loopback ports, the test origin, rulesYAML, then args.
func startEdgeArgs(t *testing.T, rulesYAML string, args ...string) *running {
	t.Helper()
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(rulesFile, []byte(rulesYAML), 0o600))
	cfg, err := ParseFlags(append([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--drain-delay", "0",
		"--origin", testOrigin(t), "--rules", rulesFile}, args...), env(nil), io.Discard)
	require.NoError(t, err)
	return startEdge(t, rulesYAML, func(c *Config) {
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

func requireProblem(t *testing.T, resp *http.Response, body []byte, status int) problem {
	t.Helper()
	require.Equal(t, status, resp.StatusCode, "%s", body)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), "%s", body)
	var p problem
	require.NoError(t, json.Unmarshal(body, &p), "%s", body)
	require.Equal(t, status, p.Status)
	return p
}

// A trusted proxy given in IPv4-mapped form is the IPv4 proxy.
func TestTrustedProxyMappedForm(t *testing.T) {
	r := startEdgeArgs(t, perIP, "--trusted-proxies", "::ffff:127.0.0.1/128")
	resp, body := raw(t, r.Addr(), "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.7\r\n\r\n")
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "203.0.113.7, 127.0.0.1", echoed(t, body)["xff"], "the proxy's hop is kept: it is trusted")
}
