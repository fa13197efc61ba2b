package limiter_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// A rider goes with the Take of the Decide it is attached to, on a Cluster
// (its key in another slot than the limit's) with and without the
// autopipeliner, once; it does not go when the over-limit cache denies.
func TestRiderRidesWithTheTake(t *testing.T) {
	c := client(limiter.ModeCluster)
	rs := limiter.NewRiderScript("return redis.call('INCR', KEYS[1])")
	require.NoError(t, rs.Load(ctx(t), c))
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%t", ap), func(t *testing.T) {
			conn := limiter.Conn(c)
			if ap {
				var stop func() error
				var err error
				conn, stop, err = limiter.AutoPipelined(c)
				require.NoError(t, err)
				defer func() { _ = stop() }()
			}
			l, err := limiter.New(connStore(t, conn), limiter.Config{Timeout: 5 * time.Second}, nil, nil)
			require.NoError(t, err)
			defer l.Close()
			prefix := testenv.KeyPrefix(t)
			counter := prefix + "{rider}:n"
			lim := limiter.Limit{Key: prefix + "k", Algorithm: limit.FixedWindow, Limit: 2, Window: time.Hour}
			var replies atomic.Int64
			var last atomic.Int64
			decide := func() (*limiter.Rider, limiter.Verdict) {
				r := &limiter.Rider{Script: rs, Keys: []string{counter}, Reply: func(rep limiter.RiderReply) {
					n, err := rep.Int64()
					if err != nil { // possibly on the batch's goroutine: no FailNow
						t.Errorf("rider reply: %v", err)
					}
					last.Store(n)
					replies.Add(1)
				}}
				v, err := l.DecideRiding(context.Background(), []limiter.Check{{Limit: lim, Cost: 1}}, r)
				require.NoError(t, err)
				return r, v
			}
			for i := range 3 { // two admitted, one denied by Redis
				r, _ := decide()
				require.True(t, r.Sent())
				require.Eventually(t, func() bool { return replies.Load() == int64(i+1) }, 5*time.Second, time.Millisecond)
				require.Equal(t, int64(i+1), last.Load())
			}
			r, v := decide() // denied by the over-limit cache: no call
			require.False(t, v.Allowed)
			require.Equal(t, limiter.SourcePrefilter, v.Checks[0].Source)
			require.False(t, r.Sent())
			n, err := c.Get(ctx(t), counter).Int64()
			require.NoError(t, err)
			require.Equal(t, int64(3), n, "each sent rider ran once")
		})
	}
}
