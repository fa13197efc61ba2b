package shedder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
)

// queueCfg tracks 8 hosts and lets a request over its share wait timeout,
// with at most maxQueued waiting.
func queueCfg(timeout time.Duration, maxQueued int) HostShareConfig {
	return HostShareConfig{Enabled: true, TrackedHosts: 8, DefaultWeight: 1, QueueTimeout: timeout, MaxQueued: maxQueued}
}

// waitResult is what one AcquireWait returned, and after how long.
type waitResult struct {
	lease HostLease
	err   error
	took  time.Duration
}

// full returns a table of 4 workers shared by a and b (a share of 2 each)
// with a at its share (its two leases returned) and b holding one: a's
// next request is over its share.
func full(t *testing.T, cfg HostShareConfig, now time.Time) (*HostShares, []HostLease) {
	t.Helper()
	h := NewHostShares(4, cfg)
	a := take(h, now, "a", TierRead, 2)
	require.Len(t, a, 2)
	require.Len(t, take(h, now, "b", TierRead, 1), 1)
	_, ok := h.Acquire(now, "a", TierRead)
	require.False(t, ok, "a is at its share")
	return h, a
}

// wait starts an AcquireWait for host and returns where its result comes.
func wait(ctx context.Context, h *HostShares, now time.Time, host string, gone func() bool) <-chan waitResult {
	out := make(chan waitResult, 1)
	go func() {
		start := time.Now()
		l, err := h.AcquireWait(ctx, now, host, netip.Addr{}, TierRead, gone)
		out <- waitResult{lease: l, err: err, took: time.Since(start)}
	}()
	return out
}

// queuedReaches waits until n requests wait in h.
func queuedReaches(t *testing.T, h *HostShares, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, proc.PollEvery(ctx, time.Millisecond, fmt.Sprintf("%d waiters", n), func(context.Context) error {
		if q := h.Queued(); q != n {
			return fmt.Errorf("%d waiting", q)
		}
		return nil
	}))
}

func (h *HostShares) wakeupCount() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wakeups
}

func (h *HostShares) reservedCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reserved
}

// TestHostQueueAdmitsOnRelease: a request over its host's share waits,
// holding nothing (the host still has exactly its share in flight), and is
// admitted when one of its host's places is given back, long before its
// queue timeout.
func TestHostQueueAdmitsOnRelease(t *testing.T) {
	now := time.Unix(1000, 0)
	h, a := full(t, queueCfg(10*time.Second, 0), now)
	res := wait(context.Background(), h, now, "a", nil)
	queuedReaches(t, h, 1)
	top, _, _ := h.Top()
	require.Contains(t, top, HostInFlight{Host: "a", InFlight: 2, Queued: 1}, "the waiter holds no place")
	a[0].Release()
	r := <-res
	require.NoError(t, r.err)
	require.Less(t, r.took, 10*time.Second, "admitted on the release, not at the timeout")
	require.Contains(t, top2(h), HostInFlight{Host: "a", InFlight: 2})
	require.Zero(t, h.reservedCount())
	require.EqualValues(t, 1, h.waits[waitAdmitted].Load())
	r.lease.Release()
	a[1].Release()
}

func top2(h *HostShares) []HostInFlight {
	top, _, _ := h.Top()
	return top
}

// TestHostQueueFIFO: waiters of one host are admitted in the order they
// came, one per release.
func TestHostQueueFIFO(t *testing.T) {
	now := time.Unix(1000, 0)
	h, a := full(t, queueCfg(10*time.Second, 0), now)
	var res []<-chan waitResult
	for i := range 3 {
		res = append(res, wait(context.Background(), h, now, "a", nil))
		queuedReaches(t, h, i+1)
	}
	held := a
	for i := range 3 {
		held[0].Release()
		held = held[1:]
		r := <-res[i]
		require.NoError(t, r.err, "waiter %d", i)
		held = append(held, r.lease)
		require.Equal(t, 2-i, h.Queued(), "the later waiters still wait")
	}
	for _, l := range held {
		l.Release()
	}
}

