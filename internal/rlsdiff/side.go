package rlsdiff

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// A Command starts one of the two services: a binary, its arguments
// (`rls` for the edge) and environment added to the settings the harness
// gives both.
type Command struct {
	Name string
	Path string
	Args []string
	Env  []string
}

// freePort asks the kernel for a port nobody listens on.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// redisServer is one redis-server for one side, emptied between sets.
type redisServer struct {
	cmd    *exec.Cmd
	addr   string
	client *redis.Client
}

func startRedis(ctx context.Context, bin string) (*redisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	r := &redisServer{cmd: cmd, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	r.client = redis.NewClient(&redis.Options{Addr: r.addr, MaxRetries: -1})
	err = pollUntil(ctx, 10*time.Second, func() bool { return r.client.Ping(ctx).Err() == nil }, nil)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("redis-server on %s: %w", r.addr, err)
	}
	return r, nil
}

func (r *redisServer) close() {
	_ = r.client.Close()
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
}

// pollUntil calls ok every 20 ms until it holds, dead reports that it
// never will, or the time is up.
func pollUntil(ctx context.Context, d time.Duration, ok func() bool, dead <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if ok() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-dead:
			return errExited
		case <-t.C:
		}
	}
}

var errExited = errors.New("the process exited")

// instance is one service serving one set.
type instance struct {
	cmd    *exec.Cmd
	exited chan struct{}
	out    *lockedBuffer
	conn   *grpc.ClientConn
	client pb.RateLimitServiceClient
	// Refused says the service would not serve the set: it exited, or
	// never answered its health check.
	Refused bool
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startInstance runs c on root (RUNTIME_ROOT, with the documents under
// ratelimit/config) and r, with the reference's variables, as its
// container would set them, and waits until /healthcheck answers 200 or
// the process exits.
func startInstance(ctx context.Context, c Command, root string, r *redisServer, env []string) (*instance, error) {
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	cmd := exec.Command(c.Path, c.Args...)
	dieWithParent(cmd)
	cmd.Env = append(os.Environ(),
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL="+r.addr,
		"USE_STATSD=false", "LOG_LEVEL=warn",
		"HOST=127.0.0.1", "PORT="+strconv.Itoa(ports[0]),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(ports[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(ports[2]),
	)
	cmd.Env = append(append(cmd.Env, c.Env...), env...)
	in := &instance{cmd: cmd, exited: make(chan struct{}), out: &lockedBuffer{}}
	cmd.Stdout, cmd.Stderr = in.out, in.out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", c.Path, err)
	}
	go func() {
		_ = cmd.Wait()
		close(in.exited)
	}()
	health := "http://127.0.0.1:" + strconv.Itoa(ports[0]) + "/healthcheck"
	hc := &http.Client{Timeout: time.Second}
	err := pollUntil(ctx, 15*time.Second, func() bool {
		resp, err := hc.Get(health)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, in.exited)
	if err != nil {
		in.Refused = true
		return in, nil
	}
	conn, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(ports[1]), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		in.stop()
		return nil, err
	}
	in.conn, in.client = conn, pb.NewRateLimitServiceClient(conn)
	return in, nil
}

func (in *instance) stop() {
	if in.conn != nil {
		_ = in.conn.Close()
	}
	select {
	case <-in.exited:
		return
	default:
	}
	_ = in.cmd.Process.Kill()
	<-in.exited
}

// writeRuntime copies a set's files into a fresh RUNTIME_ROOT.
func writeRuntime(dir string, s Set) (string, error) {
	cfg := filepath.Join(dir, "ratelimit", "config")
	if err := os.MkdirAll(cfg, 0o755); err != nil {
		return "", err
	}
	for i, f := range s.Files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		name := fmt.Sprintf("%02d-%s", i, filepath.Base(f))
		if err := os.WriteFile(filepath.Join(cfg, name), b, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}
