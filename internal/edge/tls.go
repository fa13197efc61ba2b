package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/edge/trust"
	"github.com/edgeguard/edgeguard/pkg/certstore"
	"github.com/edgeguard/edgeguard/pkg/ja4"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// TLS termination on --listen-tls: TLS 1.2 and 1.3, AEAD suites only for
// 1.2, HTTP/2 and HTTP/1.1 by ALPN (h2.go), no 0-RTT (crypto/tls has
// none). The listener is the edge's own (fasthttp's ServeTLS clones the
// config), so the session-ticket keys stay the edge's to set. Certificates
// come from a certstore, re-scanned every certPoll: a changed file is
// served from the next handshake on, connections already open keep theirs.

// certPoll is how often the certificate files are checked for changes.
const certPoll = time.Second

// tlsMetrics are the edge's edgeguard_tls_* series.
type tlsMetrics struct {
	handshakes   *prometheus.CounterVec // result
	resumptions  prometheus.Counter
	reloads      prometheus.Counter
	refusedFiles prometheus.Counter
	certificates prometheus.Gauge
	proxyRefused *prometheus.CounterVec // reason
	alpn         *prometheus.CounterVec // protocol
	ticketsAt    prometheus.Gauge
	acme         *prometheus.CounterVec // event
}

// Handshake results (the result label).
const (
	handshakeOK         = "ok"
	handshakeNoCert     = "no_cert"
	handshakeBadVersion = "bad_version"
	handshakeOther      = "other"
)

func newTLSMetrics() *tlsMetrics {
	m := &tlsMetrics{
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_tls_handshakes_total",
			Help: "TLS handshakes on --listen-tls by result: ok, no_cert (no certificate for the name and no default), bad_version (client below TLS 1.2), other.",
		}, []string{"result"}),
		resumptions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_tls_resumptions_total",
			Help: "Successful TLS handshakes that resumed a session (a session ticket).",
		}),
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
	m.alpn = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgeguard_tls_connections_total",
		Help: "Successful TLS handshakes by the protocol chosen by ALPN: h2, http/1.1, or none (a client that offered neither; served HTTP/1.1).",
	}, []string{"protocol"})
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
	for _, p := range []string{"h2", "http/1.1", "none"} {
		m.alpn.WithLabelValues(p)
	}
	for _, r := range []string{handshakeOK, handshakeNoCert, handshakeBadVersion, handshakeOther} {
		m.handshakes.WithLabelValues(r)
	}
	for _, r := range []string{"missing_header", "untrusted_source", "invalid_header", "too_many_waiting"} {
		m.proxyRefused.WithLabelValues(r)
	}
	return m
}

func (m *tlsMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.handshakes, m.resumptions, m.reloads, m.refusedFiles, m.certificates, m.proxyRefused, m.alpn, m.ticketsAt, m.acme}
}

// tlsCipherSuites are TLS 1.2's ECDHE AEAD suites (TLS 1.3's are all AEAD
// and not configurable).
var tlsCipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// acmeCerts answers a handshake for ACME (a challenge, or a managed name's
// certificate); ok false leaves it to the certificate store.
type acmeCerts func(hello *tls.ClientHelloInfo) (c *tls.Certificate, ok bool, err error)

// newTLSConfig serves the store's certificates, offering h2 when h2 is
// set, and ACME's first when acme is not nil.
func newTLSConfig(certs *certstore.Store, h2 bool, acme acmeCerts) *tls.Config {
	protos := []string{"http/1.1"}
	if h2 {
		protos = []string{"h2", "http/1.1"}
	}
	if acme != nil {
		protos = append(protos, acmeTLSALPN)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		CipherSuites: tlsCipherSuites,
		NextProtos:   protos,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			c, ok := hello.Conn.(*handshakeConn)
			if !ok {
				return nil, nil
			}
			if !slices.ContainsFunc(hello.SupportedVersions, func(v uint16) bool { return v >= tls.VersionTLS12 }) {
				c.badVersion = true
			}
			c.ja4 = fingerprint(hello)
			return nil, nil // this config
		},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if acme != nil {
				if c, ok, err := acme(hello); ok {
					return c, err
				}
			}
			c, err := certs.Certificate(hello)
			if c == nil && err == nil {
				if hc, ok := hello.Conn.(*handshakeConn); ok {
					hc.noCert = true
				}
			}
			return c, err // nil, nil: crypto/tls answers unrecognized_name
		},
	}
}

// tlsListener terminates TLS over the (capped, PROXY-aware) listener.
type tlsListener struct {
	net.Listener
	config  *tls.Config
	m       *tlsMetrics
	timeout time.Duration // bounds the handshake's writes
	log     *slog.Logger
}

func (l *tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	hc := &handshakeConn{Conn: c}
	return &serverTLSConn{Conn: tls.Server(hc, l.config), hc: hc, l: l}, nil
}

// handshakeConn is the connection under TLS; the handshake's callbacks
// note on it why a handshake failed.
type handshakeConn struct {
	net.Conn
	noCert, badVersion bool
	ja4                string // the ClientHello's JA4 fingerprint
}

