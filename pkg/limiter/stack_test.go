package limiter_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// A store call runs on a goroutine of its own; after growStack, a Take
// through an autopipelining lane to a real Redis never moves that
// goroutine's stack, which a fresh goroutine's stack is too small for
// (without growStack the same Take moves it: the path is as deep as the
// test says).
//
// The runtime starts goroutines with the stack their average needed at the
// last collection (adaptive stack starts, on by default): after the tests
// before it, a fresh goroutine's stack may already hold a store call, and
// the control (a fresh goroutine's stack moves) fails for no fault of the
// store. The test therefore runs alone in a child of this test binary with
// adaptive starts off.
func TestStoreCallStackGrownOnce(t *testing.T) {
	if !strings.Contains(os.Getenv("GODEBUG"), "adaptivestackstart=0") {
		cmd := exec.CommandContext(ctx(t), os.Args[0], "-test.run=^TestStoreCallStackGrownOnce$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "GODEBUG="+strings.TrimPrefix(os.Getenv("GODEBUG")+",adaptivestackstart=0", ","))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: TestStoreCallStackGrownOnce", "the child ran the test")
		return
	}
	st := connStore(t, autoPipelined(t, client(limiter.ModeStandalone)))
	l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.FixedWindow, Limit: 1_000_000_000, Window: time.Minute}
	reqs := []limiter.Request{{Limit: l, Cost: 1}}
	// The first calls dial the connection and load the script: deeper
	// paths, each once.
	for range 3 {
		_, err := st.Take(ctx(t), reqs)
		require.NoError(t, err)
	}
	const runs = 20
	fresh := 0
	for i := range runs {
		moved, err := limiter.TakeMovesStack(ctx(t), st, reqs, true)
		require.NoError(t, err)
		require.False(t, moved, "run %d: the stack grew during the store call", i)
		moved, err = limiter.TakeMovesStack(ctx(t), st, reqs, false)
		require.NoError(t, err)
		if moved {
			fresh++
		}
	}
	require.Equal(t, runs, fresh, "a fresh goroutine's stack holds the store call: the test shows nothing")
}
