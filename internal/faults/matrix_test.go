package faults_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/faults"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// The fault matrix (issue 24): each fault against each deployment and each
// algorithm, with nodes edges (limiter.Limiter at the edge's defaults, Redis
// autopipelining on) each reaching Redis through its own proxy. A cell runs
// its clients for warm + the fault + recovery and asserts, from the
// clients' tallies and Redis's own state:
//
//   - admitted ≤ limit + ceil(limit/nodes) per key and window (more only
//     for what the window's own arithmetic allows: a bucket's refill, a
//     fixed window's boundary); across a master change under writes (a
//     failover with no pause, a master killed), admitted ≤ ceil(limit ×
//     1.01): the edges restore their last answers on the new master;
//   - the clients, who keep asking, get the limit (no lost quota): past
//     the recovery they ask on until the store denies them, up to
//     spentWait, so a store that answers again late on a busy machine
//     leaves them the time to ask;
//   - Redis never counts more than the clients were admitted (no invented
//     quota: an abandoned call or a replay counted twice shows here);
//   - a client under its limit is denied only by a fallback during the
//     fault and its one fallback window after, or within that window of a
//     store call timing out on its edge (a stall the machine made: the
//     fallback rightly denies an exact key then), or by a min_interval
//     within that window of a store call timing out on any edge (its late
//     take holds the interval until given back); no false denials;
//   - 0 concurrency slots held once every request ended and released;
//   - the edge serves throughout: Decide never fails (no 5xx of its own).
//
// `go test` runs the quick subset; EDGEGUARD_FAULTS=full runs every cell
// (make faults), and EDGEGUARD_FAULTS_TABLE=file writes the table there.
// EDGEGUARD_FAULTS=failover runs the master changes under writes only (make
// faults-failover, FAULTS_COUNT times each); EDGEGUARD_FAULTS_LIMIT sets
// their key's limit instead of masterChangeLimit.

const (
	nodes    = 3
	warm     = 600 * time.Millisecond
	recovery = 2500 * time.Millisecond
	// grace is the one fallback window after a fault ends: the breaker's
	// cooldown (1 s) and a deadline (250 ms) before a probe closes it,
	// with room for a loaded machine.
	grace = 1500 * time.Millisecond
	// heavyLimit is the limit of the key driven past it; lightLimit the
	// limit of the key whose client stays far under it.
	heavyLimit, lightLimit = 60, 400
	// spentWait bounds how long past the recovery the heavy clients ask
	// on until the store denies them (runCell).
	spentWait        = 10 * time.Second
	ccLimit, ccLight = 6, 50
	window           = time.Hour
)

// deployment is a Redis deployment as the cells see it.
type deployment struct {
	name string
	// client builds an edge's client, dialing through n.
	client func(n *faults.Net) redis.UniversalClient
	// direct is a client that bypasses every proxy (state, pauses).
	direct redis.UniversalClient
	// masters lists the masters' addresses (CLIENT PAUSE goes to each).
	masters func(ctx context.Context) ([]string, error)
	// failover promotes a replica of key's master while it is paused; nil
	// where there is none.
	failover func(ctx context.Context, key string, pause time.Duration) error
	// switchOver promotes a replica of key's master while the master
	// keeps serving (SENTINEL FAILOVER; CLUSTER FAILOVER FORCE on the
	// replica); kill SIGKILLs key's master and waits for its replica's
	// promotion. nil where there is none.
	switchOver, kill func(ctx context.Context, key string) error
}

// clientOptions are NewRedisClient's: deadlines honoured, no retries, one
// dial attempt.
func standaloneClient(addr string, n *faults.Net) redis.UniversalClient {
	return redis.NewClient(&redis.Options{Addr: addr, Dialer: n.Dial, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
}

func startStandalone(t *testing.T) *deployment {
	s, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	direct := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	return &deployment{
		name:    "standalone",
		client:  func(n *faults.Net) redis.UniversalClient { return standaloneClient(s.Addr, n) },
		direct:  direct,
		masters: func(context.Context) ([]string, error) { return []string{s.Addr}, nil },
	}
}

var (
	clusterOnce sync.Once
	cluster     *testenv.Cluster
	clusterErr  error
)

func sharedCluster(t *testing.T) *testenv.Cluster {
	clusterOnce.Do(func() { cluster, clusterErr = testenv.StartCluster(testenv.ClusterOptions{}) })
	require.NoError(t, clusterErr)
	return cluster
}

func startCluster(t *testing.T) *deployment { return clusterDeployment(t, sharedCluster(t)) }

// startOwnCluster is a Cluster of the cell's own: a master killed stays
// dead, and its promoted replica has none.
func startOwnCluster(t *testing.T) *deployment {
	c, err := testenv.StartCluster(testenv.ClusterOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return clusterDeployment(t, c)
}

func clusterDeployment(t *testing.T, c *testenv.Cluster) *deployment {
	direct := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = direct.Close() })
	return &deployment{
		name: "cluster",
		client: func(n *faults.Net) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{
				Addrs: c.Addrs(), Dialer: n.Dial, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
				ClusterStateReloadInterval: 5 * time.Second,
			})
		},
		direct:     direct,
		masters:    c.Masters,
		failover:   clusterFailover(c),
		switchOver: clusterSwitchOver(c),
		kill: func(ctx context.Context, key string) error {
			m, err := c.MasterForKey(ctx, key)
			if err != nil {
				return err
			}
			_, err = c.KillMasterAndWaitFailover(ctx, m)
			return err
		},
	}
}

