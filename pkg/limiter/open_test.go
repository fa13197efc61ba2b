package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// Open builds a limiter over Redis as the edge and `edge rls` do: it
// decides in Redis, its Close closes the client too, a Redis not reachable
// yet is LoadErr (AP: the limiter starts), and a refused setting leaves
// nothing open.
func TestOpen(t *testing.T) {
	// Its limit of 1 is an hour's fixed window: not across the hour.
	testenv.EarlyInWindow(time.Hour, 10*time.Second)
	srv, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })

	for _, ap := range []bool{false, true} {
		op, err := limiter.Open(limiter.OpenOptions{URL: srv.URL(), Mode: limiter.ModeStandalone, Autopipeline: ap, KeyPrefix: testenv.KeyPrefix(t), Config: limiter.Config{Timeout: time.Second}}, nil)
		require.NoError(t, err)
		require.NoError(t, op.LoadErr)
		l := limiter.Limit{Key: "open", Algorithm: limit.FixedWindow, Limit: 1, Window: time.Hour}
		v, err := op.Limiter.Decide(context.Background(), []limiter.Check{{Limit: l, Cost: 1}})
		require.NoError(t, err)
		require.Equal(t, limiter.SourceStore, v.Checks[0].Source)
		require.True(t, v.Allowed)
		v, err = op.Limiter.Decide(context.Background(), []limiter.Check{{Limit: l, Cost: 1}})
		require.NoError(t, err)
		require.False(t, v.Allowed, "counted in Redis")
		op.Close()
		require.Error(t, op.Client.Ping(context.Background()).Err(), "the client is closed with the limiter")
	}

	op, err := limiter.Open(limiter.OpenOptions{URL: "redis://" + testenv.ClosedAddr(t), Mode: limiter.ModeStandalone, Config: limiter.Config{Timeout: time.Second}}, nil)
	require.NoError(t, err, "a Redis not reachable yet does not stop a start")
	require.Error(t, op.LoadErr)
	op.Close()

	_, err = limiter.Open(limiter.OpenOptions{URL: srv.URL(), Mode: limiter.ModeStandalone, KeyPrefix: "a{b}"}, nil)
	require.ErrorContains(t, err, "braces would break the hash tag")
	_, err = limiter.Open(limiter.OpenOptions{URL: "not a url", Mode: limiter.ModeStandalone}, nil)
	require.Error(t, err)
}
