package edge

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/buildinfo"
	"github.com/edgeguard/edgeguard/internal/edge/consullink"
	"github.com/edgeguard/edgeguard/internal/edge/listen"
)

// metrics are the edge's own (the pipeline's are package pipeline's):
// rules, Consul, connections, TLS and HTTP/2. Labels are bounded: every
// label from a fixed set; never a client key, address or raw host. region
// and pop are constant labels of the registry.
type metrics struct {
	rulesInfo     *prometheus.GaugeVec // version
	rulesLoaded   prometheus.Gauge
	rulesErrors   prometheus.Counter
	consulErrors  prometheus.Counter
	consulPanics  prometheus.Counter
	consulMissing *prometheus.GaugeVec // document (missing.go)
	connsRefused  prometheus.Counter
	tls           *tlsMetrics       // TLS and the PROXY protocol (tls.go)
	h2            *listen.H2Metrics // HTTP/2
	h2Streams     *listen.H2StreamMetrics
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		rulesInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edgeguard_edge_rules_info",
			Help: "The rules version running (value 1).",
		}, []string{"version"}),
		rulesLoaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_edge_rules_loaded_timestamp_seconds",
			Help: "When the running rules were loaded (Unix time).",
		}),
		rulesErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_rules_rejected_total",
			Help: "Rule documents refused as invalid (the last good rules stay).",
		}),
		consulErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_consul_errors_total",
			Help: "Failed Consul watches and registrations (retried with backoff; the settings in force stay).",
		}),
		consulPanics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_consul_panics_total",
			Help: "Panics recovered in the Consul watchers (a bug: see logs; the settings in force stay, the watch goes on).",
		}),
		connsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_connections_refused_total",
			Help: "Connections refused at accept because their peer address already held --max-conns-per-ip.",
		}),
	}
	m.tls = newTLSMetrics()
	m.h2 = listen.NewH2Metrics()
	m.h2Streams = listen.NewH2StreamMetrics()
	m.consulMissing = consullink.NewMissingGauge()
	bi := buildinfo.Get()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "edgeguard_build_info",
		Help:        "The running build (value 1): version, VCS revision, Go version.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "goversion": bi.GoVersion},
	})
	build.Set(1)
	var errs []error
	for _, c := range []prometheus.Collector{m.rulesInfo, m.rulesLoaded, m.rulesErrors, m.consulErrors, m.consulPanics, m.consulMissing, m.connsRefused, build} {
		errs = append(errs, reg.Register(c))
	}
	for _, c := range append(m.tls.collectors(), m.h2.Collectors()...) {
		errs = append(errs, reg.Register(c))
	}
	for _, c := range m.h2Streams.Collectors() {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}

// openConns exports the public server's open connections (read at scrape).
func (m *metrics) openConns(reg prometheus.Registerer, open func() float64) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "edgeguard_edge_open_connections",
		Help: "Client connections the public server holds open.",
	}, open))
}

// readyGauge exports what /readyz answers (read at scrape).
func (m *metrics) readyGauge(reg prometheus.Registerer, ready func() float64) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "edgeguard_edge_ready",
		Help: "1 when /readyz answers 200: serving, rules loaded, not draining, and the rate limit store decides or the fail mode still serves (degraded: see edgeguard_limiter_degraded).",
	}, ready))
}
