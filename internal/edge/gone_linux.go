package edge

import "syscall"

// peekClosed peeks one byte without waiting: 0 bytes read is the peer's
// FIN; data or "would block" mean it is still there.
func peekClosed(raw syscall.RawConn) bool {
	var buf [1]byte
	closed := false
	err := raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = n == 0 && err == nil || err == syscall.ECONNRESET
		return true // never wait for readiness
	})
	return closed || err != nil
}
