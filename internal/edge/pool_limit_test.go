package edge

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// TestPoolConcurrencyLimit: a pool's concurrency limit holds a slow origin
// where it is slow. slow.example's pool (limit 3, a queue of 2) answers
// only when the test lets it; 10 requests at once reach it 3 at a time,
// 2 wait in the pool's queue holding no worker, and 5 get 503 pool_limit
// at once, while fast.example (the --origin pool, no limit) is served in
// full throughout.
func TestPoolConcurrencyLimit(t *testing.T) {
	var inFlight, most atomic.Int64
	hold := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-hold
		_, _ = io.WriteString(w, "slow")
	}))
	defer slow.Close()
	defer close(hold)
	table := filepath.Join(t.TempDir(), "hosts.yaml")
	require.NoError(t, os.WriteFile(table, fmt.Appendf(nil, `version: 1
pools:
  slow:
    urls: [%q]
    concurrency: {limit: 3, queue: 2, queue_timeout: 1m}
    health_check_interval: 0s # the probe would count at the origin
hosts:
  slow.example: {pool: slow}
`, slow.URL), 0o600))
	r := startEdge(t, generous, func(c *config.Config) { c.Hosts, c.Workers = table, 16 })

	codes := make(chan int, 10)
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, "http://"+r.Addr()+"/", nil)
			req.Host = "slow.example"
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- -1
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	// 5 refused at once (the limit and its queue are full); 3 at the
	// origin, 2 queued.
	for range 5 {
		require.Equal(t, http.StatusServiceUnavailable, <-codes)
	}
	require.Eventually(t, func() bool { return inFlight.Load() == 3 }, 10*time.Second, time.Millisecond)
	require.Equal(t, 3, r.shed.Workers.Busy(), "the queued requests hold no worker")
	require.Equal(t, 5.0, metricSum(t, r, "edgeguard_origin_concurrency_refused_total", "pool", "slow", "reason", "queue_full"))
	require.Equal(t, 5.0, metricSum(t, r, "edgeguard_edge_requests_total", "outcome", "pool_limit"))
	require.Equal(t, 3.0, metricSum(t, r, "edgeguard_origin_concurrency_limit", "pool", "slow"))
	require.Equal(t, 3.0, metricSum(t, r, "edgeguard_origin_concurrency_in_flight", "pool", "slow"))
	require.Eventually(t, func() bool { return metricSum(t, r, "edgeguard_origin_concurrency_queued", "pool", "slow") == 2 }, 10*time.Second, time.Millisecond)

	// The other host is served in full while slow.example is held.
	for range 20 {
		code, _ := send(t, r, http.MethodGet, "fast.example", nil)
		require.Equal(t, http.StatusOK, code)
	}
	hold <- struct{}{} // one answer: a queued request takes its place
	require.Equal(t, http.StatusOK, <-codes)
	require.Eventually(t, func() bool { return inFlight.Load() == 3 }, 10*time.Second, time.Millisecond)
	for range 4 {
		hold <- struct{}{}
		require.Equal(t, http.StatusOK, <-codes)
	}
	wg.Wait()
	require.Equal(t, int64(3), most.Load(), "the origin never had more than the pool's limit")
}
