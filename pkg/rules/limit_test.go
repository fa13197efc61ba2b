package rules

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// TestValidationIsTheLimitersOwn: a rule's quota fields validate exactly
// when the limiter's definition (limit.Limit.Problems) accepts them, for
// every registered algorithm, at and around every bound.
func TestValidationIsTheLimitersOwn(t *testing.T) {
	limits := []int64{-1, 0, 1, 999, 1000, 1001, limit.MaxMembers, limit.MaxMembers + 1, 104_249_991, 200_000_000, limit.MaxLimit, limit.MaxLimit + 1}
	windows := []time.Duration{-time.Second, 0, time.Microsecond, 1500 * time.Microsecond, time.Millisecond, 999 * time.Millisecond, time.Second, 24 * time.Hour, 24*time.Hour + time.Millisecond}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, alg := range limit.All() {
		for _, n := range limits {
			for _, w := range windows {
				r := validRule("r")
				r.Algorithm = Algorithm(alg.String())
				r.Limit, r.Window = n, Duration(w)
				if rng.IntN(3) == 0 {
					r.Burst = limits[rng.IntN(len(limits))]
				}
				if rng.IntN(3) == 0 {
					r.MinInterval = Duration(windows[rng.IntN(len(windows))])
				}
				l := limit.Limit{Algorithm: alg, Limit: r.Limit, Window: w, Burst: r.Burst, MinInterval: r.MinInterval.D()}
				want := len(l.Problems()) == 0 && l.CostProblem(r.Cost) == nil
				err := (&Document{Version: SchemaVersion, Rules: []Rule{r}}).Validate()
				require.Equal(t, want, err == nil, "%s limit=%d window=%s burst=%d min_interval=%s: %v", alg, n, w, r.Burst, r.MinInterval.D(), err)
			}
		}
	}
}
