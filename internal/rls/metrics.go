package rls

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the service's; labels are bounded (code, result, outcome),
// never a domain, descriptor or value.
type metrics struct {
	requests     *prometheus.CounterVec
	duration     prometheus.Histogram
	descriptors  *prometheus.CounterVec
	overrides    *prometheus.CounterVec
	globalShadow prometheus.Counter
	configLoads  *prometheus.CounterVec
	resetFloods  prometheus.Counter
	refusedConns prometheus.Counter

	// The children the hot path uses, looked up once.
	okCalls, overCalls, errorCalls           prometheus.Counter
	ok, over, shadowOver, unlimited, noLimit prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_rls_requests_total",
			Help: "ShouldRateLimit calls, by overall code (ok, over_limit) or error.",
		}, []string{"code"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edgeguard_rls_request_duration_seconds",
			Help:    "Time to answer a ShouldRateLimit call, limiter decision included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		descriptors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_rls_descriptors_total",
			Help: "Descriptors answered, by result: ok, over_limit, shadow_over_limit (counted, answered OK), unlimited, no_limit.",
		}, []string{"result"}),
		overrides: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_rls_limit_overrides_total",
			Help: "Descriptor limit overrides: applied (trusted caller) or ignored (untrusted; the configured limit applied).",
		}, []string{"outcome"}),
		globalShadow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_rls_global_shadow_total",
			Help: "Calls over the limit answered OK because the service runs in shadow mode.",
		}),
		configLoads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_rls_config_loads_total",
			Help: "Rate limit service configuration loads, by outcome (ok, error: the previous configuration stays).",
		}, []string{"outcome"}),
		resetFloods: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_rls_reset_floods_total",
			Help: "gRPC connections closed for rapid reset: RST_STREAM frames, the client's and the ones it provoked (refused streams, expired deadlines), beyond the per-connection budget.",
		}),
		refusedConns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_rls_connections_refused_total",
			Help: "gRPC connections closed at accept: their client address already held --rls-max-conns-per-ip.",
		}),
	}
	m.okCalls, m.overCalls, m.errorCalls = m.requests.WithLabelValues("ok"), m.requests.WithLabelValues("over_limit"), m.requests.WithLabelValues("error")
	d := m.descriptors.WithLabelValues
	m.ok, m.over, m.shadowOver, m.unlimited, m.noLimit = d("ok"), d("over_limit"), d("shadow_over_limit"), d("unlimited"), d("no_limit")
	for _, o := range []string{"applied", "ignored"} {
		m.overrides.WithLabelValues(o)
	}
	for _, o := range []string{"ok", "error"} {
		m.configLoads.WithLabelValues(o)
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.descriptors, m.overrides, m.globalShadow, m.configLoads, m.resetFloods, m.refusedConns} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
