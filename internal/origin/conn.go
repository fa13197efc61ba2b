package origin

import (
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/edgeguard/edgeguard/internal/deadline"
)

// timedConn is an origin connection whose read deadline follows the phase
// of the exchange. Its header phase has one read deadline, set before the
// request is written (HeaderTimeout, or Timeout when that comes first);
// once the header is in, the exchange switches the connection to the body
// phase, where every Read gets its own deadline, ReadIdleTimeout from now
// (capped by Timeout), so a stream lives as long as the origin keeps
// sending.
type timedConn struct {
	net.Conn
	idle time.Duration

	// body and until belong to the goroutine that owns the exchange: set
	// after the header, read by that goroutine's Reads; the pool hands
	// the connection over with a lock.
	body  bool
	until time.Time // the exchange's overall deadline (zero: none)

	// ending is EndStreams asking the body phase to stop at once.
	ending atomic.Bool
}

// newTimedConn is c timed, its socket's deadlines kept (package deadline):
// the header phase's read deadline and the client's write deadline move
// on every exchange, a body's read deadline on every read, and the socket
// sets them about once per timeout.
func newTimedConn(c net.Conn, idle time.Duration) *timedConn {
	return &timedConn{Conn: deadline.Lazy(c), idle: idle}
}

// timedOf is the timedConn under a pooled connection (fasthttp puts TLS
// over the connection the dialer returned).
func timedOf(c net.Conn) *timedConn {
	for {
		switch v := c.(type) {
		case *timedConn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
}

// SetReadDeadline starts an exchange's header phase.
func (c *timedConn) SetReadDeadline(t time.Time) error {
	c.body, c.until = false, time.Time{}
	c.ending.Store(false)
	return c.Conn.SetReadDeadline(t)
}

// streamBody switches to the body phase, bounded overall by until (zero:
// no bound).
func (c *timedConn) streamBody(until time.Time) {
	c.body, c.until = true, until
}

// errStreamEnded is a body read refused because the edge is shutting down.
var errStreamEnded = errors.New("the edge ended the response stream on shutdown")

func (c *timedConn) Read(p []byte) (int, error) {
	if c.body {
		d := time.Now().Add(c.idle)
		if !c.until.IsZero() && c.until.Before(d) {
			d = c.until
		}
		if err := c.Conn.SetReadDeadline(d); err != nil {
			return 0, err
		}
		// After the deadline is set: end() sets the flag, then a past
		// deadline, so one of the two is seen.
		if c.ending.Load() {
			return 0, errStreamEnded
		}
	}
	return c.Conn.Read(p)
}

// end stops a body phase from another goroutine: the Read under way
// returns at once, and the next is refused.
func (c *timedConn) end() {
	c.ending.Store(true)
	_ = c.Conn.SetReadDeadline(time.Unix(1, 0))
}
