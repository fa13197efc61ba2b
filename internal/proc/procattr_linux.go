//go:build linux

package proc

import "syscall"

// SysProcAttr puts each server in its own process group, so Close can kill
// anything it forks, and asks the kernel to SIGKILL it when the test binary
// dies, so a panicking or killed test run never leaks servers. (Pdeathsig
// fires when the forking OS thread exits; the Go runtime only retires
// threads of goroutines that exit while locked with runtime.LockOSThread.)
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