// clusterSwitchOver promotes the replica of key's master with CLUSTER
// FAILOVER FORCE while the master serves on (it learns it lost its slots
// from the replica's announcement), then waits until the replica serves
// key and the cluster is healthy.
func clusterSwitchOver(c *testenv.Cluster) func(ctx context.Context, key string) error {
	return func(ctx context.Context, key string) error {
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		master := redis.NewClient(&redis.Options{Addr: m})
		role, err := master.Do(ctx, "ROLE").Slice()
		_ = master.Close()
		if err != nil {
			return err
		}
		replicas, _ := role[2].([]any)
		if len(replicas) == 0 {
			return fmt.Errorf("%s has no replica", m)
		}
		r, _ := replicas[0].([]any)
		addr := fmt.Sprintf("%v:%v", r[0], r[1])
		replica := redis.NewClient(&redis.Options{Addr: addr})
		err = replica.Do(ctx, "CLUSTER", "FAILOVER", "FORCE").Err()
		_ = replica.Close()
		if err != nil {
			return fmt.Errorf("CLUSTER FAILOVER FORCE on %s: %w", addr, err)
		}
		err = proc.PollEvery(ctx, 20*time.Millisecond, "the replica to serve "+key, func(ctx context.Context) error {
			now, err := c.MasterForKey(ctx, key)
			if err == nil && now != addr {
				err = fmt.Errorf("%s still served by %s", key, now)
			}
			return err
		})
		if err != nil {
			return err
		}
		return c.WaitHealthy(ctx)
	}
}

// clusterFailover freezes the master serving key (SIGSTOP) past the
// cluster's node timeout, so its replica is promoted while it is paused,
// then thaws it (it rejoins as a replica) and waits for a healthy cluster.
func clusterFailover(c *testenv.Cluster) func(ctx context.Context, key string, pause time.Duration) error {
	return func(ctx context.Context, key string, pause time.Duration) error {
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		if err := c.FreezeNode(m); err != nil {
			return err
		}
		timer(ctx, pause)
		if err := c.ThawNode(m); err != nil {
			return err
		}
		if err := c.WaitHealthy(ctx); err != nil {
			return err
		}
		// The witness: the key is served by the promoted replica.
		now, err := c.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		if now == m {
			return fmt.Errorf("no failover: %s still serves %s after a %v freeze", m, key, pause)
		}
		return nil
	}
}

var (
	sentinelOnce sync.Once
	sentinel     *testenv.Sentinel
	sentinelErr  error
)

func sentinelDeployment(t *testing.T, s *testenv.Sentinel) *deployment {
	direct := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs()})
	t.Cleanup(func() { _ = direct.Close() })
	return &deployment{
		name: "sentinel",
		client: func(n *faults.Net) redis.UniversalClient {
			return redis.NewFailoverClient(&redis.FailoverOptions{
				MasterName: s.MasterName, SentinelAddrs: s.SentinelAddrs(), Dialer: n.Dial,
				ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
			})
		},
		direct: direct,
		masters: func(ctx context.Context) ([]string, error) {
			m, err := s.MasterAddr(ctx)
			return []string{m}, err
		},
		failover: func(ctx context.Context, _ string, pause time.Duration) error {
			m, err := s.MasterAddr(ctx)
			if err != nil {
				return err
			}
			cl := redis.NewClient(&redis.Options{Addr: m})
			err = cl.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err()
			_ = cl.Close()
			if err != nil {
				return fmt.Errorf("pausing %s: %w", m, err)
			}
			_, err = s.Failover(ctx)
			return err
		},
		switchOver: func(ctx context.Context, _ string) error {
			_, err := s.Failover(ctx)
			return err
		},
		kill: func(ctx context.Context, _ string) error {
			_, err := s.KillMaster(ctx)
			return err
		},
	}
}

// startSentinel shares one Sentinel group among the cells that leave its
// master in place; a failover cell gets a group of its own.
func startSentinel(t *testing.T) *deployment {
	sentinelOnce.Do(func() {
		sentinel, sentinelErr = testenv.StartSentinel(testenv.SentinelOptions{DownAfter: 5 * time.Second})
	})
	require.NoError(t, sentinelErr)
	return sentinelDeployment(t, sentinel)
}

func startOwnSentinel(t *testing.T) *deployment {
	s, err := testenv.StartSentinel(testenv.SentinelOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return sentinelDeployment(t, s)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		_ = cluster.Close()
	}
	if sentinel != nil {
		_ = sentinel.Close()
	}
	os.Exit(code)
}

// fault is one row of the matrix: apply starts it and returns when it has
// run its course and been undone.
type fault struct {
	name  string
	apply func(ctx context.Context, c *cell) error
	// masterChange marks a master changed under writes: the cell's heavy
	// limit is masterChangeLimit, reached only after the change, its
	// recovery masterChangeRecovery, and its bound ceil(limit × 1.01).
	masterChange bool
}

