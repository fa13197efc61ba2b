package limiter_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/leakcheck"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// The deployments every test of the package shares, each started on first
// use (a Cluster takes seconds on two cores; tests that need no Redis start
// none). Tests namespace their keys with KeyPrefix; destructive failover tests
// start their own.
var shared struct {
	mu         sync.Mutex
	standalone *testenv.Standalone
	cluster    *testenv.Cluster
	sentinel   *testenv.Sentinel
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
	if shared.sentinel != nil {
		_ = shared.sentinel.Close()
	}
	shared.mu.Unlock()
	// Every client and server is closed: nothing the limiter started may
	// still run.
	if code == 0 {
		if err := leakcheck.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// quietLogger drops go-redis's own log lines: tests that kill servers on
// purpose would bury real failures under "failed to dial" noise.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// must stops the test binary when a shared server cannot start: every test
// after it would fail for the same reason.
func must[T any](v T, err error, what string) T {
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting %s: %v\n", what, err)
		os.Exit(1)
	}
	return v
}

func standaloneSrv() *testenv.Standalone {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.standalone == nil {
		s, err := testenv.StartStandalone(testenv.StandaloneOptions{})
		shared.standalone = must(s, err, "redis")
	}
	return shared.standalone
}

func clusterSrv() *testenv.Cluster {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster == nil {
		c, err := testenv.StartCluster(testenv.ClusterOptions{})
		shared.cluster = must(c, err, "redis cluster")
	}
	return shared.cluster
}

func sentinelSrv() *testenv.Sentinel {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.sentinel == nil {
		d, err := testenv.StartSentinel(testenv.SentinelOptions{})
		shared.sentinel = must(d, err, "redis sentinel")
	}
	return shared.sentinel
}

// client is the shared client of a mode's shared deployment.
func client(mode limiter.Mode) redis.UniversalClient {
	url := map[limiter.Mode]func() string{
		limiter.ModeStandalone: func() string { return standaloneSrv().URL() },
		limiter.ModeCluster:    func() string { return clusterSrv().URL() },
		limiter.ModeSentinel:   func() string { return sentinelSrv().URL() },
	}[mode]()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if c, ok := shared.clients[mode]; ok {
		return c
	}
	c, err := limiter.NewRedisClient(url, mode)
	must(c, err, "redis client")
	if shared.clients == nil {
		shared.clients = map[limiter.Mode]redis.UniversalClient{}
	}
	shared.clients[mode] = c
	return c
}

// namedStore is one store under test.
type namedStore struct {
	name  string
	store limiter.Store
}

// allStores returns a fresh memory store and a RedisStore over every shared
// deployment, so semantic tests hold all four to the same answers.
func allStores(t *testing.T) []namedStore {
	out := []namedStore{{"memory", limiter.NewMemoryStore()}}
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster, limiter.ModeSentinel} {
		out = append(out, namedStore{string(mode), redisStore(t, client(mode))})
	}
	return out
}

func redisStore(t testing.TB, c redis.UniversalClient) *limiter.RedisStore {
	return connStore(t, limiter.Conn(c))
}

func connStore(t testing.TB, c limiter.RedisConn) *limiter.RedisStore {
	s, err := limiter.NewRedisStore(c, "")
	require.NoError(t, err)
	return s
}

// ctx is a generous deadline: exactness tests must never time out into an error.
func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}
