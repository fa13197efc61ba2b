package listen

import (
	"net"
	"sync/atomic"
	"time"
)

// PerWrite is ln with a write deadline on every write of each connection
// it accepts: a write must be taken by the client within d, else it fails
// and the server closes the connection. fasthttp's own WriteTimeout is one
// deadline for a whole response, which would cut a long download or an
// event stream however well its client reads; per write, a response lasts
// as long as its client keeps taking bytes, and a client that stops is let
// go after d. A deadline the server sets itself (a TLS handshake, a
// refusal) still applies when it comes first. d 0 leaves ln as it is.
func PerWrite(ln net.Listener, d time.Duration) net.Listener {
	if d <= 0 {
		return ln
	}
	return perWriteListener{Listener: ln, d: d}
}

type perWriteListener struct {
	net.Listener
	d time.Duration
}

func (l perWriteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &perWriteConn{Conn: c, d: l.d}, nil
}

// perWriteConn moves its write deadline on before every write.
type perWriteConn struct {
	net.Conn
	d time.Duration
	// limit is the deadline set from outside (unix nanoseconds, 0: none);
	// HTTP/2 sets it from another goroutine than the one writing.
	limit atomic.Int64
}

func (c *perWriteConn) Write(p []byte) (int, error) {
	d := time.Now().Add(c.d)
	if l := c.limit.Load(); l != 0 && l < d.UnixNano() {
		d = time.Unix(0, l)
	}
	if err := c.Conn.SetWriteDeadline(d); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *perWriteConn) SetWriteDeadline(t time.Time) error {
	c.setLimit(t)
	return c.Conn.SetWriteDeadline(t)
}

func (c *perWriteConn) SetDeadline(t time.Time) error {
	c.setLimit(t)
	return c.Conn.SetDeadline(t)
}

func (c *perWriteConn) setLimit(t time.Time) {
	if t.IsZero() {
		c.limit.Store(0)
		return
	}
	c.limit.Store(t.UnixNano())
}

// NetConn is the socket (ClientGone looks at it).
func (c *perWriteConn) NetConn() net.Conn { return c.Conn }
