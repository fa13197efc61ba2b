package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/servers"
)

const (
	// termGrace is how long Close lets servers exit on SIGTERM before
	// SIGKILL; with persistence off they need only milliseconds.
	termGrace = time.Second
	// bindAttempts bounds retries when another process grabs a port between
	// FreePorts releasing it and the server binding it.
	bindAttempts = 4
	logTailLines = 25
)

// deployment owns a temp dir and the processes started in it.
type deployment struct {
	dir string

	mu     sync.Mutex
	procs  []*process
	closed bool
}

func newDeployment(kind string) (*deployment, error) {
	dir, err := os.MkdirTemp("", "testenv-"+kind+"-")
	if err != nil {
		return nil, fmt.Errorf("creating temp dir: %w", err)
	}
	return &deployment{dir: dir}, nil
}

// Proc is a child process the harness supervises: it runs in its own
// process group (so whatever it forks goes down with it), the kernel
// SIGKILLs it if the test binary dies (Linux), and it is reaped in the
// background, so Exited tells when it is gone and its ports are free.
type Proc struct {
	Cmd    *exec.Cmd
	exited chan struct{} // closed once Cmd.Wait has returned
}

// StartProc starts cmd under supervision. cmd must not be started yet; its
// SysProcAttr is the harness's.
func StartProc(cmd *exec.Cmd) (*Proc, error) {
	cmd.SysProcAttr = sysProcAttr()
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

// process is one running server of a deployment, with its log file.
type process struct {
	*Proc
	addr    string
	logPath string
}

func (p *process) alive() bool               { return p.Alive() }
func (p *process) signal(sig syscall.Signal) { p.Signal(sig) }
func (p *process) kill()                     { p.Kill() }

// logTail returns the last lines of the process log, which is where Redis
// explains why it refused to start.
func (p *process) logTail() string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", p.logPath, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return strings.Join(lines, "\n")
}

// spec describes a server to spawn.
type spec struct {
	name       string   // file name prefix: "node", "master", "sentinel", ...
	bin        string   // redis-server or redis-sentinel
	args       []string // after the config file path, e.g. --sentinel
	extraPorts int      // ports beyond the client port, e.g. the cluster bus
	// config returns the settings beyond the common ones; ports[0] is the
	// client port.
	config func(ports []int) string
}

// spawn starts the server described by s and waits until it answers.
// Picking a free port and binding it later races with every other process
// on the host, so a bind failure is retried with fresh ports.
func (d *deployment) spawn(ctx context.Context, s spec) (*process, error) {
	for attempt := 1; ; attempt++ {
		ports, err := FreePorts(1 + s.extraPorts)
		if err != nil {
			return nil, err
		}
		p, err := d.startProcess(s, ports)
		if err != nil {
			return nil, err
		}
		err = waitServing(ctx, p)
		if err == nil {
			return p, nil
		}
		exitedByItself := !p.alive()
		p.kill()
		tail := p.logTail()
		if attempt < bindAttempts && exitedByItself && strings.Contains(tail, "Address already in use") {
			continue
		}
		return nil, fmt.Errorf("starting %s on %s: %w\n--- last lines of %s ---\n%s", s.name, p.addr, err, p.logPath, tail)
	}
}

func (d *deployment) startProcess(s spec, ports []int) (*process, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errors.New("deployment is closed")
	}

	// Files are named by port so a retry never trips over an earlier
	// attempt's nodes.conf or log.
	base := filepath.Join(d.dir, fmt.Sprintf("%s-%d", s.name, ports[0]))
	p := &process{
		addr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		logPath: base + ".log",
	}
	conf := servers.RedisBaseConfig(ports[0], d.dir, p.logPath) + s.config(ports) + "\n"
	confPath := base + ".conf"
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, fmt.Errorf("writing %s: %w", confPath, err)
	}

	// Config errors are printed to stderr before the logfile is opened, so
	// stdout and stderr go to the same file for logTail to find.
	logFile, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", p.logPath, err)
	}
	defer logFile.Close()

	cmd := exec.Command(s.bin, append([]string{confPath}, s.args...)...)
	cmd.Dir = d.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if p.Proc, err = StartProc(cmd); err != nil {
		return nil, err
	}
	d.procs = append(d.procs, p)
	return p, nil
}

// waitServing waits until p answers PING. Any reply counts, including
// NOAUTH from a password-protected server: the server is up either way.
func waitServing(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c := newClient(p.addr)
	defer c.Close()
	return poll(ctx, p.addr+" to serve", func(ctx context.Context) error {
		if !p.alive() {
			return permanent(fmt.Errorf("process exited: %s", p.Cmd.ProcessState))
		}
		// A plain dial first: go-redis logs every failed dial, which would
		// litter test output while the server is still starting.
		var dialer net.Dialer
		conn, err := dialer.DialContext(ctx, "tcp", p.addr)
		if err != nil {
			return err
		}
		conn.Close()
		err = c.Ping(ctx).Err()
		if _, isReply := errors.AsType[redis.Error](err); err == nil || isReply {
			return nil
		}
		return err
	})
}

// Close kills every process and removes the temp dir. It is safe to call
// more than once and on a deployment that failed halfway through starting.
func (d *deployment) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	procs := d.procs
	d.mu.Unlock()

	for _, p := range procs {
		p.signal(syscall.SIGTERM)
	}
	grace := time.After(termGrace)
wait:
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-grace:
			break wait
		}
	}
	for _, p := range procs {
		p.kill()
	}
	if err := os.RemoveAll(d.dir); err != nil {
		return fmt.Errorf("removing %s: %w", d.dir, err)
	}
	return nil
}

// FreePorts asks the kernel for n distinct free loopback ports. All
// listeners stay open until every port is picked, so the same port is never
// returned twice.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("picking a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
