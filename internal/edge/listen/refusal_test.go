package listen

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// lateConn's first late SetWriteDeadline calls set a deadline already
// past, so the real write that follows refuses itself with nothing
// written: a starved goroutine reaching its write after the deadline.
type lateConn struct {
	net.Conn
	late int
}

func (c *lateConn) SetWriteDeadline(t time.Time) error {
	if c.late > 0 {
		c.late--
		t = time.Now().Add(-time.Millisecond)
	}
	return c.Conn.SetWriteDeadline(t)
}

// A refusal is written even when the goroutine writing it comes late to
// its own deadline (seen under the busy recipe: a client over the cap
// read a bare close, not the 429), and the tries are bounded.
func TestRefusalWrittenWhenItsWriterIsLate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	// late writes: how many of the writer's tries come after their
	// deadline. Up to two, the client still reads the whole refusal; when
	// every try is late, the connection is closed without one.
	for _, tc := range []struct {
		late    int
		written bool
	}{{0, true}, {1, true}, {2, true}, {refusalTries, false}} {
		late := tc.late
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		s, err := ln.Accept()
		require.NoError(t, err)
		writeRefusal(&lateConn{Conn: s, late: late}, []byte(TooManyConns))
		require.NoError(t, s.Close())
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		got, err := io.ReadAll(c)
		require.NoError(t, err)
		c.Close()
		if tc.written {
			require.Equal(t, TooManyConns, string(got), "%d of %d tries late", late, refusalTries)
		} else {
			require.Empty(t, got, "every try late: closed without a word, not waited on")
		}
	}
}
