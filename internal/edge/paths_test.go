package edge

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// lineOrigin is an origin on a raw socket that records the request line of
// every request carrying X-Probe (so health checks are left out) under the
// probe's value, and answers 200 "ok".
type lineOrigin struct {
	addr  string
	mu    sync.Mutex
	lines map[string]string
}

func startLineOrigin(t *testing.T) *lineOrigin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	o := &lineOrigin{addr: ln.Addr().String(), lines: map[string]string{}}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				tp := textproto.NewReader(bufio.NewReader(c))
				for {
					line, err := tp.ReadLine()
					if err != nil {
						return
					}
					h, err := tp.ReadMIMEHeader()
					if err != nil {
						return
					}
					if p := h.Get("X-Probe"); p != "" {
						o.mu.Lock()
						o.lines[p] = line
						o.mu.Unlock()
					}
					if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
						return
					}
				}
			}()
		}
	}()
	return o
}

func (o *lineOrigin) line(probe string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lines[probe]
}

// rawGet sends one request with target as the request line's target, byte
// for byte, and returns the status and body.
func rawGet(t *testing.T, addr, target, host, probe string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nX-Probe: %s\r\nConnection: close\r\n\r\n", target, host, probe)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// pathRules limits /api to one request a minute per client and host.
const pathRules = `
version: 1
rules:
  - id: api
    key: [ip, host]
    algorithm: sliding_log
    limit: 1
    window: 1m
    match: {path_prefix: ["/api"]}
`

// pathHosts gives each semantics a wildcard, so each case below has a
// host, and so a counter, of its own.
const pathHosts = `version: 1
hosts:
  "*.rfc3986.example": {pool: default}
  "*.servlet.example": {pool: default, path_semantics: servlet}
  "*.ci.example": {pool: default, path_semantics: case-insensitive}
  "*.windows.example": {pool: default, path_semantics: windows}
  "*.strict.example": {pool: default, path_semantics: servlet, refuse_ambiguous_paths: true}
  "*.fwd.example": {pool: default, path_semantics: servlet+windows, forward_normalized_path: true}
`

// Each named input, through a real edge and a host under each semantics:
// a path its origin would serve under /api is limited (200 then 429), one
// it would not is passed (200, 200), an ambiguous one on a host that
// refuses them gets 400; and the origin gets the request line as the
// client sent it, unless its host asks for the normalised path.
func TestPathSemanticsDecideTheRules(t *testing.T) {
	o := startLineOrigin(t)
	file := filepath.Join(t.TempDir(), "hosts.yaml")
	require.NoError(t, os.WriteFile(file, []byte(pathHosts), 0o600))
	r := startEdge(t, pathRules, func(c *config.Config) { c.Origins, c.Hosts = []string{"http://" + o.addr}, file })

	const (
		limited = "limited"
		passed  = "passed"
		refused = "refused"
	)
	cases := []struct {
		sem, target, want string
		host              string // the Host field when not the case's own
		origin            string // the origin's request target when not target
	}{
		{sem: "rfc3986", target: "/api/x", want: limited},
		{sem: "rfc3986", target: "/public/x", want: passed},
		// An rfc3986 origin serves these where they say: not under /api.
		{sem: "rfc3986", target: "/public/..;/api/x", want: passed},
		{sem: "rfc3986", target: "/API/x", want: passed},
		{sem: "rfc3986", target: "/api%3bx/y", want: passed},

		{sem: "servlet", target: "/public/..;/api/x", want: limited},
		{sem: "servlet", target: "/api;jsessionid=1/x", want: limited},
		{sem: "servlet", target: "/public;x/../api/x", want: limited},
		{sem: "servlet", target: "/api%u002fx", want: limited},
		{sem: "servlet", target: "/api/x#frag", want: limited, origin: "/api/x"},
		// An encoded ';' is data: the container serves "/api;x/y".
		{sem: "servlet", target: "/api%3bx/y", want: passed},
		// Overlong UTF-8 is not '/' to Jetty (ISO-8859-1: "/apiÀ¯x").
		{sem: "servlet", target: "/api%c0%afx", want: passed},
		{sem: "servlet", target: "/API/x", want: passed},

		{sem: "ci", target: "/API/x", want: limited},
		{sem: "ci", target: "/Api/X", want: limited},
		// Dotless ı upper-cases to I, as i does; İ upper-cases to itself.
		{sem: "ci", target: "/ap%C4%B1/x", want: limited},
		{sem: "ci", target: "/AP%C4%B0/x", want: passed},

		{sem: "windows", target: `/api\x`, want: limited},
		{sem: "windows", target: "/api%5cx", want: limited},
		{sem: "windows", target: `/public\..\api\x`, want: limited},
		{sem: "windows", target: "/api./x", want: limited},
		{sem: "windows", target: "/api%20/x", want: limited},
		{sem: "windows", target: "/api%u002fx", want: limited},

		// Absolute form: the target's authority is the host, whatever
		// Host says, so its semantics decide.
		{sem: "servlet", target: "http://%s/public/..;/api/x", host: "h.rfc3986.example", want: limited, origin: "/public/..;/api/x"},
		{sem: "rfc3986", target: "http://%s/public/..;/api/x", host: "h.servlet.example", want: passed, origin: "/public/..;/api/x"},

		{sem: "strict", target: "/api/x", want: limited},
		{sem: "strict", target: "/api;jsessionid=1/x", want: refused},
		{sem: "strict", target: "/public/..;/api/x", want: refused},
		{sem: "strict", target: "/api%5cx", want: refused},
		{sem: "strict", target: "/api%u002fx", want: refused},
		{sem: "strict", target: "/api%c0%afx", want: refused},
		{sem: "strict", target: "/api./x", want: refused},
		{sem: "strict", target: "/api%20/x", want: refused},
		{sem: "strict", target: "/api/x#frag", want: refused},
		{sem: "strict", target: "/pub%2Fic/../api/x", want: refused},

		// The normalised path, escaped again, the query as sent.
		{sem: "fwd", target: `/public/..;/api%5cx`, want: limited, origin: "/api/x"},
		{sem: "fwd", target: "/public/../api/a%3fb%23c%25;p", want: limited, origin: "/api/a%3Fb%23c%25"},
		{sem: "fwd", target: "/x/./../api/y?q=%7e&a", want: limited, origin: "/api/y?q=%7e&a"},
	}
	refusals := 0
	for i, tc := range cases {
		host := fmt.Sprintf("c%d.%s.example", i, tc.sem)
		target := tc.target
		if strings.Contains(target, "%s") {
			target = fmt.Sprintf(target, host)
		}
		hostField := host
		if tc.host != "" {
			hostField = tc.host
		}
		t.Run(fmt.Sprintf("%s %s", tc.sem, tc.target), func(t *testing.T) {
			probe := fmt.Sprint(i)
			code, body := rawGet(t, r.Addr(), target, hostField, probe)
			if tc.want == refused {
				refusals++
				require.Equal(t, http.StatusBadRequest, code, body)
				require.Contains(t, body, "the request path is ambiguous")
				require.Empty(t, o.line(probe), "a refused request reached the origin")
				return
			}
			require.Equal(t, http.StatusOK, code, body)
			want := tc.origin
			if want == "" {
				want = tc.target
			}
			require.Equal(t, "GET "+want+" HTTP/1.1", o.line(probe), "what the origin got")
			code, body = rawGet(t, r.Addr(), target, hostField, probe+"b")
			switch tc.want {
			case limited:
				require.Equal(t, http.StatusTooManyRequests, code, "the rule must see /api: %s", body)
			case passed:
				require.Equal(t, http.StatusOK, code, "the rule must not see /api: %s", body)
			}
		})
	}
	require.Equal(t, float64(refusals), metricSum(t, r, "edgeguard_edge_requests_refused_total", "reason", "ambiguous_path"))
}

// An upgrade (WebSocket) reaches the origin with its request line as sent
// too, and with the normalised path where the host asks for it.
func TestUpgradeRequestLineAsSent(t *testing.T) {
	o := startLineOrigin(t)
	file := filepath.Join(t.TempDir(), "hosts.yaml")
	require.NoError(t, os.WriteFile(file, []byte(pathHosts), 0o600))
	r := startEdge(t, generous, func(c *config.Config) { c.Origins, c.Hosts = []string{"http://" + o.addr}, file })
	for i, tc := range []struct{ host, target, want string }{
		{"u.servlet.example", "/x/../ws;p=1/%2e/a%7e", "/x/../ws;p=1/%2e/a%7e"},
		{"u.fwd.example", "/x/../ws;p=1/%2e/a%7e", "/ws/a~"},
	} {
		c, err := net.Dial("tcp", r.Addr())
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		probe := fmt.Sprint("ws", i)
		_, err = fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Probe: %s\r\n\r\n", tc.target, tc.host, probe)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		resp.Body.Close()
		c.Close()
		require.Equal(t, "GET "+tc.want+" HTTP/1.1", o.line(probe), tc.host)
	}
}
