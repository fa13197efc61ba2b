package edge

import (
	"github.com/edgeguard/edgeguard/internal/edge/listen"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
)

// listenSettings are the public listeners' settings (package listen).
func (e *Edge) listenSettings() listen.Settings {
	c := e.cfg
	return listen.Settings{
		ReadTimeout: c.ReadTimeout, WriteTimeout: c.WriteTimeout, IdleTimeout: c.IdleTimeout,
		MaxHeaderBytes: c.MaxHeaderBytes, MaxBodyBytes: c.MaxBodyBytes,
		ProxyFrom: trust.Set(c.ProxyProtocolFrom), Trusted: trust.Set(c.TrustedProxies),
		MaxConnsPerIP: c.MaxConnsPerIP, IPv6Prefix: c.IPv6Prefix,
		ListenTLS: c.ListenTLS, H2MaxStreams: c.H2MaxStreams, H2MaxHeldBytes: c.H2MaxHeldBytes,
		Certs: listen.CertsConfig{
			TLSCertDir:     c.TLSCertDir,
			TLSDefaultCert: c.TLSDefaultCert,
			TLSTicketKeys:  c.TLSTicketKeys,
			Consul:         c.Consul,
			ConsulPrefix:   c.ConsulPrefix,
			Region:         c.Region,
			ACMEDomains:    c.ACMEDomains,
			ACMEEmail:      c.ACMEEmail,
			ACMECA:         c.ACMECA,
			ACMECARoot:     c.ACMECARoot,
			ACMERenewCheck: c.ACMERenewCheck,
		},
	}
}

// TLSAddr is the bound TLS address ("" without --listen-tls).
func (e *Edge) TLSAddr() string {
	if e.tlsLn == nil {
		return ""
	}
	return e.tlsLn.Addr().String()
}
