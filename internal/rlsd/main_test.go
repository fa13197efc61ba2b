package rlsd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	poll "github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// The edge binary, built once for the package's tests, and a standalone
// Redis they share (each test limits its own descriptor values).
var (
	edgeBin string
	shared  struct {
		mu         sync.Mutex
		standalone *testenv.Standalone
	}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rlsd-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	edgeBin = filepath.Join(dir, "edge")
	build := exec.Command("go", "build", "-o", edgeBin, "github.com/edgeguard/edgeguard/cmd/edge")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	code := 1
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building cmd/edge:", err)
	} else {
		code = m.Run()
	}
	shared.mu.Lock()
	if shared.standalone != nil {
		_ = shared.standalone.Close()
	}
	shared.mu.Unlock()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// redisAddr is the shared standalone Redis's host:port.
func redisAddr(t *testing.T) string {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.standalone == nil {
		s, err := testenv.StartStandalone(testenv.StandaloneOptions{})
		require.NoError(t, err)
		shared.standalone = s
	}
	return strings.TrimPrefix(shared.standalone.URL(), "redis://")
}

// k8sConfig writes a configuration directory as a Kubernetes ConfigMap
// volume lays it out, at root/ratelimit/config: the documents in a
// timestamped hidden directory, ..data a symlink to it, and each document
// a symlink through ..data.
func k8sConfig(t *testing.T, docs map[string]string) (root string) {
	t.Helper()
	root = t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	stamp := filepath.Join(dir, "..2026_01_01_00_00_00.000000001")
	require.NoError(t, os.MkdirAll(stamp, 0o755))
	for name, doc := range docs {
		require.NoError(t, os.WriteFile(filepath.Join(stamp, name), []byte(doc), 0o644))
	}
	require.NoError(t, os.Symlink(filepath.Base(stamp), filepath.Join(dir, "..data")))
	for name := range docs {
		require.NoError(t, os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)))
	}
	return root
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ps, err := testenv.FreePorts(n)
	require.NoError(t, err)
	return ps
}

// lockedBuffer is a process's stderr, read while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// proc is a running `edge rls`.
type proc struct {
	cmd            *exec.Cmd
	log            *lockedBuffer
	done           chan struct{}
	err            error
	http, grpc, db string // addresses
	conn           *grpc.ClientConn
}

// startRLS starts `edge rls` with env only (and the ports it is given)
// and waits until /healthcheck answers 200.
func startRLS(t *testing.T, env []string) *proc {
	t.Helper()
	return startBin(t, edgeBin, []string{"rls"}, env)
}

// startBin starts bin with args and env as startRLS starts `edge rls`.
func startBin(t *testing.T, bin string, args, env []string) *proc {
	t.Helper()
	ports := freePorts(t, 3)
	p := &proc{log: &lockedBuffer{}, done: make(chan struct{}),
		http: "127.0.0.1:" + strconv.Itoa(ports[0]), grpc: "127.0.0.1:" + strconv.Itoa(ports[1]), db: "127.0.0.1:" + strconv.Itoa(ports[2])}
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "EDGEGUARD_DRAIN_DELAY=") }) {
		// A drain longer than any test: stop ends it with a second signal
		// once it has seen it, however slow the machine.
		env = append(env, "EDGEGUARD_DRAIN_DELAY=10m")
	}
	env = append(env,
		"HOST=127.0.0.1", "PORT="+strconv.Itoa(ports[0]),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(ports[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(ports[2]))
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("edge rls log:\n%s", p.log.String())
		}
	})
	err := poll.PollEvery(testenv.Within(t, 60*time.Second), 20*time.Millisecond, "edge rls serving", func(context.Context) error {
		select {
		case <-p.done:
			return poll.Permanent(fmt.Errorf("exited before serving: %v", p.err))
		default:
		}
		if code, body := p.get(t, "/healthcheck"); code != http.StatusOK {
			return fmt.Errorf("/healthcheck: %d %s", code, body)
		}
		return nil
	})
	require.NoError(t, err, p.log.String())
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	p.conn = conn
	return p
}

func (p *proc) get(t *testing.T, path string) (int, string) {
	t.Helper()
	return httpGet("http://" + p.http + path)
}

func httpGet(url string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (p *proc) call(t *testing.T, domain string, entries ...string) *pb.RateLimitResponse {
	t.Helper()
	var d rlv3.RateLimitDescriptor
	for i := 0; i+1 < len(entries); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: entries[i], Value: entries[i+1]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pb.NewRateLimitServiceClient(p.conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{&d}})
	require.NoError(t, err)
	return resp
}

func (p *proc) health(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(p.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: pb.RateLimitService_ServiceDesc.ServiceName})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return r.Status
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	require.NoError(t, poll.PollEvery(testenv.Within(t, within), 10*time.Millisecond, what, func(context.Context) error {
		if !cond() {
			return errors.New("not yet")
		}
		return nil
	}))
}

// stop sends SIGTERM and checks the drain: NOT_SERVING on gRPC health
// and /healthcheck 500 while calls are still answered; then a second
// SIGTERM ends the drain, and the process exits 0.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	waitFor(t, "gRPC health NOT_SERVING after SIGTERM", 30*time.Second, func() bool {
		return p.health(t) == healthpb.HealthCheckResponse_NOT_SERVING
	})
	code, body := p.get(t, "/healthcheck")
	require.Equal(t, http.StatusInternalServerError, code, body)
	require.Empty(t, body)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pb.NewRateLimitServiceClient(p.conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "drain", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	require.NoError(t, err, "a call while draining")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.exited(t)
}

// exited waits for the process to exit, and checks it exited 0.
func (p *proc) exited(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("edge rls still running 60 s after SIGTERM")
	}
	require.NoError(t, p.err, "exit status")
	require.Equal(t, 0, p.cmd.ProcessState.ExitCode())
}

// udpSink is a statsd server: every line received.
type udpSink struct {
	conn  net.PacketConn
	mu    sync.Mutex
	lines []string
}

func newUDPSink(t *testing.T) *udpSink {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &udpSink{conn: c}
	t.Cleanup(func() { _ = c.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.lines = append(s.lines, strings.Split(string(buf[:n]), "\n")...)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *udpSink) port() int { return s.conn.LocalAddr().(*net.UDPAddr).Port }

// counters sums the statsd counters received by name.
func (s *udpSink) counters() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, l := range s.lines {
		name, rest, ok := strings.Cut(l, ":")
		v, typ, ok2 := strings.Cut(rest, "|")
		if !ok || !ok2 || typ != "c" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err == nil {
			out[name] += n
		}
	}
	return out
}
