package listen

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the listeners' series: TLS (edgeguard_tls_*), HTTP/2, the
// PROXY protocol's refusals and the per-client cap's.
type Metrics struct {
	TLS          *TLSMetrics            // handshakes, resumptions, ALPN
	Certs        *CertMetrics           // certificates, ticket keys, ACME
	ProxyRefused *prometheus.CounterVec // reason
	ConnsRefused prometheus.Counter
	H2           *H2Metrics
	H2Streams    *H2StreamMetrics
}

// NewMetrics registers the listeners' series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		TLS:   newTLSMetrics(),
		Certs: newCertMetrics(),
		ProxyRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_edge_proxy_protocol_refused_total",
			Help: "Connections refused under the PROXY protocol policy: missing_header (a --proxy-protocol-from balancer sent none), untrusted_source (a PROXY header from anyone else), invalid_header (malformed, or a TLV running past the header), too_many_waiting (the oldest of 1024 balancer connections waiting for their header, closed to make room).",
		}, []string{"reason"}),
		ConnsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_edge_connections_refused_total",
			Help: "Connections refused at accept because their peer address already held --max-conns-per-ip.",
		}),
		H2:        newH2Metrics(),
		H2Streams: newH2StreamMetrics(),
	}
	for _, r := range []string{"missing_header", "untrusted_source", "invalid_header", "too_many_waiting"} {
		m.ProxyRefused.WithLabelValues(r)
	}
	cs := append(append(m.TLS.Collectors(), m.Certs.Collectors()...), m.ProxyRefused, m.ConnsRefused)
	cs = append(append(cs, m.H2.Collectors()...), m.H2Streams.Collectors()...)
	var errs []error
	for _, c := range cs {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