// TestHostQueueWokenWaiterKeepsItsPlaceThroughARecount: the waiter a
// release wakes judges itself with the table's active hosts recounted
// (every recountEvery on the requests' clock); the recount must count the
// place it was woken for as taken, not hand it on to the waiter behind it
// and send it back to the head of the queue, where it would wait for the
// next release (or its timeout) while the one behind is admitted.
func TestHostQueueWokenWaiterKeepsItsPlaceThroughARecount(t *testing.T) {
	now := time.Unix(1000, 0)
	h, a := full(t, queueCfg(5*time.Second, 0), now)
	first := wait(context.Background(), h, now, "a", nil)
	queuedReaches(t, h, 1)
	second := wait(context.Background(), h, now, "a", nil)
	queuedReaches(t, h, 2)
	h.mu.Lock()
	h.recountAt -= int64(recountEvery) // the woken waiter's judgement recounts
	h.mu.Unlock()
	a[0].Release()
	r := <-first
	require.NoError(t, r.err, "the first waiter is admitted on the release")
	require.Less(t, r.took, 5*time.Second, "on the release, not at the timeout")
	require.Equal(t, 1, h.Queued(), "the second still waits")
	require.Zero(t, h.reservedCount(), "no place held for the second")
	r.lease.Release()
	r = <-second
	require.NoError(t, r.err, "the second is admitted on the next release")
	r.lease.Release()
	a[1].Release()
}

// TestHostQueueTimesOut: with no place freed the waiter is refused after
// the queue timeout, not before, and leaves nothing behind.
func TestHostQueueTimesOut(t *testing.T) {
	now := time.Unix(1000, 0)
	h, a := full(t, queueCfg(50*time.Millisecond, 0), now)
	r := <-wait(context.Background(), h, now, "a", nil)
	require.ErrorIs(t, r.err, ErrQueueTimeout)
	require.GreaterOrEqual(t, r.took, 50*time.Millisecond)
	require.Zero(t, h.Queued())
	require.EqualValues(t, 1, h.waits[waitTimedOut].Load())
	for _, l := range a {
		l.Release()
	}
	require.Zero(t, h.reservedCount())
}

// TestHostQueueFullRefusesAtOnce: with max_queued waiting (across hosts)
// a further request over its share is refused at once.
func TestHostQueueFullRefusesAtOnce(t *testing.T) {
	now := time.Unix(1000, 0)
	h, a := full(t, queueCfg(10*time.Second, 1), now)
	ctx, cancel := context.WithCancel(context.Background())
	first := wait(ctx, h, now, "a", nil)
	queuedReaches(t, h, 1)
	r := <-wait(context.Background(), h, now, "a", nil)
	require.ErrorIs(t, r.err, ErrQueueFull)
	require.Less(t, r.took, 10*time.Second)
	require.EqualValues(t, 1, h.waits[waitFull].Load())
	require.Equal(t, 1, h.Queued())
	cancel()
	require.ErrorIs(t, (<-first).err, ErrGone)
	for _, l := range a {
		l.Release()
	}
}

// TestHostQueueClientGone: a waiter whose client leaves gives up its place
// in the queue at once (gone asked, or ctx ended), and a place it had just
// been woken for goes to the next waiter: nothing leaks.
func TestHostQueueClientGone(t *testing.T) {
	now := time.Unix(1000, 0)
	h, a := full(t, queueCfg(10*time.Second, 0), now)
	var left atomic.Bool
	r1 := wait(context.Background(), h, now, "a", left.Load)
	queuedReaches(t, h, 1)
	left.Store(true)
	r := <-r1
	require.ErrorIs(t, r.err, ErrGone)
	require.Less(t, r.took, 10*time.Second)
	require.Zero(t, h.Queued())
	require.EqualValues(t, 1, h.waits[waitGone].Load())

	// Woken, then gone before it judged itself: the place passes on.
	w := &hostWaiter{ready: make(chan struct{}, 1)}
	_, ok, queued := h.acquire(now, "a", netip.Addr{}, TierRead, w)
	require.False(t, ok)
	require.True(t, queued)
	next := wait(context.Background(), h, now, "a", nil)
	queuedReaches(t, h, 2)
	a[0].Release() // wakes w, which holds the place
	require.Equal(t, 1, h.reservedCount())
	h.cancel(w)
	rn := <-next
	require.NoError(t, rn.err, "the place w was woken for went to the next waiter")
	require.Zero(t, h.reservedCount())
	require.Zero(t, h.Queued())
	rn.lease.Release()
	a[1].Release()
	// Nothing of a's is held or waiting: only b's lease is left.
	require.Equal(t, []HostInFlight{{Host: "b", InFlight: 1}, {Host: OtherHost}}, top2(h))
}

