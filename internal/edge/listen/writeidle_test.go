package listen

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// slowPair is a connection accepted through perWrite(d) and its client,
// whose receive buffer is small so that what the client has not read
// stays with the server.
func slowPair(t *testing.T, d time.Duration) (server, client net.Conn) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := perWrite(raw, d)
	t.Cleanup(func() { ln.Close() })
	dialer := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10) }); err != nil {
			return err
		}
		return serr
	}}
	client, err = dialer.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	server, err = ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { server.Close() })
	return server, client
}

// The accepted socket carries TCP_NOTSENT_LOWAT from the listener: the
// kernel holds at most that much unsent, so a slow reader's progress is
// seen by the write timeout.
func TestPerWriteSetsNotSentLowat(t *testing.T) {
	server, _ := slowPair(t, time.Second)
	rc, err := server.(*perWriteConn).NetConn().(interface{ NetConn() net.Conn }).NetConn().(syscall.Conn).SyscallConn()
	require.NoError(t, err)
	var v int
	var gerr error
	require.NoError(t, rc.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpNotSentLowat) }))
	require.NoError(t, gerr)
	require.Equal(t, notSentLowat, v)
}

// A client reading slowly but steadily is never cut, however long one
// write of the server's takes in all: each wait is bounded by d, not the
// write. Here one write of 1 MiB lasts about 2.5 s for a client taking
// 16 KiB every 40 ms, with d 1 s.
func TestPerWriteSlowReaderIsNotCut(t *testing.T) {
	server, client := slowPair(t, time.Second)
	const size = 1 << 20
	read := make(chan int64, 1)
	go func() {
		tick := time.NewTicker(40 * time.Millisecond) // the client's pace is the subject
		defer tick.Stop()
		var n int64
		buf := make([]byte, 16<<10)
		for n < size {
			<-tick.C
			m, err := io.ReadFull(client, buf[:min(int64(len(buf)), size-n)])
			n += int64(m)
			if err != nil {
				break
			}
		}
		read <- n
	}()
	n, err := server.Write(make([]byte, size))
	require.NoError(t, err)
	require.Equal(t, size, n)
	require.Equal(t, int64(size), <-read)
}

// A client that stops reading is let go: the write fails with the
// deadline once nothing was taken for d.
func TestPerWriteStalledReaderIsCut(t *testing.T) {
	server, _ := slowPair(t, 300*time.Millisecond)
	const size = 8 << 20
	n, err := server.Write(make([]byte, size))
	require.Error(t, err)
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
	require.Less(t, n, size)
}

// A deadline set from outside (a refusal's, a handshake's) is never moved
// on by progress.
func TestPerWriteOutsideDeadlineHolds(t *testing.T) {
	server, client := slowPair(t, time.Hour)
	go func() { _, _ = io.Copy(io.Discard, io.LimitReader(client, 64<<10)) }() // some progress, then none
	require.NoError(t, server.SetWriteDeadline(time.Now().Add(300*time.Millisecond)))
	_, err := server.Write(make([]byte, 8<<20))
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
}

// deadlineCounter counts the deadlines set on the socket.
type deadlineCounter struct {
	net.Conn
	reads, writes atomic.Int32
}

func (c *deadlineCounter) SetReadDeadline(t time.Time) error {
	c.reads.Add(1)
	return c.Conn.SetReadDeadline(t)
}

func (c *deadlineCounter) SetWriteDeadline(t time.Time) error {
	c.writes.Add(1)
	return c.Conn.SetWriteDeadline(t)
}

// A keep-alive connection's requests move its deadlines later each time:
// fasthttp's idle wait's, then the request's, then perWrite's before the
// answer. The socket's are set once each, not per request (package
// deadline under perWrite's connections).
func TestPerWriteDeadlinesSetOncePerTimeout(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var sock *deadlineCounter
	ln := perWrite(countingListener{Listener: raw, last: &sock}, time.Minute)
	t.Cleanup(func() { ln.Close() })
	client, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	c, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 3)
		for {
			if _, err := client.Write([]byte("req")); err != nil {
				return
			}
			if _, err := io.ReadFull(client, buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 3)
	for range 100 {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Minute)))
		require.NoError(t, c.SetReadDeadline(time.Now().Add(2*time.Minute)))
		_, err := io.ReadFull(c, buf)
		require.NoError(t, err)
		_, err = c.Write([]byte("ans"))
		require.NoError(t, err)
	}
	require.Equal(t, int32(1), sock.reads.Load(), "read deadlines set on the socket")
	require.Equal(t, int32(1), sock.writes.Load(), "write deadlines set on the socket")
}

// countingListener hands out its connections with their deadlines counted.
type countingListener struct {
	net.Listener
	last **deadlineCounter
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	*l.last = &deadlineCounter{Conn: c}
	return *l.last, nil
}
