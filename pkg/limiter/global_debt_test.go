package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/pkg/limit"
)

// The debt tests walk one fake clock shared by both regions' stores and
// edges, and sweep by hand: every background call is waited for (g.bg)
// before the next step, so each figure below is exact.

// linkStore is the home region's store as the away region reaches it:
// the link can refuse (a partition) or hold each lease call until the
// test releases it (a call in flight).
type linkStore struct {
	Store
	refuse  atomic.Bool
	hold    atomic.Bool
	arrived chan struct{} // a held call arrived
	release chan struct{} // lets a held call through
}

var errRefused = errors.New("connection refused")

func (s *linkStore) Take(ctx context.Context, reqs []Request) ([]Decision, error) {
	if s.hold.Load() {
		s.arrived <- struct{}{}
		<-s.release
	}
	if s.refuse.Load() {
		return make([]Decision, len(reqs)), errRefused
	}
	return s.Store.Take(ctx, reqs)
}

func (s *linkStore) Probe(ctx context.Context, l Limit) error {
	if s.refuse.Load() {
		return errRefused
	}
	return s.Store.Probe(ctx, l)
}

// debtRig is one edge per region of a two-region deployment: home's
// store is the key's home, away's edge reaches it over link.
type debtRig struct {
	clock      *fakeClock
	link       *linkStore
	home, away *Limiter
	g          *Global // away's
	checks     []Check
	quota      int64 // the carve quota L + ⌊L·t/2⌋
}

const (
	debtLimit = 3000
	debtTol   = 0.05
)

func newDebtRig(t *testing.T) *debtRig { return newSkewedDebtRig(t, 0) }

// newSkewedDebtRig is newDebtRig with the home region's clock ahead of
// the away region's by ahead (its Redis TIME; to the away edge, the same
// as a lease call's one-way delay).
func newSkewedDebtRig(t *testing.T, ahead time.Duration) *debtRig {
	// 1,800,000,000,000 ms is a minute boundary: the clock starts at the
	// start of a 60 s window.
	clock := &fakeClock{t: time.UnixMilli(1_800_000_000_000)}
	homeNow := func() time.Time { return clock.now().Add(ahead) }
	homeStore, awayStore := NewMemoryStore(WithClock(homeNow)), NewMemoryStore(WithClock(clock.now))
	link := &linkStore{Store: homeStore, arrived: make(chan struct{}), release: make(chan struct{})}
	names := []string{"eu-west", "us-east"}
	edge := func(local Store, region string, others map[string]Store) (*Limiter, *Global) {
		now := clock.now
		if region == "eu-west" {
			now = homeNow
		}
		reg := prometheus.NewRegistry()
		l, err := New(local, Config{Timeout: time.Second}, reg, nil)
		require.NoError(t, err)
		l.now = now
		l.fallback = NewMemoryStore(WithClock(now))
		noSweep(l)
		g, err := NewGlobal(GlobalConfig{Timeout: time.Second}, reg, nil)
		require.NoError(t, err)
		g.now = now
		g.start.Do(func() {}) // no sweep of its own: the test sweeps
		require.NoError(t, g.Update(Regions{Local: region, Names: names, Stores: others}))
		for _, h := range g.state.Load().homes {
			h.lim.now = now
		}
		l.SetGlobal(g)
		t.Cleanup(l.Close)
		t.Cleanup(g.Close)
		return l, g
	}
	var key string
	for i := range 1000 {
		if k := fmt.Sprintf("debt-%d", i); Home(names, k) == "eu-west" {
			key = k
			break
		}
	}
	home, _ := edge(homeStore, "eu-west", map[string]Store{"us-east": awayStore})
	away, g := edge(awayStore, "us-east", map[string]Store{"eu-west": link})
	l := Limit{Key: key, Algorithm: limit.FixedWindow, Limit: debtLimit, Window: time.Minute}
	return &debtRig{
		clock: clock, link: link, home: home, away: away, g: g,
		checks: []Check{{Limit: l, Cost: 1, Nodes: 1, Tolerance: debtTol, Global: true}},
		quota:  debtLimit + debtLimit*debtTol/2,
	}
}

