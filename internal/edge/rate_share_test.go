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
	"github.com/edgeguard/edgeguard/pkg/shedder"
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

// hostClient is a client of up to conns connections for hostGet.
func hostClient(conns int) *fasthttp.Client {
	return &fasthttp.Client{MaxConnsPerHost: conns, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
}

// hostGet sends GET path for host to the edge at addr; it returns the
// status code, 0 when no answer came.
func hostGet(client *fasthttp.Client, addr, host, path string) int {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + path)
	req.UseHostHeader = true
	req.Header.SetHost(host)
	if err := client.Do(req, resp); err != nil {
		return 0
	}
	return resp.StatusCode()
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
	client := hostClient(64)
	get := func(host string) int { return hostGet(client, r.Addr(), host, "/item") }
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

// TestRateSharesLeaveAHostHeldByItsOriginOutEndToEnd: the rate shares
// through a real edge at its defaults but for 16 workers (so a host's share
// of them is 8), the CPU's reading modelled as in TestRateSharesEndToEnd
// (5 requests a tick use the cores).
//   - a.example's origin holds its requests: 8 fill its share of the
//     workers, and 4 more wait in its host's queue for a place (each
//     waits host_share.queue_timeout, then is sent again; they start apart,
//     so some always wait). Its origin, not the CPU, holds it back.
//   - b.example then fills the modelled CPU through an origin that answers
//     at once. No other host could use the CPU: for a second of busy ticks
//     there is no rate share, and b.example is not held.
//   - c.example joins, one request every 50 ms through the fast origin: a
//     host that could use the CPU. The rate shares start (the control: the
//     same edge, the same flood, on the same machine).
func TestRateSharesLeaveAHostHeldByItsOriginOutEndToEnd(t *testing.T) {
	var served atomic.Int64
	release := make(chan struct{})
	cpu := &modelCPU{served: &served, perTick: 5}
	origin := holdingOrigin(t, &served, release)
	r := startEdgeBefore(t, noRules, func(c *config.Config) {
		c.Origins = []string{origin}
		c.Workers = 16
	}, func(e *Edge) { e.shed.SetCPUTime(cpu.read) })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Cleanups run last first: the held requests go first, then the
	// clients stop, then the edge and the origin.
	t.Cleanup(func() { cancel(); close(release); wg.Wait() })
	// send sends GET path for host on n connections, back to back, one
	// connection starting every gap, until the test ends; it counts the
	// answers by code.
	send := func(host, path string, n int, gap time.Duration) func() map[int]int {
		client := hostClient(n)
		var mu sync.Mutex
		codes := map[int]int{}
		for i := range n {
			wg.Go(func() {
				select {
				case <-time.After(time.Duration(i) * gap):
				case <-ctx.Done():
				}
				for ctx.Err() == nil {
					code := hostGet(client, r.Addr(), host, path)
					mu.Lock()
					codes[code]++
					mu.Unlock()
				}
			})
		}
		return func() map[int]int {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(codes)
		}
	}
	rateShare := func() float64 { return metricValue(t, r, "edgeguard_shedder_host_rate_share") }

	// b.example sends (the model off: a lone host has every worker), and
	// a.example is held by its origin beside it: its share of the workers
	// full, and requests waiting for a place in it.
	bCodes := send("b.example", "/item", 4, 0)
	send("a.example", "/held", 12, 100*time.Millisecond)
	var a shedder.HostInFlight
	require.Eventually(t, func() bool {
		a = hostState(r, "a.example")
		return a.InFlight == 8 && a.Queued == 4
	}, 20*time.Second, 10*time.Millisecond, "a.example never held 8 places with 4 waiting")

	// b.example now fills the modelled CPU.
	cpu.set(true)
	start, from := time.Now(), served.Load()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	var shares []float64
	for time.Since(start) < time.Second {
		<-poll.C
		if s := rateShare(); s > 0 {
			shares = append(shares, s)
		}
	}
	busyTicks := float64(served.Load()-from) / float64(cpu.perTick) // ticks' worth of CPU b.example used
	a = hostState(r, "a.example")
	t.Logf("a.example held: %+v; b.example %v, %.0f ticks' worth of the CPU in %v; rate shares seen: %v", a, bCodes(), busyTicks, time.Since(start), shares)
	require.GreaterOrEqual(t, busyTicks, float64(time.Since(start)/(50*time.Millisecond)), "b.example did not keep the modelled CPU busy: the test shows nothing")
	require.Equal(t, 8, a.InFlight, "a.example no longer held by its origin")
	require.Empty(t, shares, "a rate share beside a host held by its origin")
	require.Equal(t, []int{200}, slices.Sorted(maps.Keys(bCodes())), "b.example with no other host able to use the CPU")

	// c.example joins: it could use the CPU.
	cClient := hostClient(1)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	joined, share := time.Now(), 0.0
	for share == 0 && time.Since(joined) < 10*time.Second {
		<-tick.C
		require.Equal(t, 200, hostGet(cClient, r.Addr(), "c.example", "/item"), "c.example")
		share = rateShare()
	}
	t.Logf("c.example joined: a rate share of %.0f/s after %v", share, time.Since(joined))
	require.Positive(t, share, "no rate share with a host that could use the CPU beside b.example")
}
