package shedder

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// paddedCounter sits alone on its cache lines: every request bumps one, and
// tiers sharing a line would make cores contend even on different tiers.
type paddedCounter struct {
	atomic.Uint64
	_ [120]byte
}

// metrics holds every collector the package exports. The per-tier request
// counters double as the offered-traffic source for the cut-off shares, so
// a request costs one atomic add rather than one for us and one for
// Prometheus.
type metrics struct {
	utilization prometheus.Gauge
	level       prometheus.Gauge
	cutoffTier  prometheus.Gauge
	thresholdG  prometheus.Gauge
	thresholdB  prometheus.Gauge
	enabled     prometheus.Gauge
	queueWait   prometheus.Histogram

	requests [numTiers]paddedCounter
	shed     [numTiers]paddedCounter

	// workers is read at scrape time so the busy/capacity gauges cost the
	// request path nothing.
	workers atomic.Pointer[Workers]

	collectors []prometheus.Collector
}

const namespace = "edgeguard_shedder_"

// newMetrics builds the collectors and registers them on reg; a nil reg
// leaves them unregistered but working, which tests and tools rely on.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: namespace + name, Help: help})
		m.collectors = append(m.collectors, g)
		return g
	}
	m.utilization = gauge("utilization", "Smoothed worker utilization (busy workers / capacity) driving the shed ramp.")
	m.level = gauge("level", "Shed level S: <= 0 sheds nothing, 1 sheds all sheddable traffic.")
	m.cutoffTier = gauge("cutoff_tier", "Index of the highest tier being shed (0 test, 1 read, 2 write), -1 when none.")
	m.enabled = gauge("enabled", "1 when shedding is enforced, 0 in shadow mode.")

	thresholds := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: namespace + "threshold",
		Help: "Utilization thresholds of the ramp: below good recovers, from bad sheds more.",
	}, []string{"threshold"})
	m.thresholdG = thresholds.WithLabelValues("good")
	m.thresholdB = thresholds.WithLabelValues("bad")
	m.collectors = append(m.collectors, thresholds)

	m.queueWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    namespace + "queue_wait_seconds",
		Help:    "Time requests spent queued for a worker slot (only requests that had to queue).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	})
	m.collectors = append(m.collectors, m.queueWait)

	for t := Tier(0); t < numTiers; t++ {
		req, shed := &m.requests[t], &m.shed[t]
		labels := prometheus.Labels{"tier": t.String()}
		m.collectors = append(m.collectors,
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: namespace + "requests_total", Help: "Requests offered to the shedder, before shedding.", ConstLabels: labels,
			}, func() float64 { return float64(req.Load()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: namespace + "shed_total", Help: "Requests shed by the ramp.", ConstLabels: labels,
			}, func() float64 { return float64(shed.Load()) }),
		)
	}

	m.collectors = append(m.collectors,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: namespace + "workers_busy", Help: "Worker slots in use.",
		}, func() float64 {
			if w := m.workers.Load(); w != nil {
				return float64(w.Busy())
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: namespace + "workers_capacity", Help: "Worker slots available (the hard concurrency cap).",
		}, func() float64 {
			if w := m.workers.Load(); w != nil {
				return float64(w.Capacity())
			}
			return 0
		}),
	)

	if reg == nil {
		return m, nil
	}
	var errs []error
	var done []prometheus.Collector
	for _, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, c)
	}
	if err := errors.Join(errs...); err != nil {
		// Undo only our own registrations: unregistering a clashing
		// collector would remove the one already there.
		for _, c := range done {
			reg.Unregister(c)
		}
		return nil, fmt.Errorf("shedder: register metrics: %w", err)
	}
	return m, nil
}

// setConfig publishes the settings dashboards draw next to the ramp.
func (m *metrics) setConfig(cfg Config) {
	m.thresholdG.Set(cfg.Good)
	m.thresholdB.Set(cfg.Bad)
	if cfg.Enabled {
		m.enabled.Set(1)
	} else {
		m.enabled.Set(0)
	}
}
