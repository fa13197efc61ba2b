//go:build !linux

package listen

import "net"

// setNotSentLowat does nothing where TCP_NOTSENT_LOWAT is not known.
func setNotSentLowat(net.Conn, int) {}
