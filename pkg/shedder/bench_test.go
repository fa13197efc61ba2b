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
