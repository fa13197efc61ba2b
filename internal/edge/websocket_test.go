package edge

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// wsOrigin is a WebSocket echo origin on loopback (gorilla/websocket):
//
//	/ws      upgrades (subprotocols chat.v2, chat.v1) and echoes every
//	         message; the message "reset" makes it reset its connection
//	/refuse  answers 403 "no upgrade", upgrade or not
//	/seen    answers 200 with the Upgrade and Connection fields it got
//
// upgrades counts the upgrade requests that reached it; peers records, by path, the
// client address of each request (one per connection to it).
type wsOrigin struct {
	url      string
	upgrades atomic.Int64
	mu       sync.Mutex
	peers    map[string][]string
}

func startWSOrigin(t *testing.T) *wsOrigin {
	t.Helper()
	o := &wsOrigin{peers: map[string][]string{}}
	up := websocket.Upgrader{Subprotocols: []string{"chat.v2", "chat.v1"}, CheckOrigin: func(*http.Request) bool { return true }}
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		o.upgrades.Add(1) // before the 101 goes out
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		c.SetReadLimit(4 << 20)
		for {
			mt, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			if string(msg) == "reset" {
				tc := c.UnderlyingConn().(*net.TCPConn)
				_ = tc.SetLinger(0)
				_ = tc.Close()
				return
			}
			if err := c.WriteMessage(mt, msg); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/refuse", func(w http.ResponseWriter, r *http.Request) {
		o.record(r)
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, "no upgrade")
	})
	mux.HandleFunc("/seen", func(w http.ResponseWriter, r *http.Request) {
		o.record(r)
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "upgrade=%q connection=%q", r.Header.Get("Upgrade"), r.Header.Get("Connection"))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	o.url = srv.URL
	return o
}

func (o *wsOrigin) record(r *http.Request) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.peers[r.URL.Path] = append(o.peers[r.URL.Path], r.RemoteAddr)
}

func (o *wsOrigin) peersOf(path string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.peers[path]...)
}

// dialWS opens a WebSocket through the edge; resp is the handshake's
// answer (also when it was refused).
func dialWS(t *testing.T, r *running, protocols ...string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second, Subprotocols: protocols}
	c, resp, err := d.Dial("ws://"+r.Addr()+"/ws", nil)
	if c != nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, resp, err
}

// waitMetric polls a metric until it reaches want.
func waitMetric(t *testing.T, r *running, want float64, name string, match ...string) {
	t.Helper()
	err := proc.PollEvery(testenv.Within(t, 10*time.Second), 10*time.Millisecond, name, func(context.Context) error {
		if got := metricSum(t, r, name, match...); got != want {
			return fmt.Errorf("%s %v = %v, want %v", name, match, got, want)
		}
		return nil
	})
	require.NoError(t, err)
}

