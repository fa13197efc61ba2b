package rlsd_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// REDIS_TYPE=SENTINEL with the reference's REDIS_URL,
// "mastername,sentinel:port,sentinel:port": the limits count in the
// master the sentinels name.
func TestSentinel(t *testing.T) {
	s, err := testenv.StartSentinel(testenv.SentinelOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	root := k8sConfig(t, map[string]string{"config.yaml": `domain: rl
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1}
`})
	p := startRLS(t, []string{
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_TYPE=SENTINEL",
		"REDIS_URL=" + s.MasterName + "," + strings.Join(s.SentinelAddrs(), ","),
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"USE_STATSD=false",
	})
	user := unique(t)
	require.Equal(t, pb.RateLimitResponse_OK, p.call(t, "rl", "user", user).OverallCode)
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, p.call(t, "rl", "user", user).OverallCode)
	// Counted in Redis, not in the local fallback.
	require.NotContains(t, p.log.String(), "not reachable")
	p.stop(t)
}

// REDIS_TYPE=CLUSTER with the reference's REDIS_URL, the seeds comma
// separated.
func TestCluster(t *testing.T) {
	c, err := testenv.StartCluster(testenv.ClusterOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	root := k8sConfig(t, map[string]string{"config.yaml": migrationConfig})
	p := startRLS(t, []string{
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_TYPE=CLUSTER",
		"REDIS_URL=" + strings.Join(c.Addrs(), ","),
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"USE_STATSD=false",
		"LOG_LEVEL=debug",
	})
	user := unique(t)
	for range 3 {
		require.Equal(t, pb.RateLimitResponse_OK, p.call(t, "rl", "user", user).OverallCode)
	}
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, p.call(t, "rl", "user", user).OverallCode)
	require.NotContains(t, p.log.String(), "not reachable")
	p.stop(t)
}

// A Redis that cannot decide makes each call a gRPC UNAVAILABLE, as the
// reference answers an error, so Envoy's failure_mode_deny decides: no
// replica admits the whole limit on its own.
func TestRedisDownIsUnavailable(t *testing.T) {
	root := k8sConfig(t, map[string]string{"config.yaml": "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1}\n"})
	p := startRLS(t, []string{
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + testenv.ClosedAddr(t),
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"USE_STATSD=false",
	})
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := pb.NewRateLimitServiceClient(p.conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "rl",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: unique(t)}}}}})
		cancel()
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	}
	require.Contains(t, p.log.String(), "answering UNAVAILABLE until it is")
	p.stop(t)
}

// REDIS_TIMEOUT bounds a decision's wait on Redis, as it bounds the
// reference's I/O: a Redis frozen (SIGSTOP) past a service's REDIS_TIMEOUT
// makes its call UNAVAILABLE, and one frozen for less than it, but longer
// than the limiter's own 250 ms default, is waited for and counts the call.
func TestRedisTimeoutIsTheDecisionDeadline(t *testing.T) {
	s, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	t.Cleanup(s.Thaw) // before Close: a stopped Redis does not exit on SIGTERM
	addr := strings.TrimPrefix(s.URL(), "redis://")
	root := k8sConfig(t, map[string]string{"config.yaml": migrationConfig})
	start := func(timeout string) *proc {
		return startRLS(t, []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + addr, "REDIS_TIMEOUT=" + timeout,
			"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "USE_STATSD=false"})
	}
	ask := func(p *proc, user string) (*pb.RateLimitResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return pb.NewRateLimitServiceClient(p.conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "rl",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
	}

	hasty := start("200ms")
	warm := unique(t)
	require.Eventually(t, func() bool { // connected, script loaded (a busy host may take longer than 200 ms at first)
		_, err := ask(hasty, warm)
		return err == nil
	}, 30*time.Second, 10*time.Millisecond)
	s.Freeze()
	_, err = ask(hasty, unique(t))
	require.Equal(t, codes.Unavailable, status.Code(err), "a Redis frozen past REDIS_TIMEOUT: %v", err)
	s.Thaw()
	hasty.stop(t)

	patient := start("1m")
	user := unique(t)
	require.Equal(t, uint32(2), patient.call(t, "rl", "user", user).Statuses[0].LimitRemaining)
	redis, err := net.ResolveTCPAddr("tcp", addr)
	require.NoError(t, err)
	s.Freeze()
	type answer struct {
		r   *pb.RateLimitResponse
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := ask(patient, user)
		done <- answer{r, err}
	}()
	// The call is in the frozen Redis's receive queue, then stays there
	// for longer than the limiter's default deadline.
	require.Eventually(t, func() bool { return queuedAt(t, redis) > 0 }, 30*time.Second, 5*time.Millisecond)
	time.Sleep(500 * time.Millisecond) // kept: the freeze's length is the condition under test
	s.Thaw()
	a := <-done
	require.NoError(t, a.err, "a Redis frozen for less than REDIS_TIMEOUT")
	require.Equal(t, pb.RateLimitResponse_OK, a.r.OverallCode)
	require.Equal(t, uint32(1), a.r.Statuses[0].LimitRemaining, "counted in Redis")
	patient.stop(t)
}

// queuedAt is how many bytes the kernel holds for the listener at addr
// (an IPv4 loopback address) on its established connections, unread.
func queuedAt(t *testing.T, addr *net.TCPAddr) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	require.NoError(t, err)
	ip := addr.IP.To4()
	local := fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], addr.Port)
	var queued int64
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 5 || f[1] != local || f[3] != "01" { // 01: ESTABLISHED
			continue
		}
		_, rxHex, _ := strings.Cut(f[4], ":")
		rx, err := strconv.ParseInt(rxHex, 16, 64)
		require.NoError(t, err)
		queued += rx
	}
	return queued
}