// TestHostQueueShareGrowthWakesWaiters: more workers (a bigger share) or
// a host leaving (a recount) wake as many waiters as there are places.
func TestHostQueueShareGrowthWakesWaiters(t *testing.T) {
	now := time.Unix(1000, 0)
	h, a := full(t, queueCfg(10*time.Second, 0), now)
	var res []<-chan waitResult
	for i := range 3 {
		res = append(res, wait(context.Background(), h, now, "a", nil))
		queuedReaches(t, h, i+1)
	}
	h.setCapacity(6) // a's share 3: one place
	r := <-res[0]
	require.NoError(t, r.err)
	require.Equal(t, 2, h.Queued(), "one place, one waiter woken")
	// b leaves: after hostIdleAfter a is alone and takes what it needs.
	h.mu.Lock()
	for i := range h.slots {
		if s := &h.slots[i]; s.used && string(s.name[:s.nameLen]) == "b" {
			s.inflight, h.inflight = 0, h.inflight-1
			h.pushIdleLocked(int32(i))
		}
	}
	h.mu.Unlock()
	h.maybeRecount(now.Add(hostIdleAfter + time.Second))
	for _, ch := range res[1:] {
		r := <-ch
		require.NoError(t, r.err)
		r.lease.Release()
	}
	r.lease.Release()
	for _, l := range a {
		l.Release()
	}
}

// TestHostQueueNoHerd: one release wakes one waiter, however many wait.
func TestHostQueueNoHerd(t *testing.T) {
	now := time.Unix(1000, 0)
	h, a := full(t, queueCfg(10*time.Second, 0), now)
	ctx, cancel := context.WithCancel(context.Background())
	var res []<-chan waitResult
	for i := range 5 {
		res = append(res, wait(ctx, h, now, "a", nil))
		queuedReaches(t, h, i+1)
	}
	before := h.wakeupCount()
	a[0].Release()
	r := <-res[0]
	require.NoError(t, r.err)
	require.Equal(t, uint64(1), h.wakeupCount()-before, "one place, one wake-up")
	require.Equal(t, 4, h.Queued())
	cancel()
	for _, ch := range res[1:] {
		require.ErrorIs(t, (<-ch).err, ErrGone)
	}
	r.lease.Release()
	a[1].Release()
	require.Zero(t, h.Queued())
}

// TestHostQueueNewcomerDoesNotPass: a place woken for a waiter is not
// taken by a request that had not waited.
func TestHostQueueNewcomerDoesNotPass(t *testing.T) {
	now := time.Unix(1000, 0)
	h, a := full(t, queueCfg(10*time.Second, 0), now)
	w := &hostWaiter{ready: make(chan struct{}, 1)}
	_, _, queued := h.acquire(now, "a", netip.Addr{}, TierRead, w)
	require.True(t, queued)
	a[0].Release()
	_, ok := h.Acquire(now, "a", TierRead)
	require.False(t, ok, "the freed place is the waiter's")
	l, ok, _ := h.acquire(now, "a", netip.Addr{}, TierRead, w)
	require.True(t, ok)
	l.Release()
	a[1].Release()
}

// TestHostQueueOffRefusesAtOnce: queue_timeout 0 keeps the refusal at
// once; critical requests never wait.
func TestHostQueueOffRefusesAtOnce(t *testing.T) {
	now := time.Unix(1000, 0)
	h, a := full(t, queueCfg(0, 0), now)
	_, err := h.AcquireWait(context.Background(), now, "a", netip.Addr{}, TierRead, nil)
	require.ErrorIs(t, err, ErrHostShare)
	l, err := h.AcquireWait(context.Background(), now, "a", netip.Addr{}, TierCritical, nil)
	require.NoError(t, err)
	l.Release()
	for _, l := range a {
		l.Release()
	}
}