// A WebSocket through the edge: the handshake's subprotocol passes
// through, messages go both ways (a 1 MiB one too), ping and pong, the
// close handshake; the tunnel is counted open then closed, its bytes
// both ways, and its access-log line at close carries them.
func TestWebSocketEcho(t *testing.T) {
	o := startWSOrigin(t)
	path := filepath.Join(t.TempDir(), "access.log")
	r := startEdge(t, generous, func(c *config.Config) {
		c.Origins = []string{o.url}
		c.AccessLog = path
	})
	c, resp, err := dialWS(t, r, "chat.v2")
	require.NoError(t, err)
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	require.Equal(t, "chat.v2", c.Subprotocol(), "the origin's choice reaches the client")
	require.NotEmpty(t, resp.Header.Get("Sec-WebSocket-Accept"))
	require.NotEmpty(t, resp.Header.Get("RateLimit-Policy"), "the rules applied to the upgrade")
	waitMetric(t, r, 1, "edgeguard_origin_tunnels_open")

	require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte("hello")))
	mt, msg, err := c.ReadMessage()
	require.NoError(t, err)
	require.Equal(t, websocket.TextMessage, mt)
	require.Equal(t, "hello", string(msg))

	big := everyByte(1 << 20)
	require.NoError(t, c.WriteMessage(websocket.BinaryMessage, big))
	mt, msg, err = c.ReadMessage()
	require.NoError(t, err)
	require.Equal(t, websocket.BinaryMessage, mt)
	require.Equal(t, big, msg)

	pong := make(chan string, 1)
	c.SetPongHandler(func(data string) error { pong <- data; return nil })
	require.NoError(t, c.WriteControl(websocket.PingMessage, []byte("are you there"), time.Now().Add(5*time.Second)))
	require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte("after the ping")))
	_, msg, err = c.ReadMessage() // runs the pong handler on the way
	require.NoError(t, err)
	require.Equal(t, "after the ping", string(msg))
	require.Equal(t, "are you there", <-pong)

	require.NoError(t, c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye")))
	_, _, err = c.ReadMessage()
	var ce *websocket.CloseError
	require.ErrorAs(t, err, &ce, "the origin's close frame came back")
	require.Equal(t, websocket.CloseNormalClosure, ce.Code)
	require.NoError(t, c.Close())

	waitMetric(t, r, 0, "edgeguard_origin_tunnels_open")
	require.Equal(t, 1.0, metricSum(t, r, "edgeguard_origin_tunnels_total", "end", "client_closed")+
		metricSum(t, r, "edgeguard_origin_tunnels_total", "end", "origin_closed"))
	require.Zero(t, metricSum(t, r, "edgeguard_origin_tunnels_total", "end", "error"))
	require.Greater(t, metricSum(t, r, "edgeguard_origin_tunnel_bytes_total", "direction", "to_origin"), float64(1<<20))
	require.Greater(t, metricSum(t, r, "edgeguard_origin_tunnel_bytes_total", "direction", "to_client"), float64(1<<20))

	var closed map[string]any
	err = proc.PollEvery(testenv.Within(t, 10*time.Second), 10*time.Millisecond, "the tunnel's line", func(context.Context) error {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["outcome"] == "tunnel_closed" {
				closed = m
				return nil
			}
		}
		return errors.New("no tunnel_closed line yet")
	})
	require.NoError(t, err)
	require.Greater(t, closed["bytes_in"], float64(1<<20))
	require.Greater(t, closed["bytes_out"], float64(1<<20))
	require.Equal(t, "/ws", closed["path"])
	require.Contains(t, []any{"client_closed", "origin_closed"}, closed["end"])
}

// A concurrency rule of one holds its slot for the tunnel's whole life: a
// second upgrade is 429 (the origin never sees it) while the first is
// open, and 101 once it closed, whichever side ended it: the client's
// close, the origin resetting its connection, the client vanishing.
func TestWebSocketHoldsItsConcurrencySlot(t *testing.T) {
	o := startWSOrigin(t)
	r := startEdge(t, oneSlot, func(c *config.Config) { c.Origins = []string{o.url} })
	admitted := func() bool {
		c, resp, err := dialWS(t, r)
		if err == nil {
			c.Close()
			return true
		}
		require.NotNil(t, resp, err)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		return false
	}
	waitAdmitted := func(what string) {
		t.Helper()
		err := proc.PollEvery(testenv.Within(t, 10*time.Second), 20*time.Millisecond, what, func(context.Context) error {
			if !admitted() {
				return errors.New("still 429")
			}
			return nil
		})
		require.NoError(t, err)
	}
	ends := map[string]func(c *websocket.Conn){
		"client closes": func(c *websocket.Conn) { require.NoError(t, c.Close()) },
		"origin resets": func(c *websocket.Conn) {
			require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte("reset")))
			_, _, err := c.ReadMessage()
			require.Error(t, err)
		},
		"client vanishes": func(c *websocket.Conn) {
			tc := c.UnderlyingConn().(*net.TCPConn)
			require.NoError(t, tc.SetLinger(0))
			require.NoError(t, tc.Close())
		},
	}
	for _, name := range []string{"client closes", "origin resets", "client vanishes"} {
		t.Run(name, func(t *testing.T) {
			// The previous case's probe may still hold the slot a moment.
			var c *websocket.Conn
			err := proc.PollEvery(testenv.Within(t, 10*time.Second), 20*time.Millisecond, "the slot is free", func(context.Context) error {
				var resp *http.Response
				var err error
				c, resp, err = dialWS(t, r)
				if err != nil {
					require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
				}
				return err
			})
			require.NoError(t, err)
			before := o.upgrades.Load()
			require.False(t, admitted(), "the open tunnel holds the client's one slot")
			require.Equal(t, before, o.upgrades.Load(), "the refused upgrade never reached the origin")
			ends[name](c)
			waitAdmitted("the slot comes back when the tunnel closes")
		})
	}
	// The last probe's tunnel ends as its client closes it: wait for the
	// gauge to see it (a busy machine may not have got there yet).
	require.NoError(t, proc.PollEvery(testenv.Within(t, 10*time.Second), 20*time.Millisecond, "no tunnel open", func(context.Context) error {
		if n := metricSum(t, r, "edgeguard_origin_tunnels_open"); n != 0 {
			return fmt.Errorf("%v tunnels open", n)
		}
		return nil
	}))
	require.Positive(t, metricSum(t, r, "edgeguard_origin_tunnels_total", "end", "origin_closed"), "the reset")
}

