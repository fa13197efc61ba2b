package shedder

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
	queueWait   *prometheus.HistogramVec

	requests [numTiers]paddedCounter
	shed     [numTiers]paddedCounter
	// Worker-cap rejections, beside the ramp's sheds in rejected_total.
	queueFull    [numTiers]paddedCounter
	queueTimeout [numTiers]paddedCounter
	hostShare    [numTiers]paddedCounter

	// The settings in force: version (a hash of them) and when that
	// version took effect, for dashboard annotations.
	settingsMu      sync.Mutex
	settingsVersion string
	settingsInfo    *prometheus.GaugeVec
	settingsLoaded  prometheus.Gauge

	// workers is read at scrape time so the busy/capacity gauges cost the
	// request path nothing.
	workers  atomic.Pointer[Workers]
	adaptive atomic.Pointer[Adaptive]
	hosts    atomic.Pointer[HostShares]
	lag      prometheus.Gauge

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

	m.queueWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    namespace + "queue_wait_seconds",
		Help:    "Time requests spent queued for a worker slot, by tier (only requests that had to queue).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"tier"})
	for t := range Tier(numTiers) {
		m.queueWait.WithLabelValues(t.String()) // every tier's series exists from the start
	}
	m.collectors = append(m.collectors, m.queueWait)

	m.settingsInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: namespace + "settings_info",
		Help: "The shedder settings version in force (value 1): a hash of the settings.",
	}, []string{"version"})
	m.settingsLoaded = gauge("settings_loaded_timestamp_seconds", "When the settings version in force took effect (Unix time).")
	m.collectors = append(m.collectors, m.settingsInfo)

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
		for reason, c := range map[string]*paddedCounter{"ramp": shed, "queue_full": &m.queueFull[t], "queue_timeout": &m.queueTimeout[t], "host_share": &m.hostShare[t]} {
			m.collectors = append(m.collectors, prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name:        namespace + "rejected_total",
				Help:        rejectedHelp,
				ConstLabels: prometheus.Labels{"tier": t.String(), "reason": reason},
			}, func() float64 { return float64(c.Load()) }))
		}
		m.collectors = append(m.collectors,
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name:        namespace + "rejected_total",
				Help:        rejectedHelp,
				ConstLabels: prometheus.Labels{"tier": t.String(), "reason": "adaptive"},
			}, func() float64 { return float64(m.adaptiveState().Rejected[t]) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        namespace + "adaptive_share",
				Help:        "Each tier's guaranteed share of the adaptive limit, in requests.",
				ConstLabels: labels,
			}, func() float64 { return m.adaptiveState().Share[t] }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        namespace + "adaptive_in_flight",
				Help:        "Origin requests in flight under the adaptive limit, by tier.",
				ConstLabels: labels,
			}, func() float64 { return float64(m.adaptiveState().InFlight[t]) }),
		)
	}
	m.lag = gauge("runtime_lag_seconds", "The edge runtime's lag at the last sample: the largest of the sampler's tick lateness, the scheduler's p99 latency and the longest GC pause since the previous sample.")
	m.collectors = append(m.collectors,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: namespace + "adaptive_limit", Help: "The adaptive concurrency limit on origin requests, learned from their latency.",
		}, func() float64 { return m.adaptiveState().Limit }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: namespace + "adaptive_floor", Help: "The lowest this edge's adaptive limit goes: adaptive.min_limit divided by the edges sharing the origin (the region's registered edges), rounded up.",
		}, func() float64 { return m.adaptiveState().Floor }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: namespace + "adaptive_gradient", Help: "The adaptive limit's last gradient, minRTT·(1+buffer)/sampleRTT clamped to [0.5, 2]: below 1 the origin is queueing.",
		}, func() float64 { return m.adaptiveState().Gradient }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: namespace + "adaptive_min_rtt_seconds", Help: "The origin's no-queue latency (minRTT) the adaptive limit compares against.",
		}, func() float64 { return m.adaptiveState().MinRTT.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: namespace + "adaptive_sample_rtt_seconds", Help: "The median origin latency of the adaptive limit's last window.",
		}, func() float64 { return m.adaptiveState().SampleRTT.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: namespace + "adaptive_enabled", Help: "1 when the adaptive limit refuses requests, 0 when it only learns.",
		}, func() float64 {
			if m.adaptiveState().Enabled {
				return 1
			}
			return 0
		}),
	)

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

	m.collectors = append(m.collectors, newHostCollector(m.hosts.Load))

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

// setConfig publishes the settings dashboards draw next to the ramp, and
// their version; the load time moves only when the version changes, so a
// re-applied identical document is not a settings change.
func (m *metrics) setConfig(cfg Config, now time.Time) {
	v := SettingsVersion(cfg)
	m.settingsMu.Lock()
	if v != m.settingsVersion {
		m.settingsVersion = v
		m.settingsInfo.Reset()
		m.settingsInfo.WithLabelValues(v).Set(1)
		m.settingsLoaded.Set(float64(now.UnixNano()) / 1e9)
	}
	m.settingsMu.Unlock()
	m.thresholdG.Set(cfg.Good)
	m.thresholdB.Set(cfg.Bad)
	if cfg.Enabled {
		m.enabled.Set(1)
	} else {
		m.enabled.Set(0)
	}
}

const rejectedHelp = "Requests answered 503 by the shedder, by tier and reason: ramp (shed by the ramp), queue_full and queue_timeout (the worker cap), host_share (the host was at its fair share of the workers), adaptive (the adaptive origin limit)."

// adaptiveState is read at scrape time.
func (m *metrics) adaptiveState() AdaptiveState {
	if a := m.adaptive.Load(); a != nil {
		return a.State()
	}
	return AdaptiveState{}
}

// queueWaitOf is the queue wait histogram of tier.
func (m *metrics) queueWaitOf(tier Tier) prometheus.Observer {
	return m.queueWait.WithLabelValues(tier.String())
}

// countRejected counts a worker-cap rejection of tier by its error.
func (m *metrics) countRejected(tier Tier, err error) {
	if !tier.valid() {
		tier = TierWrite
	}
	switch {
	case errors.Is(err, ErrQueueFull):
		m.queueFull[tier].Add(1)
	case errors.Is(err, ErrQueueTimeout):
		m.queueTimeout[tier].Add(1)
	}
}

// SettingsVersion is a short hash of cfg's canonical JSON: equal settings
// have equal versions on every edge, whatever document they came from.
func SettingsVersion(cfg Config) string {
	data, err := json.Marshal(cfg)
	if err != nil {
		panic("shedder: encoding settings failed: " + err.Error()) // plain values cannot fail
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:12]
}
