package rls_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/rls"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// TestObserverSeesAppliedDescriptors: the Observer is called once per
// applied descriptor (not for unmatched or unlimited ones), with the
// limit's path, the hits, whether it was over, and what was left; a
// shadow limit over its quota is seen over though answered OK; QUOTA_MODE
// (Options.Quota) makes one over limit among others not over the call.
func TestObserverSeesAppliedDescriptors(t *testing.T) {
	var mu sync.Mutex
	var seen []rls.Observation
	s := newService(t, setup{store: limiter.NewMemoryStore(), opts: rls.Options{Observer: func(o rls.Observation) {
		mu.Lock()
		seen = append(seen, o)
		mu.Unlock()
	}}, doc: `domain: obs
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`})
	s.ask(t, "obs", desc("user", "a"), desc("free", "x"), desc("nothing", "y"))
	s.askN(t, "obs", 2, desc("user", "a"))
	r := s.ask(t, "obs", desc("shadow", "b"), desc("shadow", "b"))
	require.Equal(t, pb.RateLimitResponse_OK, r.OverallCode)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 4)
	require.Equal(t, "obs", seen[0].Domain)
	require.Equal(t, "obs.user", seen[0].Limit.Path)
	require.Equal(t, uint64(1), seen[0].Hits)
	require.False(t, seen[0].Over)
	require.Equal(t, int64(1), seen[0].Remaining)
	require.Equal(t, uint64(2), seen[1].Hits)
	require.True(t, seen[1].Over)
	require.Equal(t, int64(1), seen[1].Remaining, "before the hits, when over")
	require.Equal(t, "obs.shadow", seen[3].Limit.Path)
	require.False(t, seen[2].Over)
	require.True(t, seen[3].Over, "a shadow limit over its quota is seen over")

	q := newService(t, setup{store: limiter.NewMemoryStore(), opts: rls.Options{Quota: true}, doc: `domain: q
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 5}
`})
	q.ask(t, "q", desc("a", "1"))
	require.Equal(t, pb.RateLimitResponse_OK, q.ask(t, "q", desc("a", "1"), desc("b", "1")).OverallCode, "one quota limit of two over")
	require.Equal(t, pb.RateLimitResponse_OVER_LIMIT, q.ask(t, "q", desc("a", "1")).OverallCode, "every quota limit over")
}

// TestLegacyHeaderNames: the legacy fields take the names given
// (the reference's LIMIT_*_HEADER).
func TestLegacyHeaderNames(t *testing.T) {
	opts := rls.Options{Headers: rls.HeadersLegacy}
	opts.LegacyNames.Limit, opts.LegacyNames.Remaining = "X-Limit", "X-Left"
	s := newService(t, setup{store: limiter.NewMemoryStore(), opts: opts, doc: `domain: h
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
`})
	r := s.ask(t, "h", desc("user", "a"))
	var keys []string
	for _, h := range r.ResponseHeadersToAdd {
		keys = append(keys, h.Key)
	}
	require.Equal(t, []string{"X-Limit", "X-Left", "RateLimit-Reset"}, keys)
}

// TestObserverCostsNoAllocation: a call allocates as much with an
// Observer as without one (the observation is passed by value).
func TestObserverCostsNoAllocation(t *testing.T) {
	req := &pb.RateLimitRequest{Domain: "a", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "u")}}
	allocs := func(obs func(rls.Observation)) float64 {
		l, err := limiter.New(limiter.NewMemoryStore(), limiter.Config{StoreName: "memory"}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		require.NoError(t, err)
		t.Cleanup(l.Close)
		srv, err := rls.New(rls.Options{Limiter: l, Observer: obs}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		require.NoError(t, err)
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: a\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n"), 0o644))
		require.NoError(t, srv.Reload(dir, false))
		return testing.AllocsPerRun(200, func() {
			if _, err := srv.ShouldRateLimit(context.Background(), req); err != nil {
				t.Fatal(err)
			}
		})
	}
	var n uint64
	without := allocs(nil)
	with := allocs(func(o rls.Observation) { n += o.Hits })
	require.Equal(t, without, with)
	require.NotZero(t, n)
}
