package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/listen"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
	"github.com/edgeguard/edgeguard/pkg/certstore"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// TLS termination on --listen-tls: TLS 1.2 and 1.3, AEAD suites only for
// 1.2, HTTP/2 and HTTP/1.1 by ALPN (listen/h2.go), no 0-RTT (crypto/tls has
// none). The listener is the edge's own (fasthttp's ServeTLS clones the
// config), so the session-ticket keys stay the edge's to set. Certificates
// come from a certstore, re-scanned every certPoll: a changed file is
// served from the next handshake on, connections already open keep theirs.

// certPoll is how often the certificate files are checked for changes.
const certPoll = time.Second

// tlsMetrics are the edge's edgeguard_tls_* series.
type tlsMetrics struct {
	handshakes   *listen.TLSMetrics // the listener's: handshakes, resumptions, ALPN
	reloads      prometheus.Counter
	refusedFiles prometheus.Counter
	certificates prometheus.Gauge
	proxyRefused *prometheus.CounterVec // reason
	ticketsAt    prometheus.Gauge
	acme         *prometheus.CounterVec // event
}

func newTLSMetrics() *tlsMetrics {
	m := &tlsMetrics{
		handshakes: listen.NewTLSMetrics(),
		reloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_tls_certificate_reloads_total",
			Help: "Certificates loaded or replaced from files (at start and on change).",
		}),
		refusedFiles: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_tls_certificate_files_refused_total",
			Help: "Certificate files refused as invalid (the certificate they would replace stays).",
		}),
		certificates: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeguard_tls_certificates",
			Help: "Certificates held (the default included).",
		}),
		proxyRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_edge_proxy_protocol_refused_total",
			Help: "Connections refused under the PROXY protocol policy: missing_header (a --proxy-protocol-from balancer sent none), untrusted_source (a PROXY header from anyone else), invalid_header (malformed, or a TLV running past the header), too_many_waiting (the oldest of 1024 balancer connections waiting for their header, closed to make room).",
		}, []string{"reason"}),
	}
	m.ticketsAt = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "edgeguard_tls_ticket_keys_rotated_timestamp_seconds",
		Help: "When the session-ticket keys in force, the region's from Consul, were last rotated (Unix time); 0 with keys of the edge's own or from --tls-ticket-keys.",
	})
	m.acme = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgeguard_tls_acme_events_total",
		Help: "ACME certificate events on this edge: cert_obtained (issued or renewed by this edge), cert_failed (an attempt failed; retried).",
	}, []string{"event"})
	for _, ev := range []string{"cert_obtained", "cert_failed"} {
		m.acme.WithLabelValues(ev)
	}
	for _, r := range []string{"missing_header", "untrusted_source", "invalid_header", "too_many_waiting"} {
		m.proxyRefused.WithLabelValues(r)
	}
	return m
}

func (m *tlsMetrics) collectors() []prometheus.Collector {
	return append(m.handshakes.Collectors(), m.reloads, m.refusedFiles, m.certificates, m.proxyRefused, m.ticketsAt, m.acme)
}

// tlsCipherSuites are TLS 1.2's ECDHE AEAD suites (TLS 1.3's are all AEAD
// scanCerts re-reads changed certificate files, logging and counting what
// changed; an invalid file is named with its reason.
func (e *Edge) scanCerts() error {
	rep, err := e.certs.Scan()
	if err != nil {
		e.metrics.tls.refusedFiles.Inc()
		e.log.Error("certificate directory unreadable; keeping the certificates in force", "dir", e.cfg.TLSCertDir, "err", err)
		return err
	}
	for _, r := range rep.Refused {
		e.metrics.tls.refusedFiles.Inc()
		e.log.Error("certificate refused; keeping the one in force (if any)", "file", r.Source, "reason", r.Err)
	}
	for _, f := range rep.Loaded {
		e.metrics.tls.reloads.Inc()
		e.log.Info("certificate loaded", "file", f)
	}
	for _, f := range rep.Removed {
		e.log.Info("certificate removed (its files are gone)", "file", f)
	}
	e.metrics.tls.certificates.Set(float64(e.certs.Len()))
	return nil
}

// readConsulCerts reads the region's certificates from Consul once, at
// start, so the edge serves them from its first handshake; the watch
// (consul.go) follows their changes.
func (e *Edge) readConsulCerts(ctx context.Context, client *region.Client) {
	certs, err := client.Certs(ctx, e.cfg.Region)
	if err != nil {
		e.log.Warn("certificates in consul not read at start; serving the others until consul answers", "err", err)
		return
	}
	m := make(map[string][]byte, len(certs))
	for _, c := range certs {
		m[c.Name] = c.PEM
	}
	e.applyConsulCerts(m)
}

// applyConsulCerts makes certs the certificates from Consul, logging and
// counting what changed; an invalid one is named with its reason and the
// one in force stays.
func (e *Edge) applyConsulCerts(certs map[string][]byte) {
	rep := e.certs.Replace("consul", certs)
	for _, r := range rep.Refused {
		e.metrics.tls.refusedFiles.Inc()
		e.log.Error("certificate from consul refused; keeping the one in force (if any)", "key", e.consulCertKey(r.Source), "reason", r.Err)
	}
	for _, s := range rep.Loaded {
		e.metrics.tls.reloads.Inc()
		e.log.Info("certificate loaded", "key", e.consulCertKey(s))
	}
	for _, s := range rep.Removed {
		e.log.Info("certificate removed (its key is gone)", "key", e.consulCertKey(s))
	}
	e.metrics.tls.certificates.Set(float64(e.certs.Len()))
}