// Neither side sending for --tunnel-idle-timeout closes the tunnel.
func TestWebSocketIdleTimeout(t *testing.T) {
	o := startWSOrigin(t)
	r := startEdge(t, generous, func(c *config.Config) {
		c.Origins = []string{o.url}
		c.TunnelIdleTimeout = 300 * time.Millisecond
	})
	c, _, err := dialWS(t, r)
	require.NoError(t, err)
	require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte("one")))
	_, msg, err := c.ReadMessage()
	require.NoError(t, err)
	require.Equal(t, "one", string(msg))
	_, _, err = c.ReadMessage() // returns when the edge closes the quiet tunnel
	require.Error(t, err)
	waitMetric(t, r, 1, "edgeguard_origin_tunnels_total", "end", "idle_timeout")
	require.Zero(t, metricSum(t, r, "edgeguard_origin_tunnels_open"))
}

// Past --max-tunnels an upgrade is 503 with Retry-After and a problem
// body, before the origin sees it.
func TestWebSocketTunnelCap(t *testing.T) {
	o := startWSOrigin(t)
	r := startEdge(t, generous, func(c *config.Config) {
		c.Origins = []string{o.url}
		c.MaxTunnels = 2
	})
	for range 2 {
		_, _, err := dialWS(t, r)
		require.NoError(t, err)
	}
	_, resp, err := dialWS(t, r)
	require.ErrorIs(t, err, websocket.ErrBadHandshake)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	require.Equal(t, int64(2), o.upgrades.Load())
	require.Equal(t, 1.0, metricSum(t, r, "edgeguard_origin_tunnels_refused_total"))
	require.Equal(t, 2.0, metricSum(t, r, "edgeguard_origin_tunnels_open"))
}

// A graceful shutdown closes open tunnels within --shutdown-timeout.
func TestWebSocketEndsOnShutdown(t *testing.T) {
	waiting(t)
	o := startWSOrigin(t)
	// 4 s: a second for the tunnels after they are cut, as with the
	// default --shutdown-timeout (TestStreamEndsOnShutdown).
	r := startEdge(t, generous, func(c *config.Config) {
		c.Origins = []string{o.url}
		c.ShutdownTimeout = 4 * time.Second
	})
	c, _, err := dialWS(t, r)
	require.NoError(t, err)
	closed := make(chan error, 1)
	go func() {
		_, _, err := c.ReadMessage()
		closed <- err
	}()
	r.stop()
	require.NoError(t, r.stopErr)
	select {
	case err := <-closed:
		require.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel outlived the shutdown")
	}
	require.Zero(t, r.origins.Tunnels.Open())
}