// fingerprint is a ClientHello's JA4 (crypto/tls hands over the extension
// types since Go 1.24: no need to parse the hello again).
func fingerprint(hello *tls.ClientHelloInfo) string {
	sigs := make([]uint16, len(hello.SignatureSchemes))
	for i, s := range hello.SignatureSchemes {
		sigs[i] = uint16(s)
	}
	return ja4.Fingerprint(ja4.Hello{
		Versions:            hello.SupportedVersions,
		CipherSuites:        hello.CipherSuites,
		Extensions:          hello.Extensions,
		SignatureAlgorithms: sigs,
		ALPN:                hello.SupportedProtos,
		SNI:                 hello.ServerName != "",
	})
}

// ja4Of is the JA4 fingerprint of the TLS client on c ("" for plain
// HTTP).
func ja4Of(c net.Conn) string {
	switch c := c.(type) {
	case *serverTLSConn:
		return c.hc.ja4
	case *framedTLSConn:
		return c.hc.ja4
	case *h2StreamConn:
		return ja4Of(c.Conn)
	}
	return ""
}

// serverTLSConn counts its handshake, run by fasthttp before it picks the
// protocol (or on the first Read), under fasthttp's deadlines. It embeds
// *tls.Conn, so fasthttp sees a TLS connection (ctx.IsTLS,
// ctx.TLSConnectionState) and the proxy writes X-Forwarded-Proto: https.
type serverTLSConn struct {
	*tls.Conn
	hc   *handshakeConn
	l    *tlsListener
	done bool
	err  error // the handshake's
}

// Handshake runs the handshake once, counted; later calls return its
// result.
func (c *serverTLSConn) Handshake() error {
	if !c.done {
		c.done = true
		c.err = c.handshake()
	}
	return c.err
}

func (c *serverTLSConn) Read(b []byte) (int, error) {
	if err := c.Handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *serverTLSConn) handshake() error {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.l.timeout))
	err := c.Conn.HandshakeContext(context.Background())
	_ = c.Conn.SetWriteDeadline(time.Time{})
	m := c.l.m
	switch {
	case err == nil:
		m.handshakes.WithLabelValues(handshakeOK).Inc()
		st := c.Conn.ConnectionState()
		if st.DidResume {
			m.resumptions.Inc()
		}
		proto := st.NegotiatedProtocol
		if proto == "" {
			proto = "none"
		}
		m.alpn.WithLabelValues(proto).Inc()
		return nil
	case c.hc.noCert:
		m.handshakes.WithLabelValues(handshakeNoCert).Inc()
	case c.hc.badVersion:
		m.handshakes.WithLabelValues(handshakeBadVersion).Inc()
	default:
		m.handshakes.WithLabelValues(handshakeOther).Inc()
	}
	c.l.log.Debug("TLS handshake failed", "peer", c.Conn.RemoteAddr().String(), "err", err)
	return err
}

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
	var acme acmeCerts
	if len(e.cfg.ACMEDomains) > 0 {
		// e.acme is set by startConsul, before Run serves a handshake.
		acme = func(hello *tls.ClientHelloInfo) (*tls.Certificate, bool, error) {
			if e.acme == nil {
				return nil, false, nil
			}
			return e.acme.certificate(hello)
		}
	}
	tlsConfig := newTLSConfig(e.certs, e.cfg.H2MaxStreams > 0, acme)
	e.tlsConfig = tlsConfig
	if e.cfg.H2MaxStreams > 0 {
		e.h2 = e.newH2Server()
		e.server.NextProto("h2", h1Unwrapped(e.h2.serveConn))
	}
	if e.cfg.TLSTicketKeys != "" {
		e.tickets = &ticketKeys{path: e.cfg.TLSTicketKeys, config: tlsConfig}
		if err := e.loadTicketKeys(); err != nil {
			return fmt.Errorf("tls-ticket-keys: %w", err)
		}
	}
	e.tlsLn = &tlsListener{Listener: e.acceptStack(ln, nil), config: tlsConfig, m: e.metrics.tls, timeout: e.cfg.ReadTimeout, log: e.log}
	return nil
}

// acceptStack puts the PROXY protocol policy and the per-client cap over a
// public listener; refusal is what a refused connection is told.
func (e *Edge) acceptStack(ln net.Listener, refusal []byte) net.Listener {
	if len(e.cfg.ProxyProtocolFrom) > 0 {
		ln = newProxyListener(ln, trust.Set(e.cfg.ProxyProtocolFrom), e.cfg.ReadTimeout, e.metrics.tls.proxyRefused, e.log)
	}
	if e.connCounts == nil {
		e.connCounts = newConnCounts(e.cfg.MaxConnsPerIP, e.cfg.IPv6Prefix, e.trusted, e.metrics.connsRefused)
	}
	return capped(ln, e.connCounts, refusal)
}

// TLSAddr is the bound TLS address ("" without --listen-tls).
func (e *Edge) TLSAddr() string {
	if e.tlsLn == nil {
		return ""
	}
	return e.tlsLn.Addr().String()
}
