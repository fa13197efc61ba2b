package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// A global rule's partition debt belongs to the window it was made in
// (docs/guarantees.md, "Global rules"): these tests walk the window
// boundary on one fake clock, shared by both regions' stores and edges,
// with the home's store behind a link the test cuts, heals and holds.

const (
	debtHome  = "eu-west"
	debtAway  = "us-east"
	debtQuota = 1000
	debtTol   = 0.1
	// debtShare is the away region's static share, floor(quota / 2).
	debtShare = debtQuota / 2
)

// debtRig is one edge in each region and the home's store.
type debtRig struct {
	clock *fakeClock
	home  *MemoryStore   // the home region's store
	link  *countingStore // the home's store as the away edge reaches it
	away  *Limiter
	g     *Global // the away edge's
	near  *Limiter
	check []Check
	cut   func(bool)
}

func newDebtRig(t *testing.T) *debtRig {
	t.Helper()
	// A window starts at 1,800,000,000 s: the fake clock starts 20 s
	// into one.
	clock := &fakeClock{t: time.UnixMilli(1_800_000_000_000).Add(20 * time.Second)}
	home := NewMemoryStore(WithClock(clock.now))
	link := &countingStore{Store: home}
	names := []string{debtHome, debtAway}
	edge := func(local string, st Store, other map[string]Store) (*Limiter, *Global) {
		l, err := New(st, Config{Timeout: time.Second}, prometheus.NewRegistry(), nil)
		require.NoError(t, err)
		l.now = clock.now
		l.fallback = NewMemoryStore(WithClock(clock.now))
		noSweep(l)
		g, err := NewGlobal(GlobalConfig{}, prometheus.NewRegistry(), nil)
		require.NoError(t, err)
		g.now = clock.now
		g.start.Do(func() {}) // the test sweeps
		require.NoError(t, g.Update(Regions{Local: local, Names: names, Stores: other}))
		l.SetGlobal(g)
		t.Cleanup(l.Close)
		t.Cleanup(g.Close)
		return l, g
	}
	awayStore := NewMemoryStore(WithClock(clock.now))
	away, g := edge(debtAway, awayStore, map[string]Store{debtHome: link})
	near, _ := edge(debtHome, home, map[string]Store{debtAway: awayStore})
	var key string
	for i := range 100 {
		if k := fmt.Sprintf("debt-%d", i); Home(names, k) == debtHome {
			key = k
			break
		}
	}
	require.NotEmpty(t, key)
	l := Limit{Key: key, Algorithm: limit.FixedWindow, Limit: debtQuota, Window: time.Minute}
	return &debtRig{
		clock: clock, home: home, link: link, away: away, g: g, near: near,
		check: []Check{{Limit: l, Cost: 1, Nodes: 1, Tolerance: debtTol, Global: true}},
		cut:   func(down bool) { link.fail.Store(down) },
	}
}

// sweep runs one round of the away edge's background work and waits for
// the calls it started.
func (r *debtRig) sweep() {
	r.g.Sweep(r.clock.now())
	r.g.bg.Wait()
}

// partition cuts the home off and floods the away edge: its first
// request is admitted on overdraft (the edge learns of the cut from the
// carve it starts), the rest from the share. It returns the debt.
func (r *debtRig) partition(t *testing.T) int64 {
	t.Helper()
	r.cut(true)
	var admitted int64
	for i := range debtShare + 100 {
		v, err := r.away.Decide(context.Background(), r.check)
		require.NoError(t, err)
		if v.Allowed {
			admitted++
		}
		if i == 0 {
			r.g.bg.Wait() // the failed carve: the home is down
			require.Equal(t, []string{debtHome}, r.g.Unreachable())
		}
	}
	require.EqualValues(t, 1+debtShare, admitted, "one on overdraft, then the share")
	require.EqualValues(t, admitted, r.debt())
	return admitted
}

