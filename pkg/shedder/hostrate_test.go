package shedder

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func rateCfg(cpuBusy float64) HostShareConfig {
	return HostShareConfig{Enabled: true, TrackedHosts: 8, DefaultWeight: 1, QueueTimeout: 10 * time.Second, CPUBusy: cpuBusy}
}

// admitN admits and at once releases up to n requests of host (a fast
// origin: nothing stays in flight, so the shares of the workers never
// bind), and returns how many were admitted.
func admitN(h *HostShares, now time.Time, host string, tier Tier, n int) int {
	got := 0
	for range n {
		if l, ok := h.Acquire(now, host, tier); ok {
			got++
			l.Release()
		}
	}
	return got
}

// RateLevel is the rate shares' level: the requests a host of weight 1
// may have admitted per sampler tick, 0 while there are no rate shares.
func (h *HostShares) RateLevel() float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rateLevel
}

func (h *HostShares) rateCapOf(host string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.slots {
		if s := &h.slots[i]; s.used && string(s.name[:s.nameLen]) == host {
			return int(s.rateCap)
		}
	}
	return -1
}

// TestRateSharesHoldTheBusiestHost: a.example 1,000 requests a tick and
// b.example 100. A busy tick sets the budget at 90 % of the 1,100
// admitted, max-min fair: b.example asked for less than an even share and
// gets all it asks for; a.example gets the rest, 890, and its 891st
// request in the next tick is refused. Critical requests are never refused
// for it. While the CPU stays busy the budget shrinks from what the rate
// shares let in.
func TestRateSharesHoldTheBusiestHost(t *testing.T) {
	now := time.Unix(1000, 0)
	h := NewHostShares(512, rateCfg(0.9))
	require.Equal(t, 1000, admitN(h, now, "a", TierRead, 1000))
	require.Equal(t, 100, admitN(h, now, "b", TierRead, 100))
	h.ObserveBusy(0.95, 50*time.Millisecond)
	require.Equal(t, 890, h.rateCapOf("a"))
	require.Equal(t, 890, h.rateCapOf("b"), "one level for every host of one weight")
	require.Equal(t, 890, admitN(h, now, "a", TierRead, 1000), "a.example held to the rest of the budget")
	require.Equal(t, 100, admitN(h, now, "b", TierRead, 100), "b.example gets all it asks for")
	require.Equal(t, 5, admitN(h, now, "a", TierCritical, 5), "critical is never refused for a rate share")

	// a 895 (5 critical) and b 100 admitted; the level let in 890 + 100:
	// the budget is 90 % of that, 891, of which b.example asks for 100.
	h.ObserveBusy(0.95, 50*time.Millisecond)
	require.Equal(t, 891-100, h.rateCapOf("a"))
}

// TestRateSharesNeedABusyCPUAndTwoHosts: a CPU under cpu_busy, a lone
// host, or cpu_busy 0 sets no rate share.
func TestRateSharesNeedABusyCPUAndTwoHosts(t *testing.T) {
	now := time.Unix(1000, 0)
	for name, c := range map[string]struct {
		cpuBusy, busy float64
		hosts         []string
	}{
		"not busy":  {0.9, 0.89, []string{"a", "b"}},
		"lone host": {0.9, 1, []string{"a"}},
		"off":       {0, 1, []string{"a", "b"}},
	} {
		t.Run(name, func(t *testing.T) {
			h := NewHostShares(512, rateCfg(c.cpuBusy))
			for _, host := range c.hosts {
				admitN(h, now, host, TierRead, 100)
			}
			h.ObserveBusy(c.busy, 50*time.Millisecond)
			require.Zero(t, h.RateLevel())
			for _, host := range c.hosts {
				require.Zero(t, h.rateCapOf(host))
				require.Equal(t, 1000, admitN(h, now, host, TierRead, 1000))
			}
		})
	}
}

