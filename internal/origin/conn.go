package origin

import (
	"errors"
	"net"
	"sync/atomic"
	"time"
)

// timedConn is an origin connection whose read deadline follows the phase
// of the exchange. fasthttp sets one read deadline before it reads the
// response header (the header phase: HeaderTimeout, or Timeout when that
// comes first); once Serve has the header it switches the connection to
// the body phase, where every Read gets its own deadline, ReadIdleTimeout
// from now (capped by Timeout), so a stream lives as long as the origin
// keeps sending.
//
// fasthttp keeps the connection it dialed and hands Serve nothing but the
// response, which records the connection's LocalAddr: that address
// carries the way back to the connection (connOf).
type timedConn struct {
	net.Conn
	idle  time.Duration
	local connAddr

	// body and until belong to the goroutine that owns the exchange: set
	// by Serve after the header, read by that goroutine's Reads; the pool
	// hands the connection over with a lock.
	body  bool
	until time.Time // the exchange's overall deadline (zero: none)

	// ending is EndStreams asking the body phase to stop at once.
	ending atomic.Bool
}

// connAddr is a timedConn's LocalAddr: the address, and the connection.
type connAddr struct {
	net.Addr
	conn *timedConn
}

func newTimedConn(c net.Conn, idle time.Duration) *timedConn {
	tc := &timedConn{Conn: c, idle: idle}
	tc.local = connAddr{Addr: c.LocalAddr(), conn: tc}
	return tc
}

// connOf is the timedConn a response was read from (nil if the address is
// not one of ours).
func connOf(laddr net.Addr) *timedConn {
	if a, ok := laddr.(*connAddr); ok {
		return a.conn
	}
	return nil
}

func (c *timedConn) LocalAddr() net.Addr { return &c.local }

// SetReadDeadline is fasthttp starting an exchange's header phase.
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
