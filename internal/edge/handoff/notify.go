package handoff

import (
	"fmt"
	"net"
	"os"
	"strconv"
)

// Notify sends state to the service manager (sd_notify(3)): "READY=1" once
// serving, and with it "MAINPID=" from a new edge that took over, so
// systemd follows the upgrade instead of taking the old edge's exit for the
// service's end. Without NOTIFY_SOCKET it does nothing.
func Notify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] != '/' && path[0] != '@' {
		return fmt.Errorf("NOTIFY_SOCKET=%q: want an absolute path or an abstract socket (@)", path)
	}
	if path[0] == '@' {
		path = "\x00" + path[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notifying the service manager: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("notifying the service manager: %w", err)
	}
	return nil
}

// ReadyState is what a serving edge tells the service manager: READY=1, and
// its pid when it took over from another edge.
func ReadyState(tookOver bool) string {
	if tookOver {
		return "MAINPID=" + strconv.Itoa(os.Getpid()) + "\nREADY=1"
	}
	return "READY=1"
}
