package shedder

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func hostCfg(tracked int) HostShareConfig {
	return HostShareConfig{Enabled: true, TrackedHosts: tracked}
}

// take acquires n leases for host and returns how many were admitted.
func take(h *HostShares, now time.Time, host string, tier Tier, n int) (admitted []HostLease) {
	for range n {
		if l, ok := h.Acquire(now, host, tier); ok {
			admitted = append(admitted, l)
		}
	}
	return admitted
}

func TestHostSharesLoneHostGetsEverything(t *testing.T) {
	// A single-host deployment behaves as before: the host may hold every
	// worker and more (the worker queue, not the share, bounds the rest).
	h := NewHostShares(8, hostCfg(4))
	now := time.Unix(1000, 0)
	got := take(h, now, "a.example", TierRead, 20)
	require.Len(t, got, 20)
}

func TestHostSharesHoldsTheOverloadingHost(t *testing.T) {
	h := NewHostShares(8, hostCfg(4))
	now := time.Unix(1000, 0)
	// a.example alone takes every worker (a lone host may).
	a := take(h, now, "a.example", TierRead, 8)
	require.Len(t, a, 8)
	// b.example arrives: two hosts active, share 4. b is within its share,
	// and a, over its own with no idle share left, is refused.
	b, ok := h.Acquire(now, "b.example", TierRead)
	require.True(t, ok)
	_, ok = h.Acquire(now, "a.example", TierRead)
	require.False(t, ok, "a is over its share of 4")
	_, ok = h.Acquire(now, "a.example", TierWrite)
	require.False(t, ok)
	// Critical is never refused for its host's share.
	c, ok := h.Acquire(now, "a.example", TierCritical)
	require.True(t, ok)
	c.Release()
	// b is within its share while a is held to its own: exempt from the ramp.
	b2, ok := h.Acquire(now, "b.example", TierRead)
	require.True(t, ok)
	require.True(t, b2.Exempt())

	// a drains to below its share: it is admitted again, and b still is.
	for _, l := range a[:5] {
		l.Release()
	}
	_, ok = h.Acquire(now, "a.example", TierRead)
	require.True(t, ok, "a holds 3 of its share of 4")
	b.Release()
	b2.Release()

	// Once b has been idle for longer than the idle window, a is alone
	// again and may take every worker.
	later := now.Add(hostIdleAfter + recountEvery)
	require.Len(t, take(h, later, "a.example", TierRead, 4), 4)
}

func TestHostSharesBorrowsIdleWorkers(t *testing.T) {
	// Four hosts active, share 4 of 16: a host over its share may still
	// take a worker while more than a share's worth is idle.
	h := NewHostShares(16, hostCfg(8))
	now := time.Unix(1000, 0)
	for _, host := range []string{"b", "c", "d"} {
		take(h, now, host, TierRead, 1)
	}
	a := take(h, now, "a", TierRead, 16)
	// 3 held by b, c, d; a may go on while idle > 4: up to 16-3-4 = 9.
	require.Len(t, a, 9)
}

func TestHostSharesBoundedTable(t *testing.T) {
	// 100,000 hosts through a table of 16: the table never grows, a host
	// whose requests have all ended gives its slot up, and with every slot
	// busy the rest are counted in the pool.
	h := NewHostShares(1_000_000, hostCfg(16))
	now := time.Unix(1000, 0)
	var held []HostLease
	for i := range 100_000 {
		l, ok := h.Acquire(now, "h"+strconv.Itoa(i)+".example", TierRead)
		require.True(t, ok)
		if i < 16 {
			held = append(held, l) // keeps slots busy
			continue
		}
		l.Release()
	}
	require.Len(t, h.slots, 16)
	require.Len(t, h.index, 64)
	entries := 0
	for _, e := range h.index {
		if e != 0 {
			entries++
		}
	}
	require.Equal(t, 16, entries)
	for i := range h.slots {
		s := &h.slots[i]
		require.Equal(t, int32(i), h.lookupLocked(0, string(s.name[:s.nameLen]), s.hash), "every tracked host is found in the index")
	}
	top, _, _ := h.Top()
	require.Len(t, top, 17, "16 tracked hosts with one in flight each, and the pool")
	require.Equal(t, HostInFlight{Host: OtherHost, InFlight: 0}, top[16])
	l, _ := h.Acquire(now, "late.example", TierRead)
	top, _, _ = h.Top()
	require.Equal(t, 1, top[len(top)-1].InFlight, "with every slot busy a new host is pooled")
	l.Release()
	for _, l := range held {
		l.Release()
	}
	require.Zero(t, h.inflight)
}