// spend decides r's check on l until the first denial (at most 2 × the
// quota), waiting for the away edge's background calls after each
// decision, and returns how many were admitted.
func (r *debtRig) spend(t *testing.T, l *Limiter) int64 {
	var n int64
	for range 2 * r.quota {
		v, err := l.Decide(context.Background(), r.checks)
		require.NoError(t, err)
		r.g.bg.Wait()
		if !v.Allowed {
			return n
		}
		n++
	}
	t.Fatalf("never denied after %d", n)
	return n
}

// partition cuts the away edge off from the home and floods it: one unit
// on overdraft (its lease call fails), then the whole static share. It
// returns the debt made.
func (r *debtRig) partition(t *testing.T) int64 {
	r.link.refuse.Store(true)
	admitted := r.spend(t, r.away)
	require.Equal(t, []string{"eu-west"}, r.g.Unreachable())
	require.EqualValues(t, 1+debtLimit/2, admitted, "one on overdraft, then the share ⌊L/2⌋")
	return admitted
}

// heal lets the link carry again and probes the home as a sweep does
// (only that: the sweep's debts are each test's next step).
func (r *debtRig) heal(t *testing.T) {
	r.link.refuse.Store(false)
	r.g.probeDown(r.g.state.Load())
	r.g.bg.Wait()
	require.Empty(t, r.g.Unreachable())
}

func (r *debtRig) debt() float64 { return testutil.ToFloat64(r.g.m.debt.WithLabelValues("eu-west")) }
func (r *debtRig) settled() float64 {
	return testutil.ToFloat64(r.g.m.settled.WithLabelValues("eu-west"))
}

// held is what the away edge holds of the key, and the most one batch
// may be.
func (r *debtRig) held() (units, most int64) {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	for _, a := range r.g.table {
		a.mu.Lock()
		units, most = a.units, a.terms.most
		a.mu.Unlock()
	}
	return units, most
}

func (r *debtRig) carved() float64 {
	return testutil.ToFloat64(r.g.m.carved.WithLabelValues("eu-west"))
}

// TestGlobalDebtHealAfterWindow: the away region is cut off from the
// key's home halfway through a window and floods its share; the link
// heals ten seconds into the next window. What it owes belongs to the
// window that ended: the next window charges nothing for it, and the home
// region admits the full carve quota there.
func TestGlobalDebtHealAfterWindow(t *testing.T) {
	r := newDebtRig(t)
	r.clock.add(30 * time.Second)
	made := r.partition(t)
	require.Equal(t, r.quota, r.spend(t, r.home), "the home region spends the window's quota meanwhile")

	r.clock.add(40 * time.Second) // 10 s into the next window
	r.heal(t)
	r.g.Sweep(r.clock.now()) // would settle debts
	r.g.bg.Wait()
	r.g.Sweep(r.clock.now()) // gauges
	debt, settled, carved := r.debt(), r.settled(), r.carved()
	next := r.spend(t, r.home)
	t.Logf("debt made %d; after the heal in the next window: debt %.0f, settled %.0f, carved %.0f; the next window admitted %d at the home (carve quota %d)",
		made, debt, settled, carved, next, r.quota)
	require.Equal(t, r.quota, next, "the next window is charged for the ended window's debt")
	require.Zero(t, debt, "the ended window's debt is dropped")
	require.Zero(t, settled, "the next window paid the ended window's debt")
	require.Zero(t, carved, "a carve was sent for a debt whose window had ended")
}

