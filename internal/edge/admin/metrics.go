package admin

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/edgeguard/edgeguard/internal/buildinfo"
)

// Metrics are the edge's own series: the rules in force and the build.
// Labels are bounded: never a client key, address or raw host. region and
// pop are constant labels of the registry.
type Metrics struct {
	RulesInfo   *prometheus.GaugeVec // version
	RulesLoaded prometheus.Gauge
	RulesErrors prometheus.Counter
}

// NewRegistry is the registry /metrics serves, holding the Go runtime's
// and the process's collectors, and the registerer the edge's parts
// register with. region and pop are target labels, attached by Prometheus
// from the Consul service meta; with labels (--metrics-region-labels) the
// edge adds them to its own series itself.
func NewRegistry(labels prometheus.Labels) (*prometheus.Registry, prometheus.Registerer) {
	r := prometheus.NewRegistry()
	var reg prometheus.Registerer = r
	if labels != nil {
		reg = prometheus.WrapRegistererWith(labels, r)
	}
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r, reg
}

// NewMetrics registers the edge's own series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		RulesInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgeguard_edge_rules_info",
			Help: "The rules version running (value 1).",
		}, []string{"version"}),
		RulesLoaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_edge_rules_loaded_timestamp_seconds",
			Help: "When the running rules were loaded (Unix time).",
		}),
		RulesErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_rules_rejected_total",
			Help: "Rule documents refused as invalid (the last good rules stay).",
		}),
	}
	bi := buildinfo.Get()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "edgeguard_build_info",
		Help:        "The running build (value 1): version, VCS revision, Go version.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "goversion": bi.GoVersion},
	})
	build.Set(1)
	var errs []error
	for _, c := range []prometheus.Collector{m.RulesInfo, m.RulesLoaded, m.RulesErrors, build} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}

// RegisterServing registers the series read at scrape: the public
// server's open connections, and ready (ready.Value).
func RegisterServing(reg prometheus.Registerer, open func() float64, ready Readiness) error {
	return errors.Join(
		reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgeguard_edge_open_connections",
			Help: "Client connections the public server holds open.",
		}, open)),
		reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgeguard_edge_ready",
			Help: "1 when /readyz answers 200: serving, rules loaded, not draining, and the rate limit store decides or the fail mode still serves (degraded: see edgeguard_limiter_degraded).",
		}, ready.Value)))
}