func TestHostSharesHostileNames(t *testing.T) {
	h := NewHostShares(4, hostCfg(4))
	now := time.Unix(1000, 0)
	long := string(make([]byte, maxHostLen+1))
	for _, host := range []string{long, "\xff\xfe", "_other", ""} {
		_, ok := h.Acquire(now, host, TierRead)
		require.True(t, ok, "%q", host)
	}
	reg := prometheus.NewRegistry()
	s, err := New(DefaultConfig(), reg)
	require.NoError(t, err)
	s.AttachWorkers(NewWorkers(4, 0, 0))
	for _, host := range []string{long, "\xff\xfe", "_other", "a.example"} {
		_, ok := s.AcquireHost(now, host, netip.Addr{}, TierRead)
		require.True(t, ok)
	}
	// Invalid UTF-8 and a host spelled like the pool count with the pool;
	// the overlong one was pooled on arrival.
	require.Equal(t, 1.0, testutil.ToFloat64(hostGauge(t, reg, "a.example")))
	require.Equal(t, 3.0, testutil.ToFloat64(hostGauge(t, reg, OtherHost)))
}

// A request named OtherHost (the edge's name for the hosts its host table
// does not list) is counted with the pooled rest: it takes no slot, and
// those requests and the pooled hosts' share the pool's one share.
func TestHostSharesOtherHostIsThePool(t *testing.T) {
	h := NewHostShares(8, hostCfg(4))
	now := time.Unix(1000, 0)
	held := take(h, now, "a.example", TierRead, 1)
	held = append(held, take(h, now, string(make([]byte, maxHostLen+1)), TierRead, 1)...) // pooled on arrival
	held = append(held, take(h, now, OtherHost, TierRead, 8)...)
	require.Len(t, held, 1+4, "a.example's one, and the pool's share of 4 (8 workers, 2 active)")
	top, active, share := h.Top()
	require.Equal(t, []HostInFlight{{Host: "a.example", InFlight: 1}, {Host: OtherHost, InFlight: 4}}, top)
	require.Equal(t, 2, active)
	require.Equal(t, 4, share)
	for _, l := range held {
		l.Release()
	}
	require.Zero(t, h.inflight)
}

// host_share.unlisted_hosts: "pooled" by default, "" read as it, "each"
// and nothing else; written only when "each", so a document at the default
// reads as before the setting existed; ShareName follows it, live.
func TestHostShareUnlistedHosts(t *testing.T) {
	def := DefaultConfig()
	require.Equal(t, UnlistedPooled, def.HostShare.UnlistedHosts)
	for _, ok := range []string{"", UnlistedPooled, UnlistedEach} {
		cfg := DefaultConfig()
		cfg.HostShare.UnlistedHosts = ok
		require.NoError(t, cfg.Validate(), ok)
	}
	for _, bad := range []string{"Each", "none", " pooled"} {
		cfg := DefaultConfig()
		cfg.HostShare.UnlistedHosts = bad
		require.ErrorContains(t, cfg.Validate(), "host_share.unlisted_hosts", bad)
	}
	out, err := json.Marshal(def)
	require.NoError(t, err)
	require.NotContains(t, string(out), "unlisted_hosts", "the default is left out: an older edge takes the document")
	each, err := ApplySettings(def, map[string]string{"host_share.unlisted_hosts": "each"})
	require.NoError(t, err)
	out, err = json.Marshal(each)
	require.NoError(t, err)
	require.Contains(t, string(out), `"unlisted_hosts":"each"`)
	back, err := ParseConfig(out)
	require.NoError(t, err)
	require.Equal(t, UnlistedEach, back.HostShare.UnlistedHosts)
	_, err = ApplySettings(def, map[string]string{"host_share.unlisted_hosts": "some"})
	require.ErrorContains(t, err, "host_share.unlisted_hosts")

	s, err := New(def, prometheus.NewRegistry())
	require.NoError(t, err)
	require.Equal(t, OtherHost, s.HostShareName("x.example", OtherHost), "pooled")
	require.Equal(t, "*.b.example", s.HostShareName("x.b.example", "*.b.example"), "a listed host's tenant")
	require.NoError(t, s.Update(each))
	require.Equal(t, "x.example", s.HostShareName("x.example", OtherHost), "each")
	require.Equal(t, "*.b.example", s.HostShareName("x.b.example", "*.b.example"), "a listed host's tenant, whatever unlisted_hosts says")
}

