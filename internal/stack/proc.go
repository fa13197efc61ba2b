package stack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one daemon of the stack, known by its pid file. The daemons
// outlive stackctl (each call of it is one Terraform provisioner), so the
// pid file, the command line recorded next to it and /proc are the only
// truth about whether one runs.
type proc struct {
	name string // file name stem in dir: <name>.pid, <name>.log
	dir  string
	bin  string
	args []string
	env  []string // extra environment, on top of stackctl's
}

func (p proc) pidPath() string { return filepath.Join(p.dir, p.name+".pid") }

// LogPath is where the daemon's stdout and stderr go.
func (p proc) logPath() string { return filepath.Join(p.dir, p.name+".log") }

// pid returns the daemon's pid if it is running, else 0. A pid file whose
// process is gone, or whose pid now belongs to another program, counts as
// not running.
func (p proc) pid() int {
	data, err := os.ReadFile(p.pidPath())
	if err != nil {
		return 0
	}
	pid, _ := parsePidFile(data)
	if pid <= 0 {
		return 0
	}
	return runningAs(pid, p.bin)
}

// parsePidFile reads "<pid> <binary>".
func parsePidFile(data []byte) (int, string) {
	pidText, bin, _ := strings.Cut(strings.TrimSpace(string(data)), " ")
	pid, err := strconv.Atoi(pidText)
	if err != nil {
		return 0, ""
	}
	return pid, bin
}

// stopByPidFile stops the daemon recorded in dir/<name>.pid, whatever its
// program.
func stopByPidFile(dir, name string) {
	data, err := os.ReadFile(filepath.Join(dir, name+".pid"))
	if err != nil {
		return
	}
	_, bin := parsePidFile(data)
	proc{name: name, dir: dir, bin: bin}.stop(5 * time.Second)
}

// runningAs returns pid if it is alive and runs bin, else 0.
func runningAs(pid int, bin string) int {
	if syscall.Kill(pid, 0) != nil {
		return 0
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err == nil {
		// A zombie still answers kill 0: "pid (comm) Z ...".
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && len(stat) > i+2 && stat[i+2] == 'Z' {
			return 0
		}
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return pid // not Linux, or not ours to read: trust the pid file
	}
	want, _ := filepath.EvalSymlinks(bin)
	if strings.TrimSuffix(exe, " (deleted)") == want || filepath.Base(exe) == filepath.Base(bin) {
		return pid
	}
	return 0
}

// start launches the daemon detached (setsid, so it survives
// stackctl and Terraform), appending to its log, and records its pid.
func (p proc) start() (int, error) {
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return 0, fmt.Errorf("creating %s: %w", p.dir, err)
	}
	log, err := os.OpenFile(p.logPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", p.logPath(), err)
	}
	defer log.Close()
	fmt.Fprintf(log, "==> stackctl: %s %s (%s)\n", p.bin, strings.Join(p.args, " "), time.Now().Format(time.RFC3339))
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer devnull.Close()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Dir = p.dir
	cmd.Stdin = devnull
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.Env = append(os.Environ(), p.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("running %s: %w", p.bin, err)
	}
	pid := cmd.Process.Pid
	// Not waited for: the daemon is adopted by init when stackctl exits.
	_ = cmd.Process.Release()
	if err := os.WriteFile(p.pidPath(), []byte(strconv.Itoa(pid)+" "+p.bin+"\n"), 0o644); err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return 0, fmt.Errorf("writing %s: %w", p.pidPath(), err)
	}
	return pid, nil
}

// ensure starts the daemon unless it runs; started reports whether it did.
func (p proc) ensure() (started bool, err error) {
	if p.pid() != 0 {
		return false, nil
	}
	if _, err := p.start(); err != nil {
		return false, err
	}
	return true, nil
}

// stop sends SIGTERM to the daemon's process group, waits up to grace, then
// SIGKILLs it, and removes the pid file. Stopping a stopped daemon is a
// no-op.
func (p proc) stop(grace time.Duration) {
	defer os.Remove(p.pidPath())
	pid := p.pid()
	if pid == 0 {
		return
	}
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if runningAs(pid, p.bin) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	for range 100 {
		if runningAs(pid, p.bin) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logTail returns the last lines of the daemon's log for error messages.
func (p proc) logTail() string {
	data, err := os.ReadFile(p.logPath())
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// permanentError ends a poll early.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }

// poll runs check until it returns nil or ctx ends.
func poll(ctx context.Context, what string, check func(context.Context) error) error {
	delay := 50 * time.Millisecond
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		if pe, ok := errors.AsType[permanentError](err); ok {
			return fmt.Errorf("waiting for %s: %w", what, pe.err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %w)", what, ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(delay*3/2, 500*time.Millisecond)
	}
}

// waitAlive waits until p's process runs and check passes; a daemon that
// exits meanwhile fails at once with the end of its log.
func waitAlive(ctx context.Context, p proc, what string, check func(context.Context) error) error {
	err := poll(ctx, what, func(ctx context.Context) error {
		if p.pid() == 0 {
			return permanentError{errors.New("process exited")}
		}
		return check(ctx)
	})
	if err != nil {
		return fmt.Errorf("%w\n--- last lines of %s ---\n%s", err, p.logPath(), p.logTail())
	}
	return nil
}

// httpOK returns nil when GET url answers 200.
func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