// A master change costs what the edges admitted on the new master before
// the restore of the largest last answer reached it (restores raise the
// count to an answer, they do not add): a few requests at the clients'
// 60 per second. The key's limit takes 10 s to reach (more on a loaded
// machine: the recovery leaves room), so that those are
// measured against a window the clients fill after the change.
const (
	masterChangeLimit    = 600
	masterChangeRecovery = 13 * time.Second
)

func toxic(name string, typ, stream string, hold time.Duration, attrs map[string]any) fault {
	return fault{name: name, apply: func(ctx context.Context, c *cell) error {
		for _, e := range c.edges {
			if err := e.net.Add(faults.Toxic{Name: typ, Type: typ, Stream: stream, Attributes: attrs}); err != nil {
				return err
			}
		}
		timer(ctx, hold)
		for _, e := range c.edges {
			e.net.Clear()
		}
		return nil
	}}
}

// timer waits d (a fault's duration) or until ctx ends.
func timer(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// pauseFor pauses every master (CLIENT PAUSE ALL) for d: connections stay
// open and commands wait, past the limiter's deadline.
func pauseFor(ctx context.Context, c *cell, d time.Duration) error {
	ms, err := c.dep.masters(ctx)
	if err != nil {
		return err
	}
	for _, m := range ms {
		cl := redis.NewClient(&redis.Options{Addr: m})
		err := cl.Do(ctx, "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err()
		_ = cl.Close()
		if err != nil {
			return fmt.Errorf("pausing %s: %w", m, err)
		}
	}
	timer(ctx, d)
	return nil
}

var allFaults = []fault{
	toxic("latency 1ms", "latency", "downstream", 1500*time.Millisecond, map[string]any{"latency": 1}),
	toxic("latency 50ms", "latency", "downstream", 1500*time.Millisecond, map[string]any{"latency": 50}),
	toxic("latency 300ms", "latency", "downstream", 1500*time.Millisecond, map[string]any{"latency": 300}),
	toxic("bandwidth 1KB/s", "bandwidth", "downstream", 1500*time.Millisecond, map[string]any{"rate": 1}),
	toxic("reset", "reset_peer", "upstream", 1500*time.Millisecond, map[string]any{"timeout": 0}),
	toxic("black hole", "timeout", "upstream", 1500*time.Millisecond, map[string]any{"timeout": 0}),
	toxic("slow close", "slow_close", "downstream", 1500*time.Millisecond, map[string]any{"delay": 1000}),
	{name: "pause 1s", apply: func(ctx context.Context, c *cell) error { return pauseFor(ctx, c, time.Second) }},
	{name: "failover in pause", apply: func(ctx context.Context, c *cell) error {
		return c.dep.failover(ctx, c.edges[0].store.Keys(c.heavy)[0], 2500*time.Millisecond)
	}},
	{name: "failover under writes", masterChange: true, apply: func(ctx context.Context, c *cell) error {
		return c.dep.switchOver(ctx, c.edges[0].store.Keys(c.heavy)[0])
	}},
	{name: "master killed", masterChange: true, apply: func(ctx context.Context, c *cell) error {
		return c.dep.kill(ctx, c.edges[0].store.Keys(c.heavy)[0])
	}},
	{name: "5 flaps", apply: func(ctx context.Context, c *cell) error {
		for range 5 {
			for _, e := range c.edges {
				e.net.Cut()
			}
			timer(ctx, 300*time.Millisecond)
			for _, e := range c.edges {
				if err := e.net.Restore(); err != nil {
					return err
				}
			}
			timer(ctx, 300*time.Millisecond)
		}
		return nil
	}},
}

func faultNamed(name string) fault {
	for _, f := range allFaults {
		if f.name == name {
			return f
		}
	}
	panic("no fault " + name)
}

// edge is one limiter with its own way to Redis.
type edge struct {
	net    *faults.Net
	client redis.UniversalClient
	lim    *limiter.Limiter
	reg    *prometheus.Registry
	store  *limiter.RedisStore
	close  func()

	// mu guards timeouts, the store timeouts the limiter had counted when
	// last looked at (noteTimeouts), and lastTimeout, when that count
	// was last seen to grow.
	mu          sync.Mutex
	timeouts    float64
	lastTimeout time.Time
}

// noteTimeouts looks at how many store calls e's limiter has counted
// timing out, and returns when that count was last seen to grow (zero:
// never). Every client looks after each fallback decision on e, so a
// timeout (whose call the fallback decided) is seen as it ends, and the
// time kept is no earlier than the timeout's.
func (e *edge) noteTimeouts() time.Time {
	n, err := testenv.CounterValue(e.reg, "edgeguard_limiter_store_errors_total", "class", "timeout")
	e.mu.Lock()
	defer e.mu.Unlock()
	if err == nil && n > e.timeouts {
		e.timeouts, e.lastTimeout = n, time.Now()
	}
	return e.lastTimeout
}

// lastTimeout is the latest noteTimeouts of the cell's edges.
func (c *cell) lastTimeout() time.Time {
	var last time.Time
	for _, e := range c.edges {
		if at := e.noteTimeouts(); at.After(last) {
			last = at
		}
	}
	return last
}

// edgeLog is what the cell's limiters log (the store failing and answering
// again, with the error), printed when the cell fails.
type edgeLog struct {
	mu    sync.Mutex
	start time.Time
	b     strings.Builder
}

func (w *edgeLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(&w.b, "+%v ", time.Since(w.start).Round(time.Millisecond))
	return w.b.Write(p)
}

func (w *edgeLog) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func newEdge(t *testing.T, dep *deployment, log *slog.Logger) *edge {
	n := faults.NewNet()
	client := dep.client(n)
	conn, stop, err := limiter.AutoPipelined(client)
	require.NoError(t, err)
	store, err := limiter.NewRedisStore(conn, "")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, store.Load(ctx))
	reg := prometheus.NewRegistry()
	lim, err := limiter.New(store, limiter.Config{}, reg, log)
	require.NoError(t, err)
	return &edge{net: n, client: client, lim: lim, reg: reg, store: store, close: func() {
		lim.Close()
		_ = stop()
		_ = client.Close()
		n.Close()
	}}
}

// cell is one run: a fault against a deployment and an algorithm.
type cell struct {
	fault fault
	dep   *deployment
	alg   limit.Algorithm
	edges []*edge
	heavy limit.Limit
	light limit.Limit
	log   *edgeLog
}

// result is one row of the table.
type result struct {
	fault, deployment, algorithm string
	admitted, bound              int64
	overAdmission                int64
	lost                         int64 // limit − admitted; -1: not measured (concurrency)
	invented                     int64 // Redis's count − admitted; math.MinInt64: not countable
	falseDenials                 int64
	leaked                       int64 // -1: not a concurrency limit
	fallbackSeconds              float64
	errors                       int64
	failed                       bool
}

var (
	resultsMu sync.Mutex
	results   []result
)

// tally is what the clients saw.
type tally struct {
	admitted, errors, falseDenials atomic.Int64
	inflight, maxInflight          atomic.Int64
	mu                             sync.Mutex
	firstFallback, lastFallback    time.Time
	// start is the cell's; denied is the first denial the store itself
	// made, at deniedAt on edge deniedBy (what a cell that lost quota
	// says when it fails).
	start    time.Time
	denied   *limiter.Decision
	deniedAt time.Time
	deniedBy int
	// lastDenied is when the store last denied.
	lastDenied time.Time
}

// storeDenial notes d, a denial edge i's store made at at: the first one,
// and when the last was.
func (tl *tally) storeDenial(i int, d limiter.Decision, at time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.denied == nil {
		tl.denied, tl.deniedAt, tl.deniedBy = &d, at, i
	}
	if at.After(tl.lastDenied) {
		tl.lastDenied = at
	}
}

// storeDeniedAfter reports whether the store denied after at.
func (tl *tally) storeDeniedAfter(at time.Time) bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.lastDenied.After(at)
}

