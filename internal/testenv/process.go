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

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/servers"
)

const (
	// termGrace is how long Close lets servers exit on SIGTERM before
	// SIGKILL; with persistence off they need only milliseconds.
	termGrace = time.Second
	// bindAttempts bounds retries when another process grabs a port between
	// FreePorts releasing it and the server binding it.
	bindAttempts = 4
)

// deployment owns a temp dir and the processes started in it.
type deployment struct {
	dir string

	mu     sync.Mutex
	procs  []*process
	closed bool
	holds  map[*process]*hold // the test's frozen marks (pulse.go)
}

func newDeployment(kind string) (*deployment, error) {
	dir, err := os.MkdirTemp("", "testenv-"+kind+"-")
	if err != nil {
		return nil, fmt.Errorf("creating temp dir: %w", err)
	}
	d := &deployment{dir: dir}
	if err := d.createPulseLock(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("creating %s: %w", pulseLock, err)
	}
	return d, nil
}

// Proc is a supervised child process (see package proc); the edge's
// end-to-end tests start theirs through StartProc too.
type Proc = proc.Proc

// StartProc starts cmd under supervision (proc.Start).
func StartProc(cmd *exec.Cmd) (*Proc, error) { return proc.Start(cmd) }

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
func (p *process) logTail() string { return proc.Tail(p.logPath) }

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
	return proc.Poll(ctx, p.addr+" to serve", func(ctx context.Context) error {
		if !p.alive() {
			return proc.Permanent(fmt.Errorf("process exited: %s", p.Cmd.ProcessState))
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
		case <-p.Exited():
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
