//go:build !race

package edge

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// What a request costs in allocations on each path, counted by
// testing.AllocsPerRun (a count, not a time: the same on any machine).
// The bounds are today's figures: a change that allocates more on one of
// these paths fails here. Built without the race detector only (its
// instrumentation allocates, and sync.Pool drops items at random under
// it): scripts/test-go.sh runs it in a build of its own.
func TestPipelineCostAllocs(t *testing.T) {
	// ruled: the key the limiter's maps and the embedded store's are kept
	// under, built once and handed to the store with the request; the
	// store's answers stay on the limiter's stack (a struct key instead
	// made each map lookup dearer, in instructions, than the allocation it
	// saved), and the call's state is pooled (the embedded store answers
	// in the caller's goroutine).
	most := map[string]float64{"denied": 0, "proxied": 0, "ruled": 1, "shed": 0}
	for _, p := range costPaths {
		t.Run(p.name, func(t *testing.T) {
			one := costEdge(t, p)
			allocs := testing.AllocsPerRun(500, one)
			t.Logf("%s: %.2f allocs per request", p.name, allocs)
			require.LessOrEqual(t, allocs, most[p.name])
		})
	}
}