// firstDenial says what storeDenial noted.
func (tl *tally) firstDenial() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.denied == nil {
		return "none"
	}
	return fmt.Sprintf("+%v on edge %d, with %d admitted in all by the end: %s", tl.deniedAt.Sub(tl.start).Round(time.Millisecond), tl.deniedBy, tl.admitted.Load(), describe(*tl.denied))
}

// describe is what a decision says of the key's state.
func describe(d limiter.Decision) string {
	return fmt.Sprintf("admitted %d, limit %d, remaining %d, retry after %v, reset after %v, source %v", d.Admitted, d.Limit, d.Remaining, d.RetryAfter, d.ResetAfter, d.Source)
}

// limiterCounters lists the limiter's counters in reg that are not zero.
func limiterCounters(reg *prometheus.Registry) string {
	fams, err := reg.Gather()
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "edgeguard_limiter_") {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetCounter() == nil || m.GetCounter().GetValue() == 0 {
				continue
			}
			b.WriteString(strings.TrimPrefix(f.GetName(), "edgeguard_limiter_"))
			for _, l := range m.GetLabel() {
				fmt.Fprintf(&b, " %s=%s", l.GetName(), l.GetValue())
			}
			fmt.Fprintf(&b, ": %g; ", m.GetCounter().GetValue())
		}
	}
	return b.String()
}

func (tl *tally) fallback(at time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.firstFallback.IsZero() || at.Before(tl.firstFallback) {
		tl.firstFallback = at
	}
	if at.After(tl.lastFallback) {
		tl.lastFallback = at
	}
}

func usedFallback(v limiter.Verdict) bool {
	return slices.ContainsFunc(v.Checks, func(o limiter.Decision) bool { return o.Source == limiter.SourceFallback })
}

