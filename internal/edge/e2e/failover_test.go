package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// A limit the steady load never reaches: every answer is 200 whether Redis
// or the fallback decides, so any 5xx is the failover's fault.
// sliding_window keeps its keys for two windows, so the test can find on
// which master each lives (a token bucket far from empty expires at once).
const steadyRules = `
version: 1
rules:
  - id: per-ip
    key: [ip]
    algorithm: sliding_window
    limit: 100000
    window: 1m
`

// load is a steady stream of requests from a few goroutines, round-robin
// over client addresses, bounded in count and time.
type load struct {
	ips  []string
	sent atomic.Int64 // requests answered (or failed)
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	mu    sync.Mutex
	codes map[int]int
	errs  []string // transport errors and 5xx, first few
	nerr  int
}

func startLoad(t *testing.T, e *edgeProc, ips []string, workers int, maxDur time.Duration, maxPerWorker int) *load {
	l := &load{ips: ips, stop: make(chan struct{}), codes: map[int]int{}}
	client := newClient(t, workers)
	var next atomic.Int64
	deadline := time.Now().Add(maxDur)
	for range workers {
		l.wg.Go(func() {
			for range maxPerWorker {
				select {
				case <-l.stop:
					return
				default:
				}
				if time.Now().After(deadline) {
					return
				}
				ip := ips[int(next.Add(1)-1)%len(ips)]
				r := get(client, e.url("/"), "X-Forwarded-For", ip)
				l.record(r)
				l.sent.Add(1)
				time.Sleep(time.Millisecond) // kept: the clients' pace, not a wait for a signal
			}
		})
	}
	t.Cleanup(l.halt)
	return l
}

func (l *load) record(r reply) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.err != nil || (r.code != http.StatusOK && r.code != http.StatusTooManyRequests) {
		l.nerr++
		if len(l.errs) < 5 {
			l.errs = append(l.errs, fmt.Sprintf("%s: status %d err %v body %q", time.Now().Format("15:04:05.000"), r.code, r.err, r.body))
		}
		return
	}
	l.codes[r.code]++
}

// halt stops the load and waits for it; safe to call twice.
func (l *load) halt() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// waitSent waits until n more requests were answered.
func (l *load) waitSent(n int64, timeout time.Duration) error {
	target := l.sent.Load() + n
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return proc.PollEvery(ctx, 5*time.Millisecond, fmt.Sprintf("%d more requests answered", n), func(context.Context) error {
		if got := l.sent.Load(); got < target {
			return fmt.Errorf("%d of %d requests answered", got, target)
		}
		return nil
	})
}

func clientIPs(n int) []string {
	ips := make([]string, n)
	for i := range ips {
		ips[i] = fmt.Sprintf("203.0.113.%d", i+1)
	}
	return ips
}

// decisionsBy is the edge's rule decisions by reason (redis, fallback, ...).
type decisionsBy struct{ redis, fallback, fallbackTotal, breakerOpen, breaker float64 }

func decisionsOf(m metrics) decisionsBy {
	return decisionsBy{
		redis:         sum(m, mDecisions, "reason", "redis"),
		fallback:      sum(m, mDecisions, "reason", "fallback"),
		fallbackTotal: sum(m, mFallback),
		breakerOpen:   sum(m, mFallback, "reason", "breaker_open"),
		breaker:       sum(m, mBreaker),
	}
}

// waitBackOnRedis polls until, over a window in which the load sent every
// client address at least three times, no decision fell back and Redis
// decided: every key, including those of the failed master, is on Redis
// again.
func waitBackOnRedis(e *edgeProc, l *load, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return proc.PollEvery(ctx, 50*time.Millisecond, "decisions back on Redis", func(context.Context) error {
		m0, err := scrapeErr(e)
		if err != nil {
			return err
		}
		if err := l.waitSent(int64(3*len(l.ips)), 5*time.Second); err != nil {
			return err
		}
		m1, err := scrapeErr(e)
		if err != nil {
			return err
		}
		d0, d1 := decisionsOf(m0), decisionsOf(m1)
		if d1.fallback > d0.fallback || d1.fallbackTotal > d0.fallbackTotal {
			return fmt.Errorf("still falling back: %.0f fallback decisions in the window (breaker state %.0f)", d1.fallback-d0.fallback, d1.breaker)
		}
		if d1.redis-d0.redis < float64(2*len(l.ips)) {
			return fmt.Errorf("only %.0f decisions by redis in the window", d1.redis-d0.redis)
		}
		return nil
	})
}

// checkLoad stops the load and asserts that it saw no 5xx or transport
// error at any point.
func checkLoad(t *testing.T, l *load) {
	l.halt()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Zero(t, l.nerr, "5xx or failed requests during the failover: %s", strings.Join(l.errs, "; "))
	require.Positive(t, l.codes[http.StatusOK])
	t.Logf("load: %d requests answered, statuses %v", l.sent.Load(), l.codes)
}

