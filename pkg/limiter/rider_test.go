package limiter_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// A rider goes with the Take of the Decide it is attached to, on a Cluster
// (its key in another slot than the limit's) with and without the
// autopipeliner, once; it does not go when the over-limit cache denies.
func TestRiderRidesWithTheTake(t *testing.T) {
	// Its limit of 2 is an hour's fixed window: not across the hour.
	testenv.EarlyInWindow(time.Hour, 10*time.Second)
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
				v, err := l.DecideRiding(context.Background(), []limiter.Check{{Limit: lim, Cost: 1}}, r, nil)
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

// Riders of concurrent Takes over lanes each run once and get one reply:
// those on the Take's master leave with its call or batch, the others with
// their own master's next command or alone, none is left waiting.
func TestRidersOfConcurrentTakesOverLanes(t *testing.T) {
	rs := limiter.NewRiderScript("return redis.call('INCR', KEYS[1])")
	for _, mode := range []limiter.Mode{limiter.ModeStandalone, limiter.ModeCluster} {
		t.Run(string(mode), func(t *testing.T) {
			c := client(mode)
			require.NoError(t, rs.Load(ctx(t), c))
			conn, stop, err := limiter.AutoPipelined(c)
			require.NoError(t, err)
			defer func() { _ = stop() }()
			l, err := limiter.New(connStore(t, conn), limiter.Config{Timeout: 10 * time.Second}, nil, nil)
			require.NoError(t, err)
			defer l.Close()
			prefix := testenv.KeyPrefix(t)
			const goroutines, each = 64, 20
			counters := []string{prefix + "{ra}:n", prefix + "{rb}:n", prefix + "{rc}:n"}
			var sent, replies, failed atomic.Int64
			errs := make(chan error, goroutines)
			for g := range goroutines {
				go func() {
					for i := range each {
						lim := limiter.Limit{Key: fmt.Sprintf("%s%d-%d", prefix, g, i%4), Algorithm: limit.FixedWindow, Limit: 1000, Window: time.Hour}
						r := &limiter.Rider{Script: rs, Keys: []string{counters[(g+i)%len(counters)]}, Reply: func(rep limiter.RiderReply) {
							if rep.Err() != nil {
								failed.Add(1)
							}
							replies.Add(1)
						}}
						if _, err := l.DecideRiding(context.Background(), []limiter.Check{{Limit: lim, Cost: 1}}, r, nil); err != nil {
							errs <- err
							return
						}
						if r.Sent() {
							sent.Add(1)
						}
					}
					errs <- nil
				}()
			}
			for range goroutines {
				require.NoError(t, <-errs)
			}
			require.Eventually(t, func() bool { return replies.Load() == sent.Load() }, 10*time.Second, time.Millisecond,
				"every sent rider gets its reply")
			require.Zero(t, failed.Load())
			require.Equal(t, int64(goroutines*each), sent.Load())
			var ran int64
			for _, k := range counters {
				n, err := c.Get(ctx(t), k).Int64()
				require.NoError(t, err)
				ran += n
			}
			require.Equal(t, sent.Load(), ran, "each sent rider ran once")
			require.Equal(t, sent.Load(), replies.Load(), "and got one reply")
		})
	}
}

// A lone Take's rider on another Cluster master does not hold the Take:
// with the rider's master paused, the Take returns, and the rider's reply
// comes once that master answers again.
func TestRiderOnAnotherMasterDoesNotHoldTheTake(t *testing.T) {
	c := client(limiter.ModeCluster)
	cc := c.(*redis.ClusterClient)
	rs := limiter.NewRiderScript("return redis.call('INCR', KEYS[1])")
	require.NoError(t, rs.Load(ctx(t), c))
	conn, stop, err := limiter.AutoPipelined(c)
	require.NoError(t, err)
	defer func() { _ = stop() }()
	st := connStore(t, conn)
	l, err := limiter.New(st, limiter.Config{Timeout: 5 * time.Second}, nil, nil)
	require.NoError(t, err)
	defer l.Close()
	prefix := testenv.KeyPrefix(t)
	lim := limiter.Limit{Key: prefix + "k", Algorithm: limit.FixedWindow, Limit: 10, Window: time.Hour}
	limMaster, err := cc.MasterForKey(ctx(t), st.Keys(lim)[0])
	require.NoError(t, err)
	var riderMaster *redis.Client
	var counter string
	for i := 0; riderMaster == nil; i++ {
		k := fmt.Sprintf("%s{r%d}:n", prefix, i)
		m, err := cc.MasterForKey(ctx(t), k)
		require.NoError(t, err)
		if m.Options().Addr != limMaster.Options().Addr {
			riderMaster, counter = m, k
		}
	}
	replies := make(chan limiter.RiderReply, 2)
	decide := func() *limiter.Rider {
		r := &limiter.Rider{Script: rs, Keys: []string{counter}, Reply: func(rep limiter.RiderReply) { replies <- rep }}
		v, err := l.DecideRiding(context.Background(), []limiter.Check{{Limit: lim, Cost: 1}}, r, nil)
		require.NoError(t, err)
		require.True(t, v.Allowed)
		return r
	}
	decide() // connections to both masters made
	rep := <-replies
	require.NoError(t, rep.Err())

	require.NoError(t, riderMaster.ClientPause(ctx(t), 1500*time.Millisecond).Err())
	require.True(t, decide().Sent())
	select {
	case <-replies:
		t.Fatal("the Take waited for its rider's paused master")
	default:
	}
	select {
	case rep := <-replies:
		n, err := rep.Int64()
		require.NoError(t, err)
		require.Equal(t, int64(2), n)
	case <-time.After(10 * time.Second):
		t.Fatal("the rider got no reply after its master's pause")
	}
}