// hostGauge is edgeguard_shedder_host_in_flight{host} as scraped.
func hostGauge(t *testing.T, reg *prometheus.Registry, host string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != namespace+"host_in_flight" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == host {
				g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
				g.Set(m.GetGauge().GetValue())
				return g
			}
		}
	}
	t.Fatalf("no host_in_flight series for %q", host)
	return nil
}

func TestHostSharesDisabledAndUpdate(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HostShare.Enabled = false
	s, err := New(cfg, nil)
	require.NoError(t, err)
	s.AttachWorkers(NewWorkers(2, 0, 0))
	now := time.Unix(1000, 0)
	take(s.hosts, now, "a", TierRead, 2)
	take(s.hosts, now, "b", TierRead, 1)
	_, ok := s.AcquireHost(now, "a", netip.Addr{}, TierRead)
	require.True(t, ok, "off: no host is held to a share")

	cfg.HostShare.Enabled = true
	require.NoError(t, s.Update(cfg))
	take(s.hosts, now, "a", TierRead, 2)
	take(s.hosts, now, "b", TierRead, 1)
	_, ok = s.AcquireHost(now, "a", netip.Addr{}, TierRead)
	require.False(t, ok, "on: a is over its share of 1")

	// A resize moves what is in flight to the pool; leases taken before
	// it give back to the pool, not to whichever host now has their slot.
	before := take(s.hosts, now, "c", TierCritical, 2)
	cfg.HostShare.TrackedHosts = 2
	require.NoError(t, s.Update(cfg))
	after := take(s.hosts, now, "d", TierCritical, 1)
	for _, l := range before {
		l.Release()
	}
	top, _, _ := s.hosts.Top()
	require.Equal(t, []HostInFlight{{Host: "d", InFlight: 1}, {Host: OtherHost, InFlight: 3}}, top, "a 2 and b 1 pooled; c gave its 2 back")
	after[0].Release()

	cfg.HostShare.TrackedHosts = 0
	require.ErrorContains(t, s.Update(cfg), "host_share.tracked_hosts")
	cfg.HostShare.TrackedHosts = MaxTrackedHosts + 1
	require.ErrorContains(t, s.Update(cfg), "host_share.tracked_hosts")
	_, err = ParseConfig([]byte(`{"host_share": {"enabled": true, "tracked": 3}}`))
	require.ErrorContains(t, err, "tracked")
	got, err := ParseConfig([]byte(`{"host_share": {"tracked_hosts": 3}}`))
	require.NoError(t, err)
	require.Equal(t, HostShareConfig{Enabled: true, TrackedHosts: 3, DefaultWeight: 1, QueueTimeout: DefaultHostQueueTimeout, CPUBusy: DefaultHostCPUBusy, UnlistedHosts: UnlistedPooled}, got.HostShare)
	got, err = ApplySettings(DefaultConfig(), map[string]string{"host_share.enabled": "false", "host_share.tracked_hosts": "10"})
	require.NoError(t, err)
	require.Equal(t, HostShareConfig{Enabled: false, TrackedHosts: 10, DefaultWeight: 1, QueueTimeout: DefaultHostQueueTimeout, CPUBusy: DefaultHostCPUBusy, UnlistedHosts: UnlistedPooled}, got.HostShare)
}