// An upgrade the origin refuses is an ordinary response: nothing is
// tunnelled, the origin connection is closed (not pooled), and the next
// bytes on the client connection are read as the next request, through
// the whole pipeline. A raw client sends both at once.
func TestUpgradeRefusedIsNotATunnel(t *testing.T) {
	o := startWSOrigin(t)
	r := startEdge(t, generous, func(c *config.Config) { c.Origins = []string{o.url} })
	c := dialRaw(t, r.Addr())
	_, err := io.WriteString(c, "GET /refuse HTTP/1.1\r\nHost: shop.example.com\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"+
		"GET /seen HTTP/1.1\r\nHost: shop.example.com\r\nX-Forwarded-For: 10.9.9.9\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(c)
	first, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(first.Body)
	require.Equal(t, http.StatusForbidden, first.StatusCode)
	require.Equal(t, "no upgrade", string(body))
	second, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "the bytes after the refused upgrade are a request the edge answers")
	require.Equal(t, http.StatusOK, second.StatusCode)
	require.NotEmpty(t, second.Header.Get("RateLimit-Policy"), "the second request went through the rules")
	body, _ = io.ReadAll(second.Body)
	require.Equal(t, `upgrade="" connection=""`, string(body))
	require.Zero(t, o.upgrades.Load())
	refused, seen := o.peersOf("/refuse"), o.peersOf("/seen")
	require.Len(t, refused, 1)
	require.Len(t, seen, 1)
	require.NotEqual(t, refused[0], seen[0], "the refused upgrade's origin connection was closed, not pooled")
	require.Zero(t, metricSum(t, r, "edgeguard_origin_tunnels_open"))
}

// What is never tunnelled: h2c (its streams would pass the rules unseen),
// an upgrade with a body, a POST; their Upgrade is stripped and the
// request proxied as usual.
func TestUpgradeNotTunnelled(t *testing.T) {
	o := startWSOrigin(t)
	r := startEdge(t, generous, func(c *config.Config) { c.Origins = []string{o.url} })
	for name, req := range map[string]string{
		"h2c":              "GET /seen HTTP/1.1\r\nHost: a.example\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
		"h2c among others": "GET /seen HTTP/1.1\r\nHost: a.example\r\nConnection: upgrade\r\nUpgrade: websocket, h2c\r\n\r\n",
		"with a body":      "GET /seen HTTP/1.1\r\nHost: a.example\r\nConnection: upgrade\r\nUpgrade: websocket\r\nContent-Length: 5\r\n\r\nhello",
		"POST":             "POST /seen HTTP/1.1\r\nHost: a.example\r\nConnection: upgrade\r\nUpgrade: websocket\r\nContent-Length: 0\r\n\r\n",
		"no Connection":    "GET /seen HTTP/1.1\r\nHost: a.example\r\nUpgrade: websocket\r\n\r\n",
		"HTTP/1.0":         "GET /seen HTTP/1.0\r\nHost: a.example\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			c := dialRaw(t, r.Addr())
			_, err := io.WriteString(c, req)
			require.NoError(t, err)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, `upgrade="" connection=""`, string(body))
			require.Empty(t, resp.Header.Get("Upgrade"))
		})
	}
	require.Zero(t, metricSum(t, r, "edgeguard_origin_tunnels_total"))
}

// rawUpgradeOrigin is an origin that speaks bytes: it reads one request
// header, sends it on reqs, and answers answer in a single write (a 101
// with the first bytes of the new protocol right behind it), then echoes.
// Other requests (the edge's health checks) get an empty 200.
func rawUpgradeOrigin(t *testing.T, answer string) (addr string, reqs <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	got := make(chan string, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				var head strings.Builder
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					head.WriteString(line)
					if line == "\r\n" {
						break
					}
				}
				if !strings.HasPrefix(head.String(), "GET /x ") { // the health check
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
					return
				}
				got <- head.String()
				if _, err := io.WriteString(c, answer); err != nil {
					return
				}
				_, _ = io.Copy(c, br)
			}()
		}
	}()
	return ln.Addr().String(), got
}