func runCell(t *testing.T, dep *deployment, f fault, alg limit.Algorithm) result {
	t.Helper()
	c := newCell(t, dep, f, alg)
	held := alg.Spec().Held

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var heavy, light tally
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the edges' log (from the cell's start):\n%s", c.log)
			for i, e := range c.edges {
				t.Logf("edge %d's limiter counters: %s", i, limiterCounters(e.reg))
			}
			t.Logf("the heavy key's first store denial: %s", heavy.firstDenial())
		}
	})
	stop := make(chan struct{})
	var faultEnd atomic.Int64 // unix nanos, 0 while the fault runs
	start := time.Now()
	heavy.start = start
	c.log.mu.Lock()
	c.log.start = start
	c.log.mu.Unlock()
	var clients sync.WaitGroup
	for i, e := range c.edges {
		for range 2 {
			clients.Go(func() { c.heavyClient(ctx, i, e, &heavy, stop) })
		}
	}
	clients.Go(func() { c.lightClient(ctx, t, &light, stop, &faultEnd, start) })

	timer(ctx, warm)
	faultErr := f.apply(ctx, c)
	faultEnd.Store(time.Now().UnixNano())
	t.Logf("the fault ended at +%v", time.Since(start).Round(time.Millisecond))
	if f.masterChange {
		timer(ctx, masterChangeRecovery)
	} else {
		timer(ctx, recovery)
	}
	if !held {
		// The heavy clients keep asking until the store itself has
		// denied them since the fault ended (their limit spent), up to
		// spentWait more: lost quota is what the store took that they
		// never got, not what a machine too busy for the store to
		// answer again within the recovery left them no time to ask
		// for. (Busy run 36: the store answered again only 2.2 s after
		// a pause ended, 0.3 s before the recovery's end: "lost 27".)
		ended := time.Unix(0, faultEnd.Load())
		if !heavy.storeDeniedAfter(ended) {
			spent := proc.PollEvery(testenv.Within(t, spentWait), 20*time.Millisecond, "the store to deny the heavy key since the fault ended", func(context.Context) error {
				if !heavy.storeDeniedAfter(ended) {
					return errors.New("not yet")
				}
				return nil
			})
			t.Logf("the heavy clients asked on past the recovery until +%v (%v)", time.Since(start).Round(time.Millisecond), spent)
		}
	}
	close(stop)
	clients.Wait()
	end := time.Now()
	for _, e := range c.edges {
		e.lim.Close()
	}
	require.NoError(t, faultErr, "applying the fault")

	r := c.result(start, end, &heavy, &light)
	if held {
		r.leaked = c.leaked(t)
	} else if l := c.heavy; l.Algorithm.String() != "token_bucket" && l.Algorithm.String() != "leaky_bucket" {
		r.invented = c.redisCount(t) - heavy.admitted.Load()
	}
	r.failed = r.admitted > r.bound || r.lost > 0 || r.falseDenials > 0 || r.errors > 0 || r.leaked > 0 || (r.invented != math.MinInt64 && r.invented > 0)
	resultsMu.Lock()
	results = append(results, r)
	resultsMu.Unlock()

	t.Logf("%s × %s × %s: admitted %d (bound %d), lost %s, Redis−admitted %s, false denials %d, leaked %s, fallback %.1fs, errors %d",
		r.fault, r.deployment, r.algorithm, r.admitted, r.bound, fmtCount(r.lost), fmtInvented(r.invented), r.falseDenials, fmtCount(r.leaked), r.fallbackSeconds, r.errors)
	require.LessOrEqual(t, r.admitted, r.bound, "over-admission: admitted beyond the bound in one window")
	require.LessOrEqual(t, r.lost, int64(0), "lost quota: the clients got less than the limit though they kept asking")
	if r.invented != math.MinInt64 {
		require.LessOrEqual(t, r.invented, int64(0), "Redis counts more than the clients were admitted (invented quota)")
	}
	require.Zero(t, r.falseDenials, "a client under its limit was denied outside the fallback window")
	if held {
		require.Zero(t, r.leaked, "concurrency slots still held after every request ended")
	}
	require.Zero(t, r.errors, "Decide failed: the edge would have answered 5xx")
	return r
}

// newCell builds the cell's limits and its edges.
func newCell(t *testing.T, dep *deployment, f fault, alg limit.Algorithm) *cell {
	t.Helper()
	prefix := strings.TrimSuffix(testenv.KeyPrefix(t), ":")
	c := &cell{fault: f, dep: dep, alg: alg}
	c.heavy = limit.Limit{Key: prefix + ".heavy", Algorithm: alg, Limit: heavyLimit, Window: window}
	if f.masterChange && !alg.Spec().Held {
		c.heavy.Limit = masterChangeLimit
		if s := os.Getenv("EDGEGUARD_FAULTS_LIMIT"); s != "" {
			v, err := strconv.ParseInt(s, 10, 64)
			require.True(t, err == nil && v > 0, "EDGEGUARD_FAULTS_LIMIT=%q: want a limit above 0", s)
			c.heavy.Limit = v
		}
	}
	c.light = limit.Limit{Key: prefix + ".light", Algorithm: alg, Limit: lightLimit, Window: window}
	if alg.Spec().Held {
		c.heavy.Limit, c.light.Limit = ccLimit, ccLight
	}
	if alg.Spec().MinInterval {
		// The light client's requests are ≥ 100 ms apart: a min_interval
		// of 20 ms never denies it.
		c.light.MinInterval = 20 * time.Millisecond
	}
	c.log = &edgeLog{start: time.Now()}
	for i := range nodes {
		e := newEdge(t, dep, slog.New(slog.NewTextHandler(c.log, &slog.HandlerOptions{
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			},
		})).With("edge", i))
		t.Cleanup(e.close)
		c.edges = append(c.edges, e)
	}
	return c
}

