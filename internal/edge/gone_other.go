//go:build !linux

package edge

import "syscall"

// peekClosed is Linux-only; elsewhere a waiting client is taken as there.
func peekClosed(syscall.RawConn) bool { return false }
