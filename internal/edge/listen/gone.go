package listen

import (
	"net"
	"syscall"
)

// ClientGone reports whether the client at the other end of c has closed
// its side: a queued request whose client left must not take a worker nor
// reach the origin (nobody would read the answer). It looks at the socket
// without reading from it (a peek that does not wait), so bytes of a
// pipelined next request stay where fasthttp will read them. A connection
// it cannot look into is taken as still there.
func ClientGone(c net.Conn) bool {
	if s, ok := c.(interface{ gone() bool }); ok { // an HTTP/2 stream
		return s.gone()
	}
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true // closed
	}
	return peekClosed(raw)
}
