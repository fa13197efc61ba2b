package proc

import (
	"fmt"
	"os/exec"
	"syscall"
	"time"
)

// Proc is a supervised child process: it runs in its own process group (so
// whatever it forks goes down with it), the kernel SIGKILLs it if its
// parent dies (Linux), and it is reaped in the background, so Exited tells
// when it is gone and its ports are free.
type Proc struct {
	Cmd    *exec.Cmd
	exited chan struct{} // closed once Cmd.Wait has returned
}

// Start starts cmd under supervision. cmd must not be started yet; its
// SysProcAttr is replaced.
func Start(cmd *exec.Cmd) (*Proc, error) {
	cmd.SysProcAttr = SysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("running %s: %w", cmd.Path, err)
	}
	p := &Proc{Cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Exited is closed once the process has exited and been reaped.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Alive reports whether the process has not exited yet.
func (p *Proc) Alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal signals the whole process group, so children the process forks
// (Redis for diskless replication, say) get it too.
func (p *Proc) Signal(sig syscall.Signal) {
	if p.Alive() {
		_ = syscall.Kill(-p.Cmd.Process.Pid, sig)
	}
}

// Kill SIGKILLs the process group and waits until the process is reaped, so
// its ports are closed when Kill returns.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.exited
}

// WaitExit waits up to timeout for the process to exit by itself and
// returns its exit code.
func (p *Proc) WaitExit(timeout time.Duration) (code int, exited bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.exited:
		return p.Cmd.ProcessState.ExitCode(), true
	case <-t.C:
		return -1, false
	}
}

// Stop sends SIGTERM, waits up to timeout, then SIGKILLs. It returns the
// exit code and whether the process exited by itself.
func (p *Proc) Stop(timeout time.Duration) (code int, exited bool) {
	p.Signal(syscall.SIGTERM)
	code, exited = p.WaitExit(timeout)
	if !exited {
		p.Kill()
	}
	return code, exited
}
