package limiter_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/limit"
	"github.com/edgeguard/edgeguard/pkg/limiter"
)

// Checks that queue behind a call the store does not answer (Redis frozen)
// are decided by the fallback when that call gives up, with no call of
// their own: a coalesced check waits one store deadline, as a lone one
// does. (They used to send a second call to the frozen store when the
// first gave up, and waited out its deadline too: two in all.) Judged by
// counts, at the default deadline: every check that joined a call was
// settled by its failure, and the store was asked only by the checks that
// led a call.
func TestCoalescedChecksShareTheFailure(t *testing.T) {
	srv, err := testenv.StartStandalone(testenv.StandaloneOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Thaw(); _ = srv.Close() })
	e := newEdgeLimiters(t, 1, srv.URL(), limiter.ModeStandalone)[0]
	l := limiter.Limit{Key: testenv.KeyPrefix(t), Algorithm: limit.SlidingLog, Limit: 100, Window: time.Minute}
	check := []limiter.Check{{Limit: l, Cost: 1, Nodes: 1}}
	v, err := e.Decide(context.Background(), check)
	require.NoError(t, err)
	require.Equal(t, limiter.SourceStore, v.Checks[0].Source, "Redis answers before the freeze")
	asked := metric(t, e.reg, "edgeguard_limiter_store_decisions_total")

	srv.Freeze()
	const n = 8
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var took []time.Duration
	var sources []limiter.Source
	for range n {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			v, err := e.Decide(context.Background(), check)
			mu.Lock()
			defer mu.Unlock()
			took = append(took, time.Since(t0))
			if err == nil {
				sources = append(sources, v.Checks[0].Source)
			}
		})
	}
	close(start)
	wg.Wait()
	// Thawed, the frozen call settles and its give-backs end: the
	// limiter's background work is over once Close returns.
	srv.Thaw()
	e.Close()
	slices.Sort(took)
	coalesced := metric(t, e.reg, "edgeguard_limiter_coalesced_checks_total")
	failed := metric(t, e.reg, "edgeguard_limiter_coalesced_failed_checks_total")
	leaders := metric(t, e.reg, "edgeguard_limiter_store_decisions_total") - asked
	t.Logf("%d checks on a frozen store: %v coalesced, %v of them settled by their call's failure, %v asked of the store; took %v to %v (deadline %v)", n, coalesced, failed, leaders, took[0], took[n-1], limiter.DefaultTimeout)
	require.Len(t, sources, n, "every check decided")
	for _, s := range sources {
		require.Equal(t, limiter.SourceFallback, s)
	}
	require.Positive(t, coalesced, "witness: checks queued behind a call in flight")
	require.Equal(t, coalesced, failed, "every check that queued behind the frozen call was settled by its failure")
	require.LessOrEqual(t, leaders, float64(n)-coalesced, "only the checks that led a call asked the store")
}