// TestClusterMasterKilledUnderLoad kills the master of one key's slot while
// an edge decides on a Redis Cluster under steady load: no request fails,
// the keys of that master fall back locally, and they return to Redis once
// a replica took over.
func TestClusterMasterKilledUnderLoad(t *testing.T) {
	c, err := testenv.StartCluster(testenv.ClusterOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	org := startOrigin(t, 0)
	e := startEdge(t, "--origin", org.URL, "--rules", writeRules(t, steadyRules),
		"--redis", c.URL(), "--redis-mode", "cluster",
		"--trusted-proxies", "127.0.0.1", "--key-salt", testenv.KeyPrefix(t))

	ips := clientIPs(32)
	l := startLoad(t, e, ips, 4, 45*time.Second, 20000)
	require.NoError(t, l.waitSent(int64(2*len(ips)), 10*time.Second))

	// The keys of the load land on every master; kill the master of one.
	masters, err := c.Masters(ctx)
	require.NoError(t, err)
	require.Len(t, masters, 3)
	keysOn := map[string][]string{}
	for _, m := range masters {
		require.NoError(t, onNode(ctx, m, func(ctx context.Context, r *redis.Client) error {
			keys, err := r.Keys(ctx, "eg:*").Result()
			keysOn[m] = keys
			return err
		}))
		require.NotEmpty(t, keysOn[m], "no key of the load on master %s (32 client addresses)", m)
	}
	key := keysOn[masters[0]][0]
	victim, err := c.MasterForKey(ctx, key)
	require.NoError(t, err)
	require.Equal(t, masters[0], victim)

	before := decisionsOf(scrape(t, e))
	killed := time.Now()
	newMaster, err := c.KillMasterAndWaitFailover(ctx, victim)
	require.NoError(t, err)
	failover := time.Since(killed)
	during := decisionsOf(scrape(t, e))
	require.Positive(t, during.fallback-before.fallback, "the killed master's keys fell back locally")
	require.Positive(t, during.fallbackTotal-before.fallbackTotal)

	recovered := time.Now()
	require.NoError(t, waitBackOnRedis(e, l, 20*time.Second), "decisions did not return to Redis after the failover")
	recovery := time.Since(recovered)
	after := decisionsOf(scrape(t, e))
	checkLoad(t, l)
	t.Logf("killed %s (%d of the load's keys on it); %s took over after %s; back on Redis %s after that; fallback decisions %.0f (fallback counter %.0f, %.0f of them with the breaker open), redis decisions %.0f → %.0f",
		victim, len(keysOn[victim]), newMaster, failover.Round(time.Millisecond), recovery.Round(time.Millisecond),
		after.fallback-before.fallback, after.fallbackTotal-before.fallbackTotal, after.breakerOpen-before.breakerOpen, before.redis, after.redis)
	logKeySpread(t, keysOn)
}

func logKeySpread(t *testing.T, keysOn map[string][]string) {
	var parts []string
	for m, keys := range keysOn {
		parts = append(parts, fmt.Sprintf("%s:%d", m, len(keys)))
	}
	sort.Strings(parts)
	t.Logf("keys per master before the kill: %s", strings.Join(parts, " "))
}

// TestSentinelMasterKilledUnderLoad does the same against a Sentinel group:
// the master is killed under load, every key falls back locally (no
// request fails), and decisions return to Redis once the sentinels
// promoted the replica.
func TestSentinelMasterKilledUnderLoad(t *testing.T) {
	s, err := testenv.StartSentinel(testenv.SentinelOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	org := startOrigin(t, 0)
	e := startEdge(t, "--origin", org.URL, "--rules", writeRules(t, steadyRules),
		"--redis", s.URL(), "--redis-mode", "sentinel",
		"--trusted-proxies", "127.0.0.1", "--key-salt", testenv.KeyPrefix(t))

	ips := clientIPs(8)
	l := startLoad(t, e, ips, 4, 45*time.Second, 20000)
	require.NoError(t, l.waitSent(int64(2*len(ips)), 10*time.Second))
	before := decisionsOf(scrape(t, e))
	require.Positive(t, before.redis, "Redis decides before the kill")
	require.Zero(t, before.fallbackTotal, "no fallback before the kill")

	old, err := s.MasterAddr(ctx)
	require.NoError(t, err)
	killed := time.Now()
	newMaster, err := s.KillMaster(ctx)
	require.NoError(t, err)
	failover := time.Since(killed)
	during := decisionsOf(scrape(t, e))
	require.Positive(t, during.fallback-before.fallback, "requests fell back locally while the master was down")
	require.Positive(t, during.fallbackTotal-before.fallbackTotal)

	recovered := time.Now()
	require.NoError(t, waitBackOnRedis(e, l, 20*time.Second), "decisions did not return to Redis after the failover")
	recovery := time.Since(recovered)
	after := decisionsOf(scrape(t, e))
	checkLoad(t, l)
	require.False(t, slices.Contains([]string{"", old}, newMaster))
	t.Logf("killed %s; sentinels promoted %s after %s; back on Redis %s after that; fallback decisions %.0f (fallback counter %.0f, %.0f of them with the breaker open), redis decisions %.0f → %.0f",
		old, newMaster, failover.Round(time.Millisecond), recovery.Round(time.Millisecond),
		after.fallback-before.fallback, after.fallbackTotal-before.fallbackTotal, after.breakerOpen-before.breakerOpen, before.redis, after.redis)
}
