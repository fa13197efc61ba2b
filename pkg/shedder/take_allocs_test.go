//go:build !race

package shedder

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Taking and releasing a free slot allocates nothing (AcquireUnless's
// release func costs two allocations). Built without the race detector,
// whose instrumentation allocates.
func TestWorkersTakeAllocatesNothing(t *testing.T) {
	w := NewWorkers(4, 0, 0)
	allocs := testing.AllocsPerRun(200, func() {
		s, err := w.TakeUnless(context.Background(), TierRead, nil)
		if err != nil {
			t.Fatal(err)
		}
		s.Release()
	})
	require.Zero(t, allocs)
	require.Equal(t, 0, w.Busy())
}
