//go:build !race

package rules

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A key asked for again (a client's next request) allocates nothing:
// matching three rules into a reused slice costs no allocation once their
// keys are cached. Built without the race detector, whose instrumentation
// allocates.
func TestKeyCacheHitAllocatesNothing(t *testing.T) {
	s := mustCompile(t, mustParse(t, keyCacheDoc), WithKeySalt([]byte("salt")))
	req := keyCacheRequest(1, "key")
	dst := s.Match(req, nil)
	require.Len(t, dst, 3)
	allocs := testing.AllocsPerRun(100, func() { dst = s.Match(req, dst[:0]) })
	require.Zero(t, allocs)
}
