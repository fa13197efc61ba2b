package rls_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// BenchmarkShouldRateLimit: one descriptor per call over real gRPC on
// loopback, counted in standalone Redis (AutoPipelined, as the edge runs
// it), values spread over 10,000 keys so every call is a Redis decision.
func BenchmarkShouldRateLimit(b *testing.B) {
	c := redisClient(b, limiter.ModeStandalone)
	conn, stop, err := limiter.AutoPipelined(c)
	require.NoError(b, err)
	defer func() { _ = stop() }()
	rs, err := limiter.NewRedisStore(conn, "rlsbench:")
	require.NoError(b, err)
	s := newService(b, setup{store: rs, doc: `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
`})
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb_ *testing.PB) {
		for pb_.Next() {
			v := n.Add(1) % 10000
			r, err := s.client.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
				Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "v" + strconv.FormatInt(v, 10)}},
			}}})
			if err != nil || r.OverallCode != pb.RateLimitResponse_OK {
				b.Fatal(err, r)
			}
		}
	})
}
