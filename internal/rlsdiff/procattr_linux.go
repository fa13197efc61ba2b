package rlsdiff

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the child when the harness dies,
// however it dies, so no service or redis-server outlives a run.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
