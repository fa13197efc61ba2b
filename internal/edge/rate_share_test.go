package edge

import (
	"context"
	"maps"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// modelCPU stands in for the edge's CPU time (Shedder.SetCPUTime): while
// on, each request its origin has served costs 1/perTick of what the
// GOMAXPROCS cores can do in a 50 ms sampler tick, so the edge's CPU looks
// busy exactly when about perTick requests a tick get through, whatever
// the machine's own cores are doing.
type modelCPU struct {
	served  *atomic.Int64
	perTick int64
	mu      sync.Mutex
	on      bool
	last    int64         // served at the last read
	used    time.Duration // the model's CPU time so far
}

func (m *modelCPU) read() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.served.Load()
	if m.on {
		perRequest := 50 * time.Millisecond * time.Duration(runtime.GOMAXPROCS(0)) / time.Duration(m.perTick)
		m.used += time.Duration(n-m.last) * perRequest
	}
	m.last = n
	return time.Second + m.used // never 0: 0 reads as "no CPU time here"
}

func (m *modelCPU) set(on bool) {
	m.mu.Lock()
	m.on = on
	m.mu.Unlock()
}

// TestRateSharesEndToEnd: the rate shares (pkg/shedder/hostrate.go) through
// a real edge at its defaults over loopback, the CPU's reading modelled
// (modelCPU: 10 requests a tick use the cores). a.example floods on 16
// connections through an origin that answers at once, so it holds few
// workers and its share of them never stops it; b.example asks for 2
// requests a tick.
//   - The model off (the CPU idle): nothing waits, every request is
//     answered 200, and there is no rate share.
//   - The model on: the rate shares start (edgeguard_shedder_host_rate_share
//     above 0), a.example's requests wait in its host's queue for its rate
//     share (host_queue_waits_total), and b.example, asking for less than
//     an even share, gets every request answered 200, none held.
func TestRateSharesEndToEnd(t *testing.T) {
	var served atomic.Int64
	cpu := &modelCPU{served: &served, perTick: 10}
	origin := countingOrigin(t, &served)
	r := startEdgeBefore(t, noRules, func(c *config.Config) { c.Origins = []string{origin} },
		func(e *Edge) { e.shed.SetCPUTime(cpu.read) })
	addr := r.Addr()
	client := &fasthttp.Client{MaxConnsPerHost: 64, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	get := func(host string) int {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://" + addr + "/item")
		req.UseHostHeader = true
		req.Header.SetHost(host)
		if err := client.Do(req, resp); err != nil {
			return 0
		}
		return resp.StatusCode()
	}
	waits := func() float64 { return metricSum(t, r, "edgeguard_shedder_host_queue_waits_total") }

	// a.example's flood, until the test ends; its answers tallied by code.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	aCodes := map[int]int{}
	for range 16 {
		wg.Go(func() {
			for ctx.Err() == nil {
				code := get("a.example")
				mu.Lock()
				aCodes[code]++
				mu.Unlock()
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	// b.example: n requests, 2 a tick (40 a second), each on its own
	// schedule; their codes.
	b := func(n int) map[int]int {
		codes := map[int]int{}
		var bmu sync.Mutex
		var bwg sync.WaitGroup
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for range n {
			<-tick.C
			bwg.Go(func() {
				code := get("b.example")
				bmu.Lock()
				codes[code]++
				bmu.Unlock()
			})
		}
		bwg.Wait()
		return codes
	}

	// The model off: the CPU idle, no rate share, nothing waits.
	idle := b(40)
	mu.Lock()
	aIdle := maps.Clone(aCodes)
	mu.Unlock()
	t.Logf("idle: b.example %v, a.example %v, rate share %v, waits %v", idle, aIdle, metricValue(t, r, "edgeguard_shedder_host_rate_share"), waits())
	require.Equal(t, map[int]int{200: 40}, idle, "b.example with the CPU idle")
	require.Equal(t, []int{200}, slices.Sorted(maps.Keys(aIdle)), "a.example with the CPU idle: every answer 200")
	require.Greater(t, aIdle[200], 40, "a.example flooded")
	require.Zero(t, metricValue(t, r, "edgeguard_shedder_host_rate_share"))
	require.Zero(t, waits(), "nothing waited with the CPU idle")

	// The model on: the rate shares start once a tick lets about 9 in.
	cpu.set(true)
	var bBusy map[int]int
	bDone := make(chan struct{})
	go func() { defer close(bDone); bBusy = b(120) }()
	// The gauge, polled while b.example sends, and once more after.
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	share := 0.0
	for sending := true; share == 0 && sending; {
		select {
		case <-bDone:
			sending = false
		case <-poll.C:
		}
		share = metricValue(t, r, "edgeguard_shedder_host_rate_share")
	}
	<-bDone
	cancel()
	wg.Wait()
	t.Logf("busy: b.example %v, a.example in all %v, a rate share seen of %.0f/s, waits %v (admitted %v, timed out %v)", bBusy, aCodes, share, waits(),
		metricSum(t, r, "edgeguard_shedder_host_queue_waits_total", "outcome", "admitted"),
		metricSum(t, r, "edgeguard_shedder_host_queue_waits_total", "outcome", "timed_out"))
	require.Positive(t, share, "the rate shares started with the CPU busy")
	require.Positive(t, waits(), "a.example waited for its rate share")
	require.Equal(t, map[int]int{200: 120}, bBusy, "b.example, asking for less than an even share: every request answered")
}