// BenchmarkHostShares is the per-request cost of a host's share: it must
// not grow with the number of hosts (10 hosts all tracked; 100,000, each
// request's host taking a slot another host gave up). The name is built in
// one buffer, as the edge finds it in the request it has just read: a
// table of 100,000 names would measure the cache misses of the table.
//
// client=yes names the client too (AcquireFrom, as the edge does: 1,000
// addresses).
//
// wait=yes takes the place as the edge does, with AcquireWait: a request
// admitted at once must cost what AcquireFrom costs, with no allocation.
func BenchmarkHostShares(b *testing.B) {
	for _, wait := range []bool{false, true} {
		for _, client := range []bool{false, true} {
			for _, hosts := range []int{10, 100_000} {
				name := fmt.Sprintf("hosts=%d", hosts)
				if client {
					name += "/client=yes"
				}
				if wait {
					name += "/wait=yes"
				}
				b.Run(name, func(b *testing.B) {
					h := NewHostShares(128, DefaultHostShareConfig())
					buf := make([]byte, 0, 64)
					now := time.Unix(1000, 0)
					ctx := context.Background()
					gone := func() bool { return false }
					b.ReportAllocs()
					b.ResetTimer()
					for i := range b.N {
						buf = append(strconv.AppendInt(append(buf[:0], "host-"...), int64(i%hosts), 10), ".example.com"...)
						var addr netip.Addr
						if client {
							addr = netip.AddrFrom4([4]byte{192, 0, byte(i % 1000 >> 8), byte(i % 1000)})
						}
						host := unsafe.String(unsafe.SliceData(buf), len(buf))
						var l HostLease
						if wait {
							l, _ = h.AcquireWait(ctx, now, host, addr, TierRead, gone)
						} else {
							l, _ = h.AcquireFrom(now, host, addr, TierRead)
						}
						l.Release()
					}
				})
			}
		}
	}
}

// TestHostSharesIndexStaysConsistent churns tables of 8 slots with 12
// hosts whose requests start and end in a random order: after every step
// each tracked host is found at its own slot and no host has two, so
// removals from the index never hide the entries after them. Many small
// tables (each with its own hash seed), so runs of entries wrap around the
// index's end too.
func TestHostSharesIndexStaysConsistent(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	now := time.Unix(1000, 0)
	for table := range 100 {
		h := NewHostShares(1000, hostCfg(8))
		var held []HostLease
		for step := range 1000 {
			if len(held) > 0 && r.IntN(2) == 0 {
				k := r.IntN(len(held))
				held[k].Release()
				held = append(held[:k], held[k+1:]...)
			} else {
				l, ok := h.Acquire(now, "h"+strconv.Itoa(r.IntN(12)), TierRead)
				require.True(t, ok)
				held = append(held, l)
			}
			seen := map[string]bool{}
			for i := range h.slots {
				s := &h.slots[i]
				if !s.used {
					continue
				}
				name := string(s.name[:s.nameLen])
				require.False(t, seen[name], "table %d step %d: %s holds two slots", table, step, name)
				seen[name] = true
				require.Equal(t, int32(i), h.lookupLocked(now.UnixNano(), name, s.hash), "table %d step %d: %s not found at its slot", table, step, name)
			}
		}
	}
}

// TestHostSharesOfTheAdaptiveLimit: while the adaptive origin limit is
// enforced and smaller than the workers, the hosts share it; in shadow,
// they share the workers.
func TestHostSharesOfTheAdaptiveLimit(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Adaptive.Enabled = true
	cfg.Adaptive.InitialLimit = 4
	s, err := New(cfg, nil)
	require.NoError(t, err)
	s.AttachWorkers(NewWorkers(16, 0, 0))
	require.Equal(t, 4, s.Adaptive().EnforcedLimit())
	now := time.Unix(1000, 0)
	a := take(s.hosts, now, "a", TierRead, 4)
	require.Len(t, a, 4, "a lone host may use the whole limit")
	_, ok := s.AcquireHost(now, "b", netip.Addr{}, TierRead)
	require.True(t, ok)
	_, ok = s.AcquireHost(now, "a", netip.Addr{}, TierRead)
	require.False(t, ok, "a holds 4 of a limit of 4 shared by 2 hosts")
	_, active, share := s.hosts.Top()
	require.Equal(t, []int{2, 2}, []int{active, share})

	cfg.Adaptive.Enabled = false // shadow: learns, refuses nothing
	require.NoError(t, s.Update(cfg))
	require.Zero(t, s.Adaptive().EnforcedLimit())
	_, ok = s.AcquireHost(now, "a", netip.Addr{}, TierRead)
	require.True(t, ok, "a holds 4 of its share of 8 workers")
}

// takeFrom acquires n leases for host from client and returns the admitted.
func takeFrom(h *HostShares, now time.Time, host, client string, n int) (admitted []HostLease) {
	for range n {
		if l, ok := h.AcquireFrom(now, host, netip.MustParseAddr(client), TierRead); ok {
			admitted = append(admitted, l)
		}
	}
	return admitted
}