// TestRateSharesGrowAndEnd: once the CPU is under cpu_busy the level grows
// by rateGrow (11 %) a tick while the hosts still ask for more than it (the requests
// refused for it count as asked for), and the rate shares end once it is
// twice what the busiest host asks for, or at once when one host is left
// (no other has sent a request for 2 s).
func TestRateSharesGrowAndEnd(t *testing.T) {
	now := time.Unix(1000, 0)
	h := twoHostsHeld(t, now)
	level := h.RateLevel()
	for tick := range 3 {
		askTwiceTheCap(t, h, now, tick)
		h.ObserveBusy(0, 50*time.Millisecond)
		require.InDelta(t, level*rateGrow, h.RateLevel(), 1e-6, "tick %d", tick)
		level = h.RateLevel()
	}
	// The hosts ask for less than half the level: no rate share.
	admitN(h, now, "a", TierRead, int(level/2)-1)
	admitN(h, now, "b", TierRead, 10)
	h.ObserveBusy(0, 50*time.Millisecond)
	require.Zero(t, h.RateLevel())
	require.Zero(t, h.rateCapOf("a"))

	admitN(h, now, "a", TierRead, 1000)
	admitN(h, now, "b", TierRead, 1000)
	h.ObserveBusy(1, 50*time.Millisecond)
	require.Positive(t, h.RateLevel())
	later := now.Add(hostIdleAfter + recountEvery)
	admitN(h, later, "a", TierRead, 1000)
	h.ObserveBusy(1, 50*time.Millisecond)
	require.Zero(t, h.RateLevel(), "a lone host has no rate share")
}

// TestRateSharesLastBetweenARareHostsRequests: a.example floods every
// tick, b.example sends one request every 4 ticks (5 a second). The rate
// shares hold a.example in the ticks where b.example asks nothing too (it
// is still active: a request in the last 2 s), so b.example's next request
// does not find the CPU taken by a flood let loose in the tick before. Once
// b.example has sent nothing for 2 s, a.example is alone and they end.
func TestRateSharesLastBetweenARareHostsRequests(t *testing.T) {
	start := time.Unix(1000, 0)
	const tick = 50 * time.Millisecond
	h := NewHostShares(512, rateCfg(0.9))
	at := func(i int) time.Time { return start.Add(time.Duration(i) * tick) }
	admitN(h, at(0), "a", TierRead, 1000)
	require.Equal(t, 1, admitN(h, at(0), "b", TierRead, 1))
	h.ObserveBusy(1, tick)
	for i := 1; i <= 12; i++ {
		require.Positive(t, h.RateLevel(), "tick %d: b.example asked last at tick %d", i, i/4*4)
		cap := h.rateCapOf("a")
		require.Positive(t, cap, "tick %d", i)
		require.Equal(t, cap, admitN(h, at(i), "a", TierRead, 1000), "tick %d: a.example held to its rate share", i)
		if i%4 == 0 {
			require.Equal(t, 1, admitN(h, at(i), "b", TierRead, 1), "tick %d", i)
		}
		h.ObserveBusy(1, tick)
	}
	// b.example's last request was at tick 12: 2 s later a.example is alone.
	quiet := at(12).Add(hostIdleAfter + recountEvery)
	admitN(h, quiet, "a", TierRead, 1000)
	h.ObserveBusy(1, tick)
	require.Zero(t, h.RateLevel(), "b.example silent for 2 s: a lone host")
	require.Equal(t, 1000, admitN(h, quiet, "a", TierRead, 1000))
}

// TestRateSharesWakeWaiters: a request over its host's rate share waits in
// its host's queue, holding nothing, and the next tick's budget admits it.
func TestRateSharesWakeWaiters(t *testing.T) {
	now := time.Unix(1000, 0)
	h := NewHostShares(512, rateCfg(0.9))
	admitN(h, now, "a", TierRead, 100)
	admitN(h, now, "b", TierRead, 100)
	h.ObserveBusy(1, 50*time.Millisecond) // level 90
	require.Equal(t, 90, admitN(h, now, "a", TierRead, 90))
	res := wait(context.Background(), h, now, "a", nil)
	queuedReaches(t, h, 1)
	admitN(h, now, "b", TierRead, 10)
	h.ObserveBusy(0, 50*time.Millisecond) // a new tick: a's budget opens again
	r := <-res
	require.NoError(t, r.err)
	r.lease.Release()
	require.EqualValues(t, 1, h.waits[waitAdmitted].Load())
}

