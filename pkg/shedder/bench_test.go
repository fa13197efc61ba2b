package shedder

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func BenchmarkAdmit(b *testing.B) {
	for _, tc := range []struct {
		name  string
		level float64
	}{
		{"idle", -1},       // S below 0: nothing is shed
		{"shedding", 0.5},  // test gone, read partially cut
		{"saturated", 1.0}, // every sheddable tier cut
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := New(DefaultConfig(), nil)
			if err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			for i := range 1000 {
				s.Admit(now, mix[i%len(mix)])
			}
			s.ObserveUtilization(now, 0.75)
			s.setLevel(tc.level)
			var seq atomic.Uint32
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1))
				for pb.Next() {
					s.Admit(now, mix[i%len(mix)])
					i++
				}
			})
		})
	}
}

func BenchmarkClassify(b *testing.B) {
	c, err := NewClassifier(DefaultConfig().Tiers)
	if err != nil {
		b.Fatal(err)
	}
	header := func(k string) (string, bool) {
		switch k {
		case "X-Priority":
			return "read", true
		case "X-Api-Key":
			return "live_123", true
		}
		return "", false
	}
	cases := []struct {
		method, path string
		trusted      bool
	}{
		{"GET", "/assets/app.js", false},
		{"POST", "/api/v1/orders", false},
		{"GET", "/healthcheck", false},
		{"GET", "/api/v1/orders", true},
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tc := &cases[i%len(cases)]
			c.Classify(tc.method, tc.path, header, tc.trusted)
			i++
		}
	})
}

func BenchmarkWorkersAcquire(b *testing.B) {
	for _, tc := range []struct {
		name        string
		capacity    int
		parallelism int
	}{
		{"uncontended", 1 << 20, 1},
		{"queueing", 2, 8}, // 8 goroutines per CPU on 2 slots: most acquires queue
	} {
		b.Run(tc.name, func(b *testing.B) {
			w := NewWorkers(tc.capacity, 1<<16, time.Minute)
			ctx := context.Background()
			b.SetParallelism(tc.parallelism)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					release, err := w.Acquire(ctx, TierRead)
					if err != nil {
						b.Error(err)
						return
					}
					release()
				}
			})
		})
	}
}

// BenchmarkAdaptive is what the adaptive origin limit adds to a proxied
// request: one Acquire and one Release with a latency sample, including the
// sort that closes a window (every 100 ms of the clock the benchmark
// advances by 10 µs per request: a window per 10,000 requests).
func BenchmarkAdaptive(b *testing.B) {
	for _, enabled := range []bool{false, true} {
		name := "off"
		if enabled {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			cfg := DefaultAdaptiveConfig()
			cfg.Enabled, cfg.MaxLimit = enabled, 100_000
			cfg.InitialLimit = cfg.MaxLimit
			a := NewAdaptive(cfg)
			var clock atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					now := time.Unix(0, clock.Add(int64(10*time.Microsecond)))
					if a.Acquire(now, TierRead) {
						a.Release(now, TierRead, 20*time.Millisecond, true)
					}
				}
			})
		})
	}
}
