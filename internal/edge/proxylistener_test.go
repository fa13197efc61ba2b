package edge

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// Balancer connections waiting for their header are bounded: past the
// bound the oldest is closed (too_many_waiting), and one whose header
// comes promptly is served. Accept itself never waits for a header.
func TestProxyListenerBoundsWaitingHeaders(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refused"}, []string{"reason"})
	l := newProxyListener(inner, trustedSet{mustPrefix("127.0.0.2/32")}, 30*time.Second, refused, slog.New(slog.DiscardHandler))
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
	open := func() *rawConn {
		c := dialFrom(t, "127.0.0.2", l.Addr().String())
		<-accepted // Accept returned with the header not sent
		return c
	}
	answer := func(c *rawConn, client string) string {
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
