//go:build unix

package origin

import "syscall"

// isConnected says whether the kernel has finished connecting c: it has a
// peer. A socket still connecting, failed or closed has none.
func isConnected(c syscall.RawConn) bool {
	ok := false
	if err := c.Control(func(fd uintptr) {
		_, err := syscall.Getpeername(int(fd))
		ok = err == nil
	}); err != nil {
		return false
	}
	return ok
}