// stopped reports whether stop is closed.
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// heavyClient asks through e until stop: one request every 100 ms (two per
// edge: 60/s in all, the limit in a second); on a concurrency limit it
// holds its slot 50 ms and tries again 20 ms after a denial.
func (c *cell) heavyClient(ctx context.Context, i int, e *edge, heavy *tally, stop <-chan struct{}) {
	held := c.alg.Spec().Held
	for !stopped(stop) {
		checks := []limiter.Check{{Limit: c.heavy, Cost: 1, Nodes: nodes}}
		v, err := e.lim.Decide(ctx, checks)
		switch {
		case err != nil:
			heavy.errors.Add(1)
		case !v.Allowed && v.Checks[0].Source == limiter.SourceStore:
			heavy.storeDenial(i, v.Checks[0], time.Now())
		case v.Allowed:
			heavy.admitted.Add(1)
			if held {
				n := heavy.inflight.Add(1)
				for {
					m := heavy.maxInflight.Load()
					if n <= m || heavy.maxInflight.CompareAndSwap(m, n) {
						break
					}
				}
				timer(ctx, 50*time.Millisecond)
				heavy.inflight.Add(-1)
				e.lim.ReleaseAsync(v) // as the edge releases: retried in the background
				continue
			}
		}
		if err == nil && usedFallback(v) {
			heavy.fallback(time.Now())
			e.noteTimeouts()
		}
		if held {
			timer(ctx, 20*time.Millisecond)
		} else {
			timer(ctx, 100*time.Millisecond)
		}
	}
}

// lightClient asks until stop: one request every 100 ms, round robin over
// the edges, far under its limit (on a concurrency limit it releases at
// once). A denial is false unless the fallback decided it while the fault
// ran or within grace of its end, or within grace of a store call timing
// out on its edge: the busy recipe's stalls (make test-busy) are faults
// the cell did not make, and an exact key's fallback denies through them
// by design. So is the store's min_interval (a denial with quota left and
// a retry within the interval) within grace of a store call timing out on
// any edge: that call's late take holds the interval until given back
// (TestLateTakeHoldsMinIntervalUntilGivenBack). An error other than a
// timeout, a denial for the count, or a fallback that outlasts the grace
// after the last timeout (a breaker that stays open), is still a false
// denial.
func (c *cell) lightClient(ctx context.Context, t *testing.T, light *tally, stop <-chan struct{}, faultEnd *atomic.Int64, start time.Time) {
	for i := 0; !stopped(stop); i++ {
		e := c.edges[i%len(c.edges)]
		at := time.Now()
		v, err := e.lim.Decide(ctx, []limiter.Check{{Limit: c.light, Cost: 1, Nodes: nodes}})
		switch {
		case err != nil:
			light.errors.Add(1)
		case v.Allowed:
			light.admitted.Add(1)
			e.lim.ReleaseAsync(v)
		default:
			end := faultEnd.Load()
			excused := usedFallback(v) && (end == 0 || at.Before(time.Unix(0, end).Add(grace)))
			if usedFallback(v) && !excused {
				if last := e.noteTimeouts(); !last.IsZero() && at.Before(last.Add(grace)) {
					excused = true
					t.Logf("light client denied at +%v by the fallback: excused, its edge saw a store call time out at +%v", at.Sub(start).Round(time.Millisecond), last.Sub(start).Round(time.Millisecond))
				}
			}
			if d := v.Checks[0]; !excused && d.Source == limiter.SourceStore && c.light.MinInterval > 0 && d.Remaining > 0 && d.RetryAfter <= c.light.MinInterval {
				// The interval, not the count: a take whose caller gave
				// up at the store deadline may still run on Redis up to
				// four deadlines after it was sent (redisclock.go), and
				// its unit, dated when it ran, holds the interval until
				// its edge gives it back.
				if last := c.lastTimeout(); !last.IsZero() && at.Before(last.Add(grace)) {
					excused = true
					t.Logf("light client denied at +%v by the store's min_interval: excused, a store call timed out at +%v (%s)", at.Sub(start).Round(time.Millisecond), last.Sub(start).Round(time.Millisecond), describe(d))
				}
			}
			if !excused {
				light.falseDenials.Add(1)
				t.Logf("light client denied at +%v by %v (fault ended: %v): %s", at.Sub(start).Round(time.Millisecond), v.Checks[0].Source, end != 0, describe(v.Checks[0]))
			}
		}
		if err == nil && usedFallback(v) {
			light.fallback(time.Now())
		}
		timer(ctx, 100*time.Millisecond)
	}
}

// result is the row of what the clients saw between start and end.
func (c *cell) result(start, end time.Time, heavy, light *tally) result {
	held := c.alg.Spec().Held
	r := result{fault: c.fault.name, deployment: c.dep.name, algorithm: c.alg.String(), leaked: -1, invented: math.MinInt64}
	r.admitted = heavy.admitted.Load()
	if held {
		r.admitted = heavy.maxInflight.Load()
	}
	r.bound = bound(c.heavy, start, end, c.fault.masterChange)
	r.overAdmission = max(0, r.admitted-c.heavy.Limit)
	r.lost = -1
	if !held {
		// The heavy clients ask far more than the limit after the fault
		// too: whatever the limit says and the clients never got is lost.
		r.lost = max(0, c.heavy.Limit-r.admitted)
	}
	r.falseDenials = light.falseDenials.Load()
	r.errors = heavy.errors.Load() + light.errors.Load()
	for _, tl := range []*tally{heavy, light} {
		if !tl.firstFallback.IsZero() {
			r.fallbackSeconds = max(r.fallbackSeconds, tl.lastFallback.Sub(tl.firstFallback).Seconds())
		}
	}
	return r
}

