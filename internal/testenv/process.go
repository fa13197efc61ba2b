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
)

const (
	// termGrace is how long Close lets servers exit on SIGTERM before
	// SIGKILL; with persistence off they need only milliseconds.
	termGrace = time.Second
	// bindAttempts bounds retries when another process grabs a port between
	// freePorts releasing it and the server binding it.
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

// process is one running redis-server or sentinel.
type process struct {
	addr    string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd.Wait has returned
}

func (p *process) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal signals the whole process group, so children Redis forks (for
// diskless replication, say) go down with it.
func (p *process) signal(sig syscall.Signal) {
	if p.alive() {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// kill SIGKILLs the process and waits until it is reaped, so its port is
// closed when kill returns.
func (p *process) kill() {
	p.signal(syscall.SIGKILL)
	<-p.exited
}

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
		ports, err := freePorts(1 + s.extraPorts)
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
		exited:  make(chan struct{}),
	}
	conf := RedisBaseConfig(ports[0], d.dir, p.logPath) + s.config(ports) + "\n"
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

	p.cmd = exec.Command(s.bin, append([]string{confPath}, s.args...)...)
	p.cmd.Dir = d.dir
	p.cmd.Stdout = logFile
	p.cmd.Stderr = logFile
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("running %s: %w", s.bin, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
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
			return permanent(fmt.Errorf("process exited: %s", p.cmd.ProcessState))
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

// RedisBaseConfig is the part of a redis-server or sentinel config file
// every server of the harness (and of the local stack) shares: loopback
// only, no persistence, quick shutdown and replica sync. The caller appends
// its own lines (cluster, replicaof, sentinel monitor, ...).
func RedisBaseConfig(port int, dir, logPath string) string {
	return strings.Join([]string{
		"port " + strconv.Itoa(port),
		"bind 127.0.0.1",
		"protected-mode no",
		"daemonize no",
		"dir " + quote(dir),
		"logfile " + quote(logPath),
		`save ""`,
		"appendonly no",
		// Masters otherwise wait up to 10 s for lagging replicas on SIGTERM.
		"shutdown-on-sigterm now",
		// The default 5 s delay, meant to batch replicas into one transfer,
		// would dominate startup and rejoin times.
		"repl-diskless-sync-delay 0",
	}, "\n") + "\n"
}

// freePorts asks the kernel for n distinct free loopback ports. All
// listeners stay open until every port is picked, so the same port is never
// returned twice.
func freePorts(n int) ([]int, error) {
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

// quote renders s as a double-quoted Redis config argument.
func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
