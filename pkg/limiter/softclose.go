package limiter

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A Sentinel client that learns of a switch closes every connection to the
// old master at once, those in use too (go-redis's pool Filter, on
// +switch-master). A take written on one just before ran on Redis, and its
// reply is then lost: the caller falls back, a fixed window's unit stays
// counted (clients get one fewer), and the edge cannot tell whether it ran.
// The old master is alive in a switch (SENTINEL FAILOVER, a partition's
// end): its reply is on its way. So a connection closed while a reply is
// owed on it closes softly: it takes no more writes at once (nothing new
// reaches the old master), and reads on for at most replyGrace (and no
// later than the reads' own deadlines), so the replies in flight are read
// and the calls answered; the next close (go-redis closes a connection it
// marked when the call hands it back) or the grace's end closes it. A
// close with nothing owed (an idle connection, a client shut down at rest)
// is immediate, as before.

// softCloseSeam, when set, is called each time a close is made soft (tests).
var softCloseSeam atomic.Pointer[func()]

// replyGrace bounds how long a connection closed with a reply owed stays
// open for reads.
const replyGrace = time.Second

// softConn is a connection that closes softly while a reply is owed.
type softConn struct {
	net.Conn
	writes   atomic.Uint64 // writes done
	answered atomic.Uint64 // writes before a read that returned data began
	closing  atomic.Int64  // unix ns, set once closed softly: reads end by then
	failed   atomic.Bool   // a read or write failed: nothing more is read
	deadline atomic.Int64  // the read deadline last set, unix ns (0: none)
	mu       sync.Mutex    // guards timer and closed, and orders the closes
	timer    *time.Timer
	closed   bool
	// onSoft, if set, is called when a close is made soft (a test seam).
	onSoft *func()
}

// softSysConn is a softConn over a connection with a file descriptor:
// go-redis checks idle connections' health through it (connCheck).
type softSysConn struct{ *softConn }

func (c softSysConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

// newSoftConn wraps conn; the result keeps conn's SyscallConn, if any.
func newSoftConn(conn net.Conn, onSoft *func()) net.Conn {
	c := &softConn{Conn: conn, onSoft: onSoft}
	if _, ok := conn.(syscall.Conn); ok {
		return softSysConn{c}
	}
	return c
}

// NetConn is the connection underneath (as crypto/tls.Conn's).
func (c *softConn) NetConn() net.Conn { return c.Conn }

func (c *softConn) Write(b []byte) (int, error) {
	if c.closing.Load() != 0 {
		return 0, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: net.ErrClosed}
	}
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.writes.Add(1)
	}
	if err != nil {
		c.failed.Store(true)
	}
	return n, err
}

func (c *softConn) Read(b []byte) (int, error) {
	w := c.writes.Load()
	n, err := c.Conn.Read(b)
	if n > 0 {
		for {
			a := c.answered.Load()
			if a >= w || c.answered.CompareAndSwap(a, w) {
				break
			}
		}
	}
	if err != nil {
		c.failed.Store(true)
	}
	return n, err
}

// owed reports whether a write may still await its reply: none of the
// reads that returned data began after it, and no read or write failed (a
// connection go-redis closes after a timeout or an error is closed at once:
// its caller is gone).
func (c *softConn) owed() bool {
	return c.writes.Load() > c.answered.Load() && !c.failed.Load()
}

func (c *softConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if c.closing.Load() != 0 || !c.owed() {
		return c.closeLocked()
	}
	end := time.Now().Add(replyGrace)
	c.closing.Store(end.UnixNano())
	// Reads end by the grace's end, or by the deadline the reader set if
	// that comes first; a later deadline is clamped (SetReadDeadline).
	if d := c.deadline.Load(); d == 0 || d > end.UnixNano() {
		if err := c.Conn.SetReadDeadline(end); err != nil {
			return c.closeLocked()
		}
	}
	c.timer = time.AfterFunc(replyGrace, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		_ = c.closeLocked()
	})
	if c.onSoft != nil {
		(*c.onSoft)()
	}
	return nil
}

func (c *softConn) closeLocked() error {
	if c.closed {
		return nil
	}
	c.closed = true
	if c.timer != nil {
		c.timer.Stop()
	}
	return c.Conn.Close()
}

func (c *softConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *softConn) SetReadDeadline(t time.Time) error {
	if ns := c.closing.Load(); ns != 0 {
		if end := time.Unix(0, ns); t.IsZero() || t.After(end) {
			t = end
		}
	}
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	c.deadline.Store(ns)
	return c.Conn.SetReadDeadline(t)
}
