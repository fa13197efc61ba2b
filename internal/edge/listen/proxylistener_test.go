package listen

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/trust"
)

// Balancer connections waiting for their header are bounded: past the
// bound the oldest is closed (too_many_waiting), and one whose header
// comes promptly is served. Accept itself never waits for a header.
func TestProxyListenerBoundsWaitingHeaders(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refused"}, []string{"reason"})
	l := newProxyListener(inner, trust.Set{netip.MustParsePrefix("127.0.0.2/32")}, 30*time.Second, refused, slog.New(slog.DiscardHandler))
	l.maxWaiting = 2
	t.Cleanup(func() { _ = l.Close() })
	// Like the server: Accept in a loop, each connection in its own
	// goroutine, which answers with the client the header named.
	accepted := make(chan struct{}, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			go func() {
				defer c.Close()
				if _, err := c.Read(make([]byte, 1)); err == nil {
					_, _ = io.WriteString(c, c.RemoteAddr().String()+"\n")
				}
			}()
		}
	}()
	open := func() net.Conn {
		c := dialFrom(t, "127.0.0.2", l.Addr().String())
		<-accepted // Accept returned with the header not sent
		return c
	}
	answer := func(c net.Conn, client string) string {
		proxyHeader(t, c, 2, client)
		_, err := c.Write([]byte{'x'})
		require.NoError(t, err)
		line, err := bufio.NewReader(c).ReadString('\n')
		require.NoError(t, err)
		return line
	}

	first, second := open(), open()
	third := open()
	_, err = first.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the oldest waiting is closed")
	require.Equal(t, 1.0, testutil.ToFloat64(refused.WithLabelValues("too_many_waiting")))
	require.Equal(t, "203.0.113.3:40000\n", answer(third, "203.0.113.3"))
	require.Equal(t, "203.0.113.2:40000\n", answer(second, "203.0.113.2"), "the others wait on")
	require.Equal(t, 1.0, testutil.ToFloat64(refused.WithLabelValues("too_many_waiting")))
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Zero(t, l.waiting.Len(), "served connections leave the list")
}

// Whatever a balancer sends, the header reader ends: with a client that
// is an IP address (the balancer's own for headers without one), having
// read no byte past the header, or with an error the policy has a reason
// for. It never panics.
func FuzzProxyHeader(f *testing.F) {
	for _, seed := range []string{
		"PROXY TCP4 203.0.113.1 127.0.0.1 40000 80\r\nGET / HTTP/1.1\r\n\r\n",
		"PROXY TCP6 2001:db8::1 ::1 40000 80\r\n",
		"PROXY UNKNOWN ff ff\r\n",
		"PROXY TCP4 203.0.113.1 127.0.0.1 40000",
		"GET / HTTP/1.1\r\n\r\n",
		"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c\xcb\x00\x71\x01\x7f\x00\x00\x01\x9c\x40\x00\x50GET",
		"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x11\xcb\x00\x71\x01\x7f\x00\x00\x01\x9c\x40\x00\x50\x02\x00\x10ab",
		"\r\n\r\n\x00\r\nQUIT\n\x21\x00\x00\x03\x04\x00\x00",
		"\r\n\r\n\x00\r\nQUIT\n\x20\x31\x00\x00",
	} {
		f.Add([]byte(seed))
	}
	balancer := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 5000}
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 256)
		client, err := readProxyHeader(br, balancer)
		if err != nil {
			require.True(t, errors.Is(err, errNoProxyHeader) || errors.Is(err, errInvalidProxyHeader), "%v", err)
			return
		}
		require.True(t, addrOf(client).IsValid(), "%v", client)
		rest, _ := io.ReadAll(br)
		require.True(t, bytes.HasSuffix(data, rest), "bytes after the header are kept")
		require.Less(t, len(rest), len(data), "a header was read")
	})
}

// dialFrom connects to addr from a chosen loopback source address.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(15*time.Second)))
	return c
}

// proxyHeader writes a PROXY header (v1 or v2) naming client on c.
func proxyHeader(t *testing.T, c net.Conn, version byte, client string) {
	t.Helper()
	h := proxyproto.HeaderProxyFromAddrs(version, &net.TCPAddr{IP: net.ParseIP(client), Port: 40000}, c.RemoteAddr())
	_, err := h.WriteTo(c)
	require.NoError(t, err)
}