// slowOriginTable is a table where a is at its share of the workers (2)
// with 10 requests waiting for a place in it, as behind a slow origin, and
// b holds 1. The waiters are still waiting when the test ends.
func slowOriginTable(t *testing.T, now time.Time) *HostShares {
	t.Helper()
	h, _ := full(t, rateCfg(0.9), now)
	ctx, cancel := context.WithCancel(context.Background())
	var waiters []<-chan waitResult
	for range 10 {
		waiters = append(waiters, wait(ctx, h, now, "a", nil))
	}
	t.Cleanup(func() {
		cancel()
		for _, w := range waiters {
			require.Error(t, (<-w).err, "still waiting for a's share of the workers")
		}
	})
	queuedReaches(t, h, 10)
	return h
}

// TestRateSharesCountWaitersOnlyForRate: a host whose requests wait for a
// place in its share of the workers (a slow origin) asks for no more rate
// for them: its waiters do not lower the other hosts' rate share.
func TestRateSharesCountWaitersOnlyForRate(t *testing.T) {
	now := time.Unix(1000, 0)
	h := slowOriginTable(t, now)
	require.Equal(t, 100, admitN(h, now, "b", TierRead, 100))
	// c, asking little and held by nothing, is the host the rate shares
	// keep the CPU for (a, held by its share of the workers, is not:
	// TestRateSharesLeaveAHostHeldByItsOriginOut).
	require.Equal(t, 5, admitN(h, now, "c", TierRead, 5))
	h.ObserveBusy(1, 50*time.Millisecond)
	// Admitted: a 2, b 101, c 5; the budget, 90 % of 108, is 97.2: a asks
	// for 2 (its 10 waiters would make it 12, and b 90), c for 5, b gets
	// the rest, 90.2.
	require.Equal(t, 91, h.rateCapOf("b"))
}

// TestRateSharesLeaveAHostHeldByItsOriginOut: a is at its share of the
// workers with requests waiting for a place in it (its origin is slow);
// b fills the CPU alone. Holding b to a rate share would give a nothing
// (its origin, not the CPU, holds it back) and leave the CPU idle: no rate
// share. Once c, held by nothing, is active too, b is held for it.
func TestRateSharesLeaveAHostHeldByItsOriginOut(t *testing.T) {
	now := time.Unix(1000, 0)
	h := slowOriginTable(t, now)
	for tick := range 3 {
		require.Equal(t, 100, admitN(h, now, "b", TierRead, 100), "tick %d", tick)
		h.ObserveBusy(1, 50*time.Millisecond)
		require.Zero(t, h.RateLevel(), "tick %d: b held back for a host waiting for its origin", tick)
		require.Zero(t, h.rateCapOf("b"), "tick %d", tick)
	}
	require.Equal(t, 100, admitN(h, now, "b", TierRead, 100))
	require.Equal(t, 5, admitN(h, now, "c", TierRead, 5))
	h.ObserveBusy(1, 50*time.Millisecond)
	require.Positive(t, h.rateCapOf("b"), "b held for c")
	require.Less(t, h.rateCapOf("b"), 100)
}

// TestWaterLevel: max-min fairness by weight.
func TestWaterLevel(t *testing.T) {
	ds := func(xs ...float64) []rateDemand {
		var out []rateDemand
		for i := 0; i < len(xs); i += 2 {
			out = append(out, rateDemand{d: xs[i], weight: xs[i+1]})
		}
		return out
	}
	require.InDelta(t, 890, waterLevel(ds(1000, 1, 100, 1), 990), 1e-9)
	require.InDelta(t, 450, waterLevel(ds(1000, 1, 1000, 1), 900), 1e-9)
	require.InDelta(t, 300, waterLevel(ds(1000, 1, 1000, 2), 900), 1e-9, "weight 2 gets 600")
	require.InDelta(t, 1000, waterLevel(ds(1000, 1, 100, 1), 5000), 1e-9, "every demand fits")
}

