package listen

import (
	"net"
	"syscall"
)

// tcpNotSentLowat is TCP_NOTSENT_LOWAT (linux/tcp.h), which the syscall
// package does not name.
const tcpNotSentLowat = 25

// setNotSentLowat sets TCP_NOTSENT_LOWAT on c's socket. A connection that
// is not a socket is left alone, and so is a kernel that refuses (the
// write timeout then sees progress only as the send buffer allows).
func setNotSentLowat(c net.Conn, n int) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpNotSentLowat, n)
	})
}
