package admin

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/edgeguard/edgeguard/internal/buildinfo"
	"github.com/edgeguard/edgeguard/internal/edge/config"
)

// NewRegistry is the registry /metrics serves, holding the Go runtime's
// and the process's collectors and the build's series, and the registerer
// the edge's parts register with. region and pop are target labels,
// attached by Prometheus from the Consul service meta; with
// --metrics-region-labels the edge adds them to its own series itself.
// Labels are bounded: never a client key, address or raw host.
func NewRegistry(cfg config.Config) (*prometheus.Registry, prometheus.Registerer) {
	r := prometheus.NewRegistry()
	var reg prometheus.Registerer = r
	if cfg.MetricsRegionLabels {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"region": cfg.Region, "pop": cfg.PoP}, r)
	}
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	bi := buildinfo.Get()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "edgeguard_build_info",
		Help:        "The running build (value 1): version, VCS revision, Go version.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "goversion": bi.GoVersion},
	})
	build.Set(1)
	reg.MustRegister(build)
	return r, reg
}

// registerServing registers the series read at scrape: the public
// server's open connections, and ready (ready.Value).
func registerServing(reg prometheus.Registerer, open func() float64, ready Readiness) error {
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
