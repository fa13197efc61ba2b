package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Daemon is a detached server known by its pid file, "<pid> <binary>" in
// Dir/<Name>.pid, with its stdout and stderr in Dir/<Name>.log.
type Daemon struct {
	Name string // file name stem in Dir
	Dir  string
	Bin  string
	Args []string
	Env  []string // extra environment, on top of the caller's
}

// PidPath is the daemon's pid file.
func (d Daemon) PidPath() string { return filepath.Join(d.Dir, d.Name+".pid") }

// LogPath is where the daemon's stdout and stderr go.
func (d Daemon) LogPath() string { return filepath.Join(d.Dir, d.Name+".log") }

// Pid returns the daemon's pid if it is running, else 0. A pid file whose
// process is gone, or whose pid now belongs to another program, counts as
// not running.
func (d Daemon) Pid() int {
	data, err := os.ReadFile(d.PidPath())
	if err != nil {
		return 0
	}
	pid, _ := ParsePidFile(data)
	if pid <= 0 {
		return 0
	}
	return RunningAs(pid, d.Bin)
}

// ParsePidFile reads "<pid> <binary>".
func ParsePidFile(data []byte) (int, string) {
	pidText, bin, _ := strings.Cut(strings.TrimSpace(string(data)), " ")
	pid, err := strconv.Atoi(pidText)
	if err != nil {
		return 0, ""
	}
	return pid, bin
}

// StopPidFile stops the daemon recorded in dir/<name>.pid, whatever its
// program.
func StopPidFile(dir, name string, grace time.Duration) {
	data, err := os.ReadFile(filepath.Join(dir, name+".pid"))
	if err != nil {
		return
	}
	_, bin := ParsePidFile(data)
	Daemon{Name: name, Dir: dir, Bin: bin}.Stop(grace)
}

// Gone reports whether pid has exited or is a zombie (which still answers
// kill 0).
func Gone(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false // no /proc here: kill 0 is all there is
	}
	// "pid (comm) S ...": the state follows the last ')'.
	i := strings.LastIndexByte(string(stat), ')')
	return i > 0 && len(stat) > i+2 && stat[i+2] == 'Z'
}

// RunningAs returns pid if it is alive and runs bin, else 0.
func RunningAs(pid int, bin string) int {
	if Gone(pid) {
		return 0
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

// Start launches the daemon detached (setsid, so it survives its caller),
// appending to its log, and records its pid.
func (d Daemon) Start() (int, error) {
	if err := os.MkdirAll(d.Dir, 0o755); err != nil {
		return 0, fmt.Errorf("creating %s: %w", d.Dir, err)
	}
	log, err := os.OpenFile(d.LogPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", d.LogPath(), err)
	}
	defer log.Close()
	fmt.Fprintf(log, "==> %s: %s %s (%s)\n", filepath.Base(os.Args[0]), d.Bin, strings.Join(d.Args, " "), time.Now().Format(time.RFC3339))
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer devnull.Close()
	cmd := exec.Command(d.Bin, d.Args...)
	cmd.Dir = d.Dir
	cmd.Stdin = devnull
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.Env = append(os.Environ(), d.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("running %s: %w", d.Bin, err)
	}
	pid := cmd.Process.Pid
	// Not waited for: the daemon is adopted by init when its caller exits.
	_ = cmd.Process.Release()
	if err := os.WriteFile(d.PidPath(), []byte(strconv.Itoa(pid)+" "+d.Bin+"\n"), 0o644); err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return 0, fmt.Errorf("writing %s: %w", d.PidPath(), err)
	}
	return pid, nil
}

// Ensure starts the daemon unless it runs; started reports whether it did.
func (d Daemon) Ensure() (started bool, err error) {
	if d.Pid() != 0 {
		return false, nil
	}
	if _, err := d.Start(); err != nil {
		return false, err
	}
	return true, nil
}

// Stop sends SIGTERM to the daemon's process group, waits up to grace, then
// SIGKILLs it, and removes the pid file. Stopping a stopped daemon is a
// no-op.
func (d Daemon) Stop(grace time.Duration) {
	defer os.Remove(d.PidPath())
	pid := d.Pid()
	if pid == 0 {
		return
	}
	exited := func(context.Context) error {
		if RunningAs(pid, d.Bin) != 0 {
			return errors.New("still running")
		}
		return nil
	}
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if PollEvery(ctx, 50*time.Millisecond, d.Name+" to exit", exited) == nil {
		return
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = PollEvery(ctx, 20*time.Millisecond, d.Name+" to be killed", exited)
}

// WaitAlive waits until the daemon runs and check passes; a daemon that
// exits meanwhile fails at once, with the end of its log.
func (d Daemon) WaitAlive(ctx context.Context, what string, check func(context.Context) error) error {
	err := Poll(ctx, what, func(ctx context.Context) error {
		if d.Pid() == 0 {
			return Permanent(errors.New("process exited"))
		}
		return check(ctx)
	})
	if err != nil {
		return WithTail(err, d.LogPath())
	}
	return nil
}
