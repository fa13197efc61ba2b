package listen

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// peekClosed asks the kernel, without waiting or reading, whether the peer
// has closed its side (POLLRDHUP: its FIN arrived, even behind bytes not
// read yet) or the connection failed.
func peekClosed(raw syscall.RawConn) bool {
	closed := false
	err := raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(fds, 0)
		closed = err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	})
	return closed || err != nil
}
