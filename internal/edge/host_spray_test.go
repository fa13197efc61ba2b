package edge

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// hostState is host's requests in flight and waiting in the edge's host
// shares, as Top names them (zero when it has none).
func hostState(r *running, host string) shedder.HostInFlight {
	top, _, _ := r.shed.Hosts().Top()
	for _, h := range top {
		if h.Host == host {
			return h
		}
	}
	return shedder.HostInFlight{Host: host}
}

// topLater formats as the edge's host shares (Top) when printed: a failed
// wait's message shows them as they were at the end of the wait.
type topLater struct{ r *running }

func (l topLater) String() string {
	top, active, share := l.r.shed.Hosts().Top()
	return fmt.Sprintf("%+v, %d active, share %d", top, active, share)
}

// TestHostSharesSprayedNamesTakeOneShare: a client that sends a new Host
// name with every request, behind an edge whose host table lists the
// customers, takes one share of the workers (the pooled rest's), not one
// per name. The edge runs at its defaults but for 16 workers and the host
// table; the CPU reading is held idle (Shedder.SetCPUTime), so only the
// shares of the workers decide, whatever the machine's load.
//   - b.example, listed, sends on one connection to an origin that answers
//     at once.
//   - The sprayer sends on 24 connections, each request for a name of its
//     own under spray.example (not listed) to a path its origin holds:
//     each name is one request in flight. They take 8 workers, the pooled
//     rest's share, and the other 16 wait in its queue (a waiter refused
//     after host_share.queue_timeout would come back with a new name).
//   - b.example then holds 6 requests at its origin beside the sprayer:
//     all 6 get in, within its share of 8.
//   - With host_share.unlisted_hosts set to "each", the sprayer's next
//     names have shares of their own again.
//
// Before the host table named the tenants, each sprayed name had a share
// of its own (of 1 worker among 25 active hosts, which a name with nothing
// in flight is always within): the sprayer took all 16 workers and
// b.example's held requests waited for a worker that never came.
func TestHostSharesSprayedNamesTakeOneShare(t *testing.T) {
	release := make(chan struct{})
	origin := holdingOrigin(t, nil, release)
	table := filepath.Join(t.TempDir(), "hosts.yaml")
	require.NoError(t, os.WriteFile(table, []byte("version: 1\nhosts:\n  b.example: {pool: default}\n"), 0o600))
	r := startEdgeBefore(t, noRules, func(c *config.Config) {
		c.Origins, c.Hosts = []string{origin}, table
		c.Workers = 16
	}, func(e *Edge) { e.shed.SetCPUTime(func() time.Duration { return time.Second }) })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Cleanups run last first: the held requests go first, then the
	// clients stop, then the edge and the origin.
	t.Cleanup(func() { cancel(); close(release); wg.Wait() })

	// b.example, active throughout; its answers by code.
	var mu sync.Mutex
	bCodes := map[int]int{}
	bClient := hostClient(1)
	wg.Go(func() {
		for ctx.Err() == nil {
			code := hostGet(bClient, r.Addr(), "b.example", "/item")
			mu.Lock()
			bCodes[code]++
			mu.Unlock()
		}
	})
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return bCodes[200] > 0
	}, 10*time.Second, 10*time.Millisecond, "b.example never answered")

	// The sprayer: a new name for every request.
	var names atomic.Int64
	sprayClient := hostClient(24)
	for range 24 {
		wg.Go(func() {
			for ctx.Err() == nil {
				hostGet(sprayClient, r.Addr(), fmt.Sprintf("n%d.spray.example", names.Add(1)), "/held")
			}
		})
	}
	require.Eventually(t, func() bool {
		other := hostState(r, shedder.OtherHost)
		return other.InFlight == 8 && other.Queued > 0
	}, 20*time.Second, 10*time.Millisecond, "the sprayer was not held to the pooled rest's share (the hosts then: %s)", topLater{r})

	// b.example holds 6 requests at its origin beside the sprayer.
	heldClient := hostClient(6)
	for range 6 {
		wg.Go(func() { hostGet(heldClient, r.Addr(), "b.example", "/held") })
	}
	require.Eventually(t, func() bool {
		return hostState(r, "b.example").InFlight >= 6
	}, 20*time.Second, 10*time.Millisecond, "b.example's held requests did not all get in")

	top, active, share := r.shed.Hosts().Top()
	mu.Lock()
	codes := maps.Clone(bCodes)
	mu.Unlock()
	t.Logf("%d names sprayed; hosts %+v, %d active, share %d; b.example's fast requests %v", names.Load(), top, active, share, codes)
	require.GreaterOrEqual(t, names.Load(), int64(24), "a name for each of the sprayer's requests")
	for _, h := range top {
		require.Contains(t, []string{"b.example", shedder.OtherHost}, h.Host, "a sprayed name took a share of its own")
	}
	require.Equal(t, 2, active)
	require.Equal(t, 8, hostState(r, shedder.OtherHost).InFlight, "the sprayer's share")
	require.Equal(t, []int{200}, slices.Sorted(maps.Keys(codes)), "b.example's fast requests")

	// host_share.unlisted_hosts "each", live: the names the table does not
	// list get shares of their own again (the sprayer's next names, sent
	// as its waiters give up).
	cfg := r.shed.Config()
	cfg.HostShare.UnlistedHosts = shedder.UnlistedEach
	require.NoError(t, r.shed.Update(cfg))
	require.Eventually(t, func() bool {
		top, _, _ := r.shed.Hosts().Top()
		return slices.ContainsFunc(top, func(h shedder.HostInFlight) bool { return strings.HasSuffix(h.Host, ".spray.example") })
	}, 20*time.Second, 10*time.Millisecond, "no sprayed name had a share of its own with unlisted_hosts each (the hosts then: %s)", topLater{r})
}
