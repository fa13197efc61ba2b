package edge

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// readyz is one answer of the admin port's /readyz.
type readyz struct {
	code int
	body string
}

func getReadyz(t *testing.T, r *running) readyz {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + r.AdminAddr() + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return readyz{resp.StatusCode, string(b)}
}

// waitReadyz polls /readyz until cond holds, and returns the answer.
func waitReadyz(t *testing.T, r *running, what string, cond func(readyz) bool) readyz {
	t.Helper()
	var last readyz
	err := proc.PollEvery(testenv.Within(t, 15*time.Second), 20*time.Millisecond, what, func(context.Context) error {
		if last = getReadyz(t, r); !cond(last) {
			return fmt.Errorf("/readyz answered %d %q", last.code, last.body)
		}
		return nil
	})
	require.NoError(t, err)
	return last
}

type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *syncLog) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// startLoggedEdge is startEdge with the edge's log kept.
func startLoggedEdge(t *testing.T, rulesYAML string, mutate func(*config.Config)) (*running, *syncLog) {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Origins = []string{testOrigin(t)}
	cfg.DrainDelay = 0
	cfg.Rules = filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(cfg.Rules, []byte(rulesYAML), 0o600))
	if mutate != nil {
		mutate(&cfg)
	}
	logs := &syncLog{}
	e, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Edge: e, done: make(chan error, 1)}
	go func() { r.done <- e.Run(ctx) }()
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); r.stopErr = <-r.done }) }
	t.Cleanup(r.stop)
	return r, logs
}

func deadRedis(t *testing.T) string { return "redis://" + testenv.ClosedAddr(t) }

// TestReadiness walks the readiness table of docs/clients.md, one row per subtest,
// with real HTTP against an edge on a real Redis (or a closed port), at the
// default flags but for the store URL and the fail mode. Draining after a
// real SIGTERM is in e2e (TestGracefulShutdownLosesNoInFlightRequest and
// TestReadinessOfProcesses); no rules loaded is TestReadinessWithoutRules.
func TestReadiness(t *testing.T) {
	waiting(t)
	rd, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rd.Close() })

	t.Run("serving, Redis healthy: 200", func(t *testing.T) { readyHealthy(t, rd.URL()) })
	t.Run("fail-mode fallback, Redis down: 200 degraded", func(t *testing.T) { readyFallbackDown(t) })
	t.Run("fail-mode fallback, Redis slow: 200 degraded, then ready", func(t *testing.T) { readyFallbackSlow(t) })
	t.Run("fail-mode closed, Redis unreachable: 503", func(t *testing.T) { readyClosedUnreachable(t) })
	t.Run("fail-mode closed, Redis frozen: 503, then ready", func(t *testing.T) { readyClosedFrozen(t) })
	t.Run("Redis rejects our credentials: 200 degraded, logged, metric", func(t *testing.T) { readyWrongCredentials(t) })
}

// readyRedis points an edge at the Redis at url, with fail mode mode and
// keys salted with salt.
func readyRedis(url string, mode limiter.FailMode, salt string) func(*config.Config) {
	return func(c *config.Config) {
		c.Redis, c.FailMode, c.KeySalt = url, mode, salt
	}
}

// readyHealthy: serving, with Redis healthy: 200 and ready.
func readyHealthy(t *testing.T, redisURL string) {
	r := startEdge(t, perIP, readyRedis(redisURL, limiter.FailFallback, testenv.KeyPrefix(t)))
	require.Equal(t, []int{200, 200, 200, 429}, codes(t, r, 4, "/"))
	require.Equal(t, readyz{200, "ready\n"}, getReadyz(t, r))
	require.Equal(t, 1.0, metricValue(t, r, "edgeguard_edge_ready"))
	require.Zero(t, metricSum(t, r, "edgeguard_limiter_degraded"))
	require.Equal(t, 3.0, metricSum(t, r, "edgeguard_edge_decisions_total", "reason", "redis", "decision", "allowed"))
}

