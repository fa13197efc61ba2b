package pipeline

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// enforcement is the region's enforcement switch in force (pkg/region's
// Enforcement), read from Consul: shadow for the whole region, or a
// percentage of each rule's keys enforced. nil (no switch, or no Consul)
// enforces every key.
type enforcement struct {
	region.Enforcement
	threshold uint64 // buckets enforced, of region.Buckets
	version   string
}

// shadowed says whether rule r's check on key only counts: a shadow rule
// always; otherwise as the region's switch says. This is the one place where
// a rule's decision becomes enforced or shadow.
func (e *Pipeline) shadowed(r *rules.CompiledRule, key string) bool {
	if r.Shadow {
		return true
	}
	en := e.enforce.Load()
	switch {
	case en == nil || en.threshold >= region.Buckets:
		return false
	case en.threshold == 0:
		return true
	}
	return region.Bucket(key) >= en.threshold
}

// SetEnforcement applies the region's enforcement switch (read from
// Consul).
func (e *Pipeline) SetEnforcement(en region.Enforcement) {
	next := &enforcement{Enforcement: en, threshold: en.Threshold(), version: en.Version()}
	old := e.enforce.Swap(next)
	m := e.metrics.enforce
	if old != nil {
		m.info.DeleteLabelValues(old.Mode, old.version)
	}
	m.info.WithLabelValues(en.Mode, next.version).Set(1)
	m.ratio.Set(float64(next.threshold) / region.Buckets)
	m.loaded.Set(float64(time.Now().UnixMilli()) / 1000)
	e.log.Info("enforcement switch applied", "switch", en.String(), "version", next.version)
}

// Enforcement is the region's enforcement switch in force; ok is false
// while there is none (every key enforced).
func (e *Pipeline) Enforcement() (en region.Enforcement, ok bool) {
	if cur := e.enforce.Load(); cur != nil {
		return cur.Enforcement, true
	}
	return region.Enforcement{}, false
}

// enforcementMetrics say which switch runs and how many checks it made
// shadow.
type enforcementMetrics struct {
	info     *prometheus.GaugeVec // mode, version
	ratio    prometheus.Gauge
	loaded   prometheus.Gauge
	checks   *prometheus.CounterVec // mode
	enforced prometheus.Counter
	shadow   prometheus.Counter
}

func newEnforcementMetrics() *enforcementMetrics {
	m := &enforcementMetrics{
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgeguard_edge_enforcement_info",
			Help: "The region's enforcement switch in force (value 1): mode (enforce or shadow) and version (regionctl enforcement get). Absent until a switch was read from Consul: every key enforced.",
		}, []string{"mode", "version"}),
		ratio: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_edge_enforced_keys_ratio",
			Help: "Share of each rule's keys the enforcement switch enforces (1: all; 0: shadow); rules marked shadow are never enforced.",
		}),
		loaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_edge_enforcement_loaded_timestamp_seconds",
			Help: "When the enforcement switch in force was applied (Unix time).",
		}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_edge_rule_checks_total",
			Help: "Rule checks sent to the limiter, by mode: enforced (may deny) or shadow (counts only: a shadow rule, or a key the enforcement switch leaves out).",
		}, []string{"mode"}),
	}
	m.ratio.Set(1)
	m.enforced = m.checks.WithLabelValues("enforced")
	m.shadow = m.checks.WithLabelValues("shadow")
	return m
}

func (m *enforcementMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.info, m.ratio, m.loaded, m.checks}
}
