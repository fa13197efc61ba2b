package listen

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/pkg/certstore"
	"github.com/edgeguard/edgeguard/pkg/ja4"
)

// TLSMetrics are the TLS listener's series: handshakes by result,
// resumptions, and the protocols ALPN chose.
type TLSMetrics struct {
	handshakes  *prometheus.CounterVec // result
	resumptions prometheus.Counter
	alpn        *prometheus.CounterVec // protocol
}

// Handshake results (the result label).
const (
	handshakeOK         = "ok"
	handshakeNoCert     = "no_cert"
	handshakeBadVersion = "bad_version"
	handshakeOther      = "other"
)

// newTLSMetrics makes the series, every label value at 0.
func newTLSMetrics() *TLSMetrics {
	m := &TLSMetrics{
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_tls_handshakes_total",
			Help: "TLS handshakes on --listen-tls by result: ok, no_cert (no certificate for the name and no default), bad_version (client below TLS 1.2), other.",
		}, []string{"result"}),
		resumptions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeguard_tls_resumptions_total",
			Help: "Successful TLS handshakes that resumed a session (a session ticket).",
		}),
		alpn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeguard_tls_connections_total",
			Help: "Successful TLS handshakes by the protocol chosen by ALPN: h2, http/1.1, or none (a client that offered neither; served HTTP/1.1).",
		}, []string{"protocol"}),
	}
	for _, p := range []string{"h2", "http/1.1", "none"} {
		m.alpn.WithLabelValues(p)
	}
	for _, r := range []string{handshakeOK, handshakeNoCert, handshakeBadVersion, handshakeOther} {
		m.handshakes.WithLabelValues(r)
	}
	return m
}

// Collectors are the series to register.
func (m *TLSMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.handshakes, m.resumptions, m.alpn}
}

// TLS termination on --listen-tls: TLS 1.2 and 1.3, AEAD suites only for
// 1.2, HTTP/2 and HTTP/1.1 by ALPN (h2.go), no 0-RTT (crypto/tls has
// none). The listener is the edge's own (fasthttp's ServeTLS clones the
// config), so the session-ticket keys stay the edge's to set. Certificates
// come from a certstore, re-scanned every certPoll: a changed file is
// served from the next handshake on, connections already open keep theirs.

// and not configurable).
var tlsCipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// acmeALPN is the ALPN protocol of TLS-ALPN-01 challenges (RFC 8737).
const acmeALPN = "acme-tls/1"

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
		protos = append(protos, acmeALPN)
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
					if hc, ok := hello.Conn.(*handshakeConn); ok && err == nil {
						hc.leaf = leafOf(c)
					}
					return c, err
				}
			}
			c, err := certs.Certificate(hello)
			if hc, ok := hello.Conn.(*handshakeConn); ok && err == nil {
				hc.noCert = c == nil
				hc.leaf = leafOf(c)
			}
			return c, err // nil, nil: crypto/tls answers unrecognized_name
		},
	}
}

// newTLSListener terminates TLS with config over ln (capped and
// PROXY-aware); timeout bounds each handshake's writes.
func newTLSListener(ln net.Listener, config *tls.Config, m *TLSMetrics, timeout time.Duration, log *slog.Logger) net.Listener {
	return &tlsListener{Listener: ln, config: config, m: m, timeout: timeout, log: log}
}

// tlsListener terminates TLS over the (Capped, PROXY-aware) listener.
type tlsListener struct {
	net.Listener
	config  *tls.Config
	m       *TLSMetrics
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
	// leaf is the certificate served (nil: none, or unparsable); set
	// during the handshake, read-only after it.
	leaf *x509.Certificate
}

// leafOf is c's leaf certificate, parsed when crypto/tls has not.
func leafOf(c *tls.Certificate) *x509.Certificate {
	if c == nil || len(c.Certificate) == 0 {
		return nil
	}
	if c.Leaf != nil {
		return c.Leaf
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return nil
	}
	return leaf
}

// handshakeOf is the TLS connection under c (nil for plain HTTP).
func handshakeOf(c net.Conn) *handshakeConn {
	switch c := c.(type) {
	case *serverTLSConn:
		return c.hc
	case *framedTLSConn:
		return c.hc
	case *h2StreamConn:
		return handshakeOf(c.Conn)
	}
	return nil
}

// CertCovers reports whether the certificate served on c covers host, a
// name or address without port (x509's VerifyHostname: SANs, one
// wildcard label). A plain connection, and one whose certificate the
// edge did not pick (none noted), cover every host.
func CertCovers(c net.Conn, host string) bool {
	hc := handshakeOf(c)
	if hc == nil || hc.leaf == nil {
		return true
	}
	return hc.leaf.VerifyHostname(host) == nil
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

// JA4Of is the JA4 fingerprint of the TLS client on c ("" for plain
// HTTP).
func JA4Of(c net.Conn) string {
	switch c := c.(type) {
	case *serverTLSConn:
		return c.hc.ja4
	case *framedTLSConn:
		return c.hc.ja4
	case *h2StreamConn:
		return JA4Of(c.Conn)
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