func TestHostShareCPUBusyConfig(t *testing.T) {
	require.InDelta(t, DefaultHostCPUBusy, DefaultConfig().HostShare.CPUBusy, 0)
	for _, ok := range []float64{0, 0.5, 0.9, 1} {
		cfg := DefaultConfig()
		cfg.HostShare.CPUBusy = ok
		require.NoError(t, cfg.Validate(), ok)
	}
	for _, bad := range []float64{-0.1, 0.49, 1.01} {
		cfg := DefaultConfig()
		cfg.HostShare.CPUBusy = bad
		require.ErrorContains(t, cfg.Validate(), "host_share.cpu_busy", bad)
	}
	cfg, err := ApplySettings(DefaultConfig(), map[string]string{"host_share.cpu_busy": "0.9"})
	require.NoError(t, err)
	require.InDelta(t, 0.9, cfg.HostShare.CPUBusy, 0)
	out, err := json.Marshal(DefaultConfig())
	require.NoError(t, err)
	require.NotContains(t, string(out), "cpu_busy", "the default is left out: an older edge takes the document")
	off := DefaultConfig()
	off.HostShare.CPUBusy = 0
	out, err = json.Marshal(off)
	require.NoError(t, err)
	require.Contains(t, string(out), `"cpu_busy":0`, "off is written: read back, it must not turn into the default")
	back, err := ParseConfig(out)
	require.NoError(t, err)
	require.Zero(t, back.HostShare.CPUBusy)
	require.NoError(t, json.Unmarshal([]byte(`{"host_share":{"enabled":true,"tracked_hosts":64,"cpu_busy":0.9}}`), &back))
	require.InDelta(t, 0.9, back.HostShare.CPUBusy, 0)
}

// TestRateSharesHoldTheCPUAtCPUBusy: two hosts that always ask for more
// than their rate share, on a CPU read busy and quiet in turn (a core kept
// at cpu_busy, read over short ticks): one quiet tick undoes a busy tick's
// shrink, so after 100 ticks the level is where it started. With a growth
// smaller than the shrink undoes, each busy-and-quiet pair would take a
// share off the level, and the hosts would be held ever further under what
// the CPU can carry (a host filling the core alone beside a host held by
// its slow origin was cut to 58 % of its rate).
func TestRateSharesHoldTheCPUAtCPUBusy(t *testing.T) {
	now := time.Unix(1000, 0)
	h := twoHostsHeld(t, now)
	start := h.RateLevel()
	for tick := range 100 {
		askTwiceTheCap(t, h, now, tick)
		busy := 0.95
		if tick%2 == 0 {
			busy = 0.85
		}
		h.ObserveBusy(busy, 50*time.Millisecond)
	}
	// Each cap is the level rounded up, so a busy tick shrinks what the
	// caps let in, a little more than the level: within a request a tick.
	require.InDelta(t, start, h.RateLevel(), 50, "the level after 50 busy and 50 quiet ticks, from %v", start)
}

// twoHostsHeld is a table where hosts a and b each had 1,000 requests
// admitted in a busy tick: the level is 900 (90 % of 2,000, halved).
func twoHostsHeld(t *testing.T, now time.Time) *HostShares {
	t.Helper()
	h := NewHostShares(512, rateCfg(0.9))
	admitN(h, now, "a", TierRead, 1000)
	admitN(h, now, "b", TierRead, 1000)
	h.ObserveBusy(1, 50*time.Millisecond)
	require.InDelta(t, 900, h.RateLevel(), 1e-9)
	return h
}

// askTwiceTheCap has a and b each ask for twice their rate share in this
// tick, and checks each is admitted exactly its share.
func askTwiceTheCap(t *testing.T, h *HostShares, now time.Time, tick int) {
	t.Helper()
	cap := h.rateCapOf("a")
	require.Equal(t, cap, admitN(h, now, "a", TierRead, 2*cap), "tick %d", tick)
	require.Equal(t, cap, admitN(h, now, "b", TierRead, 2*cap), "tick %d", tick)
}
