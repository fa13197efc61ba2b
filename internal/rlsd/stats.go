package rlsd

import (
	"context"
	"log/slog"
	"math"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/rls"
)

// The reference's per-descriptor counters, in the order of counts.
const (
	statTotalHits = iota
	statOverLimit
	statNearLimit
	statWithinLimit
	statShadowMode
	nStats
)

var statNames = [nStats]string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"}

// statsPrefix starts every per-descriptor statsd name, as the reference
// names them: ratelimit.service.rate_limit.<domain>.<key>.<stat>.
const statsPrefix = "ratelimit.service.rate_limit."

// counts are the reference's counts for one observation: what the hits
// added to each counter.
type counts [nStats]uint64

// countsOf counts an observation as envoyproxy/ratelimit's limiter does:
// every hit in total_hits; hits past the limit in over_limit (and in
// shadow_mode when the limit is in shadow mode); hits of an admitted
// call in within_limit; and in near_limit the hits that took the count
// past floor(limit × ratio) without going over the limit.
func countsOf(o rls.Observation, ratio float64) counts {
	var c counts
	hits := o.Hits
	c[statTotalHits] = hits
	limit := uint64(o.Limit.RequestsPerUnit)
	near := uint64(math.Floor(float64(float32(limit) * float32(ratio))))
	var before, after uint64
	switch {
	case o.Remaining < 0:
		// Never admissible: nothing counted before it.
		after = hits
	case o.Over:
		before = limit - min(uint64(o.Remaining), limit)
		after = before + hits
	default:
		after = limit - min(uint64(o.Remaining), limit)
		before = after - min(hits, after)
	}
	if o.Over {
		if before >= limit {
			c[statOverLimit] = hits
		} else {
			c[statOverLimit] = after - limit
			c[statNearLimit] = limit - max(near, before)
		}
		if o.Limit.Shadow {
			c[statShadowMode] = c[statOverLimit]
		}
		return c
	}
	c[statWithinLimit] = hits
	if after > near {
		if before >= near {
			c[statNearLimit] = hits
		} else {
			c[statNearLimit] = after - near
		}
	}
	return c
}

// descriptorStats is the rls.Observer: the reference's per-descriptor
// counters, sent to statsd, exposed to Prometheus, or both.
type descriptorStats struct {
	ratio  float64
	prom   [nStats]*prometheus.CounterVec // nil without Prometheus
	statsd *statsdSink                    // nil without statsd
}

func newDescriptorStats(ratio float64, reg prometheus.Registerer, statsd *statsdSink) (*descriptorStats, error) {
	d := &descriptorStats{ratio: ratio, statsd: statsd}
	if reg == nil {
		return d, nil
	}
	for i, n := range statNames {
		// The reference's Prometheus names (its statsd exporter mapping):
		// dots to underscores, the domain and the first two components of
		// the key as labels.
		d.prom[i] = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_rate_limit_" + n,
			Help: "envoyproxy/ratelimit's " + n + " counter of a descriptor: domain, then the first two dot-separated components of its key.",
		}, []string{"domain", "key1", "key2"})
		if err := reg.Register(d.prom[i]); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Observe counts one applied descriptor.
func (d *descriptorStats) Observe(o rls.Observation) {
	c := countsOf(o, d.ratio)
	if d.statsd != nil {
		d.statsd.add(o.Limit.Path, &c)
	}
	if d.prom[0] != nil {
		parts := strings.SplitN(o.Limit.Path, ".", 4)
		var l [3]string
		copy(l[:], parts)
		for i, v := range c {
			if v > 0 || i == statTotalHits {
				d.prom[i].WithLabelValues(l[0], l[1], l[2]).Add(float64(v))
			}
		}
	}
}

// statsdSink sums counters and sends them as statsd counters (UDP) every
// flush interval, as the reference's stats store does.
type statsdSink struct {
	conn net.Conn
	log  *slog.Logger
	mu   sync.Mutex
	sums map[string]*counts
}

func newStatsdSink(addr string, log *slog.Logger) (*statsdSink, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return nil, err
	}
	return &statsdSink{conn: c, log: log, sums: map[string]*counts{}}, nil
}

func (s *statsdSink) add(path string, c *counts) {
	s.mu.Lock()
	sum := s.sums[path]
	if sum == nil {
		sum = new(counts)
		s.sums[path] = sum
	}
	for i, v := range c {
		sum[i] += v
	}
	s.mu.Unlock()
}

// run flushes every interval until ctx is done, then once more.
func (s *statsdSink) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.flush()
		case <-ctx.Done():
			s.flush()
			return
		}
	}
}

// maxPacket keeps a datagram within a common MTU.
const maxPacket = 1432

func (s *statsdSink) flush() {
	s.mu.Lock()
	sums := s.sums
	s.sums = make(map[string]*counts, len(sums))
	s.mu.Unlock()
	paths := make([]string, 0, len(sums))
	for p := range sums {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf []byte
	send := func() {
		if len(buf) == 0 {
			return
		}
		if _, err := s.conn.Write(buf); err != nil {
			s.log.Debug("statsd send failed", "err", err)
		}
		buf = buf[:0]
	}
	for _, p := range paths {
		c := sums[p]
		for i, v := range c {
			if v == 0 && i != statTotalHits {
				continue
			}
			line := statsPrefix + p + "." + statNames[i] + ":" + strconv.FormatUint(v, 10) + "|c"
			if len(buf)+len(line)+1 > maxPacket {
				send()
			}
			if len(buf) > 0 {
				buf = append(buf, '\n')
			}
			buf = append(buf, line...)
		}
	}
	send()
}

func (s *statsdSink) close() { _ = s.conn.Close() }
