package shedder

import (
	rtmetrics "runtime/metrics"
	"time"
)

// LagProbe measures overload that worker utilization does not show: a host
// starved of CPU runs the edge's goroutines late, and a GC pause stops them
// all, while the workers still look idle (LinkedIn's Hodor watches a
// heartbeat and GC pauses for the same reason). Each Measure returns the
// largest of:
//
//   - the ticker's lateness: how long after its tick was sent the sampler
//     ran;
//   - the runtime's scheduling latency (time goroutines spent runnable
//     before running), p99 over the interval since the previous Measure;
//   - the longest GC stop-the-world pause in that interval.
//
// Not safe for concurrent use: one sampler owns it.
type LagProbe struct {
	samples []rtmetrics.Sample
	prev    [2]*rtmetrics.Float64Histogram
}

const (
	schedLatencies = "/sched/latencies:seconds"
	gcPauses       = "/sched/pauses/total/gc:seconds"
)

// NewLagProbe returns a probe whose first Measure covers the time since
// the process started.
func NewLagProbe() *LagProbe {
	return &LagProbe{samples: []rtmetrics.Sample{{Name: schedLatencies}, {Name: gcPauses}}}
}

// Measure returns the lag for a tick sent at tick and received at now.
func (p *LagProbe) Measure(tick, now time.Time) time.Duration {
	lag := max(now.Sub(tick), 0)
	rtmetrics.Read(p.samples)
	for i, s := range p.samples {
		if s.Value.Kind() != rtmetrics.KindFloat64Histogram {
			continue // a runtime without the metric
		}
		cur := s.Value.Float64Histogram()
		q := 0.99
		if i == 1 {
			q = 1 // the longest pause
		}
		if d := deltaQuantile(p.prev[i], cur, q); d > 0 {
			lag = max(lag, time.Duration(d*float64(time.Second)))
		}
		// Read reuses the histogram's memory on the next call: keep a copy.
		p.prev[i] = cloneHist(p.prev[i], cur)
	}
	return lag
}

func cloneHist(dst, src *rtmetrics.Float64Histogram) *rtmetrics.Float64Histogram {
	if dst == nil {
		dst = &rtmetrics.Float64Histogram{}
	}
	dst.Counts = append(dst.Counts[:0], src.Counts...)
	dst.Buckets = append(dst.Buckets[:0], src.Buckets...)
	return dst
}

// deltaQuantile returns the q quantile (0 < q <= 1) of the observations
// cur holds beyond prev (prev nil: all of cur), as the lower bound of the
// bucket it falls in, so an open-ended last bucket still gives a finite
// value; 0 when nothing new was observed. The two histograms must share
// their buckets, as the runtime's do.
func deltaQuantile(prev, cur *rtmetrics.Float64Histogram, q float64) float64 {
	var total uint64
	delta := func(i int) uint64 {
		c := cur.Counts[i]
		if prev != nil && i < len(prev.Counts) && prev.Counts[i] <= c {
			c -= prev.Counts[i]
		}
		return c
	}
	for i := range cur.Counts {
		total += delta(i)
	}
	if total == 0 {
		return 0
	}
	// The rank of the quantile, counted from the top, so q=1 is the
	// largest observation.
	above := uint64((1 - q) * float64(total))
	var seen uint64
	for i := len(cur.Counts) - 1; i >= 0; i-- {
		seen += delta(i)
		if seen > above {
			return max(cur.Buckets[i], 0)
		}
	}
	return 0
}