// readyFallbackDown: fail-mode fallback, Redis down: 200 degraded.
func readyFallbackDown(t *testing.T) {
	r := startEdge(t, perIP, readyRedis(deadRedis(t), limiter.FailFallback, testenv.KeyPrefix(t)))
	// Known before any request: the script load at start failed.
	rz := getReadyz(t, r)
	require.Equal(t, 200, rz.code)
	require.True(t, strings.HasPrefix(rz.body, "degraded: reason=unreachable"), rz.body)
	require.Contains(t, rz.body, "decided locally")
	require.Equal(t, []int{200, 200, 200, 429}, codes(t, r, 4, "/"), "still enforcing, locally")
	require.Equal(t, 200, getReadyz(t, r).code)
	require.Equal(t, 1.0, metricSum(t, r, "edgeguard_limiter_degraded", "reason", "unreachable"))
	require.Equal(t, 1.0, metricValue(t, r, "edgeguard_edge_ready"))
}

// frozenRedisEdge starts an edge with fail mode mode on a Redis of its
// own, checks it is ready, and freezes that Redis; thaw resumes it (and
// runs at cleanup if the test has not).
func frozenRedisEdge(t *testing.T, mode limiter.FailMode) (r *running, thaw func()) {
	frozen, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = frozen.Close() })
	r = startEdge(t, perIP, readyRedis(frozen.URL(), mode, testenv.KeyPrefix(t)))
	require.Equal(t, readyz{200, "ready\n"}, getReadyz(t, r))
	frozen.Freeze()
	var once sync.Once
	thaw = func() { once.Do(frozen.Thaw) }
	t.Cleanup(thaw)
	return r, thaw
}

// readyFallbackSlow: fail-mode fallback, Redis slow: 200 degraded, then ready.
func readyFallbackSlow(t *testing.T) {
	r, thaw := frozenRedisEdge(t, limiter.FailFallback)
	// Past the deadline (250 ms) the checks are decided locally.
	require.Equal(t, []int{200, 200, 200, 429}, codes(t, r, 4, "/"))
	rz := getReadyz(t, r)
	require.Equal(t, 200, rz.code)
	require.True(t, strings.HasPrefix(rz.body, "degraded: reason=timeout"), rz.body)
	require.Equal(t, 1.0, metricSum(t, r, "edgeguard_limiter_degraded", "reason", "timeout"))
	// Each of the 4 requests timed out; a health probe that ran inside
	// the freeze (a slow host stretches it) counts one more.
	require.GreaterOrEqual(t, metricSum(t, r, "edgeguard_limiter_store_errors_total", "class", "timeout"), 4.0)
	// Redis answers again; no request comes, readiness finds out.
	thaw()
	waitReadyz(t, r, "ready once Redis answers", func(rz readyz) bool { return rz == readyz{200, "ready\n"} })
	require.Zero(t, metricSum(t, r, "edgeguard_limiter_degraded"))
}

// readyClosedUnreachable: fail-mode closed, Redis unreachable: 503.
func readyClosedUnreachable(t *testing.T) {
	r := startEdge(t, perIP, readyRedis(deadRedis(t), limiter.FailClosed, testenv.KeyPrefix(t)))
	rz := getReadyz(t, r)
	require.Equal(t, 503, rz.code, rz.body)
	require.True(t, strings.HasPrefix(rz.body, "unavailable: reason=unreachable"), rz.body)
	require.Equal(t, []int{503, 503}, codes(t, r, 2, "/"), "what /readyz announced")
	require.Equal(t, 503, getReadyz(t, r).code)
	require.Zero(t, metricValue(t, r, "edgeguard_edge_ready"))
}