func TestHostSharesOneAddressCannotShutItsHostOut(t *testing.T) {
	// 8 workers; one address takes its host's whole share while the edge
	// has room (slow streams up to its per-address connection cap), then
	// another host becomes active: two hosts, a share of 4 each.
	h := NewHostShares(8, hostCfg(4))
	now := time.Unix(1000, 0)
	attacker := takeFrom(h, now, "shop.example", "192.0.2.66", 4)
	require.Len(t, attacker, 4)
	other := takeFrom(h, now, "other.example", "198.51.100.1", 2)
	require.Len(t, other, 2)
	// The edge has 2 workers idle, no more than a share: shop.example is
	// at its share. Its other clients are judged on the requests of
	// addresses holding less than half a share (2 of the attacker's 4), so
	// they get the rest of the share...
	legit := takeFrom(h, now, "shop.example", "203.0.113.7", 1)
	legit = append(legit, takeFrom(h, now, "shop.example", "203.0.113.8", 1)...)
	require.Len(t, legit, 2, "the host's other clients are admitted beside the heavy address")
	// ...and no more: the host's fair count is now its share.
	require.Empty(t, takeFrom(h, now, "shop.example", "203.0.113.9", 1))
	// The heavy address itself is judged on the host's whole count.
	require.Empty(t, takeFrom(h, now, "shop.example", "192.0.2.66", 1), "the heavy address holds more than the share")
	// The same without addresses (Acquire): refused, as before.
	_, ok := h.Acquire(now, "shop.example", TierRead)
	require.False(t, ok)
	// Releases give back what each lease took: with the attacker gone,
	// its host is back to the two legitimate requests.
	for _, l := range append(attacker, legit...) {
		l.Release()
	}
	for _, l := range other {
		l.Release()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Zero(t, h.inflight)
	for i := range h.slots {
		require.Zero(t, h.slots[i].inflight)
		require.Zero(t, h.slots[i].levels)
	}
	for i, n := range h.pairs {
		require.Zero(t, n, "pair counter %d", i)
	}
}

func TestHostSharesFloodFromManyAddressesHeldToTheShare(t *testing.T) {
	// Many addresses, each with little in flight, are each "light": the
	// host's fair count is then its whole count, held to the share.
	h := NewHostShares(8, hostCfg(4))
	now := time.Unix(1000, 0)
	b := takeFrom(h, now, "b.example", "198.51.100.1", 1)
	require.Len(t, b, 1)
	admitted := 0
	for i := range 50 {
		admitted += len(takeFrom(h, now, "a.example", fmt.Sprintf("192.0.2.%d", i+1), 1))
	}
	require.Equal(t, 4, admitted, "a.example flooded from 50 addresses keeps to its share of 4")
	require.Len(t, takeFrom(h, now, "b.example", "198.51.100.2", 3), 3, "b keeps its share")
}

// TestHostSharesThirdHostJoins: a and b hold their shares of 12 workers (6
// each) when c becomes active mid-run. The share falls to 4 at once: c is
// admitted up to its 4 (past the workers: its requests wait for the
// workers a and b give back), a and b are refused new requests until they
// are back under 4, and nobody's requests in flight are cut: the shares
// move as requests end.
func TestHostSharesThirdHostJoins(t *testing.T) {
	h := NewHostShares(12, hostCfg(8))
	now := time.Unix(1000, 0)
	from := func(host string, n, base int) []HostLease {
		var out []HostLease
		for i := range n {
			out = append(out, takeFrom(h, now, host, fmt.Sprintf("192.0.2.%d", base+i), 1)...)
		}
		return out
	}
	a := from("a.example", 6, 1)
	b := from("b.example", 6, 21)
	require.Len(t, a, 6)
	require.Len(t, b, 6)
	_, active, share := h.Top()
	require.Equal(t, 2, active)
	require.Equal(t, 6, share)

	c := from("c.example", 5, 41)
	require.Len(t, c, 4, "c gets its share of 4 at once, no more")
	_, active, share = h.Top()
	require.Equal(t, 3, active)
	require.Equal(t, 4, share)
	require.Empty(t, from("a.example", 1, 61), "a holds 6, over the new share")
	require.Empty(t, from("b.example", 1, 62))

	// a's requests end one by one: at 4 it is still at its share; at 3 it
	// is admitted again.
	a[0].Release()
	a[1].Release()
	require.Empty(t, from("a.example", 1, 63), "a at 4: at its share")
	a[2].Release()
	again := from("a.example", 1, 64)
	require.Len(t, again, 1, "a at 3: under its share")
	for _, l := range append(append(append(a[3:], b...), c...), again...) {
		l.Release()
	}
}