// TestGlobalDebtHealRacesBoundary: the link heals 10 ms before the
// window's end, the sweep's carve carrying the debt is sent then, and is
// answered 10 ms into the next window. The home answers from the new
// window; the debt belongs to the old one, so the carve pays none of it
// and the new window's count keeps only the batch the edge holds: the
// window admits its whole carve quota over both edges.
func TestGlobalDebtHealRacesBoundary(t *testing.T) {
	r := newDebtRig(t)
	r.clock.add(30 * time.Second)
	made := r.partition(t)

	r.clock.add(30*time.Second - 10*time.Millisecond)
	r.heal(t)
	r.link.hold.Store(true)
	r.g.Sweep(r.clock.now()) // settles: a carve carrying the debt
	select {
	case <-r.link.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the sweep sent no carve for the debt")
	}
	r.clock.add(20 * time.Millisecond) // the window ends meanwhile
	r.link.hold.Store(false)
	r.link.release <- struct{}{}
	r.g.bg.Wait()
	r.g.Sweep(r.clock.now())
	debt, settled := r.debt(), r.settled()
	held, most := r.held()
	home := r.spend(t, r.home)
	away := r.spend(t, r.away)
	t.Logf("debt made %d; the carve answered in the next window: debt %.0f, settled %.0f, the away edge holds %d; the next window admitted %d (home %d, away %d; carve quota %d)",
		made, debt, settled, held, home+away, home, away, r.quota)
	require.Equal(t, r.quota, home+away, "the next window is charged for the ended window's debt")
	require.LessOrEqual(t, held, most, "the away edge kept what the carve took for the debt: it went back to the new window")
	require.Equal(t, r.quota-held, home, "the home found the new window short of more than the away edge holds")
	require.Zero(t, settled, "a carve answered in the next window paid the ended window's debt")
	require.Zero(t, debt)
}

// TestGlobalDebtHealWithinWindow: healed before the window ends, the sweep's
// carve pays the whole debt, once, into the window it was made in: the
// window's total over both regions is its carve quota, share included.
func TestGlobalDebtHealWithinWindow(t *testing.T) {
	r := newDebtRig(t)
	r.clock.add(30 * time.Second)
	made := r.partition(t)

	r.clock.add(10 * time.Second)
	r.heal(t)
	r.g.Sweep(r.clock.now()) // settles
	r.g.bg.Wait()
	r.g.Sweep(r.clock.now()) // gauges
	debt, settled := r.debt(), r.settled()
	home := r.spend(t, r.home)
	away := r.spend(t, r.away)
	t.Logf("debt made %d; healed within its window: debt %.0f, settled %.0f; the window admitted %d (away %d while cut off, then home %d, away %d; carve quota %d)",
		made, debt, settled, made+home+away, made, home, away, r.quota)
	require.EqualValues(t, made, settled, "the debt is paid once, in full")
	require.Zero(t, debt)
	require.Equal(t, r.quota, made+home+away, "the share's admissions count against the window they were made in")
}

// TestGlobalDebtHomeAheadAtBoundary: the home's window was exhausted when
// the link healed, so the debt waits; the home's clock runs 50 ms ahead of
// the away edge's (or, to the edge, the lease call's delay), so the home's
// "exhausted until" ends 50 ms before the edge's window does. The sweep in
// those 50 ms carves with the debt, and the home answers from its new
// window: the carve pays nothing, and the new window admits its whole
// carve quota.
func TestGlobalDebtHomeAheadAtBoundary(t *testing.T) {
	r := newSkewedDebtRig(t, 50*time.Millisecond)
	r.clock.add(30 * time.Second)
	made := r.partition(t)
	require.Equal(t, r.quota, r.spend(t, r.home), "the home region spends the window's quota meanwhile")

	r.clock.add(10 * time.Second)
	r.heal(t)
	r.g.Sweep(r.clock.now()) // the home is exhausted: nothing paid
	r.g.bg.Wait()
	require.Zero(t, r.settled())

	r.clock.add(20*time.Second - 20*time.Millisecond) // the home's window ended 30 ms ago, the edge's ends in 20
	r.g.Sweep(r.clock.now())
	r.g.bg.Wait()
	r.g.Sweep(r.clock.now())
	debt, settled := r.debt(), r.settled()
	held, most := r.held()
	r.clock.add(40 * time.Millisecond) // both in the next window
	home := r.spend(t, r.home)
	away := r.spend(t, r.away)
	t.Logf("debt made %d; carved at the home's new window: debt %.0f, settled %.0f, the away edge holds %d; the next window admitted %d (home %d, away %d; carve quota %d)",
		made, debt, settled, held, home+away, home, away, r.quota)
	require.Equal(t, r.quota, home+away, "the next window is charged for the ended window's debt")
	require.Zero(t, settled, "a carve answered from the next window paid the ended window's debt")
	require.LessOrEqual(t, held, most, "the away edge kept what the carve took for the debt")
}
