package listen

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/edgeguard/edgeguard/internal/deadline"
)

// perWrite is ln with a write timeout judged by progress on each
// connection it accepts: a write fails, and the server closes the
// connection, only when the client took no byte of it for d. fasthttp's
// own WriteTimeout is one deadline for a whole response, which would cut
// a long download or an event stream however well its client reads; here
// a response lasts as long as its client keeps taking bytes, however
// slowly, and a client that stops is let go after d (nginx's send_timeout
// works the same way). A deadline the server sets itself (a TLS
// handshake, a refusal) still applies when it comes first. d 0 leaves ln
// as it is.
//
// Progress can only be seen if the kernel takes bytes as the client reads
// them. A socket's send buffer grows to megabytes, and a blocked write
// waits until half of it has drained: at 64 KiB/s that is tens of seconds
// without a byte taken. So every accepted socket gets TCP_NOTSENT_LOWAT
// (one system call at accept; the listener's own is not inherited by
// multipath TCP's, which Go listens with by default): a write waits only
// until less than notSentLowat bytes are unsent, and a slow reader's
// progress shows within a second. It also keeps the unsent bytes a slow
// reader leaves in the kernel to about notSentLowat per connection.
func perWrite(ln net.Listener, d time.Duration) net.Listener {
	if d <= 0 {
		return ln
	}
	return perWriteListener{Listener: ln, d: d}
}

// notSentLowat is the TCP_NOTSENT_LOWAT perWrite sets: two of the
// proxy's 32 KiB body writes and more, so a client reading at line rate
// never waits on it.
const notSentLowat = 128 << 10

type perWriteListener struct {
	net.Listener
	d time.Duration
}

func (l perWriteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	setNotSentLowat(c, notSentLowat)
	// The socket's deadlines are kept (package deadline): moved on
	// before every write here, and by fasthttp twice a request, they are
	// set on it about once per timeout.
	return &perWriteConn{Conn: deadline.Lazy(c), d: l.d}, nil
}

// perWriteConn moves its write deadline on before every write. Under it
// is the socket with its deadlines kept (deadline.Conn).
type perWriteConn struct {
	net.Conn
	d time.Duration
	// limit is the deadline set from outside (unix nanoseconds, 0: none);
	// HTTP/2 sets it from another goroutine than the one writing.
	limit atomic.Int64
}

// Write writes p whole, each wait for the client bounded by d: a write
// that timed out having written some bytes goes on with the rest, under a
// new deadline. The deadline set from outside is never moved.
func (c *perWriteConn) Write(p []byte) (int, error) {
	total := 0
	for {
		d := time.Now().Add(c.d)
		limited := false
		if l := c.limit.Load(); l != 0 && l < d.UnixNano() {
			d, limited = time.Unix(0, l), true
		}
		if err := c.Conn.SetWriteDeadline(d); err != nil {
			return total, err
		}
		n, err := c.Conn.Write(p)
		total += n
		if err == nil || n == 0 || limited || n == len(p) || !errors.Is(err, os.ErrDeadlineExceeded) {
			return total, err
		}
		p = p[n:] // the client took some: it gets d again for the rest
	}
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

// NetConn is the connection under it, the socket's deadlines kept
// (ClientGone follows the chain to the socket).
func (c *perWriteConn) NetConn() net.Conn { return c.Conn }
