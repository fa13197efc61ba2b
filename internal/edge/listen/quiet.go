package listen

import (
	"net"
	"sync"
	"time"
)

// QuietGrace is how long a connection that has sent nothing may hold a
// shutdown: net/http's rule for connections that have not begun a
// request. fasthttp counts a connection as busy from its accept, so
// without Quiet its shutdown waits for such a connection until
// --read-timeout (a browser's preconnect, a client that dialled one
// connection too many).
const QuietGrace = 5 * time.Second

// Quiet are the connections accepted through Framed that have sent
// nothing yet, with when each was accepted. The nil Quiet keeps none.
type Quiet struct {
	mu sync.Mutex
	m  map[net.Conn]quietConn
}

// quietConn is one: when it was accepted, and the connection under its
// framer (closed by Close without going through the framer's Close).
type quietConn struct {
	at    time.Time
	inner net.Conn
}

// newQuiet is an empty Quiet.
func newQuiet() *Quiet { return &Quiet{m: map[net.Conn]quietConn{}} }

func (q *Quiet) add(c, inner net.Conn) {
	if q == nil {
		return
	}
	q.mu.Lock()
	q.m[c] = quietConn{at: time.Now(), inner: inner}
	q.mu.Unlock()
}

// drop forgets c: it has sent something, been handed over, or closed.
func (q *Quiet) drop(c net.Conn) {
	if q == nil {
		return
	}
	q.mu.Lock()
	delete(q.m, c)
	q.mu.Unlock()
}

// closeOlder closes the connections that have sent nothing since they
// were accepted, olderThan ago or more, and says how many.
func (q *Quiet) closeOlder(olderThan time.Duration) int {
	if q == nil {
		return 0
	}
	cutoff := time.Now().Add(-olderThan)
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for c, qc := range q.m {
		if !qc.at.After(cutoff) {
			_ = qc.inner.Close()
			delete(q.m, c)
			n++
		}
	}
	return n
}

// CloseIdle closes the connections that have sent nothing for QuietGrace.
func (q *Quiet) CloseIdle() int { return q.closeOlder(QuietGrace) }

// count is how many connections have sent nothing yet.
func (q *Quiet) count() int {
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.m)
}
