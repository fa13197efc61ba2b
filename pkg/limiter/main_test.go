package limiter_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// The deployments every test of the package shares (started once: a Cluster
// takes seconds on two cores). Tests namespace their keys with KeyPrefix;
// destructive failover tests start their own.
var (
	standalone *testenv.Standalone
	cluster    *testenv.Cluster
	sentinel   *testenv.Sentinel
	clients    = map[string]redis.UniversalClient{}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

// quietLogger drops go-redis's own log lines: tests that kill servers on
// purpose would bury real failures under "failed to dial" noise.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func run(m *testing.M) int {
	redis.SetLogger(quietLogger{})
	var err error
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
		for _, d := range []interface{ Close() error }{standalone, cluster, sentinel} {
			if d != nil {
				_ = d.Close()
			}
		}
	}()
	if standalone, err = testenv.StartStandalone(testenv.StandaloneOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "starting redis:", err)
		return 1
	}
	if cluster, err = testenv.StartCluster(testenv.ClusterOptions{}); err != nil {
		standalone.Close()
		fmt.Fprintln(os.Stderr, "starting redis cluster:", err)
		return 1
	}
	if sentinel, err = testenv.StartSentinel(testenv.SentinelOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "starting redis sentinel:", err)
		return 1
	}
	for name, u := range map[limiter.Mode]string{
		limiter.ModeStandalone: standalone.URL(),
		limiter.ModeCluster:    cluster.URL(),
		limiter.ModeSentinel:   sentinel.URL(),
	} {
		c, err := limiter.NewRedisClient(u, name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "redis client:", err)
			return 1
		}
		clients[string(name)] = c
	}
	return m.Run()
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
		out = append(out, namedStore{string(mode), redisStore(t, clients[string(mode)])})
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
