package origin

import (
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// blackHole is a loopback address whose SYNs go unanswered: a listener
// with a backlog of 0, its one place in the accept queue taken and never
// accepted, so the kernel drops every later SYN (as a black-holed origin
// does, or a firewall).
func blackHole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err, "the connection that fills the accept queue")
	t.Cleanup(func() { c.Close() })
	return addr
}

// A dial whose deadline passes before the connection is made is a connect
// timeout: the request gets a 502, the timeout is counted by phase, and no
// late connection is.
func TestDialTimeoutAgainstABlackHole(t *testing.T) {
	addr := blackHole(t)
	p := newProxy(t, Config{URLs: []string{"http://" + addr}, DialTimeout: 200 * time.Millisecond})
	start := time.Now()
	resp := get(t, startEdge(t, p, "192.0.2.1", "r1"), "/")
	require.Equal(t, fasthttp.StatusBadGateway, resp.StatusCode())
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "given up before the dial timeout")
	require.Equal(t, 1.0, counterValue(t, p.metrics.timeouts[phaseConnect]))
	require.Equal(t, 1.0, counterValue(t, p.metrics.errors[reasonConnect]))
	require.Zero(t, counterValue(t, p.metrics.late))

	_, err := dialTCP(addr, 100*time.Millisecond, func() { t.Error("a black hole counted as a late connection") })
	require.ErrorIs(t, err, fasthttp.ErrDialTimeout)
}

// A dial whose goroutine sees its connection only after the deadline (here
// held there by the seam, as a CPU-starved edge holds it) is judged by
// the kernel: the socket was connected, so the request goes through, the
// origin is not blamed, and the late connection is counted.
func TestDialDeadlineAsksTheKernel(t *testing.T) {
	o := startOrigin(t, okHandler("hello"))
	p := newProxy(t, Config{URLs: []string{o.url()}, DialTimeout: time.Second, UnhealthyAfter: 1})
	checked := make(chan struct{})
	var once sync.Once
	dialHooks.Store(&dialSeams{
		connected: func() { <-checked }, // the dialing goroutine runs only after the deadline
		checked:   func() { once.Do(func() { close(checked) }) },
	})
	t.Cleanup(func() { dialHooks.Store(nil) })

	resp := get(t, startEdge(t, p, "192.0.2.1", "r1"), "/")
	require.Equal(t, fasthttp.StatusOK, resp.StatusCode())
	require.Equal(t, "hello", string(resp.Body()))
	require.Equal(t, 1.0, counterValue(t, p.metrics.late))
	require.Zero(t, counterValue(t, p.metrics.timeouts[phaseConnect]))
	require.Zero(t, counterValue(t, p.metrics.errors[reasonConnect]))
	require.True(t, p.origins[0].healthy.Load())
}

// isConnected tells a connected socket from one that is not (any more).
func TestIsConnected(t *testing.T) {
	o := startOrigin(t, okHandler(""))
	c, err := net.Dial("tcp", o.addr)
	require.NoError(t, err)
	raw, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	require.True(t, isConnected(raw))
	require.NoError(t, c.Close())
	require.False(t, isConnected(raw), "a closed socket")
}

// A name is resolved (IPv4, as fasthttp's dialer) and its addresses kept
// for the next dials.
func TestDialResolvesNames(t *testing.T) {
	o := startOrigin(t, okHandler(""))
	_, port, err := net.SplitHostPort(o.addr)
	require.NoError(t, err)
	name := net.JoinHostPort("localhost", port)
	dnsCache.Delete(name)
	for range 2 {
		c, err := dialTCP(name, time.Second, func() {})
		require.NoError(t, err)
		require.Equal(t, o.addr, c.RemoteAddr().String())
		c.Close()
	}
	v, ok := dnsCache.Load(name)
	require.True(t, ok)
	require.Equal(t, uint32(2), v.(*resolved).next.Load(), "both dials used the cached entry")
}

// BenchmarkDial compares a loopback dial with fasthttp's dialer (the one
// the edge used before the deadline asked the kernel) in the same run.
func BenchmarkDial(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	for _, d := range []struct {
		name string
		dial func() (net.Conn, error)
	}{
		{"fasthttp", func() (net.Conn, error) { return fasthttp.DialTimeout(addr, time.Second) }},
		{"edge", func() (net.Conn, error) { return dialTCP(addr, time.Second, func() {}) }},
	} {
		b.Run(d.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c, err := d.dial()
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}
