package rls_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limiter"
	"github.com/edgeguard/edgeguard/pkg/rlsconfig"
)

// The Redis deployments the conformance suite runs against, started on
// first use and shared by the package's tests (keys are namespaced per
// test by a key prefix).
var shared struct {
	mu         sync.Mutex
	standalone *testenv.Standalone
	cluster    *testenv.Cluster
	clients    map[limiter.Mode]redis.UniversalClient
}

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	code := m.Run()
	shared.mu.Lock()
	for _, c := range shared.clients {
		_ = c.Close()
	}
	if shared.standalone != nil {
		_ = shared.standalone.Close()
	}
	if shared.cluster != nil {
		_ = shared.cluster.Close()
	}
	shared.mu.Unlock()
	os.Exit(code)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func redisClient(t testing.TB, mode limiter.Mode) redis.UniversalClient {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if c, ok := shared.clients[mode]; ok {
		return c
	}
	var url string
	switch mode {
	case limiter.ModeStandalone:
		if shared.standalone == nil {
			s, err := testenv.StartStandalone(testenv.StandaloneOptions{})
			require.NoError(t, err)
			shared.standalone = s
		}
		url = shared.standalone.URL()
	case limiter.ModeCluster:
		if shared.cluster == nil {
			c, err := testenv.StartCluster(testenv.ClusterOptions{})
			require.NoError(t, err)
			shared.cluster = c
		}
		url = shared.cluster.URL()
	}
	c, err := limiter.NewRedisClient(url, mode)
	require.NoError(t, err)
	if shared.clients == nil {
		shared.clients = map[limiter.Mode]redis.UniversalClient{}
	}
	shared.clients[mode] = c
	return c
}

var prefixes atomic.Int64

// service is a rate limit service on loopback over a limiter on a real
// store, and an Envoy-style client (go-control-plane's generated client).
type service struct {
	srv    *rls.Server
	client pb.RateLimitServiceClient
	conn   *grpc.ClientConn
	addr   string
}

type setup struct {
	store limiter.Store
	// timeout is the limiter's store deadline; 0: storeDeadline.
	timeout time.Duration
	opts    rls.Options
	grpc    rls.GRPCOptions
	dir     string // configuration directory; "" writes doc into a fresh one
	doc     string
	match   []rlsconfig.Option    // how the documents compile
	reg     prometheus.Registerer // the limiter's metrics (nil: none)
}

// storeDeadline is the store deadline of a service whose test asserts what
// Redis answers (counts, remaining): one no stall of a busy machine
// reaches, so Redis decides every call. A call past the product's 250 ms
// goes to the fallback, rightly, and a late take counts in Redis until it
// is given back (under make test-busy a conformance test read 2 left where
// Redis, asked in time, says 3). The deadline itself is the subject of
// TestRedisDownEveryDecisionWithinTheDeadline, which sets its own.
const storeDeadline = 5 * time.Second

func newService(t testing.TB, s setup) *service {
	t.Helper()
	if s.timeout == 0 {
		s.timeout = storeDeadline
	}
	l, err := limiter.New(s.store, limiter.Config{StoreName: "redis", Timeout: s.timeout}, s.reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	t.Cleanup(l.Close)
	s.opts.Limiter = l
	srv, err := rls.New(s.opts, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	dir := s.dir
	if dir == "" {
		dir = filepath.Join(t.TempDir(), "config")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "test.yaml"), []byte(s.doc), 0o644))
	}
	require.NoError(t, srv.Reload(dir, false, s.match...))
	g := rls.NewGRPC(srv, s.grpc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- g.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		g.Stop(ctx)
		require.NoError(t, <-done)
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &service{srv: srv, client: pb.NewRateLimitServiceClient(conn), conn: conn, addr: ln.Addr().String()}
}

// stores are the deployments each conformance test runs on: standalone
// Redis and a Redis Cluster, each test with its own key prefix, and the
// memory store the fallback decides with.
func stores(t *testing.T) map[string]func(t *testing.T) limiter.Store {
	mk := func(mode limiter.Mode) func(t *testing.T) limiter.Store {
		return func(t *testing.T) limiter.Store {
			c := redisClient(t, mode)
			rs, err := limiter.NewRedisStore(limiter.Conn(c), fmt.Sprintf("rlstest%d:", prefixes.Add(1)))
			require.NoError(t, err)
			return rs
		}
	}
	return map[string]func(t *testing.T) limiter.Store{
		// The fallback's store: the answers when Redis cannot be asked.
		"memory":     func(*testing.T) limiter.Store { return limiter.NewMemoryStore() },
		"standalone": mk(limiter.ModeStandalone),
		"cluster":    mk(limiter.ModeCluster),
	}
}
