package limiter_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// TestPenaltyRegionWide: a penalty one edge imposes is enforced by another
// edge of the region (same Redis), with the time left, and ends on time.
func TestPenaltyRegionWide(t *testing.T) {
	c := client(limiter.ModeStandalone)
	a := limiter.NewPenaltyBox(c, "", time.Second, 0)
	b := limiter.NewPenaltyBox(c, "", time.Second, 0)
	key, other := testenv.KeyPrefix(t)+"k", testenv.KeyPrefix(t)+"other"

	left := make([]time.Duration, 2)
	require.NoError(t, b.Check(ctx(t), []string{key, other}, left))
	require.Equal(t, []time.Duration{0, 0}, left)

	const d = 1500 * time.Millisecond
	require.NoError(t, a.Trip(ctx(t), key, d))
	ttl := c.PTTL(ctx(t), a.RedisKey(key)).Val()
	require.True(t, ttl > 0 && ttl <= d, "the penalty is in Redis with its TTL (%s)", ttl)

	require.NoError(t, b.Check(ctx(t), []string{key, other}, left))
	require.Greater(t, left[0], time.Duration(0), "the other edge sees the penalty")
	require.LessOrEqual(t, left[0], d)
	require.Zero(t, left[1], "only the penalised key")

	// Once seen, the other edge answers from memory, without asking Redis
	// (a penalised flood costs Redis nothing): a fresh box does ask.
	fresh := limiter.NewPenaltyBox(c, "", time.Second, 0)
	require.NoError(t, c.Set(ctx(t), a.RedisKey(other), 1, time.Minute).Err())
	require.NoError(t, c.Del(ctx(t), a.RedisKey(key)).Err())
	require.NoError(t, b.Check(ctx(t), []string{key}, left[:1]))
	require.Greater(t, left[0], time.Duration(0), "answered from this edge's memory")
	require.NoError(t, fresh.Check(ctx(t), []string{key, other}, left))
	require.Zero(t, left[0])
	require.Greater(t, left[1], 50*time.Second, "a penalty set directly in Redis is seen")

	// It ends, here too.
	require.Eventually(t, func() bool {
		require.NoError(t, b.Check(ctx(t), []string{key}, left[:1]))
		return left[0] == 0
	}, 10*time.Second, 20*time.Millisecond)
}

// TestPenaltyStoreDown: a box whose Redis is gone reports the error and
// penalises nothing it did not already know of (availability first).
func TestPenaltyStoreDown(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = dead.Close() })
	p := limiter.NewPenaltyBox(dead, "", 200*time.Millisecond, 0)
	left := []time.Duration{time.Hour}
	require.ErrorIs(t, p.Check(ctx(t), []string{"k"}, left), limiter.ErrPenaltyStore)
	require.Zero(t, left[0])
	require.ErrorIs(t, p.Trip(ctx(t), "k", time.Minute), limiter.ErrPenaltyStore)
	require.NoError(t, p.Check(ctx(t), []string{"k"}, left), "a trip is remembered here even when Redis failed")
	require.Greater(t, left[0], 59*time.Second)
}

// TestPenaltyLocalBounded: the local memory of penalties never holds more
// than its cap; Redis still holds what it could not.
func TestPenaltyLocalBounded(t *testing.T) {
	p := limiter.NewPenaltyBox(nil, "", 0, 2)
	for _, k := range []string{"a", "b", "c"} {
		require.NoError(t, p.Trip(ctx(t), k, time.Minute))
	}
	left := make([]time.Duration, 3)
	require.NoError(t, p.Check(ctx(t), []string{"a", "b", "c"}, left))
	require.Greater(t, left[0], time.Duration(0))
	require.Greater(t, left[1], time.Duration(0))
	require.Zero(t, left[2], "past the cap, a local-only box forgets")
}
