//go:build unix && !linux

package testenv

import "syscall"

// sysProcAttr puts each server in its own process group, so Close can kill
// anything it forks. Without Pdeathsig outside Linux, servers outlive a
// test binary that is killed before Close runs.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
