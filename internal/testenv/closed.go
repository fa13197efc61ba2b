package testenv

import (
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

// reserved holds the sockets of ClosedAddr's addresses until Listen or the
// test's end releases them.
var reserved sync.Map // address → *reservation

type reservation struct {
	once sync.Once
	fd   int
}

func (r *reservation) release() { r.once.Do(func() { _ = syscall.Close(r.fd) }) }

// ClosedAddr is a loopback address ("127.0.0.1:port") on which a connection
// is refused for as long as the test runs. The port stays reserved: a
// socket is bound to it without listening (and without SO_REUSEADDR), so
// the kernel answers a connection with a reset, and no other test or
// process on the machine can start listening there meanwhile — which a
// port found free and then closed does not promise on a busy machine.
// Listen takes the address over when the test brings a server up there.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("testenv: socket: %v", err)
	}
	r := &reservation{fd: fd}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		r.release()
		t.Fatalf("testenv: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		r.release()
		t.Fatalf("testenv: getsockname: %v", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	reserved.Store(addr, r)
	t.Cleanup(func() {
		reserved.Delete(addr)
		r.release()
	})
	return addr
}

// Listen listens on addr, first releasing it if ClosedAddr reserved it (a
// socket that never listened leaves no TIME_WAIT behind: the port is free
// at once).
func Listen(addr string) (net.Listener, error) {
	if r, ok := reserved.LoadAndDelete(addr); ok {
		r.(*reservation).release()
	}
	return net.Listen("tcp", addr)
}
