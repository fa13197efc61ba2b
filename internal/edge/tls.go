package edge

import (
	"errors"
	"fmt"
	"net"

	"github.com/edgeguard/edgeguard/internal/edge/handoff"

	"github.com/edgeguard/edgeguard/internal/edge/listen"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
)

// TLS termination on --listen-tls: TLS 1.2 and 1.3, AEAD suites only for
// 1.2, HTTP/2 and HTTP/1.1 by ALPN (listen/h2.go), no 0-RTT (crypto/tls has
// none). The listener is the edge's own (fasthttp's ServeTLS clones the
// config), so the session-ticket keys stay the edge's to set. Certificates
// come from a certstore, re-scanned every certPoll: a changed file is
// served from the next handshake on, connections already open keep theirs.

// listenTLS builds the TLS listener: TCP, then the PROXY protocol policy,
// the per-client cap, and TLS.
func (e *Edge) listenTLS() error {
	var err error
	if e.certs, err = listen.NewCerts(listen.CertsConfig{
		TLSCertDir:     e.cfg.TLSCertDir,
		TLSDefaultCert: e.cfg.TLSDefaultCert,
		TLSTicketKeys:  e.cfg.TLSTicketKeys,
		Consul:         e.cfg.Consul,
		ConsulPrefix:   e.cfg.ConsulPrefix,
		Region:         e.cfg.Region,
		ACMEDomains:    e.cfg.ACMEDomains,
		ACMEEmail:      e.cfg.ACMEEmail,
		ACMECA:         e.cfg.ACMECA,
		ACMECARoot:     e.cfg.ACMECARoot,
		ACMERenewCheck: e.cfg.ACMERenewCheck,
	}, e.lnMet.Certs, e.log); err != nil {
		return err
	}
	if e.certs.Len() == 0 && e.cfg.Consul == "" {
		return errors.New("listen-tls: no valid certificate in --tls-cert-dir or --tls-default-cert")
	}
	ln, err := e.bind(handoff.TLS, e.cfg.ListenTLS)
	if err != nil {
		return fmt.Errorf("listening on %s (TLS): %w", e.cfg.ListenTLS, err)
	}
	e.tlsLn = ln // closed by close() from here on
	tlsConfig, err := e.certs.TLSConfig(e.cfg.H2MaxStreams > 0)
	if err != nil {
		return err
	}
	if e.cfg.H2MaxStreams > 0 {
		e.h2 = listen.NewH2Server(listen.H2Config{
			Addr:           e.tlsLn.Addr(),
			Handler:        e.pipe.Handle,
			Counts:         e.connCounts,
			Log:            e.log,
			Metrics:        e.lnMet.H2,
			StreamMetrics:  e.lnMet.H2Streams,
			MaxStreams:     e.cfg.H2MaxStreams,
			MaxHeldBytes:   e.cfg.H2MaxHeldBytes,
			MaxHeaderBytes: e.cfg.MaxHeaderBytes,
			ReadTimeout:    e.cfg.ReadTimeout,
			WriteTimeout:   e.cfg.WriteTimeout,
			IdleTimeout:    e.cfg.IdleTimeout,
		})
		e.server.NextProto("h2", listen.H1Unwrapped(e.h2.ServeConn))
	}
	e.tlsLn = listen.NewTLSListener(e.acceptStack(ln, nil), tlsConfig, e.lnMet.TLS, e.cfg.ReadTimeout, e.log)
	return nil
}

// acceptStack puts the per-write deadline, the PROXY protocol policy and
// the per-client cap over a public listener; refusal is what a refused
// connection is told.
func (e *Edge) acceptStack(ln net.Listener, refusal []byte) net.Listener {
	// Innermost: every write to the socket, TLS records included, has its
	// own --write-timeout.
	ln = listen.PerWrite(ln, e.cfg.WriteTimeout)
	if len(e.cfg.ProxyProtocolFrom) > 0 {
		ln = listen.NewProxyListener(ln, trust.Set(e.cfg.ProxyProtocolFrom), e.cfg.ReadTimeout, e.lnMet.ProxyRefused, e.log)
	}
	if e.connCounts == nil {
		e.connCounts = listen.NewConnCounts(e.cfg.MaxConnsPerIP, e.cfg.IPv6Prefix, trust.Set(e.cfg.TrustedProxies), e.lnMet.ConnsRefused)
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
