package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// TestUpgradeKeepsAOneEdgePoPInDNS: a PoP of one edge, registered in Consul,
// is upgraded 3 times in a row (SIGUSR2). Throughout, the Consul catalog has
// the edge passing and Consul's DNS answers for the service: the old edge
// neither fails its check nor deregisters, and the new one takes over the
// same registration (same address, same admin socket for the check). Both
// are polled every 20 ms from before the first upgrade to after the last.
//
// Parallel: its Consul and edge are its own, and most of its time is the
// agent's check interval; it runs beside the other waiting tests once the
// load tests are done.
func TestUpgradeKeepsAOneEdgePoPInDNS(t *testing.T) {
	t.Parallel()
	c, err := testenv.StartConsul(testenv.ConsulOptions{Datacenter: "eu-west"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	u := startUpgradeEdge(t, "--consul", c.HTTPAddr(), "--region", "eu-west", "--pop", "ams",
		"--rules-cache", filepath.Join(t.TempDir(), "rules.cache"))
	client, err := c.Client("")
	require.NoError(t, err)
	passing := func(ctx context.Context) (int, error) {
		entries, _, err := client.Health().Service(region.Service, "", true, nil)
		return len(entries), err
	}
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", c.DNSAddr())
	}}
	inDNS := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		addrs, err := resolver.LookupHost(ctx, region.Service+".service.consul")
		if err == nil && len(addrs) == 0 {
			err = fmt.Errorf("no address")
		}
		return err
	}
	// Registered and passing before anything is upgraded (the agent checks
	// /readyz every 2 s).
	require.NoError(t, pollUntil(t, 30*time.Second, func() error {
		n, err := passing(context.Background())
		if err == nil && n != 1 {
			err = fmt.Errorf("%d passing instances", n)
		}
		if err == nil {
			err = inDNS(context.Background())
		}
		return err
	}))

	var polls, catalogGaps, dnsGaps atomic.Int64
	var firstGap atomic.Value
	stop := make(chan struct{})
	pollStart := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			polls.Add(1)
			if n, err := passing(context.Background()); err != nil || n != 1 {
				catalogGaps.Add(1)
				firstGap.CompareAndSwap(nil, fmt.Sprintf("catalog: %d passing, %v", n, err))
			}
			if err := inDNS(context.Background()); err != nil {
				dnsGaps.Add(1)
				firstGap.CompareAndSwap(nil, fmt.Sprintf("dns: %v", err))
			}
		}
	})
	pid := u.Cmd.Process.Pid
	for i := range 3 {
		require.NoError(t, syscall.Kill(pid, syscall.SIGUSR2))
		line := u.waitLog(t, "edge serving", i+2, 60*time.Second)
		newPID := int(line["pid"].(float64))
		require.NotEqual(t, pid, newPID)
		require.NoError(t, pollUntil(t, 30*time.Second, func() error {
			if !exited(pid) {
				return fmt.Errorf("edge %d still runs", pid)
			}
			return nil
		}))
		pid = newPID
	}
	// Several of the agent's check intervals (2 s) have passed, the last
	// ones with the last edge alone.
	require.NoError(t, pollUntil(t, 30*time.Second, func() error {
		if polls.Load() < 150 || time.Since(pollStart) < 7*time.Second {
			return fmt.Errorf("%d polls over %v", polls.Load(), time.Since(pollStart))
		}
		return nil
	}))
	close(stop)
	wg.Wait()
	t.Logf("3 upgrades: %d polls of the catalog and of DNS; %d without the edge passing, %d without a DNS answer", polls.Load(), catalogGaps.Load(), dnsGaps.Load())
	require.Zero(t, catalogGaps.Load(), "the PoP left the catalog: %v", firstGap.Load())
	require.Zero(t, dnsGaps.Load(), "the PoP left DNS: %v", firstGap.Load())
	n, err := passing(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// pollUntil polls f every 20 ms until it returns nil, for at most within
// (stretched on a busy machine by testenv.Within).
func pollUntil(t *testing.T, within time.Duration, f func() error) error {
	return proc.PollEvery(testenv.Within(t, within), 20*time.Millisecond, "the condition", func(context.Context) error { return f() })
}
