package rls_test

import (
	"context"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// TestRedisDownEveryDecisionWithinTheDeadline: with Redis frozen (the
// worst case: connections open, no answer) and then killed, every call is
// answered within the client's deadline, by the limiter's bounded
// fallback, which still enforces the limit: the keys Redis answered for
// in the window get what it had left at its last answer, a key it never
// answered for while it answered others none.
//
// Before the freeze each key is asked until Redis has answered one of its
// calls: a call past the store deadline (a stalled or starved Redis) is
// the fallback's, and Redis then has no answer for that key to leave it.
// The fallback's admissions go to Redis with the next call (a replay), so
// "what it had left" is read from the answer Redis gave.
func TestRedisDownEveryDecisionWithinTheDeadline(t *testing.T) {
	srv, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	client, err := limiter.NewRedisClient(srv.URL(), limiter.ModeStandalone)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	store, err := limiter.NewRedisStore(limiter.Conn(client), "")
	require.NoError(t, err)
	const deadline = time.Second
	reg := prometheus.NewRegistry()
	s := newService(t, setup{store: store, timeout: 100 * time.Millisecond, reg: reg, doc: `domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
`})
	call := func(value string) (*pb.RateLimitResponse, time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		r, err := s.client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("k", value)}})
		require.NoError(t, err, "answered within the deadline")
		return r, time.Since(start)
	}
	left := map[string]int{} // what Redis had left for each key at its last answer
	for _, value := range []string{"frozen", "killed"} {
		for tries := 0; ; tries++ {
			require.Less(t, tries, 4, "Redis answers one of %s's calls", value)
			before := testenv.Counter(t, reg, "edgeguard_limiter_checks_total", "reason", "fallback")
			r, _ := call(value)
			if testenv.Counter(t, reg, "edgeguard_limiter_checks_total", "reason", "fallback") == before {
				require.Equal(t, ok, r.OverallCode)
				left[value] = int(r.Statuses[0].LimitRemaining)
				break
			}
			// It admits a share of the limit, or denies a key Redis
			// has not answered for while it answered others.
			t.Logf("%s: call %d decided by the fallback (past the store deadline): %v", value, tries, r.OverallCode)
		}
	}

	srv.Freeze()
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			srv.Thaw()
		}
	})
	var slowest time.Duration
	for phase, value := range []string{"frozen", "killed"} {
		if phase == 1 {
			srv.Thaw()
			thawed = true
			require.NoError(t, srv.Close())
		}
		require.Positive(t, left[value])
		for i := range left[value] + 4 {
			r, took := call(value)
			slowest = max(slowest, took)
			if i < left[value] {
				require.Equal(t, ok, r.OverallCode, "%s call %d", value, i)
				require.EqualValues(t, left[value]-1-i, r.Statuses[0].LimitRemaining, "%s call %d: the fallback counts", value, i)
			} else {
				require.Equal(t, over, r.OverallCode, "%s call %d: the fallback enforces the limit", value, i)
			}
		}
		r, took := call("unseen-" + value)
		slowest = max(slowest, took)
		require.Equal(t, over, r.OverallCode, "%s: a key Redis never answered for gets no share", value)
	}
	require.Less(t, slowest, deadline)
	t.Logf("slowest answer with Redis down: %s", slowest)
}