// heal lets the home answer again and sweeps until the away edge knows.
func (r *debtRig) heal(t *testing.T) {
	t.Helper()
	r.cut(false)
	r.g.probeDown(r.g.state.Load())
	r.g.bg.Wait()
	require.Empty(t, r.g.Unreachable())
}

func (r *debtRig) debt() int64 { return r.sum(func(a *away) int64 { return a.debt }) }

// units is what the away edge holds, unspent.
func (r *debtRig) units() int64 { return r.sum(func(a *away) int64 { return a.units }) }

// sum adds field over the away edge's allowances, each read under its lock.
func (r *debtRig) sum(field func(*away) int64) int64 {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	var n int64
	for _, a := range r.g.table {
		a.mu.Lock()
		n += field(a)
		a.mu.Unlock()
	}
	return n
}

func (r *debtRig) settled(t *testing.T) int64 {
	var m dto.Metric
	require.NoError(t, r.g.m.settled.WithLabelValues(debtHome).Write(&m))
	return int64(m.GetCounter().GetValue())
}

// used is what the home counted of the key's carving limit in the window
// at the clock's time.
func (r *debtRig) used(t *testing.T) int64 {
	c := carving(r.check[0], 2)
	cl := carveLimit(c)
	ds, err := r.home.Take(context.Background(), []Request{{Limit: cl, Cost: 1, Peek: true}})
	require.NoError(t, err)
	return cl.Limit - ds[0].Remaining
}

// nextWindowAdmits floods the home region's edge until it denies and
// returns what it admitted: the window's quota, less only what the away
// edge holds of it.
func (r *debtRig) nextWindowAdmits(t *testing.T) int64 {
	var n int64
	for range 2 * debtQuota {
		v, err := r.near.Decide(context.Background(), r.check)
		require.NoError(t, err)
		if !v.Allowed {
			break
		}
		n++
	}
	return n
}

// TestGlobalDebtHealAfterItsWindow: the away region admits its share
// while cut off; the link heals only after that window ended. The debt is
// dropped, not charged to the window the heal lands in: that window admits
// its full quota.
func TestGlobalDebtHealAfterItsWindow(t *testing.T) {
	r := newDebtRig(t)
	debt := r.partition(t)
	// 45 s later: 5 s into the next window, and less than a window
	// after the first request admitted on overdraft.
	r.clock.add(45 * time.Second)
	r.heal(t)
	r.sweep() // settles what is still owed
	r.sweep()
	left, settled, used := r.debt(), r.settled(t), r.used(t)
	admitted := r.nextWindowAdmits(t)
	t.Logf("debt %d, settled %d, left %d; the next window: %d counted at the home after the heal, then admitted %d (quota %d)",
		debt, settled, left, used, admitted, debtQuota)
	require.GreaterOrEqual(t, admitted, int64(debtQuota), "the next window paid the old one's debt")
	require.Zero(t, settled, "debt of an ended window charged to the next")
	require.Zero(t, left, "the debt outlived its window")
	require.LessOrEqual(t, used, int64(25), "the next window holds more than the away edge's allowance")
}