// leaked is how many concurrency slots Redis still holds once every
// request ended and released. Releases are retried in the background for
// up to 10 s; the wait covers them and a replay still in flight.
func (c *cell) leaked(t *testing.T) int64 {
	st := c.edges[0].store
	keys := append(st.Keys(c.heavy), st.Keys(c.light)...)
	var n int64
	var err error // of the last read
	read := func(ctx context.Context) error {
		n, err = 0, nil
		for _, k := range keys {
			v, zerr := c.dep.direct.ZCard(ctx, k).Result()
			n, err = n+v, errors.Join(err, zerr)
		}
		return err
	}
	// Slots still held when the wait ends are a figure the matrix's table
	// records (the cell fails on it afterwards), not an error here.
	_ = proc.PollEvery(testenv.Within(t, 12*time.Second), 20*time.Millisecond, "every concurrency slot released", func(ctx context.Context) error {
		if err := read(ctx); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%d slots held", n)
		}
		return nil
	})
	if err != nil {
		// No answer yet (a Cluster between failovers): wait for one.
		err = proc.PollEvery(testenv.Within(t, 20*time.Second), 20*time.Millisecond, "Redis to answer", read)
	}
	require.NoError(t, err, "reading the concurrency ZSETs")
	return n
}

// redisCount is what Redis counts for the heavy limit. A Cluster on a
// starved machine may be between failovers (CLUSTERDOWN) for a while: the
// state is read once it answers.
func (c *cell) redisCount(t *testing.T) int64 {
	var count int64
	err := proc.PollEvery(testenv.Within(t, 20*time.Second), 20*time.Millisecond, "Redis to answer", func(context.Context) error {
		var err error
		count, err = redisCount(c.dep.direct, c.edges[0].store, c.heavy)
		return err
	})
	require.NoError(t, err, "reading Redis's count")
	return count
}

// bound is the most a key may admit between start and end: limit +
// ceil(limit/N) per window (ceil(limit × 1.01) across a master change under
// writes: tight), plus what the algorithm itself refills in the time
// (buckets) or allows across a window boundary (fixed and sliding windows
// start afresh). Concurrency slots are not restored: their bound stays.
func bound(l limit.Limit, start, end time.Time, tight bool) int64 {
	b := l.Limit + (l.Limit+nodes-1)/nodes
	if l.Algorithm.Spec().Held {
		return b
	}
	if tight {
		b = (l.Limit*101 + 99) / 100
	}
	elapsed := end.Sub(start)
	b += int64(math.Ceil(float64(l.Limit) * elapsed.Seconds() / l.Window.Seconds()))
	if start.Truncate(l.Window) != end.Truncate(l.Window) {
		b += l.Limit
	}
	return b
}

// redisCount reads what Redis holds as admitted for l, where the state is a
// count: the fixed window's per-window fields, the sliding window's two
// counters, the sliding log's members. Buckets hold a time, not a count.
func redisCount(rc redis.UniversalClient, st *limiter.RedisStore, l limit.Limit) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys := st.Keys(l)
	switch l.Algorithm.String() {
	case "fixed_window":
		vals, err := rc.HGetAll(ctx, keys[0]).Result()
		if err != nil {
			return 0, err
		}
		var n int64
		for _, v := range vals { // one field per window start
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, err
			}
			n += x
		}
		return n, nil
	case "sliding_window":
		cur, err := rc.HGet(ctx, keys[0], "n").Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, err
		}
		prev, err := rc.Get(ctx, keys[1]).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, err
		}
		return cur + prev, nil
	case "sliding_log":
		return rc.ZCard(ctx, keys[0]).Result()
	}
	return 0, fmt.Errorf("%s keeps no count", l.Algorithm)
}

func fmtInvented(v int64) string {
	if v == math.MinInt64 {
		return "–"
	}
	return strconv.FormatInt(v, 10)
}

// fmtCount renders a count, "–" where it is not measured (-1).
func fmtCount(v int64) string {
	if v < 0 {
		return "–"
	}
	return strconv.FormatInt(v, 10)
}

// table renders the results as the README's markdown table.
func table(rs []result) string {
	var b strings.Builder
	b.WriteString("| fault | deployment | algorithm | admitted / bound | over-admission | lost quota | Redis − admitted | false denials | leaked slots | fallback s | errors | |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		mark := "ok"
		if r.failed {
			mark = "**FAIL**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d / %d | %d | %s | %s | %d | %s | %.1f | %d | %s |\n",
			r.fault, r.deployment, r.algorithm, r.admitted, r.bound, r.overAdmission, fmtCount(r.lost), fmtInvented(r.invented),
			r.falseDenials, fmtCount(r.leaked), r.fallbackSeconds, r.errors, mark)
	}
	return b.String()
}

// matrixCell names one cell of a plan.
type matrixCell struct {
	deployment string
	fault      string
	algorithm  string
}

