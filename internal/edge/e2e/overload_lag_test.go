package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestRuntimeLagShedsAStalledEdge stalls two edge processes the same way
// (SIGSTOP for 300 ms, SIGCONT for 100 ms, as a host starved of CPU runs
// them in bursts) while test-tier traffic arrives far below their workers.
// Only the edge with runtime_lag_bad sheds: its workers never look busy,
// the lag it measures on resuming does. The other edge, the ramp alone,
// sheds nothing through the same stalls.
func TestRuntimeLagShedsAStalledEdge(t *testing.T) {
	origin := startOrigin(t, 0)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	base := `"good": 0.7, "bad": 0.8, "start_after": "1s", "full_after": "2s", "smoothing": "200ms", "share_window": "1s"`
	lagFile := write("lag.json", `{`+base+`, "runtime_lag_bad": "100ms"}`)
	rampFile := write("ramp.json", `{`+base+`}`)
	lagging := startEdge(t, "--origin", origin.URL, "--workers", "64", "--shedder", lagFile, "--trusted-proxies", "127.0.0.1")
	ramp := startEdge(t, "--origin", origin.URL, "--workers", "64", "--shedder", rampFile, "--trusted-proxies", "127.0.0.1")
	edges := []*edgeProc{lagging, ramp}
	signal := func(sig syscall.Signal) {
		for _, e := range edges {
			_ = e.Cmd.Process.Signal(sig)
		}
	}
	t.Cleanup(func() { signal(syscall.SIGCONT) })

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var cycles atomic.Int64
	wg.Go(func() { // the stalls
		defer signal(syscall.SIGCONT)
		for {
			signal(syscall.SIGSTOP)
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			signal(syscall.SIGCONT)
			cycles.Add(1)
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	client := newClient(t, 64)
	var notProcessed [2]atomic.Int64 // 503s with EdgeGuard-Not-Processed, per edge
	for i, e := range edges {
		wg.Go(func() { // 20 test-tier requests/s, each edge
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			var inner sync.WaitGroup
			defer inner.Wait()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				inner.Go(func() {
					r := get(client, e.url("/"), "X-Priority", "test")
					if r.err == nil && r.code == http.StatusServiceUnavailable && r.header.Get("EdgeGuard-Not-Processed") == "1" {
						notProcessed[i].Add(1)
					}
				})
			}
		})
	}

	// The lagging edge sheds within 20 s of stalls (start_after and
	// full_after are 1 s and 2 s; the stalls also slow the scrapes).
	err := proc.PollEvery(testenv.Within(t, 20*time.Second), 200*time.Millisecond, "a test-tier request refused", func(context.Context) error {
		if notProcessed[0].Load() == 0 {
			return errors.New("no test-tier request refused yet")
		}
		return nil
	})
	// Ten more stalls, so the ramp-only edge goes through as many after
	// the other started shedding (a stall cycle takes 400 ms).
	var more error
	if err == nil {
		from := cycles.Load()
		more = proc.PollEvery(testenv.Within(t, 20*time.Second), 100*time.Millisecond, "ten more stalls", func(context.Context) error {
			if n := cycles.Load() - from; n < 10 {
				return fmt.Errorf("%d stalls since the first refusal", n)
			}
			return nil
		})
	}
	close(stop)
	wg.Wait()
	require.NoError(t, err, "the edge with runtime_lag_bad never shed through %d stalls", cycles.Load())
	require.NoError(t, more, "the stalls went on after the first refusal")

	lagM, rampM := scrape(t, lagging), scrape(t, ramp)
	shedLag := sum(lagM, "edgeguard_shedder_shed_total", "tier", "test")
	shedRamp := sum(rampM, "edgeguard_shedder_shed_total", "tier", "test")
	t.Logf("%d stalls of 300 ms: runtime_lag_bad edge shed %.0f test requests (%d refused with EdgeGuard-Not-Processed seen); ramp-only edge shed %.0f (%d seen)",
		cycles.Load(), shedLag, notProcessed[0].Load(), shedRamp, notProcessed[1].Load())
	require.Positive(t, shedLag)
	require.Zero(t, shedRamp, "the ramp alone sheds on worker utilization, which the stalls do not raise")
	require.Zero(t, notProcessed[1].Load())
}
