// Package deadline keeps a connection's socket deadlines and moves them
// only when a deadline asked for comes earlier than the socket's.
//
// Each deadline set on a socket costs Go's runtime a timer update, about
// 650 instructions, and a server moves its deadlines on every request: a
// keep-alive HTTP/1.1 connection's read deadline twice (fasthttp's idle
// wait, then the request's), its write deadline before each response, and
// an origin connection's as often. Almost always the new deadline is later
// than the one the socket has. Conn records such a deadline instead of
// setting it: the socket's own comes first and can only end a read or a
// write early, and Read and Write, finding it passed while the one asked
// for has not, set that one and go on. A deadline earlier than the
// socket's, a past one included, is set at once.
//
// So a read or a write times out exactly when the deadline last asked for
// passes, never earlier and never later, and the socket's deadline moves
// about once per timeout instead of on every request.
package deadline

import (
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// Conn is a net.Conn whose deadlines are set on the socket only when they
// must be (the package comment).
type Conn struct {
	net.Conn

	mu          sync.Mutex // guards read and write: a connection's callers may be on several goroutines
	read, write side
}

// side is one direction's deadline: the socket's, and the one asked for
// (zero: none).
type side struct{ armed, ask time.Time }

// Lazy is c with its deadlines kept (the package comment).
func Lazy(c net.Conn) *Conn { return &Conn{Conn: c} }

// Read reads through the socket's read deadline: one that passed before
// the one asked for did is moved on to it, and the read goes on.
func (c *Conn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if n > 0 || err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !c.rearm(&c.read, c.Conn.SetReadDeadline) {
			return n, err
		}
	}
}

// Write writes p whole through the socket's write deadline, as Read
// reads: a write the socket's deadline ended early goes on with the rest
// of p.
func (c *Conn) Write(p []byte) (int, error) {
	total := 0
	for {
		n, err := c.Conn.Write(p)
		total += n
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !c.rearm(&c.write, c.Conn.SetWriteDeadline) {
			return total, err
		}
		p = p[n:]
	}
}

// SetReadDeadline asks for t as the read deadline.
func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.set(&c.read, t, c.Conn.SetReadDeadline)
}

// SetWriteDeadline asks for t as the write deadline.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	return c.set(&c.write, t, c.Conn.SetWriteDeadline)
}

// SetDeadline asks for t as both.
func (c *Conn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}

// NetConn is the connection under the kept deadlines.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// set records t, and sets it on the socket unless the socket's comes
// first.
func (c *Conn) set(s *side, t time.Time, apply func(time.Time) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.ask = t
	if !s.armed.IsZero() && (t.IsZero() || !t.Before(s.armed)) {
		return nil
	}
	s.armed = t
	return apply(t)
}

// rearm sets the deadline asked for on the socket after the socket's
// passed, and reports whether it did: false when the socket's was the one
// asked for, or the one asked for has passed too.
func (c *Conn) rearm(s *side, apply func(time.Time) error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.ask.Equal(s.armed) || !s.ask.IsZero() && !time.Now().Before(s.ask) {
		return false
	}
	s.armed = s.ask
	return apply(s.ask) == nil
}
