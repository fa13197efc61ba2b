package listen

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Quiet keeps a framed connection until it sends a byte, is closed, or
// is handed to HTTP/2; closeOlder closes the quiet ones old enough, under
// the framer.
func TestQuietKeepsConnectionsThatSentNothing(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer raw.Close()
	q := newQuiet()
	ln := Framed(raw, q)
	pair := func() (client, server net.Conn) {
		c, err := net.Dial("tcp", raw.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		s, err := ln.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return c, s
	}
	speaking, speakingS := pair()
	silent, _ := pair()
	closing, closingS := pair()
	require.Equal(t, 3, q.count())

	_, err = io.WriteString(speaking, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	require.NoError(t, err)
	_, err = speakingS.Read(make([]byte, 64))
	require.NoError(t, err)
	require.Equal(t, 2, q.count(), "a connection that sent a byte is not quiet")
	require.NoError(t, closingS.Close())
	require.Equal(t, 1, q.count(), "a closed connection is forgotten")

	require.Zero(t, q.closeOlder(time.Hour), "none is quiet for an hour")
	require.Equal(t, 1, q.closeOlder(0))
	require.Zero(t, q.count())
	require.NoError(t, silent.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = silent.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the silent connection was closed by the edge")
	// The others are left as they were: closing sees only the close it
	// was sent, speaking is still open.
	require.NoError(t, speaking.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err = speaking.Read(make([]byte, 1))
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "the connection that spoke is still open")
	_, err = closing.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)

	// A TLS connection handed to HTTP/2 is read by the HTTP/2 server
	// from then on, never through the framer: it is not quiet.
	hc, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer hc.Close()
	sc, err := raw.Accept() // not through Framed: the framed TLS connection is built below
	require.NoError(t, err)
	defer sc.Close()
	tc := &framedTLSConn{serverTLSConn: &serverTLSConn{Conn: tls.Server(sc, &tls.Config{})}, q: q}
	q.add(tc, sc)
	require.Equal(t, 1, q.count())
	var handed net.Conn
	require.NoError(t, h1Unwrapped(func(c net.Conn) error { handed = c; return nil })(tc))
	require.Same(t, tc.serverTLSConn, handed)
	require.Zero(t, q.count(), "an HTTP/2 connection is not quiet")

	var none *Quiet // no Quiet: Framed keeps nothing
	require.Zero(t, none.closeOlder(0))
	require.Zero(t, none.CloseIdle())
	require.Zero(t, none.count())
}