// consulCertKey is the Consul key of a certificate the store names
// "consul:NAME".
func (e *Edge) consulCertKey(source string) string {
	name := strings.TrimPrefix(source, "consul:")
	return region.NewLayout(e.cfg.ConsulPrefix).Certs(e.cfg.Region) + name
}

// certFullScan is how often every certificate file is checked even
// without a notification (a missed or overflowed inotify event, a network
// file system).
const certFullScan = 30 * time.Second

// watchCerts keeps the certificates and ticket keys current until ctx is
// done. On Linux the directories are watched (inotify) and read at the
// next tick after a change, so an idle poll costs nothing however many
// certificates there are; elsewhere, or if the watch fails, every file is
// checked every tick.
func (e *Edge) watchCerts(ctx context.Context) {
	var dirs []string
	if e.cfg.TLSCertDir != "" {
		dirs = append(dirs, e.cfg.TLSCertDir)
	}
	if e.cfg.TLSDefaultCert != "" {
		dirs = append(dirs, filepath.Dir(e.cfg.TLSDefaultCert))
	}
	events, stop, err := watchDirs(dirs)
	if err != nil {
		e.log.Warn("certificate directories not watched; checking every file every second", "err", err)
	} else {
		defer stop()
	}
	t := time.NewTicker(certPoll)
	defer t.Stop()
	pending, last := false, time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-events: // nil without a watch: never ready
			pending = true
		case now := <-t.C:
			if events == nil || pending || now.Sub(last) >= certFullScan {
				pending, last = false, now
				_ = e.scanCerts()
			}
			if e.tickets != nil {
				_ = e.loadTicketKeys() // one stat
			}
		}
	}
}

// listenTLS builds the TLS listener: TCP, then the PROXY protocol policy,
// the per-client cap, and TLS.
func (e *Edge) listenTLS() error {
	e.certs = certstore.New(e.cfg.TLSCertDir, e.cfg.TLSDefaultCert)
	if err := e.scanCerts(); err != nil {
		return err
	}
	if e.certs.Len() == 0 && e.cfg.Consul == "" {
		return errors.New("listen-tls: no valid certificate in --tls-cert-dir or --tls-default-cert")
	}
	ln, err := net.Listen("tcp", e.cfg.ListenTLS)
	if err != nil {
		return fmt.Errorf("listening on %s (TLS): %w", e.cfg.ListenTLS, err)
	}
	e.tlsLn = ln // closed by close() from here on
	var acme listen.ACMECerts
	if len(e.cfg.ACMEDomains) > 0 {
		// e.acme is set by startConsul, before Run serves a handshake.
		acme = func(hello *tls.ClientHelloInfo) (*tls.Certificate, bool, error) {
			if e.acme == nil {
				return nil, false, nil
			}
			return e.acme.certificate(hello)
		}
	}
	tlsConfig := listen.NewTLSConfig(e.certs, e.cfg.H2MaxStreams > 0, acme)
	e.tlsConfig = tlsConfig
	if e.cfg.H2MaxStreams > 0 {
		e.h2 = listen.NewH2Server(listen.H2Config{
			Addr:           e.tlsLn.Addr(),
			Handler:        e.handle,
			Counts:         e.connCounts,
			Log:            e.log,
			Metrics:        e.metrics.h2,
			StreamMetrics:  e.metrics.h2Streams,
			MaxStreams:     e.cfg.H2MaxStreams,
			MaxHeldBytes:   e.cfg.H2MaxHeldBytes,
			MaxHeaderBytes: e.cfg.MaxHeaderBytes,
			ReadTimeout:    e.cfg.ReadTimeout,
			WriteTimeout:   e.cfg.WriteTimeout,
			IdleTimeout:    e.cfg.IdleTimeout,
		})
		e.server.NextProto("h2", listen.H1Unwrapped(e.h2.ServeConn))
	}
	if e.cfg.TLSTicketKeys != "" {
		e.tickets = &ticketKeys{path: e.cfg.TLSTicketKeys, config: tlsConfig}
		if err := e.loadTicketKeys(); err != nil {
			return fmt.Errorf("tls-ticket-keys: %w", err)
		}
	}
	e.tlsLn = listen.NewTLSListener(e.acceptStack(ln, nil), tlsConfig, e.metrics.tls.handshakes, e.cfg.ReadTimeout, e.log)
	return nil
}

// acceptStack puts the PROXY protocol policy and the per-client cap over a
// public listener; refusal is what a refused connection is told.
func (e *Edge) acceptStack(ln net.Listener, refusal []byte) net.Listener {
	if len(e.cfg.ProxyProtocolFrom) > 0 {
		ln = listen.NewProxyListener(ln, trust.Set(e.cfg.ProxyProtocolFrom), e.cfg.ReadTimeout, e.metrics.tls.proxyRefused, e.log)
	}
	if e.connCounts == nil {
		e.connCounts = listen.NewConnCounts(e.cfg.MaxConnsPerIP, e.cfg.IPv6Prefix, e.trusted, e.metrics.connsRefused)
	}
	return listen.Capped(ln, e.connCounts, refusal)
}

// TLSAddr is the bound TLS address ("" without --listen-tls).
func (e *Edge) TLSAddr() string {
	if e.tlsLn == nil {
		return ""
	}
	return e.tlsLn.Addr().String()
}
