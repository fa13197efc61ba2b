//go:build !unix

package origin

import "syscall"

// isConnected cannot ask the kernel here: a dial whose deadline passes is
// a timeout, as with Go's own dialer.
func isConnected(syscall.RawConn) bool { return false }
