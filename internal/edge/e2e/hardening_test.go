package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// sourceAddrs are loopback client addresses: several clients, each under
// the default --max-conns-per-ip.
func sourceAddrs(n int) []net.IP {
	out := make([]net.IP, n)
	for i := range out {
		out[i] = net.IPv4(127, 0, 0, byte(2+i))
	}
	return out
}

// rssBytes is the resident set of a process (VmRSS).
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	require.Fail(t, "no VmRSS in /proc/PID/status")
	return 0
}

// procAddr is an IPv4 address and port as /proc/net/tcp prints them.
func procAddr(a *net.TCPAddr) string {
	ip := a.IP.To4()
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], a.Port)
}

// edgeSockets reads the kernel's view of the edge's accepted loopback
// connections from clients: for each client address (procAddr form), the
// bytes received but not yet read by the edge (rx_queue). An entry with 0
// is a socket whose request bytes the edge has consumed.
func edgeSockets(t *testing.T, edge *net.TCPAddr, clients map[string]bool) map[string]int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	require.NoError(t, err)
	local := procAddr(edge)
	out := map[string]int{}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 5 || f[1] != local || f[3] != "01" || !clients[f[2]] { // 01: ESTABLISHED
			continue
		}
		_, rxHex, _ := strings.Cut(f[4], ":")
		rx, err := strconv.ParseInt(rxHex, 16, 64)
		require.NoError(t, err)
		out[f[2]] = int(rx)
	}
	return out
}

// TestDeclaredBodiesCostNoMemory opens sockets that each declare a 10 MB
// body and send 1 byte of it, the way a client would tie up a server that
// reserves memory for declared bodies. The edge streams bodies, so the
// sockets cost it buffers, not the declared megabytes. The witness that
// the attack is real: the edge holds every socket open and has read each
// one's header and byte (the kernel's receive queue of each is empty).
func TestDeclaredBodiesCostNoMemory(t *testing.T) {
	const limit = 100 << 20 // above idle, for 300 sockets
	org := startOrigin(t, 0)
	e := startEdge(t, "--origin", org.URL, "--log-level", "warn")
	c := newClient(t, 1)
	for range 3 {
		r := get(c, e.url("/"))
		require.NoError(t, r.err)
		require.Equal(t, 200, r.code)
	}
	edgeAddr, err := net.ResolveTCPAddr("tcp", e.Addr)
	require.NoError(t, err)
	pid := e.Cmd.Process.Pid
	idle := rssBytes(t, pid)

	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	clients := map[string]bool{}
	sources := sourceAddrs(3)
	req := []byte("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Type: application/octet-stream\r\nContent-Length: 10000000\r\n\r\nx")
	figures := map[int]int64{}
	for _, n := range []int{100, 300} {
		for i := len(conns); i < n; i++ {
			d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: sources[i%len(sources)]}}
			conn, err := d.Dial("tcp", e.Addr)
			require.NoError(t, err)
			conns = append(conns, conn)
			clients[procAddr(conn.LocalAddr().(*net.TCPAddr))] = true
			_, err = conn.Write(req)
			require.NoError(t, err)
		}
		// Every socket is open at the edge and drained by it.
		var seen map[string]int
		require.Eventually(t, func() bool {
			seen = edgeSockets(t, edgeAddr, clients)
			if len(seen) != n {
				return false
			}
			for _, rx := range seen {
				if rx != 0 {
					return false
				}
			}
			return true
		}, 8*time.Second, 20*time.Millisecond, "the edge holds and has read all %d sockets", n)
		open := sum(scrape(t, e), "edgeguard_edge_open_connections")
		require.GreaterOrEqual(t, open, float64(n), "the edge counts the sockets as open connections")
		rss := rssBytes(t, pid)
		figures[n] = rss - idle
		t.Logf("%d sockets declaring 10 MB, 1 byte sent: RSS %.1f MB, idle %.1f MB, above idle %.1f MB",
			n, float64(rss)/(1<<20), float64(idle)/(1<<20), float64(rss-idle)/(1<<20))
	}
	require.LessOrEqual(t, figures[300], int64(limit), "300 sockets cost at most 100 MB above idle")

	// Other clients are served meanwhile.
	start := time.Now()
	r := get(c, e.url("/"))
	require.NoError(t, r.err)
	require.Equal(t, 200, r.code)
	require.Less(t, time.Since(start), 2*time.Second)
}

// TestSlowRequestsGetNoInstant502 holds 700 requests at a slow origin at
// once, at the default --workers: each admitted request gets an origin
// connection (the pool is sized to the workers), so none fails at once.
func TestSlowRequestsGetNoInstant502(t *testing.T) {
	const (
		inflight = 700
		delay    = 1500 * time.Millisecond
	)
	org := startOrigin(t, delay)
	e := startEdge(t, "--origin", org.URL, "--log-level", "warn")

	sources := sourceAddrs(7)
	var next sync.Mutex
	i := 0
	tr := &http.Transport{
		MaxConnsPerHost:     inflight,
		MaxIdleConnsPerHost: inflight,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			next.Lock()
			src := sources[i%len(sources)]
			i++
			next.Unlock()
			d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: src}}
			return d.DialContext(ctx, network, addr)
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	codes := make([]int, inflight)
	fast := make([]bool, inflight)
	var wg sync.WaitGroup
	for k := range inflight {
		wg.Go(func() {
			start := time.Now()
			r := get(client, e.url("/slow"))
			if r.err != nil {
				codes[k] = -1
				return
			}
			codes[k] = r.code
			fast[k] = time.Since(start) < delay/2
		})
	}
	wg.Wait()
	count := map[int]int{}
	instant := 0
	for k, c := range codes {
		count[c]++
		if c != 200 && fast[k] {
			instant++
		}
	}
	t.Logf("%d slow requests at once: status counts %v, %d answered instantly with an error", inflight, count, instant)
	require.Equal(t, inflight, count[200], "every request reaches the origin: %v", count)
	require.GreaterOrEqual(t, org.arrived.Load(), int64(inflight), "every request reached the origin (health checks come on top)")
	m := scrape(t, e)
	require.Zero(t, sum(m, "edgeguard_origin_errors_total", "reason", "no_free_conns"))
}

// TestStartRefusals: a node without an origin, or using Redis without a key
// salt, refuses to start and says what is missing.
func TestStartRefusals(t *testing.T) {
	for name, c := range map[string]struct {
		args []string
		want string
	}{
		"no origin":          {nil, "origin: required"},
		"redis without salt": {[]string{"--origin", "http://127.0.0.1:1", "--redis", cluster.URL(), "--redis-mode", "cluster"}, "key-salt: required with --redis"},
		"catch-all proxies":  {[]string{"--origin", "http://127.0.0.1:1", "--trusted-proxies", "0.0.0.0/0"}, "trusts every address"},
	} {
		t.Run(name, func(t *testing.T) {
			ports := freePorts(t, 2)
			e := spawnEdge(t, append([]string{"--listen", "127.0.0.1:" + strconv.Itoa(ports[0]), "--admin", "127.0.0.1:" + strconv.Itoa(ports[1])}, c.args...)...)
			code, exited := e.WaitExit(20 * time.Second)
			require.True(t, exited, "the edge must not start")
			require.Equal(t, 2, code)
			require.Contains(t, e.out.String(), c.want)
		})
	}
}