// TestGlobalDebtHealRacesTheBoundary: the link heals in the last second of
// the window in which the debt was made, and the carve that settles it is
// held on the link while the clock moves on. Landing within that window it
// charges the debt there, once; landing after it, it takes nothing and the
// debt is dropped. Either way the next window admits its full quota.
func TestGlobalDebtHealRacesTheBoundary(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration // on the link, before the settling carve runs
		inW   bool          // it runs within the debt's window
	}{
		{"lands in its window", 500 * time.Millisecond, true},
		{"lands on the boundary", 1000 * time.Millisecond, false},
		{"lands after its window", 1500 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newDebtRig(t)
			r.clock.add(39 * time.Second) // 59 s into the window
			debt := r.partition(t)
			r.heal(t)
			gate := make(chan struct{})
			r.link.gate = gate
			r.g.Sweep(r.clock.now()) // starts the settling carve, held on the link
			r.clock.add(tc.delay)
			gate <- struct{}{}
			r.g.bg.Wait()
			r.link.gate = nil
			left, settled, used := r.debt(), r.settled(t), r.used(t)
			r.sweep()
			r.clock.add(2 * time.Second) // the next window in every case
			next := r.used(t)
			admitted := r.nextWindowAdmits(t)
			t.Logf("debt %d, settled %d, left %d; counted at the home when the carve landed %d, in the next window %d, which then admitted %d (quota %d)",
				debt, settled, left, used, next, admitted, debtQuota)
			require.GreaterOrEqual(t, admitted, int64(debtQuota), "the next window paid the old one's debt")
			require.Zero(t, left, "the debt is settled or dropped")
			require.Zero(t, r.debt(), "the debt is settled or dropped")
			if tc.inW {
				require.Equal(t, debt, settled, "charged to its window, once")
				require.GreaterOrEqual(t, used, debt, "the debt's window does not hold it")
			} else {
				require.Zero(t, settled, "debt charged after its window ended")
			}
		})
	}
}

// TestTakeUntilOnRedis: a take bound to a window (Request.until) runs in
// Redis only before that window ends on Redis's clock. Past it, it takes
// nothing and says so (errWindowEnded), beside a take of the same call
// that runs, and the limiter does not count the refusal as the store
// failing.
func TestTakeUntilOnRedis(t *testing.T) {
	st := standaloneStore(t)
	l, err := New(st, Config{Timeout: 5 * time.Second}, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	// Redis runs on this machine's clock. A window of 366 days: its end
	// is not crossed while the test runs.
	k := lim("until", limit.FixedWindow, 100, limit.FixedWindow.Spec().MaxWindow)
	end := windowEnd(time.Now(), k.Window)
	reqs := []Request{
		{Limit: k, Cost: 5, Need: 1, until: end.Add(-k.Window)}, // the window before: over
		{Limit: k, Cost: 1},
	}
	ds, errs := l.call(context.Background(), reqs, []string{memKey(k), memKey(k)}, time.Now(), nil)
	require.ErrorIs(t, errs[0], errWindowEnded)
	require.Zero(t, ds[0].Admitted)
	require.NoError(t, errs[1])
	require.EqualValues(t, 1, ds[1].Admitted)
	require.EqualValues(t, 99, ds[1].Remaining, "the refused take counted")
	require.False(t, l.health.failing.Load(), "a take refused past its window counted as the store failing")

	ds, errs = l.call(context.Background(), []Request{{Limit: k, Cost: 5, Need: 1, until: end}}, []string{memKey(k)}, time.Now(), nil)
	require.NoError(t, errs[0])
	require.EqualValues(t, 5, ds[0].Admitted, "a take bound to the window it runs in")
	require.EqualValues(t, 94, ds[0].Remaining)
}

// TestGlobalDebtMadeDuringACarve: a key's first request starts a carve
// and is admitted on overdraft, a debt the carve was not sent with. The
// carve's units pay it when they were carved in the debt's window, and
// only then: landing in the next window, they are all the edge's to
// spend, and the debt is dropped with its window.
func TestGlobalDebtMadeDuringACarve(t *testing.T) {
	for _, tc := range []struct {
		name    string
		delay   time.Duration
		settled int64
	}{
		{"lands in its window", 500 * time.Millisecond, 1},
		{"lands after its window", 1500 * time.Millisecond, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newDebtRig(t)
			r.clock.add(39 * time.Second) // 59 s into the window
			gate := make(chan struct{})
			r.link.gate = gate
			v, err := r.away.Decide(context.Background(), r.check)
			require.NoError(t, err)
			require.True(t, v.Allowed)
			require.EqualValues(t, 1, r.debt(), "admitted on overdraft")
			r.clock.add(tc.delay)
			gate <- struct{}{}
			r.g.bg.Wait()
			r.link.gate = nil
			settled, used := r.settled(t), r.used(t)
			units := r.units()
			r.sweep()
			t.Logf("settled %d, units held %d, counted at the home %d, debt after a sweep %d", settled, units, used, r.debt())
			require.Equal(t, tc.settled, settled)
			require.Equal(t, used, units+settled, "the home counted other than the units held and the debt paid")
			require.Zero(t, r.debt())
		})
	}
}