// readyClosedFrozen: fail-mode closed, Redis frozen: 503, then ready.
func readyClosedFrozen(t *testing.T) {
	r, thaw := frozenRedisEdge(t, limiter.FailClosed)
	require.Equal(t, []int{503, 503, 503, 503, 503, 503}, codes(t, r, 6, "/"))
	rz := getReadyz(t, r)
	require.Equal(t, 503, rz.code, rz.body)
	require.True(t, strings.HasPrefix(rz.body, "unavailable: reason=timeout"), rz.body)
	require.Contains(t, rz.body, "1 shard(s) with an open breaker")
	require.Zero(t, metricValue(t, r, "edgeguard_edge_ready"))
	// No traffic reaches a node its load balancer took out: readiness
	// itself probes, and the node comes back once Redis answers.
	thaw()
	waitReadyz(t, r, "ready once Redis answers", func(rz readyz) bool { return rz == readyz{200, "ready\n"} })
	// (The timed-out calls may have counted in Redis once it resumed:
	// the quota left is not asserted, only who decides.)
	before := metricSum(t, r, "edgeguard_limiter_checks_total", "reason", "redis")
	codes(t, r, 1, "/")
	require.Equal(t, before+1, metricSum(t, r, "edgeguard_limiter_checks_total", "reason", "redis"), "Redis decides again")
}

// readyWrongCredentials: Redis rejects our credentials: 200 degraded, logged, metric.
func readyWrongCredentials(t *testing.T) {
	locked, err := testenv.StartStandalone(testenv.StandaloneOptions{Password: "the-right-one"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = locked.Close() })
	wrong := (&url.URL{Scheme: "redis", Host: locked.Addr, User: url.UserPassword("", "a-wrong-one")}).String()
	r, logs := startLoggedEdge(t, perIP, readyRedis(wrong, limiter.FailFallback, testenv.KeyPrefix(t)))
	rz := getReadyz(t, r)
	require.Equal(t, 200, rz.code)
	require.True(t, strings.HasPrefix(rz.body, "degraded: reason=credentials"), rz.body)
	require.Contains(t, rz.body, "WRONGPASS")
	require.Equal(t, []int{200, 200, 200, 429}, codes(t, r, 4, "/"), "enforced locally meanwhile")
	require.Equal(t, 1.0, metricSum(t, r, "edgeguard_limiter_degraded", "reason", "credentials"))
	require.Positive(t, metricSum(t, r, "edgeguard_limiter_store_errors_total", "class", "credentials"), "what the alert watches")
	require.Contains(t, logs.String(), "level=ERROR msg=\"rate limit store rejects our credentials")
}

// TestReadinessWithoutRules: an edge whose rules come from Consul, which
// holds an invalid document (and no cache on disk): 503 "no rules loaded",
// until valid rules arrive.
func TestReadinessWithoutRules(t *testing.T) {
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	kv := regionClient(t, c).Layout().GlobalRules()
	cl, err := c.Client("")
	require.NoError(t, err)
	_, err = cl.KV().Put(&api.KVPair{Key: kv, Value: []byte("version: 1\nrules:\n  - id: broken\n    limit: -1\n")}, nil)
	require.NoError(t, err)
	r := startConsulEdge(t, "eu-west", "ams", c.HTTPAddr(), filepath.Join(t.TempDir(), "cache.yaml"))
	require.Equal(t, readyz{503, "no rules loaded\n"}, getReadyz(t, r))
	require.Zero(t, metricValue(t, r, "edgeguard_edge_ready"))

	rulesFile := filepath.Join(t.TempDir(), "global.yaml")
	require.NoError(t, os.WriteFile(rulesFile, []byte(tightGlobal), 0o600))
	out, code := regionctlRun(t, "--consul", c.HTTPAddr(), "rules", "push", "--all", "--message", "first rules", rulesFile)
	require.Equal(t, 0, code, out)
	waitReadyz(t, r, "ready once rules arrive", func(rz readyz) bool { return rz == readyz{200, "ready\n"} })
	require.Equal(t, 1.0, metricValue(t, r, "edgeguard_edge_ready"))
}

// TestReadinessWhileDraining: from the moment the edge starts draining,
// /readyz answers 503 even though the store is healthy.
func TestReadinessWhileDraining(t *testing.T) {
	waiting(t)
	r := startEdge(t, perIP, func(c *config.Config) { c.DrainDelay = time.Second })
	require.Equal(t, readyz{200, "ready\n"}, getReadyz(t, r))
	go r.stop()
	rz := waitReadyz(t, r, "503 while draining", func(rz readyz) bool { return rz.code == 503 })
	require.Equal(t, "draining\n", rz.body)
}
