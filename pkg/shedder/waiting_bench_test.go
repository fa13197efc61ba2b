//go:build unix

package shedder

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkHostQueueWaiting: what waiting costs the edge while a host's
// clients wait behind a slow origin. 1,000 requests wait in a.example's
// queue, each with a client that stays, asked as the edge asks: a
// non-blocking poll(2) of a socket. One op is every waiter's client asked
// once (four passes of goneAskPerPass). cpu-ns/check is the process's CPU
// time (user and system: the checks, the passes, the GC) per waiter asked;
// cpu-ms/s the same per second of waiting, what the edge's one core
// spends beside the host the queue protects.
func BenchmarkHostQueueWaiting(b *testing.B) {
	const waiters = 1000
	now := time.Unix(1000, 0)
	h := NewHostShares(4, queueCfg(time.Hour, 2*waiters))
	held := append(take(h, now, "a", TierRead, 2), take(h, now, "b", TierRead, 1)...)
	passes := make(chan struct{}, 1<<16)
	var checks atomic.Int64
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	gone := func() bool {
		if checks.Add(1)%waiters == 0 {
			passes <- struct{}{}
		}
		p := []unix.PollFd{{Fd: int32(fds[0]), Events: unix.POLLIN}}
		n, err := unix.Poll(p, 0)
		return err == nil && n > 0 && p[0].Revents&unix.POLLHUP != 0
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h.AcquireWait(ctx, now, "a", netip.Addr{}, TierRead, gone)
			if !errors.Is(err, ErrGone) {
				b.Errorf("a waiter ended with %v, want ErrGone when the benchmark ends", err)
			}
		}()
	}
	for h.Queued() < waiters {
		<-passes // every waiter queued and watched
	}
	for len(passes) > 0 {
		<-passes
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, wall0 := cpuTime(b), time.Now()
	for range b.N {
		<-passes
	}
	cpu, wall := cpuTime(b)-cpu0, time.Since(wall0)
	b.StopTimer()
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*waiters), "cpu-ns/check")
	b.ReportMetric(float64(cpu)/float64(wall)*1000, "cpu-ms/s")
	cancel()
	wg.Wait()
	for _, l := range held {
		l.Release()
	}
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
