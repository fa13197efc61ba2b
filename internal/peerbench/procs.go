package peerbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// server is one process under measurement: the origin, the edge or nginx.
type server struct {
	name  string
	p     *proc.Proc
	addr  string // where clients send requests
	admin string // the edge's admin address, else empty
	dir   string
}

func (s *server) pid() int { return s.p.Cmd.Process.Pid }

func (s *server) stop() {
	if s != nil && s.p != nil {
		s.p.Stop(5 * time.Second)
	}
}

// startServing starts cmd as startLogged does and waits until it answers
// HTTP on addr; one that does not is stopped.
func startServing(ctx context.Context, name, dir string, cmd *exec.Cmd, addr string) (*server, error) {
	s, err := startLogged(name, dir, cmd)
	if err != nil {
		return nil, err
	}
	s.addr = addr
	if err := s.waitReady(ctx, "http://"+addr+"/obj/1"); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// logTail is the end of the server's log, for error messages.
func (s *server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, s.name+".log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func ports(n int) ([]string, error) {
	ps, err := testenv.FreePorts(n)
	if err != nil {
		return nil, err
	}
	out := make([]string, n)
	for i, p := range ps {
		out[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	return out, nil
}

func startLogged(name, dir string, cmd *exec.Cmd) (*server, error) {
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// A command whose standard output is already taken (haproxy's access
	// log) keeps it.
	if cmd.Stdout == nil {
		cmd.Stdout = f
	}
	cmd.Stderr = f
	p, err := proc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return &server{name: name, p: p, dir: dir}, nil
}

// waitReady waits until GET url answers 200 (the body read whole).
func (s *server) waitReady(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := proc.PollEvery(ctx, 20*time.Millisecond, s.name, func(ctx context.Context) error {
		if !s.p.Alive() {
			return proc.Permanent(errors.New("it exited"))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w; its log ends:\n%s", err, s.logTail())
	}
	return nil
}

// startOrigin re-executes this program as the origin (ServeOriginIfAsked).
func startOrigin(ctx context.Context, dir string) (*server, error) {
	return startOriginAs(ctx, dir, "origin", originEnv)
}

// startOriginAs re-executes this program as the origin that env selects
// (ServeOriginIfAsked), logging to dir/name.log; more are further
// KEY=value settings for it.
func startOriginAs(ctx context.Context, dir, name, env string, more ...string) (*server, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	a, err := ports(1)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(append(os.Environ(), env+"="+a[0]), more...)
	return startServing(ctx, name, dir, cmd, a[0])
}

// startEdge runs the edge binary in front of origin, with no rules (it
// proxies every request) and no cap on connections per client address
// (every client here is 127.0.0.1).
func startEdge(ctx context.Context, bin, dir, origin string, extra ...string) (*server, error) {
	return startEdgeAs(ctx, "edge", bin, dir, origin, extra...)
}

// startEdgeAs is startEdge logging to dir/name.log.
func startEdgeAs(ctx context.Context, name, bin, dir, origin string, extra ...string) (*server, error) {
	a, err := ports(2)
	if err != nil {
		return nil, err
	}
	args := append([]string{
		"--listen", a[0], "--admin", a[1], "--origin", "http://" + origin,
		"--drain-delay", "0s", "--shutdown-timeout", "2s", "--log-level", "warn",
		"--max-conns-per-ip", "0",
	}, extra...)
	cmd := exec.Command(bin, args...)
	// Only the flags above configure the edge: an EDGEGUARD_ variable of
	// the caller's (a test run's EDGEGUARD_CONSUL names a binary) would be
	// read as a setting.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "EDGEGUARD_") })
	s, err := startServing(ctx, name, dir, cmd, a[0])
	if err != nil {
		return nil, err
	}
	s.admin = a[1]
	return s, nil
}

// nginxConf is nginx set up as the edge is: two worker processes (the edge
// runs on the machine's cores, here two), keep-alive connections to the
// origin, the forwarding fields the edge writes (X-Forwarded-For from the
// socket peer, -Proto, -Host, a request id, which the client gets back too),
// no access log (the edge's is off by default), its workers running as the
// user who started it (root's would otherwise drop to nobody, who cannot
// write the temporary files in this user's directory). proxy_buffering is on,
// nginx's default: nginx reads the origin's response into its buffers
// (8 × 4 KiB plus a temporary file of up to maxTemp) while the client takes
// it, where the edge holds at most 32 KiB and lets the origin wait.
const nginxConf = `daemon off;
master_process on;
user %[5]s;
worker_processes 2;
worker_rlimit_nofile 16384;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 8192; }
http {
	access_log off;
	client_body_temp_path %[1]s/client_body;
	proxy_temp_path %[1]s/proxy_temp;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	keepalive_requests 1000000;
	upstream origin { server %[2]s; keepalive 64; }
	server {
		listen %[3]s;
		location / {
			proxy_pass http://origin;
			proxy_http_version 1.1;
			proxy_buffering on;
			proxy_max_temp_file_size %[4]s;
			proxy_set_header Connection "";
			proxy_set_header Host $host;
			proxy_set_header X-Forwarded-For $remote_addr;
			proxy_set_header X-Forwarded-Proto $scheme;
			proxy_set_header X-Forwarded-Host $host;
			proxy_set_header X-Request-ID $request_id;
			add_header X-Request-ID $request_id always;
		}
	}
}
`

// startNginx runs nginx as this user from a generated configuration in its
// own directory. maxTemp is proxy_max_temp_file_size ("1024m" is nginx's
// default; "0" keeps nginx from spooling responses to disk).
func startNginx(ctx context.Context, bin, dir, origin, maxTemp string) (*server, error) {
	return startNginxAs(ctx, "nginx", bin, dir, func(nd, listen, who string) ([]byte, error) {
		return fmt.Appendf(nil, nginxConf, nd, origin, listen, maxTemp, who), nil
	})
}

// startNginxAs runs nginx as this user in dir/name (its prefix, holding
// its configuration, pid file and logs) from the configuration render
// writes for that directory, the address it listens on and the user and
// group its workers run as; it logs to dir/name.log.
func startNginxAs(ctx context.Context, name, bin, dir string, render func(nd, listen, who string) ([]byte, error)) (*server, error) {
	a, err := ports(1)
	if err != nil {
		return nil, err
	}
	nd := filepath.Join(dir, name)
	if err := os.MkdirAll(nd, 0o755); err != nil {
		return nil, err
	}
	conf := filepath.Join(nd, "nginx.conf")
	u, err := user.Current()
	if err != nil {
		return nil, err
	}
	who := u.Username
	if g, err := user.LookupGroupId(u.Gid); err == nil {
		who += " " + g.Name
	}
	text, err := render(nd, a[0], who)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(conf, text, 0o644); err != nil {
		return nil, err
	}
	s, err := startServing(ctx, name, dir, exec.Command(bin, "-p", nd, "-c", conf, "-e", filepath.Join(nd, "error.log")), a[0])
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(nd, "error.log"))
		return nil, fmt.Errorf("%w\nnginx's error log:\n%s", err, b)
	}
	return s, nil
}

// nginxSpooled counts the responses nginx wrote to a temporary file.
func nginxSpooled(dir string) int {
	b, _ := os.ReadFile(filepath.Join(dir, "nginx", "error.log"))
	return bytes.Count(b, []byte("buffered to a temporary file"))
}

// nginxErrors is the end of nginx's error log, for an error about target
// nginx; empty for any other target.
func nginxErrors(dir, target string) string {
	if target != "nginx" {
		return ""
	}
	b, _ := os.ReadFile(filepath.Join(dir, "nginx", "error.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "; nginx's error log ends:\n" + string(b)
}

// loadavg is the first three fields of /proc/loadavg: other work on the
// machine, printed beside the figures.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// tcpMemKiB is the memory of every TCP socket on the machine (the "mem"
// pages of /proc/net/sockstat), in KiB; -1 if it cannot be read. Other work
// on the machine counts too.
func tcpMemKiB() int64 {
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "TCP:" {
			continue
		}
		for i := 1; i+1 < len(f); i += 2 {
			if f[i] == "mem" {
				n, err := strconv.ParseInt(f[i+1], 10, 64)
				if err != nil {
					return -1
				}
				return n * int64(os.Getpagesize()) / 1024
			}
		}
	}
	return -1
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times (100 on Linux
// everywhere but a few exotic builds).
const clockTick = 100

// tree is pid and its children (nginx's master and workers).
func tree(pid int) []int {
	pids := []int{pid}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil || c == pid {
			continue
		}
		if f, err := statFields(c); err == nil && len(f) > 1 && f[1] == strconv.Itoa(pid) {
			pids = append(pids, c)
		}
	}
	return pids
}

// statFields are the fields of /proc/PID/stat after the command name,
// starting with the state (field 3).
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, errors.New("malformed /proc stat")
	}
	return strings.Fields(string(b[i+1:])), nil
}

// cpuSeconds is the user and system CPU time of pid and its children.
func cpuSeconds(pid int) float64 {
	var ticks int64
	for _, p := range tree(pid) {
		f, err := statFields(p)
		if err != nil || len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64) // utime, field 14
		s, _ := strconv.ParseInt(f[12], 10, 64) // stime, field 15
		ticks += u + s
	}
	return float64(ticks) / clockTick
}

// memKiB sums a /proc/PID/status field (VmRSS, VmHWM) over pid and its
// children, in KiB. Pages the processes share (nginx's workers and master)
// count once for each.
func memKiB(pid int, field string) int64 {
	var total int64
	for _, p := range tree(pid) {
		f, err := os.Open("/proc/" + strconv.Itoa(p) + "/status")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
				n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				total += n
			}
		}
		f.Close()
	}
	return total
}

// goroutines reads go_goroutines from the edge's /metrics; -1 if it cannot.
func goroutines(ctx context.Context, admin string) int {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return int(n)
			}
		}
	}
	return -1
}

// metricLines are the lines of the edge's /metrics that start with prefix.
func metricLines(ctx context.Context, admin, prefix string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error() + "\n"
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			b.WriteString(sc.Text() + "\n")
		}
	}
	return b.String()
}

// BuildEdge builds the edge into dir and returns the binary's path.
func BuildEdge(dir string) (string, error) {
	bin := filepath.Join(dir, "edge")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/edgeguard/edgeguard/cmd/edge").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building the edge: %w\n%s", err, out)
	}
	return bin, nil
}
