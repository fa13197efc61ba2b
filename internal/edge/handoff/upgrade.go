package handoff

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
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
	Stdout  io.Writer
	Stderr  io.Writer
	Timeout time.Duration // how long the new edge has to answer ready
}

// ErrNotReady is the new edge not answering ready in time.
var ErrNotReady = errors.New("the new edge did not answer ready in time")

// Run starts the new binary with lns and waits until it answers ready. It
// returns the new process's pid; on any error the new process, if it was
// started, is killed and reaped and the listeners stay this process's own.
func (u Upgrade) Run(lns []Named) (pid int, err error) {
	var files []*os.File
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	var names []string
	for _, l := range lns {
		tl, ok := l.Ln.(*net.TCPListener)
		if !ok {
			return 0, fmt.Errorf("listener %s is a %T, not a TCP listener", l.Name, l.Ln)
		}
		f, err := tl.File() // a copy of the descriptor; the socket stays open here
		if err != nil {
			return 0, fmt.Errorf("passing listener %s: %w", l.Name, err)
		}
		files, names = append(files, f), append(names, l.Name)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("making the readiness pipe: %w", err)
	}
	defer r.Close()
	files, names = append(files, w), append(names, readyName)

	cmd := exec.Command(u.Exe, u.Args...)
	cmd.Stdout, cmd.Stderr = u.Stdout, u.Stderr
	cmd.ExtraFiles = files
	for _, kv := range u.Env {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case EnvListenFDs, envSystemdPID, envSystemdFDs, envSystemdNames:
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, EnvListenFDs+"="+strings.Join(names, ":"))
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s: %w", u.Exe, err)
	}
	// Only the new process holds the pipe's write end now: its exit ends
	// the read below.
	_ = w.Close()
	files = files[:len(files)-1]
	// Starting the process put each passed descriptor in blocking mode
	// (os.File.Fd does), and the flag belongs to the socket this process
	// accepts on too: an Accept that found the socket blocking would wait
	// in the kernel, deaf to Close, once the new edge takes connections.
	for _, f := range files {
		if err := setNonblock(f); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return 0, fmt.Errorf("restoring the listeners' non-blocking mode: %w", err)
		}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	if err := r.SetReadDeadline(time.Now().Add(u.Timeout)); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return 0, fmt.Errorf("waiting for the new edge: %w", err)
	}
	buf := make([]byte, len("ready\n"))
	_, rerr := io.ReadFull(r, buf)
	if rerr == nil && string(buf) == "ready\n" {
		// The new edge runs on; its exit is reaped by the goroutine above
		// if this process still lives then.
		return cmd.Process.Pid, nil
	}
	_ = cmd.Process.Kill() // too slow, or a stranger wrote to the pipe
	werr := <-exited
	if errors.Is(rerr, os.ErrDeadlineExceeded) {
		return 0, fmt.Errorf("%w (%s); killed it", ErrNotReady, u.Timeout)
	}
	return 0, fmt.Errorf("the new edge (pid %d) exited before it was ready: %v", cmd.Process.Pid, werr)
}

// setNonblock puts f's descriptor in non-blocking mode without Fd, which
// would put it in blocking mode first.
func setNonblock(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = syscall.SetNonblock(int(fd), true) }); err != nil {
		return err
	}
	return serr
}