// The bytes an origin sends right behind its 101 reach the client first,
// then the tunnel echoes; the origin got the upgrade's fields back after
// the hop-by-hop stripping, and the edge's forwarding fields. A 101 that
// names no protocol is a 502, never a tunnel.
func TestUpgradeRawBytes(t *testing.T) {
	const greeting = "hello before you asked"
	for name, tc := range map[string]struct {
		answer string
		status int
	}{
		"101 and bytes behind it": {"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n" + greeting, http.StatusSwitchingProtocols},
		"101 without Upgrade":     {"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\r\n" + greeting, http.StatusBadGateway},
	} {
		t.Run(name, func(t *testing.T) {
			addr, reqs := rawUpgradeOrigin(t, tc.answer)
			r := startEdge(t, generous, func(c *config.Config) { c.Origins = []string{"http://" + addr} })
			c := dialRaw(t, r.Addr())
			_, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: a.example\r\nConnection: keep-alive, Upgrade\r\nUpgrade: echo\r\n\r\n")
			require.NoError(t, err)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			require.Equal(t, tc.status, resp.StatusCode)
			head := <-reqs
			require.Contains(t, head, "Upgrade: echo\r\n")
			require.Contains(t, head, "Connection: Upgrade\r\n")
			require.Contains(t, head, "X-Forwarded-For: 127.0.0.1\r\n")
			if tc.status != http.StatusSwitchingProtocols {
				body, _ := io.ReadAll(resp.Body)
				require.NotContains(t, string(body), greeting)
				return
			}
			require.Equal(t, "echo", resp.Header.Get("Upgrade"))
			first := make([]byte, len(greeting))
			_, err = io.ReadFull(br, first)
			require.NoError(t, err)
			require.Equal(t, greeting, string(first))
			_, err = io.WriteString(c, "\x00\xffnot http at all\r\n")
			require.NoError(t, err)
			echo := make([]byte, len("\x00\xffnot http at all\r\n"))
			_, err = io.ReadFull(br, echo)
			require.NoError(t, err)
			require.Equal(t, "\x00\xffnot http at all\r\n", string(echo), "a tunnel passes bytes that are not HTTP")
		})
	}
}

// Over TLS (wss://, HTTP/1.1 by ALPN) the tunnel carries messages both
// ways too: the framing reader under the TLS connection is switched off.
func TestWebSocketOverTLS(t *testing.T) {
	o := startWSOrigin(t)
	site := newTLSSite(t)
	site.put(t, "shop.pem", "ecdsa", "shop.example.com")
	r, _ := startTLSEdge(t, site, generous, func(c *config.Config) { c.Origins = []string{o.url} })
	d := websocket.Dialer{
		HandshakeTimeout: 10 * time.Second,
		TLSClientConfig:  &tls.Config{RootCAs: site.ca.Pool, ServerName: "shop.example.com"},
		NetDialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var nd net.Dialer
			return nd.DialContext(ctx, "tcp", r.TLSAddr())
		},
	}
	c, resp, err := d.Dial("wss://shop.example.com/ws", nil)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	for _, m := range [][]byte{[]byte("over tls"), everyByte(64 << 10)} {
		require.NoError(t, c.WriteMessage(websocket.BinaryMessage, m))
		_, got, err := c.ReadMessage()
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
}

// everyByte is n bytes in which, at each offset modulo 4, every byte value
// occurs: whatever a client's 4-byte mask, the frame on the wire holds a
// bare LF and CR, which no HTTP/1.x reader would let through.
func everyByte(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i / 4)
	}
	return b
}

// An upgrade is counted by the rules like any request: with a per-client
// rule of 3 a minute, the fourth upgrade is 429 with the rule's fields and
// never reaches the origin; the three open tunnels are not disturbed.
func TestWebSocketUpgradesAreRateLimited(t *testing.T) {
	o := startWSOrigin(t)
	r := startEdge(t, perIP, func(c *config.Config) { c.Origins = []string{o.url} })
	var open []*websocket.Conn
	for range 3 {
		c, resp, err := dialWS(t, r)
		require.NoError(t, err)
		require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
		open = append(open, c)
	}
	_, resp, err := dialWS(t, r)
	require.ErrorIs(t, err, websocket.ErrBadHandshake)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
	require.Equal(t, int64(3), o.upgrades.Load(), "the denied upgrade never reached the origin")
	for i, c := range open {
		msg := fmt.Sprintf("tunnel %d", i)
		require.NoError(t, c.WriteMessage(websocket.TextMessage, []byte(msg)))
		_, got, err := c.ReadMessage()
		require.NoError(t, err)
		require.Equal(t, msg, string(got))
	}
}
