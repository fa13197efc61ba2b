package testenv

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A connection to ClosedAddr is refused, nobody else can listen there while
// the test runs, and Listen takes the address over.
func TestClosedAddr(t *testing.T) {
	addr := ClosedAddr(t)
	_, err := net.DialTimeout("tcp", addr, 2*time.Second)
	require.True(t, errors.Is(err, syscall.ECONNREFUSED), "dial %s: %v", addr, err)
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		ln.Close()
	}
	require.Error(t, err, "the port is reserved")

	ln, err = Listen(addr)
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	require.NoError(t, err)
	c.Close()
}
