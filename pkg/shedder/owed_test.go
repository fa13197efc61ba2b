package shedder

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// takeOwedLater is acquireLater through TakeOwed: it reports the waiter's
// name with its error, in the order the slots are handed out (the slot is
// given back after the report), and closes the channel it returns once the
// slot is given back.
func takeOwedLater(w *Workers, name string, tier Tier, owed time.Duration, got chan<- string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		slot, err := w.TakeOwed(context.Background(), tier, nil, owed)
		if err != nil {
			got <- name + ": " + err.Error()
			return
		}
		got <- name
		slot.Release()
	}()
	return done
}

// A waiter its share owes a worker goes ahead of the waiters of its tier
// owed none, never ahead of a higher tier; among equals, first come first
// served.
func TestTakeOwedGoesFirstInItsTier(t *testing.T) {
	w := NewWorkers(1, 8, time.Minute)
	hold, err := w.TakeUnless(context.Background(), TierRead, nil)
	require.NoError(t, err)
	got := make(chan string, 8)
	var dones []<-chan struct{}
	for i, c := range []struct {
		name string
		tier Tier
		owed time.Duration
	}{
		{"read 1", TierRead, 0},
		{"read 2", TierRead, 0},
		{"owed read 1", TierRead, time.Minute},
		{"write", TierWrite, 0},
		{"owed read 2", TierRead, time.Minute},
		{"owed test", TierTest, time.Minute},
	} {
		dones = append(dones, takeOwedLater(w, c.name, c.tier, c.owed, got))
		waitQueued(t, w, i+1)
	}
	hold.Release()
	var order []string
	for range 6 {
		order = append(order, <-got)
	}
	require.Equal(t, []string{"write", "owed read 1", "owed read 2", "read 1", "read 2", "owed test"}, order)
	for _, d := range dones { // the last slot is given back after its report
		<-d
	}
	require.Equal(t, 0, w.Busy())
}

// A full queue turns away the newest waiter of the request's tier owed
// nothing for a request owed a worker (as it does for a higher tier); a
// request owed nothing cannot turn away one that is owed.
func TestTakeOwedTurnsAwayTheUnowed(t *testing.T) {
	w := NewWorkers(1, 2, time.Minute)
	hold, err := w.TakeUnless(context.Background(), TierRead, nil)
	require.NoError(t, err)
	got := make(chan string, 4)
	takeOwedLater(w, "read 1", TierRead, 0, got)
	waitQueued(t, w, 1)
	takeOwedLater(w, "read 2", TierRead, 0, got)
	waitQueued(t, w, 2)

	takeOwedLater(w, "owed", TierRead, time.Minute, got)
	require.Equal(t, "read 2: "+ErrQueueFull.Error(), <-got, "the newest unowed read makes room")
	waitQueued(t, w, 2)
	takeOwedLater(w, "owed 2", TierRead, time.Minute, got)
	require.Equal(t, "read 1: "+ErrQueueFull.Error(), <-got)
	waitQueued(t, w, 2)

	// Now both places are owed: neither an unowed read nor an owed test
	// request (a lower tier) finds room.
	_, err = w.TakeOwed(context.Background(), TierRead, nil, 0)
	require.ErrorIs(t, err, ErrQueueFull)
	_, err = w.TakeOwed(context.Background(), TierTest, nil, time.Minute)
	require.ErrorIs(t, err, ErrQueueFull)
	hold.Release()
	require.Equal(t, "owed", <-got)
	require.Equal(t, "owed 2", <-got)
}

// A request owed a worker waits up to the longer of the queue timeout and
// what it is owed: a read beside it times out at the queue timeout while it
// keeps waiting and gets the next slot.
func TestTakeOwedWaitsLonger(t *testing.T) {
	w := NewWorkers(1, 4, 5*time.Millisecond)
	hold, err := w.TakeUnless(context.Background(), TierRead, nil)
	require.NoError(t, err)
	got := make(chan string, 1)
	done := takeOwedLater(w, "owed", TierRead, time.Minute, got)
	waitQueued(t, w, 1)
	for range 3 {
		_, err = w.TakeOwed(context.Background(), TierRead, nil, 0)
		require.ErrorIs(t, err, ErrQueueTimeout, "a read owed nothing waits queue_timeout")
	}
	require.Equal(t, 1, w.Queued(), "the owed read outwaited them")
	select {
	case r := <-got:
		t.Fatalf("the owed read was answered before a slot freed: %s", r)
	default:
	}
	hold.Release()
	require.Equal(t, "owed", <-got)
	<-done // its slot given back: the one worker is free

	// Owed less than the queue timeout, it still waits the queue timeout.
	hold, err = w.TakeUnless(context.Background(), TierRead, nil)
	require.NoError(t, err)
	defer hold.Release()
	start := time.Now()
	_, err = w.TakeOwed(context.Background(), TierRead, nil, time.Nanosecond)
	require.ErrorIs(t, err, ErrQueueTimeout)
	require.GreaterOrEqual(t, time.Since(start), 5*time.Millisecond)
}

// A host's lease says what its share owes it: host_share.queue_timeout
// while it is within its share and another host is active; nothing for a
// lone host, for a host at its share (admitted only because workers were
// idle), or with the queue timeout at 0.
func TestHostLeaseOwed(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := DefaultHostShareConfig()
	h := NewHostShares(4, cfg)
	var leases []HostLease
	take := func(host string) HostLease {
		t.Helper()
		l, ok := h.AcquireFrom(now, host, netip.Addr{}, TierRead)
		require.True(t, ok, host)
		leases = append(leases, l)
		return l
	}
	require.Zero(t, take("a.example").Owed(), "a lone host is owed nothing: it may use every worker")
	require.Zero(t, take("a.example").Owed())
	require.Zero(t, take("a.example").Owed())
	// b.example joins: shares of 2; a.example holds 3.
	require.Equal(t, cfg.QueueTimeout, take("b.example").Owed(), "b.example is within its share while a.example is served")
	for _, l := range leases {
		l.Release()
	}

	// At its share, admitted because more than a share's worth is idle.
	// Three hosts active on 12 workers: shares of 4.
	h = NewHostShares(12, cfg)
	leases = nil
	take("b.example")
	take("c.example")
	for range 4 {
		require.Equal(t, cfg.QueueTimeout, take("a.example").Owed())
	}
	require.Zero(t, take("a.example").Owed(), "a.example at its share of 4, admitted on 6 idle workers, is owed nothing")
	for _, l := range leases {
		l.Release()
	}

	cfg.QueueTimeout = 0
	h = NewHostShares(4, cfg)
	leases = nil
	take("a.example")
	require.Zero(t, take("b.example").Owed(), "host_share.queue_timeout 0: nothing waits on the shares")
}
