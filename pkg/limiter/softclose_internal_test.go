package limiter

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tcpPair is a loopback connection: the client's end wrapped softly, and
// the server's.
func tcpPair(t *testing.T) (*softConn, net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	srv, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { raw.Close(); srv.Close() })
	wrapped := newSoftConn(raw, nil)
	_, sys := wrapped.(syscall.Conn)
	require.True(t, sys, "a TCP connection keeps its SyscallConn (go-redis's health check)")
	return wrapped.(softSysConn).softConn, raw, srv
}

func exchange(t *testing.T, c net.Conn, srv net.Conn) {
	_, err := c.Write([]byte("PING\r\n"))
	require.NoError(t, err)
	buf := make([]byte, 16)
	_, err = srv.Read(buf)
	require.NoError(t, err)
	_, err = srv.Write([]byte("+PONG\r\n"))
	require.NoError(t, err)
	n, err := c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "+PONG\r\n", string(buf[:n]))
}

func TestSoftConnClosesAtOnceWithNothingOwed(t *testing.T) {
	c, raw, srv := tcpPair(t)
	exchange(t, c, srv)
	require.NoError(t, c.Close())
	_, err := raw.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed, "closed at once: every reply was read")
	require.NoError(t, c.Close(), "a second close is harmless")
}

func TestSoftConnReadsTheReplyOwed(t *testing.T) {
	c, raw, srv := tcpPair(t)
	exchange(t, c, srv)
	_, err := c.Write([]byte("PING\r\n"))
	require.NoError(t, err)
	require.True(t, c.owed())
	require.NoError(t, c.Close())

	_, err = c.Write([]byte("PING\r\n"))
	require.ErrorIs(t, err, net.ErrClosed, "nothing new is written once closed")
	// The reply arrives after the close and is read.
	_, err = srv.Write([]byte("+PONG\r\n"))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "+PONG\r\n", string(buf[:n]))

	// Reads end by the grace's end, whatever deadline is asked for.
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Hour)))
	_, err = c.Read(buf)
	require.Error(t, err)
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed), "%v", err)
	require.GreaterOrEqual(t, time.Since(start), replyGrace/2)
	// And the grace's end closes the connection.
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.closed
	}, 10*time.Second, 10*time.Millisecond)
	_, err = raw.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
}

func TestSoftConnSecondCloseIsFinal(t *testing.T) {
	c, raw, _ := tcpPair(t)
	_, err := c.Write([]byte("PING\r\n"))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	_, err = raw.Write([]byte("x"))
	require.NoError(t, err, "open for the reply owed")
	require.NoError(t, c.Close())
	_, err = raw.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
}

func TestSoftConnWithoutAFileDescriptor(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	w := newSoftConn(a, nil)
	_, sys := w.(syscall.Conn)
	require.False(t, sys)
	require.Equal(t, a, w.(interface{ NetConn() net.Conn }).NetConn())
	require.NoError(t, w.Close())
}

func TestSoftConnClosesAtOnceAfterAFailedRead(t *testing.T) {
	c, raw, _ := tcpPair(t)
	_, err := c.Write([]byte("PING\r\n"))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
	_, err = c.Read(make([]byte, 16))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.NoError(t, c.Close())
	_, err = raw.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed, "a read that timed out leaves nothing to read for")
}

func TestSoftConnKeepsAnEarlierDeadline(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	rec := &deadlineConn{Conn: a}
	c := newSoftConn(rec, nil).(*softConn)
	_, err := c.Write([]byte("PING\r\n"))
	require.NoError(t, err)
	soon := time.Now().Add(20 * time.Millisecond)
	require.NoError(t, c.SetReadDeadline(soon))
	require.NoError(t, c.Close())
	require.Equal(t, []time.Time{soon}, rec.set, "the reader's own deadline comes first: the close keeps it")

	// A later one is clamped to the grace's end.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Hour)))
	require.Len(t, rec.set, 2)
	require.WithinDuration(t, time.Now().Add(replyGrace), rec.set[1], replyGrace)
	require.True(t, rec.set[1].Before(time.Now().Add(replyGrace+time.Millisecond)))
	require.NoError(t, c.Close())
}

// deadlineConn records the read deadlines set, and swallows writes.
type deadlineConn struct {
	net.Conn
	set []time.Time
}

func (c *deadlineConn) Write(b []byte) (int, error) { return len(b), nil }

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.set = append(c.set, t)
	return c.Conn.SetReadDeadline(t)
}
