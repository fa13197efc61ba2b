package limiter_test

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// TestEveryValidLimitIsDecidable walks every registered algorithm at the
// edges of what validates (the shortest and longest window, the largest
// limit each allows there, the largest burst): each such limit must count
// correctly in memory and in Redis, and one step past it must be refused.
// A rule that validates is a rule the limiter can decide: before the shared
// validation, sliding_window 200000000/24h validated and every request was
// then admitted unchecked, and a token bucket of 1e9 per ms never counted.
func TestEveryValidLimitIsDecidable(t *testing.T) {
	stores := []namedStore{{"memory", limiter.NewMemoryStore()}, {"redis", redisStore(t, client(limiter.ModeStandalone))}}
	for _, alg := range limit.All() {
		sp := alg.Spec()
		for _, window := range []time.Duration{max(limit.MinWindow, sp.MinWindow), limit.MaxWindow} {
			l := limit.Limit{Algorithm: alg, Window: window}
			// The largest limit that validates at this window.
			top := sort.Search(limit.MaxLimit+1, func(n int) bool {
				l.Limit = int64(n) + 1
				return len(l.Problems()) > 0
			})
			l.Limit = int64(top)
			require.Empty(t, l.Problems(), "%s/%s: limit %d", alg, window, top)
			past := l
			past.Limit++
			require.NotEmpty(t, past.Problems(), "%s/%s: one past the bound", alg, window)
			corners := []limit.Limit{l, {Algorithm: alg, Window: window, Limit: 1}}
			if sp.Burst {
				b := l
				b.Burst = limit.MaxLimit
				require.Empty(t, b.Problems())
				corners = append(corners, b)
			}
			for _, c := range corners {
				for _, st := range stores {
					t.Run(fmt.Sprintf("%s/%s/%s/limit=%d/burst=%d", st.name, alg, window, c.Limit, c.Burst), func(t *testing.T) {
						c.Key = testenv.KeyPrefix(t)
						capacity := c.Capacity()
						// Both takes at one instant and in one call: nothing leaks
						// or refills between them, and a key whose TTL is a
						// millisecond (a fast bucket) is still there.
						at := time.Now()
						ds, err := st.store.Take(ctx(t), []limiter.Request{{Limit: c, Cost: 1, At: at}, {Limit: c, Cost: 1, At: at}})
						require.NoError(t, err)
						remaining := capacity
						for i := int64(1); i <= 2; i++ {
							d := ds[i-1]
							if i > capacity {
								require.False(t, d.Allowed, "beyond capacity %d", capacity)
								require.Positive(t, d.RetryAfter)
								// A sliding window counter may need the rest of
								// this window and all of the next.
								require.LessOrEqual(t, d.RetryAfter, 2*window+time.Millisecond)
								continue
							}
							require.True(t, d.Allowed, "take %d of capacity %d", i, capacity)
							// The state counts: remaining falls with every unit.
							// The buckets' float state may read one lower
							// than exact, never higher (README).
							if i == 2 && ds[0].ResetAfter <= 5*time.Millisecond {
								// The first take's state lasts a few ms of
								// Redis's own clock (a bucket refilling a
								// unit per µs): it may be gone by the second.
								require.LessOrEqual(t, d.Remaining, remaining, "take %d", i)
							} else {
								require.Less(t, d.Remaining, remaining, "take %d", i)
							}
							require.GreaterOrEqual(t, d.Remaining, capacity-i-1, "take %d", i)
							remaining = d.Remaining
						}
					})
				}
			}
		}
	}
}