// quick is the subset `go test` runs: every algorithm on standalone under
// connections reset (the fallback, replays, restores, retried releases),
// 50 ms of latency (slow, not down: exact) and a pause past the deadline
// (calls written before their callers gave up: given back once Redis
// answers), the Cluster under a reset, and a Sentinel failover under
// writes (the writes its old master took after the promotion are lost: the
// edges' last answers restore them).
func quick() []matrixCell {
	var cs []matrixCell
	for _, f := range []string{"reset", "latency 50ms", "pause 1s"} {
		for _, a := range limit.Names() {
			cs = append(cs, matrixCell{"standalone", f, a})
		}
	}
	cs = append(cs, matrixCell{"cluster", "reset", "fixed_window"}, matrixCell{"cluster", "reset", "concurrency"},
		matrixCell{"sentinel", "failover under writes", "fixed_window"})
	return cs
}

// failoverCells are the master changes under writes, on Sentinel and
// Cluster, for the algorithms that keep a count or a time (concurrency
// slots are not restored: see full).
func failoverCells() []matrixCell {
	var cs []matrixCell
	for _, d := range []string{"sentinel", "cluster"} {
		for _, f := range []string{"failover under writes", "master killed"} {
			for _, a := range limit.Names() {
				if a != "concurrency" {
					cs = append(cs, matrixCell{d, f, a})
				}
			}
		}
	}
	return cs
}

func full() []matrixCell {
	var cs []matrixCell
	for _, d := range []string{"standalone", "sentinel", "cluster"} {
		for _, f := range allFaults {
			if (f.name == "failover in pause" || f.masterChange) && d == "standalone" {
				continue // nothing to fail over to
			}
			for _, a := range limit.Names() {
				if f.masterChange && a == "concurrency" {
					// Slots are not restored, and a release a Sentinel
					// master acknowledged before the switch is lost: its
					// slot stays held until its TTL (docs/guarantees.md).
					continue
				}
				cs = append(cs, matrixCell{d, f.name, a})
			}
		}
	}
	return cs
}

func TestFaultMatrix(t *testing.T) {
	plan := quick()
	switch os.Getenv("EDGEGUARD_FAULTS") {
	case "full":
		plan = full()
	case "failover":
		plan = failoverCells()
	}
	if algs := os.Getenv("EDGEGUARD_FAULTS_ALGS"); algs != "" {
		plan = slices.DeleteFunc(plan, func(mc matrixCell) bool { return !slices.Contains(strings.Split(algs, ","), mc.algorithm) })
	}
	deps := map[string]func(*testing.T) *deployment{"standalone": startStandalone, "sentinel": startSentinel, "cluster": startCluster}
	// A cell's deployment: its own (every standalone cell, every cell
	// that fails over: a pause or a failover stays in its cell) or the
	// package's shared Sentinel or Cluster.
	deployment := func(mc matrixCell) (dep func(*testing.T) *deployment, own bool) {
		switch {
		case mc.deployment == "sentinel" && (mc.fault == "failover in pause" || faultNamed(mc.fault).masterChange):
			return startOwnSentinel, true
		case mc.deployment == "cluster" && mc.fault == "master killed":
			return startOwnCluster, true
		}
		return deps[mc.deployment], mc.deployment == "standalone"
	}
	cell := func(mc matrixCell, parallel bool) (string, func(*testing.T)) {
		return mc.deployment + "/" + mc.fault + "/" + mc.algorithm, func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			alg, err := limit.Parse(mc.algorithm)
			require.NoError(t, err)
			dep, _ := deployment(mc)
			runCell(t, dep(t), faultNamed(mc.fault), alg)
		}
	}
	// The cells with a deployment of their own run side by side (at most
	// as many as there are cores), and so does the group of the cells on
	// the shared deployments, which run one after the other within it.
	t.Run("cells", func(t *testing.T) {
		var shared []matrixCell
		for _, mc := range plan {
			if _, own := deployment(mc); !own {
				shared = append(shared, mc)
			}
		}
		if len(shared) > 0 {
			t.Run("shared", func(t *testing.T) {
				t.Parallel()
				for _, mc := range shared {
					t.Run(cell(mc, false))
				}
			})
		}
		// A master change under writes runs alone, before the others
		// start (they wait for this loop to end): the restore of the
		// edges' last answers races the new master's first admissions,
		// and beside the other cells on a two-core machine it lost the
		// race by 39 of 600 (twice, where alone it passes 20 of 20).
		for _, mc := range plan {
			if _, own := deployment(mc); own {
				t.Run(cell(mc, !faultNamed(mc.fault).masterChange))
			}
		}
	})
	resultsMu.Lock()
	rs := slices.Clone(results)
	resultsMu.Unlock()
	slices.SortFunc(rs, func(a, b result) int {
		return strings.Compare(a.deployment+a.fault+a.algorithm, b.deployment+b.fault+b.algorithm)
	})
	tab := table(rs)
	t.Logf("fault matrix (%d cells):\n%s", len(rs), tab)
	if path := os.Getenv("EDGEGUARD_FAULTS_TABLE"); path != "" {
		require.NoError(t, os.WriteFile(path, []byte(tab), 0o644))
	}
}
