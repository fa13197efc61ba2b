package limiter_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// TestDifferentialMemoryRedis feeds the same random sequences of (time, cost,
// need, refund) to the memory store and to Redis and requires identical
// answers: the Go algorithms and the Lua scripts are one specification.
//
// Simulated time runs ahead of the wall clock (now + random advances), so a
// key whose TTL a simulated call set never expires in Redis before the memory
// store would consider it gone.
func TestDifferentialMemoryRedis(t *testing.T) {
	for _, alg := range limit.All() { // every registered algorithm
		for seed := uint64(1); seed <= 4; seed++ {
			t.Run(alg.String(), func(t *testing.T) {
				red := redisStore(t, client(limiter.ModeStandalone))
				differential(t, red, rand.New(rand.NewPCG(seed, uint64(alg))), alg, 300)
			})
		}
	}
}

// differential runs one random sequence of steps on a fresh memory store and
// on red, requiring the same answer at every step.
func differential(t *testing.T, red limiter.Store, rng *rand.Rand, alg limiter.Algorithm, steps int) {
	l := randomLimit(rng, alg)
	l.Key = testenv.KeyPrefix(t)
	mem := limiter.NewMemoryStore()
	start := time.Now()
	var jumped time.Duration
	var memLeases, redLeases []limiter.Lease
	for i := 0; i < steps; i++ {
		jumped += time.Duration(rng.ExpFloat64() * float64(l.Window) / float64(l.Limit+1))
		if rng.IntN(40) == 0 {
			jumped += l.Window // sometimes idle for a whole window
		}
		at := start.Add(time.Since(start) + jumped)
		if len(memLeases) > 0 && rng.IntN(5) == 0 {
			j := rng.IntN(len(memLeases))
			n := rng.Int64N(memLeases[j].Units + 1)
			mh, _ := memLeases[j].Split(n)
			rh, _ := redLeases[j].Split(n)
			require.NoError(t, mem.Refund(ctx(t), []limiter.Lease{mh}))
			require.NoError(t, red.Refund(ctx(t), []limiter.Lease{rh}))
			memLeases[j].Units, redLeases[j].Units = 0, 0
			continue
		}
		req := limiter.Request{Limit: l, Cost: 1 + rng.Int64N(min(4, l.Capacity())), At: at}
		if rng.IntN(3) == 0 {
			req.Need = 1 + rng.Int64N(req.Cost)
		}
		md, err := mem.Take(ctx(t), []limiter.Request{req})
		require.NoError(t, err)
		rd, err := red.Take(ctx(t), []limiter.Request{req})
		require.NoError(t, err)
		require.Equal(t, view(md[0]), view(rd[0]), "step %d: %+v", i, req)
		memLeases = append(memLeases, md[0].Lease)
		redLeases = append(redLeases, rd[0].Lease)
	}
}

// view is a Decision without its lease (member ids differ between stores).
type decisionView struct {
	Admitted, Remaining   int64
	Allowed               bool
	ResetAfter, RetryAfer time.Duration
}

func view(d limiter.Decision) decisionView {
	return decisionView{d.Admitted, d.Remaining, d.Allowed, d.ResetAfter, d.RetryAfter}
}

func randomLimit(rng *rand.Rand, alg limiter.Algorithm) limiter.Limit {
	l := limiter.Limit{Algorithm: alg, Limit: 1 + rng.Int64N(20), Window: time.Duration(2000+rng.IntN(20000)) * time.Millisecond}
	if alg.Spec().Burst {
		l.Burst = rng.Int64N(2 * l.Limit)
	}
	if alg.Spec().MinInterval && rng.IntN(2) == 0 {
		l.MinInterval = time.Duration(rng.Int64N(int64(l.Window) / 4))
	}
	return l
}