// TestHostQueueConfig: the fields' bounds, their spelling in a document,
// and a document at their defaults reads as before they existed.
func TestHostQueueConfig(t *testing.T) {
	for _, tc := range []struct {
		kv   map[string]string
		want string
	}{
		{map[string]string{"host_share.queue_timeout": "-1s"}, "host_share.queue_timeout: must be in [0s, 30s]"},
		{map[string]string{"host_share.queue_timeout": "31s"}, "host_share.queue_timeout: must be in [0s, 30s]"},
		{map[string]string{"host_share.queue_timeout": "soon"}, "host_share.queue_timeout"},
		{map[string]string{"host_share.max_queued": "-1"}, "host_share.max_queued: must be in [0, 1000000]"},
		{map[string]string{"host_share.max_queued": "1000001"}, "host_share.max_queued: must be in [0, 1000000]"},
		{map[string]string{"host_share.max_queued": "many"}, "host_share.max_queued"},
	} {
		_, err := ApplySettings(DefaultConfig(), tc.kv)
		require.ErrorContains(t, err, tc.want, "%v", tc.kv)
	}
	cfg, err := ApplySettings(DefaultConfig(), map[string]string{"host_share.queue_timeout": "250ms", "host_share.max_queued": "64"})
	require.NoError(t, err)
	data, err := json.Marshal(cfg)
	require.NoError(t, err)
	require.Contains(t, string(data), `"queue_timeout":"250ms","max_queued":64`)
	back, err := ParseConfig(data)
	require.NoError(t, err)
	require.Equal(t, 250*time.Millisecond, back.HostShare.QueueTimeout)
	require.Equal(t, 64, back.HostShare.MaxQueued)

	def, err := json.Marshal(DefaultConfig().HostShare)
	require.NoError(t, err)
	require.NotContains(t, string(def), "queue_timeout")
	require.NotContains(t, string(def), "max_queued")
	require.Equal(t, time.Second, DefaultConfig().HostShare.QueueTimeout)

	_, err = ParseConfig([]byte(`{"host_share": {"queue_timeout": "1s", "typo": 1}}`))
	require.Error(t, err, "unknown fields stay errors under host_share")
	_, err = ParseConfig([]byte(`{"host_share": {"queue_timeout": 5}}`))
	require.Error(t, err, "a duration is spelled as one")
	require.True(t, errors.Is(err, err) && !strings.Contains(err.Error(), "panic"))
}

// TestAcquireHostWaitMetrics: a wait that times out is a host_share
// rejection and a timed_out wait; a client that left is neither a
// rejection nor anything but client_gone; the waiters show per host while
// they wait.
func TestAcquireHostWaitMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	cfg := rawConfig()
	cfg.HostShare = queueCfg(30*time.Millisecond, 0)
	s, err := New(cfg, reg, seeded())
	require.NoError(t, err)
	s.AttachWorkers(NewWorkers(4, 0, 0))
	now := time.Unix(1000, 0)
	for _, host := range []string{"a", "a", "b"} {
		_, ok := s.AcquireHost(now, host, netip.Addr{}, TierRead)
		require.True(t, ok)
	}
	_, err = s.AcquireHostWait(context.Background(), now, "a", netip.Addr{}, TierRead, nil)
	require.ErrorIs(t, err, ErrQueueTimeout)
	cfg.HostShare.QueueTimeout = 10 * time.Second // the next waiter leaves first
	require.NoError(t, s.Update(cfg))

	var left atomic.Bool
	done := make(chan error, 1)
	go func() {
		_, err := s.AcquireHostWait(context.Background(), now, "a", netip.Addr{}, TierRead, left.Load)
		done <- err
	}()
	queuedReaches(t, s.Hosts(), 1)
	got := scrape(t, reg)
	require.Equal(t, 1.0, got["edgeguard_shedder_host_queued{host=a}"])
	require.Equal(t, 0.0, got["edgeguard_shedder_host_queued{host=_other}"])
	left.Store(true)
	require.ErrorIs(t, <-done, ErrGone)

	got = scrape(t, reg)
	require.Equal(t, 1.0, got["edgeguard_shedder_rejected_total{reason=host_share,tier=read}"])
	require.Equal(t, 1.0, got["edgeguard_shedder_host_queue_waits_total{outcome=timed_out}"])
	require.Equal(t, 1.0, got["edgeguard_shedder_host_queue_waits_total{outcome=client_gone}"])
	require.Zero(t, got["edgeguard_shedder_host_queue_waits_total{outcome=admitted}"])
	require.Zero(t, got["edgeguard_shedder_host_queue_waits_total{outcome=full}"])
	require.NotContains(t, got, "edgeguard_shedder_host_queued{host=a}", "no waiter left")
}
