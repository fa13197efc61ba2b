//go:build unix && !linux

package proc

import "syscall"

// SysProcAttr puts each server in its own process group, so Close can kill
// anything it forks. Without Pdeathsig outside Linux, servers outlive a
// test binary that is killed before Close runs.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
