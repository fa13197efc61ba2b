package handoff

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// Named is one listening socket to hand over.
type Named struct {
	Name string
	Ln   net.Listener // as bound: a *net.TCPListener
}

// Upgrade is one start of a new binary.
type Upgrade struct {
	Exe     string   // the binary, re-read from disk
	Args    []string // without the program name
	Env     []string // the variables that named inherited sockets are dropped
	Stdout  *os.File
	Stderr  *os.File
	Timeout time.Duration // how long the new edge has to answer ready
}

// ErrNotReady is the new edge not answering ready in time.
var ErrNotReady = errors.New("the new edge did not answer ready in time")

// Run starts the new binary with lns and waits until it answers ready. It
// returns the new process's pid; on any error the new process, if it was
// started, is killed and reaped and the listeners stay this process's own.
//
// The descriptors are passed by number (syscall.StartProcess), never
// through os.File.Fd: Fd puts a socket in blocking mode, a flag of the
// socket this process accepts on too, and an Accept that found it blocking
// would wait in the kernel, deaf to Close, once the new edge takes the
// connection it was woken for.
func (u Upgrade) Run(lns []Named) (pid int, err error) {
	files := []uintptr{os.Stdin.Fd(), u.Stdout.Fd(), u.Stderr.Fd()}
	var names []string
	for _, l := range lns {
		tl, ok := l.Ln.(*net.TCPListener)
		if !ok {
			return 0, fmt.Errorf("listener %s is a %T, not a TCP listener", l.Name, l.Ln)
		}
		rc, err := tl.SyscallConn()
		if err != nil {
			return 0, fmt.Errorf("passing listener %s: %w", l.Name, err)
		}
		var fd uintptr
		if err := rc.Control(func(s uintptr) { fd = s }); err != nil {
			return 0, fmt.Errorf("passing listener %s: %w", l.Name, err)
		}
		files, names = append(files, fd), append(names, l.Name)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("making the readiness pipe: %w", err)
	}
	defer r.Close()
	files, names = append(files, w.Fd()), append(names, readyName)

	var env []string
	for _, kv := range u.Env {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case EnvListenFDs, envSystemdPID, envSystemdFDs, envSystemdNames:
			continue
		}
		env = append(env, kv)
	}
	env = append(env, EnvListenFDs+"="+strings.Join(names, ":"))
	// The listeners stay open until StartProcess has returned: lns are
	// this process's own and closed only after a successful upgrade.
	pid, _, err = syscall.StartProcess(u.Exe, append([]string{u.Exe}, u.Args...), &syscall.ProcAttr{Env: env, Files: files})
	// Only the new process holds the pipe's write end now: its exit ends
	// the read below.
	_ = w.Close()
	if err != nil {
		return 0, fmt.Errorf("starting %s: %w", u.Exe, err)
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		return 0, fmt.Errorf("finding the new edge (pid %d): %w", pid, err)
	}
	exited := make(chan error, 1)
	go func() {
		st, err := proc.Wait()
		if err == nil && !st.Success() {
			err = errors.New(st.String())
		}
		exited <- err
	}()

	if err := r.SetReadDeadline(time.Now().Add(u.Timeout)); err != nil {
		_ = proc.Kill()
		<-exited
		return 0, fmt.Errorf("waiting for the new edge: %w", err)
	}
	buf := make([]byte, len("ready\n"))
	_, rerr := io.ReadFull(r, buf)
	if rerr == nil && string(buf) == "ready\n" {
		// The new edge runs on; its exit is reaped by the goroutine above
		// if this process still lives then.
		return pid, nil
	}
	_ = proc.Kill() // too slow, or a stranger wrote to the pipe
	werr := <-exited
	if errors.Is(rerr, os.ErrDeadlineExceeded) {
		return 0, fmt.Errorf("%w (%s); killed it", ErrNotReady, u.Timeout)
	}
	return 0, fmt.Errorf("the new edge (pid %d) exited before it was ready: %v", pid, werr)
}
