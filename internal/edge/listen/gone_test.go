package listen

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ClientGone tells a closed client from one that is there, with or without
// unread bytes, without consuming them.
func TestClientGone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server, err := ln.Accept()
	require.NoError(t, err)
	defer server.Close()
	Capped := &cappedConn{Conn: server}

	require.False(t, ClientGone(Capped), "idle client")
	_, err = client.Write([]byte("GET / HTTP/1.1\r\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !ClientGone(Capped) }, time.Second, time.Millisecond)
	require.NoError(t, client.Close())
	require.Eventually(t, func() bool { return ClientGone(Capped) }, 5*time.Second, time.Millisecond, "closed client with unread bytes")
	buf := make([]byte, 64)
	n, _ := io.ReadAtLeast(server, buf, 1)
	require.Equal(t, "GET / HTTP/1.1\r\n", string(buf[:n]), "peeking consumed nothing")
}
