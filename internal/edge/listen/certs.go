package listen

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/pkg/certstore"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// certPoll is how often the certificate files are checked for changes.
const certPoll = time.Second

// CertMetrics are the series of the certificates, the session-ticket keys
// and the ACME names.
type CertMetrics struct {
	reloads      prometheus.Counter
	refusedFiles prometheus.Counter
	certificates prometheus.Gauge
	ticketsAt    prometheus.Gauge
	acme         *prometheus.CounterVec // event
}

// newCertMetrics makes the series, every label value at 0.
func newCertMetrics() *CertMetrics {
	m := &CertMetrics{
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
	return m
}

// Collectors are the series to register.
func (m *CertMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.reloads, m.refusedFiles, m.certificates, m.ticketsAt, m.acme}
}

// CertsConfig are the settings the certificates, keys and ACME names are
// read with (the flags of the same names).
type CertsConfig struct {
	TLSCertDir     string
	TLSDefaultCert string
	TLSTicketKeys  string
	Consul         string
	ConsulPrefix   string
	Region         string
	ACMEDomains    []string
	ACMEEmail      string
	ACMECA         string
	ACMECARoot     string
	ACMERenewCheck time.Duration
}

// Certs are the TLS listener's certificates by SNI (from files and from
// Consul), its session-ticket keys (from a file or the region's in
// Consul) and its ACME names.
type Certs struct {
	cfg       CertsConfig
	log       *slog.Logger
	m         *CertMetrics
	certs     *certstore.Store
	tlsConfig *tls.Config // once TLSConfig made it
	tickets   *ticketKeys // nil without --tls-ticket-keys
	acme      *acmeState  // nil without --acme-domains
}

// newCerts reads the certificate files; it refuses none (Len says how many
// there are).
func newCerts(cfg CertsConfig, m *CertMetrics, log *slog.Logger) (*Certs, error) {
	e := &Certs{cfg: cfg, m: m, log: log, certs: certstore.New(cfg.TLSCertDir, cfg.TLSDefaultCert)}
	return e, e.scanCerts()
}

// Len is how many certificates there are (the default included).
func (e *Certs) Len() int { return e.certs.Len() }

// TLSConfig is the listener's configuration, offering h2 when h2 is set,
// with the session-ticket keys of --tls-ticket-keys loaded.
func (e *Certs) TLSConfig(h2 bool) (*tls.Config, error) {
	var acme acmeCerts
	if len(e.cfg.ACMEDomains) > 0 {
		// e.acme is set by StartACME, before Run serves a handshake.
		acme = func(hello *tls.ClientHelloInfo) (*tls.Certificate, bool, error) {
			if e.acme == nil {
				return nil, false, nil
			}
			return e.acme.certificate(hello)
		}
	}
	e.tlsConfig = newTLSConfig(e.certs, h2, acme)
	if e.cfg.TLSTicketKeys != "" {
		e.tickets = &ticketKeys{path: e.cfg.TLSTicketKeys, config: e.tlsConfig}
		if err := e.loadTicketKeys(); err != nil {
			return nil, fmt.Errorf("tls-ticket-keys: %w", err)
		}
	}
	return e.tlsConfig, nil
}

// scanCerts re-reads changed certificate files, logging and counting what
// changed; an invalid file is named with its reason.
func (e *Certs) scanCerts() error {
	rep, err := e.certs.Scan()
	if err != nil {
		e.m.refusedFiles.Inc()
		e.log.Error("certificate directory unreadable; keeping the certificates in force", "dir", e.cfg.TLSCertDir, "err", err)
		return err
	}
	for _, r := range rep.Refused {
		e.m.refusedFiles.Inc()
		e.log.Error("certificate refused; keeping the one in force (if any)", "file", r.Source, "reason", r.Err)
	}
	for _, f := range rep.Loaded {
		e.m.reloads.Inc()
		e.log.Info("certificate loaded", "file", f)
	}
	for _, f := range rep.Removed {
		e.log.Info("certificate removed (its files are gone)", "file", f)
	}
	e.m.certificates.Set(float64(e.certs.Len()))
	return nil
}

// ReadConsul reads the region's certificates from Consul once, at
// start, so the edge serves them from its first handshake; the watch
// (consul.go) follows their changes.
func (e *Certs) ReadConsul(ctx context.Context, client *region.Client) {
	certs, err := client.Certs(ctx, e.cfg.Region)
	if err != nil {
		e.log.Warn("certificates in consul not read at start; serving the others until consul answers", "err", err)
		return
	}
	m := make(map[string][]byte, len(certs))
	for _, c := range certs {
		m[c.Name] = c.PEM
	}
	e.ApplyConsul(m)
}

// ApplyConsul makes certs the certificates from Consul, logging and
// counting what changed; an invalid one is named with its reason and the
// one in force stays.
func (e *Certs) ApplyConsul(certs map[string][]byte) {
	rep := e.certs.Replace("consul", certs)
	for _, r := range rep.Refused {
		e.m.refusedFiles.Inc()
		e.log.Error("certificate from consul refused; keeping the one in force (if any)", "key", e.consulCertKey(r.Source), "reason", r.Err)
	}
	for _, s := range rep.Loaded {
		e.m.reloads.Inc()
		e.log.Info("certificate loaded", "key", e.consulCertKey(s))
	}
	for _, s := range rep.Removed {
		e.log.Info("certificate removed (its key is gone)", "key", e.consulCertKey(s))
	}
	e.m.certificates.Set(float64(e.certs.Len()))
}

// consulCertKey is the Consul key of a certificate the store names
// "consul:NAME".
func (e *Certs) consulCertKey(source string) string {
	name := strings.TrimPrefix(source, "consul:")
	return region.NewLayout(e.cfg.ConsulPrefix).Certs(e.cfg.Region) + name
}

// certFullScan is how often every certificate file is checked even
// without a notification (a missed or overflowed inotify event, a network
// file system).
const certFullScan = 30 * time.Second

// Watch keeps the certificates and ticket keys current until ctx is
// done. On Linux the directories are watched (inotify) and read at the
// next tick after a change, so an idle poll costs nothing however many
// certificates there are; elsewhere, or if the watch fails, every file is
// checked every tick.
func (e *Certs) Watch(ctx context.Context) {
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
