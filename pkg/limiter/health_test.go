package limiter

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
)

// remoteStore makes a counting memory store look remote: health is only
// followed for stores across the network.
type remoteStore struct{ *countingStore }

func (remoteStore) Remote() bool { return true }

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}
func (b *lockedBuffer) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.b.String() }

func newHealthLimiter(t *testing.T, mode FailMode) (*Limiter, *countingStore, *fakeClock, *prometheus.Registry, *lockedBuffer) {
	clock := &fakeClock{t: time.UnixMilli(1_800_000_000_000)}
	st := &countingStore{Store: NewMemoryStore(WithClock(clock.now))}
	reg := prometheus.NewRegistry()
	logs := &lockedBuffer{}
	l, err := New(remoteStore{st}, Config{FailMode: mode, BreakerFailures: 3, BreakerCooldown: time.Second}, reg, slog.New(slog.NewTextHandler(logs, nil)))
	require.NoError(t, err)
	l.now = clock.now
	l.fallback = NewMemoryStore(WithClock(clock.now))
	return l, st, clock, reg, logs
}

func degradedGauge(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "edgeguard_limiter_degraded" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "reason" && lp.GetValue() == reason {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("edgeguard_limiter_degraded{reason=%q} not exported", reason)
	return 0
}

// Health follows the store: healthy while it answers, degraded (or, fail
// closed, unavailable) with the failure's class while it fails, and healthy
// again once a probe got through — triggered by Health itself when no
// request comes (a node a load balancer took out gets none).
func TestHealthFollowsTheStore(t *testing.T) {
	for _, tc := range []struct {
		mode FailMode
		want HealthState
	}{
		{FailFallback, Degraded},
		{FailOpen, Degraded},
		{FailClosed, Unavailable},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			l, st, clock, reg, _ := newHealthLimiter(t, tc.mode)
			k := lim("k", limit.FixedWindow, 100, time.Minute)
			decide := func() { _, _ = l.Decide(context.Background(), []Check{{Limit: k, Cost: 1}}) }
			require.Equal(t, Healthy, l.Health().State, "nothing asked yet")
			decide()
			require.Equal(t, Health{State: Healthy, FailMode: tc.mode}, l.Health())

			st.fail.Store(true)
			decide()
			h := l.Health()
			require.Equal(t, tc.want, h.State, "one failed call")
			require.Equal(t, ReasonUnreachable, h.Reason)
			require.Contains(t, h.Detail, errDown.Error())
			require.Equal(t, 1.0, degradedGauge(t, reg, ReasonUnreachable))
			require.Zero(t, degradedGauge(t, reg, ReasonCredentials))
			for range 3 {
				decide()
			}
			require.Equal(t, 1, l.Health().OpenShards, "the breaker opened")

			// The store is back, but no request comes: Health probes.
			st.fail.Store(false)
			probes := st.probes.Load()
			require.Equal(t, tc.want, l.Health().State, "cooldown not over: no probe yet")
			require.Equal(t, probes, st.probes.Load())
			clock.add(time.Second)
			require.Eventually(t, func() bool { return l.Health().State == Healthy }, 5*time.Second, time.Millisecond)
			require.Greater(t, st.probes.Load(), probes)
			require.Zero(t, degradedGauge(t, reg, ReasonUnreachable))
		})
	}
}

// A failure seen outside a decision (the edge's script load at start)
// makes the limiter degraded before any request, and a readiness check
// finds out, by itself, when the store answers.
func TestHealthOfAStoreDownAtStart(t *testing.T) {
	l, st, clock, _, _ := newHealthLimiter(t, FailClosed)
	st.fail.Store(true)
	l.StoreFailed(errDown)
	require.Equal(t, Unavailable, l.Health().State)
	st.fail.Store(false)
	clock.add(time.Second)
	require.Eventually(t, func() bool { return l.Health().State == Healthy }, 5*time.Second, time.Millisecond)
}

// A store that keeps failing is logged again every 30 s, not once per
// call, and not only once.
func TestHealthLogsAPersistentFailureEvery30s(t *testing.T) {
	l, _, clock, _, logs := newHealthLimiter(t, FailFallback)
	start := clock.now()
	for _, at := range []time.Duration{0, time.Second, 10 * time.Second, 29 * time.Second, 30 * time.Second, 45 * time.Second, 61 * time.Second} {
		l.observe(errDown, start.Add(at))
	}
	require.Equal(t, 3, strings.Count(logs.String(), "rate limit store failing"), logs.String())
	clock.add(time.Minute)
	l.observe(nil, clock.now())
	require.Contains(t, logs.String(), "rate limit store answers again")
}

// Against a real Redis that requires a password: a wrong password and no
// password are both classed as rejected credentials, logged at error
// level, counted, and the limiter reports degraded for that reason.
func TestHealthRejectedCredentials(t *testing.T) {
	srv, err := testenv.StartStandalone(testenv.StandaloneOptions{Password: "right-password"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	addr := srv.Addr
	for name, opts := range map[string]*redis.Options{
		"wrong password": {Addr: addr, Password: "wrong-password"},
		"no password":    {Addr: addr},
	} {
		t.Run(name, func(t *testing.T) {
			rc := redis.NewClient(opts)
			t.Cleanup(func() { _ = rc.Close() })
			rs, err := NewRedisStore(Conn(rc), testenv.KeyPrefix(t))
			require.NoError(t, err)
			reg := prometheus.NewRegistry()
			logs := &lockedBuffer{}
			l, err := New(rs, Config{}, reg, slog.New(slog.NewTextHandler(logs, nil)))
			require.NoError(t, err)
			v, err := l.Decide(context.Background(), []Check{{Limit: lim("k", limit.SlidingLog, 10, time.Minute), Cost: 1}})
			require.NoError(t, err)
			require.Equal(t, SourceFallback, v.Checks[0].Source)
			h := l.Health()
			require.Equal(t, Degraded, h.State)
			require.Equal(t, ReasonCredentials, h.Reason, h.Detail)
			require.Equal(t, 1.0, degradedGauge(t, reg, ReasonCredentials))
			require.Contains(t, logs.String(), "level=ERROR")
			require.Contains(t, logs.String(), "rejects our credentials")
		})
	}
}

func TestClassifyStoreError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{context.DeadlineExceeded, ReasonTimeout},
		{errDown, ReasonUnreachable},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			require.Equal(t, tc.want, ClassifyStoreError(tc.err))
		})
	}
}