// gauge reads one of the away edge's gauges for the home.
func (r *debtRig) gauge(t *testing.T, g *prometheus.GaugeVec) int64 {
	var m dto.Metric
	require.NoError(t, g.WithLabelValues(debtHome).Write(&m))
	return int64(m.GetGauge().GetValue())
}

// unpayable asserts that the away edge's debt is want, all of it shown on
// an exhausted home and none settled, and that both gauges are 0 once the
// next window starts (the rig starts 20 s into a window of a minute).
func (r *debtRig) unpayable(t *testing.T, want int64) {
	t.Helper()
	debt, exhausted := r.gauge(t, r.g.m.debt), r.gauge(t, r.g.m.debtExhausted)
	t.Logf("debt %d, on an exhausted home %d, settled %d", debt, exhausted, r.settled(t))
	require.Zero(t, r.settled(t))
	require.Equal(t, want, debt)
	require.Equal(t, want, exhausted, "the debt no lease can pay")
	r.clock.add(41 * time.Second) // 1 s into the next window
	r.sweep()
	require.Zero(t, r.gauge(t, r.g.m.debt), "the debt outlived its window")
	require.Zero(t, r.gauge(t, r.g.m.debtExhausted))
}

// TestGlobalDebtOnExhaustedHome: debt the home cannot be asked to pay
// shows as such. Admitted on overdraft while the carve it started was out,
// it meets a home whose window has nothing left: no carve is asked before
// that window ends, and the debt ends with it. So does a share's debt
// that the heal finds the home cannot take, its window exhausted by the
// home region meanwhile. Beside them, a debt made while the home is cut
// off is still to be paid, and is paid at the heal.
func TestGlobalDebtOnExhaustedHome(t *testing.T) {
	t.Run("exhausted", func(t *testing.T) {
		r := newDebtRig(t)
		require.GreaterOrEqual(t, r.nextWindowAdmits(t), int64(debtQuota), "the home region takes the window's quota")
		gate := make(chan struct{})
		r.link.gate = gate
		for range 3 { // the first starts a carve, held; all on overdraft
			v, err := r.away.Decide(context.Background(), r.check)
			require.NoError(t, err)
			require.True(t, v.Allowed, "admitted on overdraft")
		}
		gate <- struct{}{} // the carve finds nothing left
		r.g.bg.Wait()
		r.link.gate = nil
		v, err := r.away.Decide(context.Background(), r.check)
		require.NoError(t, err)
		require.False(t, v.Allowed, "the home's window is exhausted")
		r.sweep()
		r.unpayable(t, 3)
	})
	t.Run("the share's debt at the heal", func(t *testing.T) {
		r := newDebtRig(t)
		debt := r.partition(t)
		require.GreaterOrEqual(t, r.nextWindowAdmits(t), int64(debtQuota), "the home region takes the window's quota meanwhile")
		r.heal(t)
		r.sweep() // the settling carve finds nothing left
		r.sweep()
		r.unpayable(t, debt)
	})
	t.Run("cut off", func(t *testing.T) {
		r := newDebtRig(t)
		debt := r.partition(t)
		r.sweep()
		require.Equal(t, debt, r.gauge(t, r.g.m.debt))
		require.Zero(t, r.gauge(t, r.g.m.debtExhausted), "a debt the heal pays")
		r.heal(t)
		r.sweep()
		r.sweep()
		require.Equal(t, debt, r.settled(t))
		require.Zero(t, r.gauge(t, r.g.m.debt))
	})
}
