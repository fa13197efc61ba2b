package edge

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// loadOrigin is an origin for the load tests: /ws is a WebSocket that
// waits for its client to close; /slow sends its header only once the
// current gate is closed (each arrival counted in slow); anything else is
// an immediate 200.
type loadOrigin struct {
	url  string
	slow atomic.Int64
	mu   sync.Mutex
	gate chan struct{}
}

func startLoadOrigin(t *testing.T) *loadOrigin {
	t.Helper()
	o := &loadOrigin{gate: make(chan struct{})}
	up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		gate := o.gate
		o.mu.Unlock()
		o.slow.Add(1)
		select {
		case <-gate:
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "late")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(o.open)
	o.url = srv.URL
	return o
}

// open lets every waiting /slow answer, and sets a new gate for the next.
func (o *loadOrigin) open() {
	o.mu.Lock()
	defer o.mu.Unlock()
	close(o.gate)
	o.gate = make(chan struct{})
}

// Long-lived streams do not look like load, and do not hide it. With a
// worker cap far below the number of open tunnels (16 workers, 1,000
// WebSockets open through the edge) and the shedder at its defaults:
// (a) no worker is busy and every ordinary request is 200: a tunnel holds
// no worker; (b) an origin slow to its header, holding every worker, is
// seen as it is without the tunnels: every further request is shed (503),
// the same count as before the tunnels were opened, then all is 200 again
// once the origin answers.
func TestTunnelsAreNotLoad(t *testing.T) {
	const (
		workers = 16
		tunnels = 1000
		probes  = 10
	)
	o := startLoadOrigin(t)
	r := startEdge(t, generous, func(c *config.Config) {
		c.Origins = []string{o.url}
		c.Workers = workers
		c.MaxConnsPerIP = 0 // a thousand sockets from one loopback address
	})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers + probes}, Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	get := func(path string) int {
		resp, err := client.Get("http://" + r.Addr() + path)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	codes := func(n int) map[int]int {
		out := map[int]int{}
		for range n {
			out[get("/orders")]++
		}
		return out
	}
	// holdWorkers fills every worker with a request the origin holds, runs
	// check, then lets them finish and says how they ended.
	holdWorkers := func(check func()) map[int]int {
		before := o.slow.Load()
		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			end = map[int]int{}
		)
		for range workers {
			wg.Go(func() {
				code := get("/slow")
				mu.Lock()
				end[code]++
				mu.Unlock()
			})
		}
		err := proc.PollEvery(testenv.Within(t, 20*time.Second), 10*time.Millisecond, "every worker at the slow origin", func(context.Context) error {
			if got := o.slow.Load() - before; got < workers {
				return fmt.Errorf("%d of %d at the origin", got, workers)
			}
			return nil
		})
		require.NoError(t, err)
		check()
		o.open()
		wg.Wait()
		return end
	}

	// Without tunnels: what a held origin looks like.
	var shedBefore map[int]int
	require.Equal(t, map[int]int{http.StatusOK: workers}, holdWorkers(func() { shedBefore = codes(probes) }))
	require.Equal(t, map[int]int{http.StatusServiceUnavailable: probes}, shedBefore, "every worker held: further requests are shed")

	d := websocket.Dialer{HandshakeTimeout: 20 * time.Second}
	for i := range tunnels {
		c, _, err := d.Dial("ws://"+r.Addr()+"/ws", nil)
		require.NoError(t, err, "tunnel %d", i)
		t.Cleanup(func() { c.Close() })
	}
	require.Equal(t, float64(tunnels), metricSum(t, r, "edgeguard_origin_tunnels_open"))

	// (a) The tunnels are not load.
	waitMetric(t, r, 0, "edgeguard_shedder_workers_busy")
	require.Equal(t, map[int]int{http.StatusOK: 100}, codes(100), "1,000 open tunnels, 16 workers: every ordinary request served")

	// (b) They do not hide load either.
	var shedWith map[int]int
	require.Equal(t, map[int]int{http.StatusOK: workers}, holdWorkers(func() { shedWith = codes(probes) }))
	require.Equal(t, shedBefore, shedWith, "a held origin is shed alike with 1,000 tunnels open")
	require.Equal(t, map[int]int{http.StatusOK: probes}, codes(probes), "served again once the origin answers")
	require.Equal(t, float64(tunnels), metricSum(t, r, "edgeguard_origin_tunnels_open"), "the tunnels stayed open throughout")
}
