package limiter

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// flakyRefunds fails the first refunds it is asked for, as a Redis blip
// would.
type flakyRefunds struct {
	Store
	fails atomic.Int64
	tries atomic.Int64
}

func (s *flakyRefunds) Refund(ctx context.Context, leases []Lease) error {
	s.tries.Add(1)
	if s.fails.Add(-1) >= 0 {
		return errors.New("connection reset")
	}
	return s.Store.Refund(ctx, leases)
}

// ReleaseAsync returns at once; a failed release is retried until the
// store takes it, so the slot is free again without waiting for its TTL.
func TestReleaseAsyncRetries(t *testing.T) {
	l, st, _ := newTestLimiter(t, Config{})
	flaky := &flakyRefunds{Store: st}
	flaky.fails.Store(2)
	l.store = flaky
	c := lim("conc", limit.Concurrency, 1, time.Minute)
	v, err := l.Decide(context.Background(), []Check{{Limit: c, Cost: 1}})
	require.NoError(t, err)
	require.True(t, v.Allowed)
	l.ReleaseAsync(v)
	l.ReleaseAsync(v) // a lease is given back once
	l.Close()         // waits for the release under way
	require.Equal(t, int64(3), flaky.tries.Load(), "two failures, then the release went through")
	require.Equal(t, 2.0, testutil.ToFloat64(l.metrics.releaseRetries))
	v2, err := l.Decide(context.Background(), []Check{{Limit: c, Cost: 1}})
	require.NoError(t, err)
	require.True(t, v2.Allowed, "the slot is free")
}
